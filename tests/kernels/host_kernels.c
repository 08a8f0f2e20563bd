/* Host kernels for the host backend's tests: the host equivalents of
 * tests/kernels/test_kernels.cu, written to the graphd_host_kernel ABI. */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "graphd/host_kernel.h"

static uint64_t global_index(const graphd_host_launch *l, uint32_t t) {
  return (uint64_t)l->block_idx[0] * l->block[0] + t;
}

/* y[i] = a * x[i] for i < n: (const float *x, float *y, float a, uint32_t n) */
GRAPHD_HOST_PARAMS(scale, 4, 0, 8, 8, 8, 16, 4, 20, 4);
GRAPHD_HOST_KERNEL(scale) {
  const float *x = *(const float *const *)params[0];
  float *y = *(float *const *)params[1];
  float a = *(const float *)params[2];
  uint32_t n = *(const uint32_t *)params[3];
  for (uint32_t t = 0; t < l->block[0]; t++) {
    uint64_t i = global_index(l, t);
    if (i < n) y[i] = a * x[i];
  }
}

/* y[i] += x[i]: (const float *x, float *y, uint32_t n) */
GRAPHD_HOST_PARAMS(accumulate, 3, 0, 8, 8, 8, 16, 4);
GRAPHD_HOST_KERNEL(accumulate) {
  const float *x = *(const float *const *)params[0];
  float *y = *(float *const *)params[1];
  uint32_t n = *(const uint32_t *)params[2];
  for (uint32_t t = 0; t < l->block[0]; t++) {
    uint64_t i = global_index(l, t);
    if (i < n) y[i] += x[i];
  }
}

/* A struct parameter with pointer fields: (struct pair p, uint32_t n),
 * out[i] = in[i] * 2 + 1. */
struct pair {
  const float *in;
  float *out;
};
GRAPHD_HOST_PARAMS(pair_kernel, 2, 0, 16, 16, 4);
GRAPHD_HOST_KERNEL(pair_kernel) {
  const struct pair *p = (const struct pair *)params[0];
  uint32_t n = *(const uint32_t *)params[1];
  for (uint32_t t = 0; t < l->block[0]; t++) {
    uint64_t i = global_index(l, t);
    if (i < n) p->out[i] = p->in[i] * 2.0f + 1.0f;
  }
}

/* Sleeps ms milliseconds, once per launch: (uint32_t ms). For the tests of
 * a device that stays busy (shutdown grace). */
GRAPHD_HOST_PARAMS(sleep_ms, 1, 0, 4);
GRAPHD_HOST_KERNEL(sleep_ms) {
  if (l->block_idx[0] != 0) return;
  uint32_t ms = *(const uint32_t *)params[0];
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* fault(n): faults the device when n is non-zero, as an illegal address
 * would on a GPU (n = 1: the reset clears it; n >= 2: it cannot);
 * otherwise does nothing. */
GRAPHD_HOST_PARAMS(fault, 1, 0, 4);
GRAPHD_HOST_KERNEL(fault) {
  uint32_t n = *(const uint32_t *)params[0];
  if (n) *l->fault = n >= 2 ? 2 : 1;
}

/* No parameter description exported: sizes are not checked on host devices. */
GRAPHD_HOST_KERNEL(undescribed) {
  (void)l;
  (void)params;
}

/* *counter -= 1, once per launch: (uint32_t *counter) */
GRAPHD_HOST_PARAMS(count_down, 1, 0, 8);
GRAPHD_HOST_KERNEL(count_down) {
  uint32_t *c = *(uint32_t *const *)params[0];
  if (l->block_idx[0] == 0) (*c)--;
}

/* *out = how many stamp launches the process ran before, plus one: the
 * order in which the daemon ran them, across sessions. (uint64_t *out) */
GRAPHD_HOST_PARAMS(stamp, 1, 0, 8);
GRAPHD_HOST_KERNEL(stamp) {
  static uint64_t launches;
  uint64_t *out = *(uint64_t *const *)params[0];
  if (l->block_idx[0] == 0) *out = __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
}
