/* The host backend's kernel ABI: what a host module (an ELF shared object
 * registered with kind GRAPHD_MODULE_HOST_ELF) exports.
 *
 * A kernel is `void NAME(const graphd_host_launch *l, void *const *params)`.
 * The daemon's worker calls it once per block of the grid, in order, with
 * l->block_idx set; the kernel loops over the block's threads itself.
 * A kernel that sets *l->fault to 1 faults the device as an illegal
 * address would a GPU: no more blocks or nodes run, and the daemon resets
 * the device (its captures are dropped and its sessions closed). Setting
 * it to 2 makes a fault the reset cannot clear, as CUDA 13 drivers treat an
 * illegal address: graphd then exits for its service manager to restart
 * it.
 * params[i] points at parameter i's bytes, as CUDA's kernelParams do, with
 * pointer parameters already patched to host addresses.
 *
 * A module may describe a kernel's parameters for the device stage of
 * validation by exporting `graphd_params_NAME`, an array of uint32_t:
 * { count, offset0, size0, offset1, size1, ... }. GRAPHD_HOST_PARAMS does
 * this. Without it, parameter sizes are not checked on host devices. */
#ifndef GRAPHD_HOST_KERNEL_H
#define GRAPHD_HOST_KERNEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct graphd_host_launch {
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t block_idx[3];
  void *shared; /* dynamic shared memory for this block */
  uint32_t shared_bytes;
  int *fault; /* set *fault = 1 to report a device fault (2: unrecoverable) */
} graphd_host_launch;

typedef void (*graphd_host_kernel)(const graphd_host_launch *l, void *const *params);

#define GRAPHD_HOST_KERNEL(name)                                                                   \
  __attribute__((visibility("default"))) void name(const graphd_host_launch *l, void *const *params)

#define GRAPHD_HOST_PARAMS(name, ...)                                                              \
  __attribute__((visibility("default"))) const uint32_t graphd_params_##name[] = {__VA_ARGS__}

#ifdef __cplusplus
}
#endif
#endif
