/* A latency histogram with log-linear buckets: exact below 8 ns, then 8
 * buckets per power of two, so a percentile read from it is within 12.5%
 * (it reports the bucket's upper bound, capped at the largest value seen).
 * Beside them it counts exactly, for a Prometheus histogram, the values at
 * or below each of a few fixed bounds (gd_hist_le_ns, 1 us to 10 s), and
 * sums the values. Fixed size, no allocation; one per device, loop thread
 * only. */
#ifndef GRAPHD_HIST_H
#define GRAPHD_HIST_H

#include <stdint.h>

#define GD_HIST_SUB_BITS 3u
#define GD_HIST_BUCKETS (64u << GD_HIST_SUB_BITS)
#define GD_HIST_LE_N 22u

/* The fixed bounds (ns, ascending): 1, 2.5 and 5 times each power of ten
 * from 1 us to 10 s. */
extern const uint64_t gd_hist_le_ns[GD_HIST_LE_N];

typedef struct gd_hist {
  uint64_t count;
  uint64_t max;
  uint64_t sum;              /* of the values, saturating */
  uint64_t le[GD_HIST_LE_N]; /* values <= gd_hist_le_ns[k] (cumulative) */
  uint64_t bucket[GD_HIST_BUCKETS];
} gd_hist;

void gd_hist_add(gd_hist *h, uint64_t v);

/* The value at quantile q (0 < q <= 1): the smallest bucket bound that
 * covers ceil(q * count) samples; 0 when empty. */
uint64_t gd_hist_quantile(const gd_hist *h, double q);

#endif
