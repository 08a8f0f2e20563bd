#include "hist.h"

#include <math.h>

#define SUB (1u << GD_HIST_SUB_BITS)

const uint64_t gd_hist_le_ns[GD_HIST_LE_N] = {
    1000,      2500,      5000,       10000,      25000,      50000,       100000,   250000,
    500000,    1000000,   2500000,    5000000,    10000000,   25000000,    50000000, 100000000,
    250000000, 500000000, 1000000000, 2500000000, 5000000000, 10000000000,
};

static uint32_t bucket_of(uint64_t v) {
  if (v < SUB) return (uint32_t)v;
  uint32_t e = 63u - (uint32_t)__builtin_clzll(v); /* >= GD_HIST_SUB_BITS */
  uint32_t m = (uint32_t)(v >> (e - GD_HIST_SUB_BITS)) & (SUB - 1);
  return ((e - GD_HIST_SUB_BITS + 1) << GD_HIST_SUB_BITS) | m;
}

static uint64_t bucket_upper(uint32_t b) {
  if (b < SUB) return b;
  uint32_t e = (b >> GD_HIST_SUB_BITS) + GD_HIST_SUB_BITS - 1;
  uint64_t m = b & (SUB - 1);
  uint64_t lower = (SUB | m) << (e - GD_HIST_SUB_BITS);
  return lower + (1ull << (e - GD_HIST_SUB_BITS)) - 1;
}

void gd_hist_add(gd_hist *h, uint64_t v) {
  h->bucket[bucket_of(v)]++;
  h->count++;
  if (v > h->max) h->max = v;
  h->sum = h->sum + v < h->sum ? UINT64_MAX : h->sum + v;
  for (uint32_t k = GD_HIST_LE_N; k > 0 && v <= gd_hist_le_ns[k - 1]; k--) h->le[k - 1]++;
}

uint64_t gd_hist_quantile(const gd_hist *h, double q) {
  if (!h->count) return 0;
  uint64_t want = (uint64_t)ceil(q * (double)h->count);
  if (want < 1) want = 1;
  if (want > h->count) want = h->count;
  uint64_t seen = 0;
  for (uint32_t b = 0; b < GD_HIST_BUCKETS; b++) {
    seen += h->bucket[b];
    if (seen >= want) {
      uint64_t u = bucket_upper(b);
      return u < h->max ? u : h->max;
    }
  }
  return h->max;
}
