/* The host module of fuzz_request: kernels that are safe whatever
 * parameters a fuzzed program gives them (they never follow a pointer
 * parameter), so that what the fuzzer finds is graphd's, not a kernel's. */
#include <stdint.h>
#include <string.h>

#include "graphd/host_kernel.h"

/* Does nothing: (). */
GRAPHD_HOST_PARAMS(fuzz_nop, 0);
GRAPHD_HOST_KERNEL(fuzz_nop) {
  (void)l;
  (void)params;
}

/* Writes every byte of the block's dynamic shared memory, which must be as
 * large as the launch declared: (uint32_t a, uint64_t b). */
GRAPHD_HOST_PARAMS(fuzz_shared, 2, 0, 4, 8, 8);
GRAPHD_HOST_KERNEL(fuzz_shared) {
  uint32_t a = *(const uint32_t *)params[0];
  if (l->shared && l->shared_bytes) memset(l->shared, (int)(a & 0xff), l->shared_bytes);
}

/* Faults the device when n == 1, as an illegal address would a GPU (a
 * fault the reset clears; a fault past the reset makes graphd exit, which
 * is not what a fuzzer should find): (uint32_t n). */
GRAPHD_HOST_PARAMS(fuzz_fault, 1, 0, 4);
GRAPHD_HOST_KERNEL(fuzz_fault) {
  if (*(const uint32_t *)params[0] == 1) *l->fault = 1;
}

/* No parameter description: sizes are not checked on host devices. */
GRAPHD_HOST_KERNEL(fuzz_undescribed) {
  (void)l;
  (void)params;
}
