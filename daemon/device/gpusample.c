/* See gpusample.h. Worker thread only. */
#include "gpusample.h"

#include <stdlib.h>
#include <string.h>

#include "daemon/base/clock.h"
#include "common/log.h"
#include "device.h"

#define OPS (d->be->ops)
#define BE d->be, d->dev

/* The next gap: from 1 to 2 * every - 1, every on average. */
static uint32_t next_gap(gd_gpu_sampler *g, uint32_t every) {
  if (every <= 1) return 1;
  uint64_t x = g->rng;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  g->rng = x;
  return 1 + (uint32_t)(x % (2ull * every - 1));
}

/* Doubles the ring (16 pairs at first), the pairs in flight first in
 * their order; false when not one more pair could be had. */
static bool grow(gd_device *d, gd_gpu_sampler *g) {
  if (g->cap >= GD_GPU_SAMPLE_MAX_PAIRS) return false;
  uint32_t want = g->cap ? 2 * g->cap : 16;
  if (want > GD_GPU_SAMPLE_MAX_PAIRS) want = GD_GPU_SAMPLE_MAX_PAIRS;
  gd_event *start = malloc(want * sizeof *start), *end = malloc(want * sizeof *end);
  if (!start || !end) {
    free(start);
    free(end);
    return false;
  }
  for (uint32_t i = 0; i < g->cap; i++) {
    start[i] = g->start[(g->head + i) % g->cap];
    end[i] = g->end[(g->head + i) % g->cap];
  }
  char e[256] = "";
  uint32_t made = g->cap;
  for (; made < want; made++) {
    if (OPS->event_create_timed(BE, &start[made], e, sizeof e) < 0) break;
    if (OPS->event_create_timed(BE, &end[made], e, sizeof e) < 0) {
      OPS->event_destroy(BE, start[made]);
      break;
    }
  }
  bool more = made > g->cap;
  if (!more && !g->cap) {
    g->broken = true;
    GD_LOG(GD_WARN, "capture", "device %d: no GPU time of replays will be reported: %s", d->index,
           e);
  }
  free(g->start);
  free(g->end);
  g->start = start;
  g->end = end;
  g->cap = made;
  g->head = 0;
  return more;
}

int gpu_sample_begin(gd_device *d, gd_gpu_sampler *g, gd_stream st) {
  uint32_t every = d->gpu_sample_every;
  if (!every || g->broken) return -1;
  if (!g->rng) g->rng = (gd_now_ns() ^ (0x9E3779B97F4A7C15ull * (uint64_t)(d->index + 1))) | 1;
  if (!g->gap) g->gap = next_gap(g, every);
  if (--g->gap) return -1;
  g->gap = next_gap(g, every);
  gpu_sample_poll(d, g);
  if (g->pending == g->cap && !grow(d, g)) {
    if (!g->missed++)
      GD_LOG(GD_INFO, "capture",
             "device %d: replays run so far ahead of the GPU that some go untimed (%u samples "
             "in flight)",
             d->index, g->pending);
    return -1;
  }
  uint32_t k = (g->head + g->pending) % g->cap;
  char e[256];
  return OPS->event_record(BE, g->start[k], st, e, sizeof e) == 0 ? (int)k : -1;
}

void gpu_sample_end(gd_device *d, gd_gpu_sampler *g, gd_stream st, int k) {
  char e[256];
  if (OPS->event_record(BE, g->end[k], st, e, sizeof e) == 0) g->pending++;
}

void gpu_sample_poll(gd_device *d, gd_gpu_sampler *g) {
  while (g->pending) {
    uint64_t ns = 0;
    char e[256];
    int r = OPS->event_elapsed(BE, g->start[g->head], g->end[g->head], &ns, e, sizeof e);
    if (r == 0) return;
    g->head = (g->head + 1) % g->cap;
    g->pending--;
    if (r < 0) {
      GD_LOG(GD_DEBUG, "capture", "device %d: a replay's GPU time could not be read: %s", d->index,
             e);
      continue;
    }
    g->ns += ns;
    g->n++;
  }
}

void gpu_sample_take(gd_gpu_sampler *g, uint64_t *ns, uint64_t *n) {
  *ns += g->ns;
  *n += g->n;
  g->ns = g->n = 0;
}

void gpu_sample_free(gd_device *d, gd_gpu_sampler *g) {
  for (uint32_t k = 0; k < g->cap; k++) {
    OPS->event_destroy(BE, g->start[k]);
    OPS->event_destroy(BE, g->end[k]);
  }
  free(g->start);
  free(g->end);
  memset(g, 0, sizeof *g);
}
