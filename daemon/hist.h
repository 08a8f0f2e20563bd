/* A latency histogram with log-linear buckets: exact below 8 ns, then 8
 * buckets per power of two, so a percentile read from it is within 12.5%
 * (it reports the bucket's upper bound, capped at the largest value seen).
 * Fixed size, no allocation; one per device, loop thread only. */
#ifndef GRAPHD_HIST_H
#define GRAPHD_HIST_H

#include <stdint.h>

#define GD_HIST_SUB_BITS 3u
#define GD_HIST_BUCKETS (64u << GD_HIST_SUB_BITS)

typedef struct gd_hist {
  uint64_t count;
  uint64_t max;
  uint64_t bucket[GD_HIST_BUCKETS];
} gd_hist;

void gd_hist_add(gd_hist *h, uint64_t v);

/* The value at quantile q (0 < q <= 1): the smallest bucket bound that
 * covers ceil(q * count) samples; 0 when empty. */
uint64_t gd_hist_quantile(const gd_hist *h, double q);

#endif
