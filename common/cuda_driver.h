/* The CUDA driver, loaded at run time (docs/design.md, "The driver").
 *
 * Nothing in graphd or libgraphd links libcuda: gd_cuda_load() dlopens
 * libcuda.so.1 (or $GRAPHD_LIBCUDA, for tests) and resolves every entry
 * point with cuGetProcAddress at the CUDA 13 ABI of the headers we build
 * with. Each field has the prototype cuda.h gives its name, so calls read
 * like plain driver calls: cu->cuInit(0).
 *
 * Thread-safe: the table is built once and never changes afterwards. */
#ifndef GRAPHD_COMMON_CUDA_DRIVER_H
#define GRAPHD_COMMON_CUDA_DRIVER_H

#include <cuda.h>
#include <stddef.h>

#define GD_CUDA_MIN_DRIVER 13000

/* Every driver entry point graphd uses, by the name cuGetProcAddress knows.
 * Careful: where cuda.h maps a name to a function of another name (not a
 * _vN suffix), list the target. cuda.h maps cuGraphInstantiate to
 * cuGraphInstantiateWithFlags, but cuGetProcAddress("cuGraphInstantiate")
 * returns the old five-argument cuGraphInstantiate_v2 (seen on driver 580),
 * so the entry is cuGraphInstantiateWithFlags.
 * And careful where CUDA 13 gave a name a new ABI that cuda.h does not
 * declare under it: cuGetProcAddress("cuCtxSynchronize") at 13000 returns
 * the one that takes a CUcontext, while cuda.h declares the one without.
 * Such names are resolved at the version of cuda.h's prototype
 * (GD_CUDA_OLD_ABI in cuda_driver.c); tests/test_cuda_abi.py finds them. */
#define GD_CUDA_FUNCS(X)                                                                           \
  X(cuInit)                                                                                        \
  X(cuGetErrorName)                                                                                \
  X(cuGetErrorString)                                                                              \
  X(cuDeviceGetCount)                                                                              \
  X(cuDeviceGet)                                                                                   \
  X(cuDeviceGetName)                                                                               \
  X(cuDeviceGetUuid)                                                                               \
  X(cuDeviceTotalMem)                                                                              \
  X(cuDeviceGetAttribute)                                                                          \
  X(cuDevicePrimaryCtxRetain)                                                                      \
  X(cuDevicePrimaryCtxGetState)                                                                    \
  X(cuDevicePrimaryCtxRelease)                                                                     \
  X(cuDevicePrimaryCtxReset)                                                                       \
  X(cuDevicePrimaryCtxSetFlags)                                                                    \
  X(cuCtxSetCurrent)                                                                               \
  X(cuCtxGetCurrent)                                                                               \
  X(cuCtxSynchronize)                                                                              \
  X(cuMemGetInfo)                                                                                  \
  X(cuModuleLoadDataEx)                                                                            \
  X(cuModuleUnload)                                                                                \
  X(cuModuleGetFunction)                                                                           \
  X(cuFuncLoad)                                                                                    \
  X(cuFuncGetParamInfo)                                                                            \
  X(cuFuncGetAttribute)                                                                            \
  X(cuFuncSetAttribute)                                                                            \
  X(cuMemImportFromShareableHandle)                                                                \
  X(cuMemExportToShareableHandle)                                                                  \
  X(cuMemRetainAllocationHandle)                                                                   \
  X(cuMemGetAllocationPropertiesFromHandle)                                                        \
  X(cuMemGetAllocationGranularity)                                                                 \
  X(cuMemAddressReserve)                                                                           \
  X(cuMemAddressFree)                                                                              \
  X(cuMemCreate)                                                                                   \
  X(cuMemMap)                                                                                      \
  X(cuMemUnmap)                                                                                    \
  X(cuMemSetAccess)                                                                                \
  X(cuMemRelease)                                                                                  \
  X(cuMemGetAddressRange)                                                                          \
  X(cuMemAlloc)                                                                                    \
  X(cuMemFree)                                                                                     \
  X(cuMemAllocAsync)                                                                               \
  X(cuMemFreeAsync)                                                                                \
  X(cuMemcpyHtoD)                                                                                  \
  X(cuMemcpyDtoH)                                                                                  \
  X(cuIpcGetMemHandle)                                                                             \
  X(cuIpcOpenMemHandle)                                                                            \
  X(cuIpcCloseMemHandle)                                                                           \
  X(cuPointerGetAttribute)                                                                         \
  X(cuStreamCreate)                                                                                \
  X(cuStreamDestroy)                                                                               \
  X(cuStreamSynchronize)                                                                           \
  X(cuStreamQuery)                                                                                 \
  X(cuStreamGetDevice)                                                                             \
  X(cuMemHostRegister)                                                                             \
  X(cuMemHostUnregister)                                                                           \
  X(cuMemHostGetDevicePointer)                                                                     \
  X(cuStreamWaitValue64)                                                                           \
  X(cuStreamWriteValue64)                                                                          \
  X(cuStreamBatchMemOp)                                                                            \
  X(cuStreamBeginCapture)                                                                          \
  X(cuStreamEndCapture)                                                                            \
  X(cuGraphCreate)                                                                                 \
  X(cuGraphDestroy)                                                                                \
  X(cuGraphAddKernelNode)                                                                          \
  X(cuGraphAddMemsetNode)                                                                          \
  X(cuGraphAddMemcpyNode)                                                                          \
  X(cuGraphAddNode)                                                                                \
  X(cuGraphConditionalHandleCreate)                                                                \
  X(cuModuleLoadData)                                                                              \
  X(cuGraphInstantiateWithFlags)                                                                   \
  X(cuGraphUpload)                                                                                 \
  X(cuGraphExecDestroy)                                                                            \
  X(cuGraphExecMemcpyNodeSetParams)                                                                \
  X(cuGraphExecKernelNodeSetParams)                                                                \
  X(cuGraphNodeSetEnabled)                                                                         \
  X(cuGraphLaunch)                                                                                 \
  X(cuMemcpyDtoDAsync)                                                                             \
  X(cuMemcpyHtoDAsync)                                                                             \
  X(cuMemcpyDtoHAsync)                                                                             \
  X(cuMemsetD32Async)                                                                              \
  X(cuEventCreate)                                                                                 \
  X(cuEventDestroy)                                                                                \
  X(cuEventRecord)                                                                                 \
  X(cuEventSynchronize)                                                                            \
  X(cuEventQuery)                                                                                  \
  X(cuEventElapsedTime)                                                                            \
  X(cuStreamWaitEvent)                                                                             \
  X(cuLaunchKernel)

