/* A stand-in libcuda for the driver-loading tests: it reports the version
 * FAKE_DRIVER_VERSION and a driver with no usable device. Never a CUDA
 * simulator: every entry point but the few below fails. */
#include <cuda.h>
#include <string.h>

__attribute__((visibility("default"))) CUresult cuDriverGetVersion(int *v) {
  *v = FAKE_DRIVER_VERSION;
  return CUDA_SUCCESS;
}

static CUresult fake_init(unsigned flags) {
  (void)flags;
  return CUDA_ERROR_NO_DEVICE;
}

static CUresult fake_error_name(CUresult r, const char **s) {
  *s = r == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_NOT_SUPPORTED";
  return CUDA_SUCCESS;
}

static CUresult fake_unsupported(void) { return CUDA_ERROR_NOT_SUPPORTED; }

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(
    const char *symbol, void **pfn, int version, cuuint64_t flags,
    CUdriverProcAddressQueryResult *status) {
  (void)version, (void)flags;
  if (strcmp(symbol, "cuInit") == 0)
    *pfn = (void *)fake_init;
  else if (strcmp(symbol, "cuGetErrorName") == 0 || strcmp(symbol, "cuGetErrorString") == 0)
    *pfn = (void *)fake_error_name;
  else
    *pfn = (void *)fake_unsupported;
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}
