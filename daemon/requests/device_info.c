/* See device_info.h. Loop thread. */
#include "device_info.h"

#include "daemon/device/worker.h"

static const char *state_name(int st) {
  return st == GD_DEVICE_OK ? "ok" : st == GD_DEVICE_FAILED ? "failed" : "starting";
}

/* The worker's busy time and the time it has served (worker_busy). A
 * reading taken while the worker ends a spell may be a little ahead of the
 * next: the figure reported is the largest yet, so that it never goes back
 * (a counter that goes back reads as a restart to Prometheus). */
static void worker_figures(gd_daemon *d, int i, uint64_t *busy_ns, uint64_t *clock_ns) {
  *busy_ns = *clock_ns = 0;
  if (d->pool.workers && i < d->pool.n) worker_busy(daemon_worker(d, i), busy_ns, clock_ns);
  gd_device_counters *c = &d->counters[i];
  if (*busy_ns < c->last_busy_ns) *busy_ns = c->last_busy_ns;
  c->last_busy_ns = *busy_ns;
}

/* The counters Status reads as it answers (source READ in the list), each
 * by its name. */
#define READ_FIELD_TALLY(name)
#define READ_FIELD_KEPT(name)
#define READ_FIELD_READ(name) uint64_t name;
typedef struct reading {
#define GRAPHD_DEVICE_COUNTER(name, field, kind, unit, source, ...) READ_FIELD_##source(name)
#include "graphd/device_counters.def"
} reading;

static void read_figures(gd_daemon *d, int i, reading *rd) {
  const gd_device_counters *c = &d->counters[i];
  rd->replay_p50_ns = gd_hist_quantile(&c->replay_latency, 0.50);
  rd->replay_p90_ns = gd_hist_quantile(&c->replay_latency, 0.90);
  rd->replay_p99_ns = gd_hist_quantile(&c->replay_latency, 0.99);
  rd->replay_max_ns = c->replay_latency.max;
  rd->replay_latency_count = c->replay_latency.count;
  rd->replay_latency_sum_ns = c->replay_latency.sum;
  rd->instances = c->last_instances;
  rd->graphs = c->last_graphs;
  worker_figures(d, i, &rd->worker_busy_ns, &rd->worker_clock_ns);
}

/* A counter's value by its source: the loop's counters, or the reading. */
#define VALUE_TALLY(c, rd, name) (c)->name
#define VALUE_KEPT(c, rd, name) (c)->name
#define VALUE_READ(c, rd, name) (rd)->name

void device_info_fill(gd_daemon *d, int i, uint64_t free_mem, Graphd__Wire__DeviceInfo *di,
                      Graphd__Wire__DeviceCounters *dc) {
  const gd_device_facts *f = d->facts[i];
  const gd_device_counters *c = &d->counters[i];
  gd_device *dev = &d->devices[i];
  graphd__wire__device_info__init(di);
  graphd__wire__device_counters__init(dc);
  di->ordinal = (uint32_t)i;
  di->name = (char *)f->name;
  di->uuid.data = (uint8_t *)f->uuid;
  di->uuid.len = 16;
  di->total_memory = f->total_memory;
  di->free_memory = free_mem;
  di->backend = (char *)d->be->name;
  di->epoch = atomic_load(&dev->epoch);
  di->mps_enabled = f->mps_enabled != 0;
  di->state = (char *)state_name(atomic_load(&dev->state));
  reading rd;
  read_figures(d, i, &rd);
  /* Every counter of the list, under its name on the wire. */
#define GRAPHD_DEVICE_COUNTER(name, field, kind, unit, source, ...)                                \
  dc->name = VALUE_##source(c, &rd, name);
#include "graphd/device_counters.def"
  /* The latency histogram's bounds and counts (its count and sum are in
   * the list). */
  dc->n_replay_latency_le_ns = dc->n_replay_latency_le_count = GD_HIST_LE_N;
  dc->replay_latency_le_ns = (uint64_t *)gd_hist_le_ns;
  dc->replay_latency_le_count = (uint64_t *)c->replay_latency.le;
  di->staging_budget_bytes = dev->budget;
  di->counters = dc;
}