typedef struct gd_cuda {
  void *lib;
  int driver_version; /* e.g. 13000 */
#define GD_CUDA_FIELD_(name) __typeof__(&name) name;
  GD_CUDA_FUNCS(GD_CUDA_FIELD_)
#undef GD_CUDA_FIELD_
} gd_cuda;

/* Loads the driver once per process and returns the shared table.
 * Returns 0; -GRAPHD_UNAVAILABLE when there is no driver (no libcuda, or
 * cuInit finds no device); -GRAPHD_FAILED_PRECONDITION when the driver is
 * older than CUDA 13 ("driver too old: need CUDA 13 ...") or lacks an entry
 * point. err gets a one-line reason. A failure is remembered: later calls
 * return the same result and message. cuInit(0) has been called on
 * success. */
int gd_cuda_load(const gd_cuda **out, char *err, size_t errlen);

/* What the driver says of the memory at ptr, ORed: GD_CUDA_MEM_DEVICE for
 * device memory; how another process may map it: GD_CUDA_MEM_LEGACY_IPC
 * (cuIpcGetMemHandle), GD_CUDA_MEM_VMM_FD (exportable as a POSIX fd); and
 * GD_CUDA_MEM_POOL for memory from a stream-ordered pool. Device memory
 * with neither way is a compiled module's, or pool memory. An attribute
 * the driver does not answer adds nothing. */
enum {
  GD_CUDA_MEM_DEVICE = 1,
  GD_CUDA_MEM_LEGACY_IPC = 2,
  GD_CUDA_MEM_VMM_FD = 4,
  GD_CUDA_MEM_POOL = 8,
};
unsigned gd_cuda_mem_kind(const gd_cuda *cu, CUdeviceptr ptr);

/* The buffer id of the allocation at ptr (it changes when the address is
 * reused); 0 when the driver gives none. */
unsigned long long gd_cuda_buffer_id(const gd_cuda *cu, CUdeviceptr ptr);

/* "CUDA_ERROR_X: description" for a CUresult, into buf. */
const char *gd_cuda_strerror(const gd_cuda *cu, CUresult r, char *buf, size_t len);

#endif
