/* libgraphd: the counters of a Status as the library reads them. The
 * device counters' list (graphd/device_counters.def): each counter copied
 * from the wire into its place in graphd_device_record, and the list
 * handed to programs that show every counter (graphd_device_metric). And
 * the request counters, a sized record per kind of request. Stands on no
 * other file of libgraphd.
 *
 * DESIGN: no state but the list itself, constant, and the status the
 * caller owns: any thread. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
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

graphd_status gd_status_requests(gd_status_priv *p, const Graphd__Wire__StatusReply *sr) {
  p->req = NULL;
  p->nreq = 0;
  if (!sr->n_requests) return GRAPHD_OK;
  if (!(p->req = calloc(sr->n_requests, sizeof *p->req))) return GRAPHD_RESOURCE_EXHAUSTED;
  for (size_t i = 0; i < sr->n_requests; i++) {
    const Graphd__Wire__RequestCounters *w = sr->requests[i];
    graphd_request_record *r = &p->req[i];
    r->size = sizeof *r;
    snprintf(r->request, sizeof r->request, "%s", w->request ? w->request : "");
    r->calls = w->calls;
    r->errors = w->errors;
    r->handler_ns = w->handler_ns;
  }
  p->nreq = sr->n_requests;
  return GRAPHD_OK;
}

/* The smallest record size a caller may pass: the record's first two
 * members. */
#define REQUEST_RECORD_MIN offsetof(graphd_request_record, calls)

graphd_status graphd_daemon_status_requests(const graphd_daemon_status *s, size_t size,
                                            graphd_request_record **out, size_t *n) {
  if (out) *out = NULL;
  if (n) *n = 0;
  if (!s || !out || !n || size < REQUEST_RECORD_MIN) return GRAPHD_INVALID_ARGUMENT;
  const gd_status_priv *p = (const gd_status_priv *)s; /* pub is its first member */
  if (!p->nreq) return GRAPHD_OK;
  char *a = calloc(p->nreq, size); /* calloc: the product is checked */
  if (!a) return GRAPHD_RESOURCE_EXHAUSTED;
  for (size_t i = 0; i < p->nreq; i++)
    gd_record_fill(a + i * size, size, &p->req[i], sizeof *p->req);
  *out = (graphd_request_record *)(void *)a;
  *n = p->nreq;
  return GRAPHD_OK;
}

void graphd_request_records_free(graphd_request_record *list) { free(list); }
