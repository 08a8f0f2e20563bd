/* What the benchmarks share: a monotonic clock in microseconds and the
 * comparison to sort samples by. */
#ifndef GRAPHD_BENCH_UTIL_H
#define GRAPHD_BENCH_UTIL_H

#include <time.h>

static inline double bench_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* For qsort over doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#endif
