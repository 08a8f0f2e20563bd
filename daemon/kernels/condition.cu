// The condition kernel of graphd's conditional steps: sets a conditional
// node's value from a 4-byte word in device memory (non-zero is true). The
// daemon launches it right before a conditional node and at the end of a
// loop's body. Compiled to a fatbin at build time and carried inside
// graphd; the driver resolves cudaGraphSetConditional when it loads it.
#include <cuda_runtime.h>

extern "C" __global__ void graphd_set_condition(cudaGraphConditionalHandle handle,
                                                const unsigned int *word) {
  cudaGraphSetConditional(handle, *word != 0u ? 1u : 0u);
}
