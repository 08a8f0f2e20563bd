// graphd's own kernels, compiled to one fatbin at build time and carried
// inside graphd: the condition kernel of conditional steps, and the fill
// and copy kernels that stand in for memset and copy steps direct mode
// binds to a client's buffers (a kernel node takes new pointers in an
// executable graph; a memset or memcpy node made on graphd's memory cannot
// be pointed at memory another process exported).
#include <cuda_runtime.h>

// Sets a conditional node's value from a 4-byte word in device memory
// (non-zero is true). The daemon launches it right before a conditional
// node and at the end of a loop's body; the driver resolves
// cudaGraphSetConditional when it loads the fatbin.
extern "C" __global__ void graphd_set_condition(cudaGraphConditionalHandle handle,
                                                const unsigned int *word) {
  cudaGraphSetConditional(handle, *word != 0u ? 1u : 0u);
}

// count elements of element_size bytes (1, 2 or 4) at dst set to value, as
// a memset node would. Byte i of the range takes byte i % 4 of the value
// repeated to 32 bits, whatever dst's alignment.
extern "C" __global__ void graphd_fill(unsigned char *dst, unsigned long long count,
                                       unsigned int value, unsigned int element_size) {
  unsigned long long bytes = count * element_size;
  unsigned int word = element_size == 1   ? value * 0x01010101u
                      : element_size == 2 ? value * 0x00010001u
                                          : value;
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long head = 0;
  if ((reinterpret_cast<unsigned long long>(dst) & 15u) == 0) {
    uint4 v = make_uint4(word, word, word, word);
    unsigned long long n = bytes / 16;
    for (unsigned long long k = i; k < n; k += stride) reinterpret_cast<uint4 *>(dst)[k] = v;
    head = n * 16;
  }
  for (unsigned long long k = head + i; k < bytes; k += stride)
    dst[k] = (unsigned char)(word >> (8u * (unsigned)(k & 3u)));
}

// bytes from src to dst, as a memcpy node would (the ranges do not overlap).
extern "C" __global__ void graphd_copy(unsigned char *dst, const unsigned char *src,
                                       unsigned long long bytes) {
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long both =
      reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src);
  unsigned long long head = 0;
  if ((both & 15u) == 0) {
    unsigned long long n = bytes / 16;
    for (unsigned long long k = i; k < n; k += stride)
      reinterpret_cast<uint4 *>(dst)[k] = reinterpret_cast<const uint4 *>(src)[k];
    head = n * 16;
  } else if ((both & 3u) == 0) {
    unsigned long long n = bytes / 4;
    for (unsigned long long k = i; k < n; k += stride)
      reinterpret_cast<unsigned int *>(dst)[k] = reinterpret_cast<const unsigned int *>(src)[k];
    head = n * 4;
  }
  for (unsigned long long k = head + i; k < bytes; k += stride) dst[k] = src[k];
}
