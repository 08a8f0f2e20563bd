// CUDA test kernels, compiled by the build to PTX and to sm_90 CUBIN.
#include <stdint.h>

extern "C" __global__ void scale(const float *x, float *y, float a, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}

extern "C" __global__ void accumulate(const float *x, float *y, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

struct pair {
  const float *in;
  float *out;
};

extern "C" __global__ void pair_kernel(pair p, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p.out[i] = p.in[i] * 2.0f + 1.0f;
}

// 4 KiB of static shared memory plus whatever dynamic shared memory the
// launch asks for: for the device-stage shared memory checks.
extern "C" __global__ void shared_user(float *y, unsigned n) {
  __shared__ float tile[1024];
  extern __shared__ float dyn[];
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x % 1024] = (float)i;
  dyn[0] = 1.0f;
  __syncthreads();
  if (i < n) y[i] = tile[threadIdx.x % 1024] + dyn[0] - 1.0f;
}

/* fault(n): when n is non-zero, writes through a pointer no allocation
 * holds, a sticky CUDA_ERROR_ILLEGAL_ADDRESS for the context. */
extern "C" __global__ void fault(unsigned n) {
  if (n && threadIdx.x == 0) *(volatile unsigned *)(0x10ull + 0x1000ull * n) = n;
}

// *counter -= 1, once per launch (the body of a conditional loop's test).
extern "C" __global__ void count_down(unsigned *counter) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *counter -= 1u;
}
