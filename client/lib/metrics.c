/* libgraphd: the device counters' list (graphd/device_counters.def) as the
 * library reads it: each counter copied from the wire into its place in
 * graphd_device_record, and the list handed to programs that show every
 * counter (graphd_device_metric). Stands on no other file of libgraphd.
 *
 * DESIGN: no state but the list itself, constant: any thread. */
#include <stddef.h>
#include <string.h>

#include "graphd.pb-c.h"
#include "graphd/graphd.h"
#include "internal.h"

#define KIND_COUNTER "counter"
#define KIND_GAUGE "gauge"
#define UNIT_NS "ns"
#define UNIT_BYTES "bytes"
#define UNIT_COUNT "count"
#define OWN_LINE 1
#define OWN_PART 0
#define OWN_NONE 0

static const graphd_metric_info metrics[] = {
#define GRAPHD_DEVICE_COUNTER(id, num, kind_, unit_, source, place, path, form, prom, help_)       \
  {.name = #id,                                                                                    \
   .field = num,                                                                                   \
   .offset = (uint32_t)offsetof(graphd_device_record, path),                                       \
   .kind = KIND_##kind_,                                                                           \
   .unit = UNIT_##unit_,                                                                           \
   .prometheus = prom,                                                                             \
   .prometheus_own = OWN_##form,                                                                   \
   .help = help_},
#include "graphd/device_counters.def"
};

#define NMETRICS (sizeof metrics / sizeof metrics[0])

const graphd_metric_info *graphd_device_metric(uint32_t i) {
  return i < NMETRICS ? &metrics[i] : NULL;
}

uint64_t graphd_device_record_value(const graphd_device_record *r, const graphd_metric_info *m) {
  uint64_t v = 0;
  if (r && m && (size_t)m->offset + sizeof v <= r->size)
    memcpy(&v, (const char *)r + m->offset, sizeof v);
  return v;
}

void gd_record_counters(graphd_device_record *r, const Graphd__Wire__DeviceCounters *w) {
#define GRAPHD_DEVICE_COUNTER(name, field, kind, unit, source, place, path, ...) r->path = w->name;
#include "graphd/device_counters.def"
}
