/* CUDA backend: one device per visible GPU, through the dlopen'd driver.
 *
 * DESIGN: enumeration runs once on the main thread before the loop starts
 * (context-free driver queries only). Afterwards each gd_backend_dev is
 * used by its own worker thread only, which retains the device's primary
 * context and keeps it current. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cuda_driver.h"
#include "common/uuid.h"
#include "graphd/encoding.h"
#include "backend.h"
#include "daemon/base/check.h"
#include "common/memfd.h"
#include "graphd/status.h"

/* A legacy IPC allocation open in a device's context. The driver opens a
 * handle once per context (a second cuIpcOpenMemHandle answers
 * CUDA_ERROR_ALREADY_MAPPED), but one allocation may back several regions
 * at once: the same buffer registered by two sessions of a process (the
 * XLA handler's and the Python package's), or registered again before the
 * release of its previous region has run (a release waits for the jobs
 * that use the region). So each allocation is opened once and shared,
 * counted by the regions that use it, and keyed by the bytes of its IPC
 * handle: the driver gives an allocation the same handle every time, and
 * it is by that handle that the driver itself refuses a second open, so a
 * handle found here names the mapping a second open would have given. */
typedef struct ipc_open {
  uint8_t handle[64];
  CUdeviceptr ptr; /* where it is mapped here */
  size_t bytes;    /* of the allocation from ptr on */
  int refs;        /* regions using it */
  struct ipc_open *next;
} ipc_open;

struct gd_backend_dev {
  CUdevice dev;
  int ordinal;
  CUcontext ctx;
  size_t vmm_granularity;
  CUmodule cond_mod;                 /* graphd's own kernels' module, loaded on first use */
  CUfunction cond_fn;                /* graphd_set_condition */
  CUfunction util_fn[GD_UTIL_COUNT]; /* graphd_fill, graphd_copy */
  ipc_open *ipc;                     /* the legacy IPC allocations open here */
};

/* graphd's own kernels (daemon/kernels/graphd_kernels.cu), built by nvcc into
 * a fatbin that graphd carries; empty when graphd was built without nvcc. */
extern const unsigned char gd_kernels_fatbin[];
extern const size_t gd_kernels_fatbin_len;

#define JIT_LOG 8192

static int import_vmm(gd_backend *be, gd_backend_dev *d, const gd_region_import *in,
                      gd_region_map *out, char *err, size_t errlen);
static void cuda_region_release(gd_backend *be, gd_backend_dev *d, gd_region_map *m);

/* The driver does much of its work for VMM sharing on first use in a
 * process (the first import, reservation and mapping cost several times
 * what later ones do). Pays it when the device opens: one allocation of
 * the smallest size, exported, imported and mapped the way a client's
 * region is, then let go. Best effort: a failure leaves the cost where it
 * was, on the first region a client registers. */
static void warm_vmm(gd_backend *be, gd_backend_dev *d) {
  const gd_cuda *cu = be->priv;
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = d->ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  CUmemGenericAllocationHandle h;
  if (cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
          CUDA_SUCCESS ||
      cu->cuMemCreate(&h, gran, &prop, 0) != CUDA_SUCCESS)
    return;
  int fd = -1;
  if (cu->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
      CUDA_SUCCESS) {
    gd_region_import in = {.kind = GRAPHD_REGION_VMM_FD, .fd = fd, .size = gran};
    gd_region_map m;
    char e[256];
    if (import_vmm(be, d, &in, &m, e, sizeof e) == 0) cuda_region_release(be, d, &m);
    close(fd);
  }
  CU_CHECK_IGNORE(cu->cuMemRelease(h));
}

static int cuda_open(gd_backend *be, int i, gd_backend_dev **out, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  gd_backend_dev *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of memory opening GPU %d", i);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  CU_CHECK_GOTO(cu->cuDeviceGet(&d->dev, be->devices[i].backend_index), GRAPHD_UNAVAILABLE, fail);
  CU_CHECK_GOTO(cu->cuDevicePrimaryCtxRetain(&d->ctx, d->dev), GRAPHD_UNAVAILABLE, fail);
  CU_CHECK_GOTO(cu->cuCtxSetCurrent(d->ctx), GRAPHD_UNAVAILABLE, fail_release);
  d->ordinal = be->devices[i].backend_index;
  warm_vmm(be, d);
  *out = d;
  return 0;

fail_release:
  CU_CHECK_IGNORE(cu->cuDevicePrimaryCtxRelease(d->dev));
fail:
  free(d);
  return rc;
}

static void cuda_close(gd_backend *be, gd_backend_dev *d) {
  const gd_cuda *cu = be->priv;
  if (d->cond_mod) CU_CHECK_IGNORE(cu->cuModuleUnload(d->cond_mod));
  while (d->ipc) {
    ipc_open *o = d->ipc;
    d->ipc = o->next;
    CU_CHECK_IGNORE(cu->cuIpcCloseMemHandle(o->ptr));
    free(o);
  }
  CU_CHECK_IGNORE(cu->cuCtxSetCurrent(NULL));
  CU_CHECK_IGNORE(cu->cuDevicePrimaryCtxRelease(d->dev));
  free(d);
}

/* Errors after which the context is unusable: every later call in it
 * fails the same way until it is destroyed. */
static int sticky(CUresult r) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTAINED: return 1;
    default: return 0;
  }
}

/* A query of the legacy stream, which graphd never uses (its streams are
 * non-blocking), enters the context and so reports a sticky error, without
 * waiting for anything. */
static int cuda_health(gd_backend *be, gd_backend_dev *d, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  CUresult r = cu->cuStreamQuery(NULL);
  if (!sticky(r)) return 0;
  char buf[160];
  gd_cuda_strerror(cu, r, buf, sizeof buf);
  snprintf(err, errlen, "GPU %d: %s", d->ordinal, buf);
  return -GRAPHD_UNAVAILABLE;
}

/* The reset destroys the context and everything in it; our retain stays
 * counted and is given back, then a fresh context is retained, which must
 * pass the health query before the device serves again. (CUDA 13 on the
 * H200 refuses the fresh context after an illegal address: graphd then
 * exits for a restart, see upkeep.h.) */
static int cuda_reset(gd_backend *be, gd_backend_dev *d, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  d->cond_mod = NULL; /* gone with the context */
  memset(d->util_fn, 0, sizeof d->util_fn);
  d->cond_fn = NULL;
  CU_CHECK_GOTO(cu->cuDevicePrimaryCtxReset(d->dev), GRAPHD_UNAVAILABLE, exit);
  CU_CHECK_IGNORE(cu->cuDevicePrimaryCtxRelease(d->dev));
  CU_CHECK_GOTO(cu->cuDevicePrimaryCtxRetain(&d->ctx, d->dev), GRAPHD_UNAVAILABLE, exit);
  CU_CHECK_GOTO(cu->cuCtxSetCurrent(d->ctx), GRAPHD_UNAVAILABLE, exit);
  CU_CHECK_GOTO(cu->cuStreamQuery(NULL), GRAPHD_UNAVAILABLE, exit);
exit:
  return rc;
}

static int cuda_mem_info(gd_backend *be, gd_backend_dev *d, uint64_t *free_b, uint64_t *total_b,
                         char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  size_t f = 0, t = 0;
  (void)d; /* the context is current on this worker */
  CU_CHECK_GOTO(cu->cuMemGetInfo(&f, &t), GRAPHD_INTERNAL, exit);
  *free_b = f;
  *total_b = t;
exit:
  return rc;
}

static const char *uuid_of(gd_backend *be, int ordinal) {
  for (int i = 0; i < be->ndevices; i++)
    if (be->devices[i].backend_index == ordinal) return be->devices[i].uuid_str;
  return "an unknown GPU";
}

static int cuda_module_load(gd_backend *be, gd_backend_dev *d, uint32_t kind, const void *bytes,
                            size_t len, void **mod, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  (void)d;
  if (kind != GD_MODULE_PTX && kind != GD_MODULE_CUBIN && kind != GD_MODULE_FATBIN) {
    snprintf(err, errlen, "GPUs run PTX, CUBIN or fatbin modules (this module is kind %u)", kind);
    return -GRAPHD_FAILED_PRECONDITION;
  }
  /* PTX must be NUL-terminated text. */
  const void *image = bytes;
  char *copy = NULL;
  if (kind == GD_MODULE_PTX && (len == 0 || ((const char *)bytes)[len - 1] != '\0')) {
    copy = malloc(len + 1);
    if (!copy) {
      snprintf(err, errlen, "out of memory loading a module");
      return -GRAPHD_RESOURCE_EXHAUSTED;
    }
    memcpy(copy, bytes, len);
    copy[len] = '\0';
    image = copy;
  }
  char *log = calloc(1, JIT_LOG);
  CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *vals[] = {log, (void *)(uintptr_t)(log ? JIT_LOG : 0)};
  CUmodule m = NULL;
  CUresult r = cu->cuModuleLoadDataEx(&m, image, log ? 2 : 0, opts, vals);
  free(copy);
  if (r != CUDA_SUCCESS) {
    char e[160];
    gd_cuda_strerror(cu, r, e, sizeof e);
    snprintf(err, errlen, "cuModuleLoadDataEx failed: %s%s%s", e,
             log && log[0] ? "; JIT log: " : "", log ? log : "");
    free(log);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? -GRAPHD_RESOURCE_EXHAUSTED : -GRAPHD_INVALID_ARGUMENT;
  }
  free(log);
  *mod = m;
  return 0;
}

static void cuda_module_unload(gd_backend *be, gd_backend_dev *d, void *mod) {
  const gd_cuda *cu = be->priv;
  (void)d;
  CU_CHECK_IGNORE(cu->cuModuleUnload((CUmodule)mod));
}

static int cuda_function_get(gd_backend *be, gd_backend_dev *d, void *mod, const char *name,
                             void **fn, gd_func_info *info, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUfunction f;
  CUresult r = cu->cuModuleGetFunction(&f, (CUmodule)mod, name);
  if (r == CUDA_ERROR_NOT_FOUND) {
    snprintf(err, errlen, "the module has no function '%s' (is it extern \"C\"?)", name);
    return -GRAPHD_NOT_FOUND;
  }
  CU_CHECK_GOTO(r, GRAPHD_INTERNAL, exit);
  /* Lazy loading is the default: load now so errors surface here. */
  CU_CHECK_GOTO(cu->cuFuncLoad(f), GRAPHD_INTERNAL, exit);
  memset(info, 0, sizeof *info);
  info->params_known = 1;
  for (uint32_t i = 0; i < GD_FUNC_MAX_PARAMS; i++) {
    size_t off = 0, size = 0;
    if (cu->cuFuncGetParamInfo(f, i, &off, &size) != CUDA_SUCCESS) break;
    info->param_offset[i] = (uint32_t)off;
    info->param_size[i] = (uint32_t)size;
    info->nparams = i + 1;
  }
  int v = 0;
  CU_CHECK_GOTO(cu->cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f),
                GRAPHD_INTERNAL, exit);
  info->max_threads_per_block = (uint32_t)v;
  CU_CHECK_GOTO(cu->cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f), GRAPHD_INTERNAL,
                exit);
  info->static_shared_bytes = (uint32_t)v;
  CU_CHECK_GOTO(
      cu->cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, d->dev),
      GRAPHD_INTERNAL, exit);
  info->max_shared_optin = (uint32_t)v;
  info->default_shared_limit = 48u << 10;
  *fn = f;
exit:
  return rc;
}

static int cuda_function_set_shared(gd_backend *be, gd_backend_dev *d, void *fn, uint32_t bytes,
                                    char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d;
  CU_CHECK_GOTO(cu->cuFuncSetAttribute((CUfunction)fn,
                                       CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)bytes),
                GRAPHD_RESOURCE_EXHAUSTED, exit);
exit:
  return rc;
}

static int import_vmm(gd_backend *be, gd_backend_dev *d, const gd_region_import *in,
                      gd_region_map *out, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  size_t size = 0;
  int reserved = 0, mapped = 0;
  CUresult r = cu->cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)in->fd,
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) {
    char e[160];
    snprintf(err, errlen, "the fd is not an exported CUDA VMM allocation: %s",
             gd_cuda_strerror(cu, r, e, sizeof e));
    return -GRAPHD_INVALID_ARGUMENT;
  }
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  CU_CHECK_GOTO(cu->cuMemGetAllocationPropertiesFromHandle(&prop, h), GRAPHD_INTERNAL, fail);
  if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != d->ordinal) {
    snprintf(err, errlen,
             "the memory lives on %s %d (%s), but this session is bound to GPU %d (%s); open a "
             "data session for the memory's device",
             prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? "GPU" : "location",
             prop.location.id, uuid_of(be, prop.location.id), d->ordinal, uuid_of(be, d->ordinal));
    rc = -GRAPHD_FAILED_PRECONDITION;
    goto fail;
  }
  size_t gran = 0;
  CU_CHECK_GOTO(cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                GRAPHD_INTERNAL, fail);
  size = (in->size + gran - 1) / gran * gran;
  CU_CHECK_GOTO(cu->cuMemAddressReserve(&va, size, 0, 0, 0), GRAPHD_RESOURCE_EXHAUSTED, fail);
  reserved = 1;
  r = cu->cuMemMap(va, size, 0, h, 0);
  if (r != CUDA_SUCCESS) {
    char e[160];
    snprintf(err, errlen,
             "cannot map %zu bytes of the allocation (is the declared size %llu "
             "larger than the allocation?): %s",
             size, (unsigned long long)in->size, gd_cuda_strerror(cu, r, e, sizeof e));
    rc = -GRAPHD_INVALID_ARGUMENT;
    goto fail;
  }
  mapped = 1;
  CUmemAccessDesc ad;
  memset(&ad, 0, sizeof ad);
  ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ad.location.id = d->ordinal;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_CHECK_GOTO(cu->cuMemSetAccess(va, size, &ad, 1), GRAPHD_INTERNAL, fail);
  /* The mapping keeps the physical memory alive; drop our handle. */
  CU_CHECK_IGNORE(cu->cuMemRelease(h));
  out->ptr = va;
  out->size = in->size;
  out->mapped = size;
  out->kind = in->kind;
  out->handle = NULL;
  return 0;
fail:
  if (mapped) CU_CHECK_IGNORE(cu->cuMemUnmap(va, size));
  if (reserved) CU_CHECK_IGNORE(cu->cuMemAddressFree(va, size));
  CU_CHECK_IGNORE(cu->cuMemRelease(h));
  return rc;
}

/* The open mapping of in's allocation, opened now or shared with the
 * regions that have it open already, with a reference taken. */
static int ipc_get(gd_backend *be, gd_backend_dev *d, const gd_region_import *in, ipc_open **out,
                   char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  for (ipc_open *o = d->ipc; o; o = o->next)
    if (memcmp(o->handle, in->ipc_handle, sizeof o->handle) == 0) {
      o->refs++;
      *out = o;
      return 0;
    }
  CUipcMemHandle h;
  memcpy(h.reserved, in->ipc_handle, sizeof h.reserved);
  CUdeviceptr p = 0;
  CUresult r = cu->cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r == CUDA_ERROR_ALREADY_MAPPED) {
    /* Open here, but not under this handle's bytes: graphd's own books are
     * wrong, not the client's memory. */
    char e[160];
    snprintf(err, errlen,
             "graphd has this allocation open already under another IPC handle and cannot "
             "share the mapping (a graphd bookkeeping fault; unregister the buffer's other "
             "regions, or report it): %s",
             gd_cuda_strerror(cu, r, e, sizeof e));
    return -GRAPHD_INTERNAL;
  }
  if (r != CUDA_SUCCESS) {
    char e[160];
    snprintf(err, errlen,
             "cannot open the legacy IPC handle (was the memory freed, or is the "
             "client in another PID namespace?): %s",
             gd_cuda_strerror(cu, r, e, sizeof e));
    return -GRAPHD_INVALID_ARGUMENT;
  }
  int ordinal = -1;
  CUdeviceptr base = 0;
  size_t size = 0;
  ipc_open *o = NULL;
  CU_CHECK_GOTO(cu->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p),
                GRAPHD_INTERNAL, fail);
  if (ordinal != d->ordinal) {
    snprintf(err, errlen,
             "the memory lives on GPU %d (%s), but this session is bound to GPU %d (%s); open a "
             "data session for the memory's device",
             ordinal, uuid_of(be, ordinal), d->ordinal, uuid_of(be, d->ordinal));
    rc = -GRAPHD_FAILED_PRECONDITION;
    goto fail;
  }
  CU_CHECK_GOTO(cu->cuMemGetAddressRange(&base, &size, p), GRAPHD_INTERNAL, fail);
  if (!(o = calloc(1, sizeof *o))) {
    snprintf(err, errlen, "out of memory importing a region");
    rc = -GRAPHD_RESOURCE_EXHAUSTED;
    goto fail;
  }
  memcpy(o->handle, in->ipc_handle, sizeof o->handle);
  o->ptr = p;
  o->bytes = size - (size_t)(p - base);
  o->refs = 1;
  o->next = d->ipc;
  d->ipc = o;
  *out = o;
  return 0;
fail:
  CU_CHECK_IGNORE(cu->cuIpcCloseMemHandle(p));
  return rc;
}

/* Drops a region's reference; the last one closes the mapping. */
static void ipc_put(gd_backend *be, gd_backend_dev *d, ipc_open *o) {
  const gd_cuda *cu = be->priv;
  if (--o->refs > 0) return;
  for (ipc_open **pp = &d->ipc; *pp; pp = &(*pp)->next)
    if (*pp == o) {
      *pp = o->next;
      break;
    }
  CU_CHECK_IGNORE(cu->cuIpcCloseMemHandle(o->ptr));
  free(o);
}

static int import_legacy(gd_backend *be, gd_backend_dev *d, const gd_region_import *in,
                         gd_region_map *out, char *err, size_t errlen) {
  ipc_open *o;
  int rc = ipc_get(be, d, in, &o, err, errlen);
  if (rc < 0) return rc;
  if (in->size > o->bytes) {
    snprintf(err, errlen, "the region declares %llu bytes but the allocation has %zu",
             (unsigned long long)in->size, o->bytes);
    ipc_put(be, d, o);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  out->ptr = o->ptr;
  out->size = in->size;
  out->mapped = in->size;
  out->kind = in->kind;
  out->handle = o;
  return 0;
}

static int cuda_region_import(gd_backend *be, gd_backend_dev *d, const gd_region_import *in,
                              gd_region_map *out, char *err, size_t errlen) {
  if (in->kind == GRAPHD_REGION_VMM_FD) return import_vmm(be, d, in, out, err, errlen);
  if (in->kind == GRAPHD_REGION_LEGACY_IPC) return import_legacy(be, d, in, out, err, errlen);
  snprintf(err, errlen, "GPUs take VMM or legacy IPC memory, not host memfds");
  return -GRAPHD_FAILED_PRECONDITION;
}

static void cuda_region_release(gd_backend *be, gd_backend_dev *d, gd_region_map *m) {
  const gd_cuda *cu = be->priv;
  if (m->kind == GRAPHD_REGION_VMM_FD) {
    CU_CHECK_IGNORE(cu->cuMemUnmap(m->ptr, m->mapped));
    CU_CHECK_IGNORE(cu->cuMemAddressFree(m->ptr, m->mapped));
  } else if (m->handle) {
    ipc_put(be, d, m->handle);
  }
}

/* --- captures and replay ------------------------------------------------ */

typedef struct cuda_staging {
  CUmemGenericAllocationHandle h;
} cuda_staging;

static int cuda_staging_alloc(gd_backend *be, gd_backend_dev *d, uint64_t bytes, gd_staging *out,
                              char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = d->ordinal;
  size_t gran = 0;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  int created = 0, reserved = 0, mapped = 0;
  CU_CHECK_GOTO(cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                GRAPHD_INTERNAL, fail);
  size_t size = (bytes + gran - 1) / gran * gran;
  CUresult r = cu->cuMemCreate(&h, size, &prop, 0);
  if (r != CUDA_SUCCESS) {
    char e[160];
    snprintf(err, errlen, "cannot allocate %zu bytes of staging: %s", size,
             gd_cuda_strerror(cu, r, e, sizeof e));
    return r == CUDA_ERROR_OUT_OF_MEMORY ? -GRAPHD_RESOURCE_EXHAUSTED : -GRAPHD_INTERNAL;
  }
  created = 1;
  CU_CHECK_GOTO(cu->cuMemAddressReserve(&va, size, 0, 0, 0), GRAPHD_RESOURCE_EXHAUSTED, fail);
  reserved = 1;
  CU_CHECK_GOTO(cu->cuMemMap(va, size, 0, h, 0), GRAPHD_INTERNAL, fail);
  mapped = 1;
  CUmemAccessDesc ad;
  memset(&ad, 0, sizeof ad);
  ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ad.location.id = d->ordinal;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_CHECK_GOTO(cu->cuMemSetAccess(va, size, &ad, 1), GRAPHD_INTERNAL, fail);
  out->ptr = va;
  out->bytes = size;
  out->handle = (void *)(uintptr_t)h;
  return 0;
fail:
  if (mapped) CU_CHECK_IGNORE(cu->cuMemUnmap(va, size));
  if (reserved) CU_CHECK_IGNORE(cu->cuMemAddressFree(va, size));
  if (created) CU_CHECK_IGNORE(cu->cuMemRelease(h));
  return rc;
}

static void cuda_staging_free(gd_backend *be, gd_backend_dev *d, gd_staging *s) {
  const gd_cuda *cu = be->priv;
  (void)d;
  CU_CHECK_IGNORE(cu->cuMemUnmap(s->ptr, s->bytes));
  CU_CHECK_IGNORE(cu->cuMemAddressFree(s->ptr, s->bytes));
  CU_CHECK_IGNORE(cu->cuMemRelease((CUmemGenericAllocationHandle)(uintptr_t)s->handle));
  s->bytes = 0;
}

static int cuda_stream_create(gd_backend *be, gd_backend_dev *d, gd_stream *out, char *err,
                              size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUstream st;
  (void)d;
  CU_CHECK_GOTO(cu->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), GRAPHD_RESOURCE_EXHAUSTED, exit);
  *out = st;
exit:
  return rc;
}

static void cuda_stream_destroy(gd_backend *be, gd_backend_dev *d, gd_stream s) {
  const gd_cuda *cu = be->priv;
  (void)d;
  CU_CHECK_IGNORE(cu->cuStreamDestroy((CUstream)s));
}

static int cuda_device_sync(gd_backend *be, gd_backend_dev *d, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d;
  CU_CHECK_GOTO(cu->cuCtxSynchronize(), GRAPHD_UNAVAILABLE, exit);
exit:
  return rc;
}

static int cuda_stream_sync(gd_backend *be, gd_backend_dev *d, gd_stream s, char *err,
                            size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d;
  CU_CHECK_GOTO(cu->cuStreamSynchronize((CUstream)s), GRAPHD_UNAVAILABLE, exit);
exit:
  return rc;
}

/* Host-pinned flags (docs/design.md, "Ordering"): the memfd page is mapped here and
 * registered for device access, so the client's host can still write our
 * waits free if we die, and we can write theirs if they die. */
static int cuda_flags_map(gd_backend *be, gd_backend_dev *d, int fd, uint64_t bytes,
                          gd_flags_map *out, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d;
  long page = sysconf(_SC_PAGESIZE);
  uint64_t len = (bytes + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;
  if (gd_memfd_check(fd, gd_memfd_shared_seals(), len, "flag page", err, errlen) < 0)
    return -GRAPHD_INVALID_ARGUMENT;
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    snprintf(err, errlen, "cannot map the flag page: %s", strerror(errno));
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  CUdeviceptr dp = 0;
  CU_CHECK_GOTO(
      cu->cuMemHostRegister(p, len, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE),
      GRAPHD_INTERNAL, fail);
  CU_CHECK_GOTO(cu->cuMemHostGetDevicePointer(&dp, p, 0), GRAPHD_INTERNAL, fail_unreg);
  out->host = p;
  out->dev = dp;
  out->bytes = len;
  return 0;
fail_unreg:
  CU_CHECK_IGNORE(cu->cuMemHostUnregister(p));
fail:
  munmap(p, len);
  return rc;
}

static void cuda_flags_unmap(gd_backend *be, gd_backend_dev *d, gd_flags_map *m) {
  const gd_cuda *cu = be->priv;
  (void)d;
  CU_CHECK_IGNORE(cu->cuMemHostUnregister((void *)m->host));
  munmap((void *)m->host, m->bytes);
}

static int cuda_wait_value(gd_backend *be, gd_backend_dev *d, gd_stream s, volatile uint64_t *w,
                           uint64_t dev_addr, uint64_t value, int (*give_up)(void *), void *arg,
                           char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d, (void)w, (void)give_up, (void)arg;
  CU_CHECK_GOTO(cu->cuStreamWaitValue64((CUstream)s, dev_addr, value, CU_STREAM_WAIT_VALUE_GEQ),
                GRAPHD_INTERNAL, exit);
exit:
  return rc;
}

static int cuda_write_value(gd_backend *be, gd_backend_dev *d, gd_stream s, volatile uint64_t *w,
                            uint64_t dev_addr, uint64_t value, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d, (void)w;
  CU_CHECK_GOTO(cu->cuStreamWriteValue64((CUstream)s, dev_addr, value, 0), GRAPHD_INTERNAL, exit);
exit:
  return rc;
}

static int cuda_graph_create(gd_backend *be, gd_backend_dev *d, gd_graph *out, char *err,
                             size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUgraph g;
  (void)d;
  CU_CHECK_GOTO(cu->cuGraphCreate(&g, 0), GRAPHD_INTERNAL, exit);
  *out = g;
exit:
  return rc;
}

static void cuda_graph_destroy(gd_backend *be, gd_backend_dev *d, gd_graph g) {
  const gd_cuda *cu = be->priv;
  (void)d;
  CU_CHECK_IGNORE(cu->cuGraphDestroy((CUgraph)g));
}

static void kernel_node_params(const gd_kernel_desc *k, CUDA_KERNEL_NODE_PARAMS *p) {
  memset(p, 0, sizeof *p);
  p->func = (CUfunction)k->fn;
  p->gridDimX = k->grid[0];
  p->gridDimY = k->grid[1];
  p->gridDimZ = k->grid[2];
  p->blockDimX = k->block[0];
  p->blockDimY = k->block[1];
  p->blockDimZ = k->block[2];
  p->sharedMemBytes = k->shared_bytes;
  p->kernelParams = k->params;
}

static int cuda_graph_exec_kernel_params(gd_backend *be, gd_backend_dev *d, gd_graph_exec e,
                                         gd_node n, const gd_kernel_desc *k, char *err,
                                         size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d;
  CUDA_KERNEL_NODE_PARAMS p;
  kernel_node_params(k, &p);
  CU_CHECK_GOTO(cu->cuGraphExecKernelNodeSetParams((CUgraphExec)e, (CUgraphNode)n, &p),
                GRAPHD_INTERNAL, exit);
exit:
  return rc;
}

static int cuda_graph_add_kernel(gd_backend *be, gd_backend_dev *d, gd_graph g, const gd_node *deps,
                                 size_t ndeps, const gd_kernel_desc *k, gd_node *out, char *err,
                                 size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d;
  CUDA_KERNEL_NODE_PARAMS p;
  kernel_node_params(k, &p);
  CUgraphNode n;
  CU_CHECK_GOTO(cu->cuGraphAddKernelNode(&n, (CUgraph)g, (const CUgraphNode *)deps, ndeps, &p),
                GRAPHD_INVALID_ARGUMENT, exit);
  *out = n;
exit:
  return rc;
}

static int cuda_graph_add_memset(gd_backend *be, gd_backend_dev *d, gd_graph g, const gd_node *deps,
                                 size_t ndeps, uint64_t dst, uint32_t element_size, uint32_t value,
                                 uint64_t count, gd_node *out, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUDA_MEMSET_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.dst = dst;
  p.elementSize = element_size;
  p.value = value;
  p.width = count;
  p.height = 1;
  CUgraphNode n;
  CU_CHECK_GOTO(
      cu->cuGraphAddMemsetNode(&n, (CUgraph)g, (const CUgraphNode *)deps, ndeps, &p, d->ctx),
      GRAPHD_INVALID_ARGUMENT, exit);
  *out = n;
exit:
  return rc;
}

static void copy_params(CUDA_MEMCPY3D *c, uint64_t dst, uint64_t src, uint64_t bytes) {
  memset(c, 0, sizeof *c);
  c->srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c->srcDevice = src;
  c->dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c->dstDevice = dst;
  c->WidthInBytes = bytes;
  c->Height = 1;
  c->Depth = 1;
}

static int cuda_graph_add_memcpy(gd_backend *be, gd_backend_dev *d, gd_graph g, const gd_node *deps,
                                 size_t ndeps, uint64_t dst, uint64_t src, uint64_t bytes,
                                 gd_node *out, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUDA_MEMCPY3D c;
  copy_params(&c, dst, src, bytes);
  CUgraphNode n;
  CU_CHECK_GOTO(
      cu->cuGraphAddMemcpyNode(&n, (CUgraph)g, (const CUgraphNode *)deps, ndeps, &c, d->ctx),
      GRAPHD_INVALID_ARGUMENT, exit);
  *out = n;
exit:
  return rc;
}

/* graphd's own kernel `name` in *fn (kept in *fn once found), its module
 * loaded on first use. */
static int own_function(gd_backend *be, gd_backend_dev *d, const char *name, CUfunction *fn,
                        char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  if (*fn) return 0;
  if (gd_kernels_fatbin_len == 0) {
    snprintf(err, errlen, "this graphd was built without nvcc, so it has no %s kernel for GPUs",
             name);
    return -GRAPHD_UNIMPLEMENTED;
  }
  if (!d->cond_mod)
    CU_CHECK_GOTO(cu->cuModuleLoadData(&d->cond_mod, gd_kernels_fatbin), GRAPHD_INTERNAL, exit);
  CU_CHECK_GOTO(cu->cuModuleGetFunction(fn, d->cond_mod, name), GRAPHD_INTERNAL, exit);
exit:
  return rc;
}

static int cuda_util_function(gd_backend *be, gd_backend_dev *d, int which, void **fn, char *err,
                              size_t errlen) {
  static const char *const names[GD_UTIL_COUNT] = {"graphd_fill", "graphd_copy"};
  if (which < 0 || which >= GD_UTIL_COUNT) return -GRAPHD_INTERNAL;
  int rc = own_function(be, d, names[which], &d->util_fn[which], err, errlen);
  if (rc == 0) *fn = d->util_fn[which];
  return rc;
}

/* The condition kernel's node parameters: set the condition *h from the
 * word at *word (params holds the two pointers). */
static void set_condition_params(gd_backend_dev *d, CUgraphConditionalHandle *h, CUdeviceptr *word,
                                 void *params[2], CUDA_KERNEL_NODE_PARAMS *k) {
  params[0] = h;
  params[1] = word;
  memset(k, 0, sizeof *k);
  k->func = d->cond_fn;
  k->gridDimX = k->gridDimY = k->gridDimZ = 1;
  k->blockDimX = k->blockDimY = k->blockDimZ = 1;
  k->kernelParams = params;
}

/* Adds "set the condition from the word" to g after deps. */
static int add_set_condition(gd_backend *be, gd_backend_dev *d, CUgraph g, const gd_node *deps,
                             size_t ndeps, uint64_t handle, uint64_t cond, CUgraphNode *out,
                             char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = own_function(be, d, "graphd_set_condition", &d->cond_fn, err, errlen);
  if (rc < 0) return rc;
  CUgraphConditionalHandle h = (CUgraphConditionalHandle)handle;
  CUdeviceptr word = (CUdeviceptr)cond;
  void *params[2];
  CUDA_KERNEL_NODE_PARAMS k;
  set_condition_params(d, &h, &word, params, &k);
  CU_CHECK_GOTO(cu->cuGraphAddKernelNode(out, g, (const CUgraphNode *)deps, ndeps, &k),
                GRAPHD_INVALID_ARGUMENT, exit);
exit:
  return rc;
}

/* A conditional node whose value a condition kernel sets right before it
 * from the word (and, for a loop, again at the end of each pass). */
static int cuda_graph_add_conditional(gd_backend *be, gd_backend_dev *d, gd_graph g,
                                      const gd_node *deps, size_t ndeps, int kind, uint64_t cond,
                                      gd_node *out, gd_node *reader, gd_graph bodies[2],
                                      uint64_t *handle, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUgraphConditionalHandle h;
  CU_CHECK_GOTO(cu->cuGraphConditionalHandleCreate(&h, (CUgraph)g, d->ctx, 0, 0),
                GRAPHD_INVALID_ARGUMENT, exit);
  CUgraphNode set;
  if ((rc = add_set_condition(be, d, (CUgraph)g, deps, ndeps, (uint64_t)h, cond, &set, err,
                              errlen)) < 0)
    goto exit;
  CUgraphNodeParams p;
  memset(&p, 0, sizeof p);
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = h;
  p.conditional.type = kind == GD_COND_WHILE ? CU_GRAPH_COND_TYPE_WHILE : CU_GRAPH_COND_TYPE_IF;
  p.conditional.size = kind == GD_COND_WHILE ? 1 : 2;
  p.conditional.ctx = d->ctx;
  CUgraphNode n;
  CU_CHECK_GOTO(cu->cuGraphAddNode(&n, (CUgraph)g, &set, NULL, 1, &p), GRAPHD_INVALID_ARGUMENT,
                exit);
  bodies[0] = p.conditional.phGraph_out[0];
  bodies[1] = kind == GD_COND_WHILE ? NULL : p.conditional.phGraph_out[1];
  *handle = (uint64_t)h;
  *out = n;
  *reader = set;
exit:
  return rc;
}

static int cuda_graph_close_loop(gd_backend *be, gd_backend_dev *d, gd_graph body,
                                 const gd_node *deps, size_t ndeps, uint64_t handle, uint64_t cond,
                                 gd_node *reader, char *err, size_t errlen) {
  CUgraphNode n = NULL;
  int rc = add_set_condition(be, d, (CUgraph)body, deps, ndeps, handle, cond, &n, err, errlen);
  *reader = n;
  return rc;
}

/* A condition kernel node (add_set_condition), top level or in a body,
 * reads the word at `cond` from the next launch on. */
static int cuda_graph_exec_condition_word(gd_backend *be, gd_backend_dev *d, gd_graph_exec e,
                                          gd_node reader, uint64_t handle, uint64_t cond, char *err,
                                          size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUgraphConditionalHandle h = (CUgraphConditionalHandle)handle;
  CUdeviceptr word = (CUdeviceptr)cond;
  void *params[2];
  CUDA_KERNEL_NODE_PARAMS k;
  set_condition_params(d, &h, &word, params, &k);
  CU_CHECK_GOTO(cu->cuGraphExecKernelNodeSetParams((CUgraphExec)e, (CUgraphNode)reader, &k),
                GRAPHD_INTERNAL, exit);
exit:
  return rc;
}

static int cuda_graph_instantiate(gd_backend *be, gd_backend_dev *d, gd_graph g, gd_stream s,
                                  gd_graph_exec *out, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUgraphExec e = NULL;
  (void)d;
  CUresult r = cu->cuGraphInstantiateWithFlags(&e, (CUgraph)g, 0);
  if (r == CUDA_ERROR_NOT_SUPPORTED) {
    /* A second instance of a graph with a conditional node: the caller
     * re-points the one it has (capture.c does not ask), so this is an
     * answer to pass on, not an error to log. */
    char e2[160];
    snprintf(err, errlen, "the graph cannot have another executable instance: %s",
             gd_cuda_strerror(cu, r, e2, sizeof e2));
    return -GRAPHD_FAILED_PRECONDITION;
  }
  CU_CHECK_GOTO(r, GRAPHD_INVALID_ARGUMENT, exit);
  CU_CHECK_GOTO(cu->cuGraphUpload(e, (CUstream)s), GRAPHD_INTERNAL, fail);
  *out = e;
  return 0;
fail:
  CU_CHECK_IGNORE(cu->cuGraphExecDestroy(e));
exit:
  return rc;
}

static void cuda_graph_exec_destroy(gd_backend *be, gd_backend_dev *d, gd_graph_exec e) {
  const gd_cuda *cu = be->priv;
  (void)d;
  CU_CHECK_IGNORE(cu->cuGraphExecDestroy((CUgraphExec)e));
}

static int cuda_graph_exec_repoint_memcpy(gd_backend *be, gd_backend_dev *d, gd_graph_exec e,
                                          gd_node n, uint64_t dst, uint64_t src, uint64_t bytes,
                                          bool *outside, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUDA_MEMCPY3D c;
  copy_params(&c, dst, src, bytes);
  CUresult r = cu->cuGraphExecMemcpyNodeSetParams((CUgraphExec)e, (CUgraphNode)n, &c, d->ctx);
  if (r == CUDA_ERROR_INVALID_VALUE) {
    /* The driver refuses memory "from another context" than the node was
     * made with: VMM mappings and legacy IPC mappings do not mix. The node
     * keeps its last good addresses, switched off. */
    if (!*outside)
      CU_CHECK_GOTO(cu->cuGraphNodeSetEnabled((CUgraphExec)e, (CUgraphNode)n, 0), GRAPHD_INTERNAL,
                    exit);
    *outside = true;
    return 0;
  }
  CU_CHECK_GOTO(r, GRAPHD_INVALID_ARGUMENT, exit);
  if (*outside) {
    CU_CHECK_GOTO(cu->cuGraphNodeSetEnabled((CUgraphExec)e, (CUgraphNode)n, 1), GRAPHD_INTERNAL,
                  exit);
    *outside = false;
  }
exit:
  return rc;
}

static int cuda_graph_launch(gd_backend *be, gd_backend_dev *d, gd_graph_exec e, gd_stream s,
                             char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d;
  CU_CHECK_GOTO(cu->cuGraphLaunch((CUgraphExec)e, (CUstream)s), GRAPHD_INTERNAL, exit);
exit:
  return rc;
}

static int cuda_memcpy_async(gd_backend *be, gd_backend_dev *d, uint64_t dst, uint64_t src,
                             uint64_t bytes, gd_stream s, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d;
  CU_CHECK_GOTO(cu->cuMemcpyDtoDAsync(dst, src, bytes, (CUstream)s), GRAPHD_INTERNAL, exit);
exit:
  return rc;
}

static int cuda_zero_async(gd_backend *be, gd_backend_dev *d, uint64_t dst, uint64_t bytes,
                           gd_stream s, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d;
  CU_CHECK_GOTO(cu->cuMemsetD32Async(dst, 0, bytes / 4, (CUstream)s), GRAPHD_INTERNAL, exit);
exit:
  return rc;
}

/* An event of the given cuEventCreate flags. */
static int event_create(gd_backend *be, unsigned flags, gd_event *out, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUevent e;
  CU_CHECK_GOTO(cu->cuEventCreate(&e, flags), GRAPHD_INTERNAL, exit);
  *out = e;
exit:
  return rc;
}

static int cuda_event_create(gd_backend *be, gd_backend_dev *d, gd_event *out, char *err,
                             size_t errlen) {
  (void)d;
  return event_create(be, CU_EVENT_DISABLE_TIMING, out, err, errlen);
}

static int cuda_event_create_timed(gd_backend *be, gd_backend_dev *d, gd_event *out, char *err,
                                   size_t errlen) {
  (void)d;
  return event_create(be, CU_EVENT_DEFAULT, out, err, errlen);
}

static int cuda_event_elapsed(gd_backend *be, gd_backend_dev *d, gd_event start, gd_event end,
                              uint64_t *ns, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  float ms = 0;
  (void)d;
  CUresult r = cu->cuEventElapsedTime(&ms, (CUevent)start, (CUevent)end);
  if (r == CUDA_ERROR_NOT_READY) return 0;
  CU_CHECK_GOTO(r, GRAPHD_INTERNAL, exit);
  *ns = ms > 0 ? (uint64_t)((double)ms * 1e6) : 0;
  return 1;
exit:
  return rc;
}

static void cuda_event_destroy(gd_backend *be, gd_backend_dev *d, gd_event e) {
  const gd_cuda *cu = be->priv;
  (void)d;
  CU_CHECK_IGNORE(cu->cuEventDestroy((CUevent)e));
}

static int cuda_event_record(gd_backend *be, gd_backend_dev *d, gd_event e, gd_stream s, char *err,
                             size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d;
  CU_CHECK_GOTO(cu->cuEventRecord((CUevent)e, (CUstream)s), GRAPHD_INTERNAL, exit);
exit:
  return rc;
}

static int cuda_stream_wait_event(gd_backend *be, gd_backend_dev *d, gd_stream s, gd_event e,
                                  char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d;
  CU_CHECK_GOTO(cu->cuStreamWaitEvent((CUstream)s, (CUevent)e, 0), GRAPHD_INTERNAL, exit);
exit:
  return rc;
}

static int cuda_event_done(gd_backend *be, gd_backend_dev *d, gd_event e) {
  const gd_cuda *cu = be->priv;
  (void)d;
  return cu->cuEventQuery((CUevent)e) == CUDA_SUCCESS;
}

static int cuda_event_sync(gd_backend *be, gd_backend_dev *d, gd_event e, char *err,
                           size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  (void)d;
  CU_CHECK_GOTO(cu->cuEventSynchronize((CUevent)e), GRAPHD_UNAVAILABLE, exit);
exit:
  return rc;
}

static void cuda_destroy(gd_backend *be) {
  free(be->devices);
  free(be);
}

static const gd_backend_ops cuda_ops = {
    .device_open = cuda_open,
    .device_close = cuda_close,
    .device_sync = cuda_device_sync,
    .mem_info = cuda_mem_info,
    .module_load = cuda_module_load,
    .module_unload = cuda_module_unload,
    .function_get = cuda_function_get,
    .function_set_shared = cuda_function_set_shared,
    .region_import = cuda_region_import,
    .region_release = cuda_region_release,
    .device_health = cuda_health,
    .device_reset = cuda_reset,
    .staging_alloc = cuda_staging_alloc,
    .staging_free = cuda_staging_free,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .flags_map = cuda_flags_map,
    .flags_unmap = cuda_flags_unmap,
    .wait_value = cuda_wait_value,
    .write_value = cuda_write_value,
    .graph_create = cuda_graph_create,
    .graph_destroy = cuda_graph_destroy,
    .graph_add_kernel = cuda_graph_add_kernel,
    .graph_add_memset = cuda_graph_add_memset,
    .graph_add_memcpy = cuda_graph_add_memcpy,
    .graph_add_conditional = cuda_graph_add_conditional,
    .graph_close_loop = cuda_graph_close_loop,
    .graph_exec_condition_word = cuda_graph_exec_condition_word,
    .graph_instantiate = cuda_graph_instantiate,
    .graph_exec_destroy = cuda_graph_exec_destroy,
    .graph_exec_repoint_memcpy = cuda_graph_exec_repoint_memcpy,
    .graph_exec_kernel_params = cuda_graph_exec_kernel_params,
    .util_function = cuda_util_function,
    .graph_launch = cuda_graph_launch,
    .memcpy_async = cuda_memcpy_async,
    .zero_async = cuda_zero_async,
    .event_create = cuda_event_create,
    .event_create_timed = cuda_event_create_timed,
    .event_elapsed = cuda_event_elapsed,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_done = cuda_event_done,
    .event_sync = cuda_event_sync,
    .destroy = cuda_destroy,
};

int backend_cuda_new(gd_backend **out, char *err, size_t errlen) {
  const gd_cuda *cu;
  int rc = gd_cuda_load(&cu, err, errlen);
  gd_backend *be = NULL;
  gd_device_facts *f = NULL;
  int n = 0;
  if (rc < 0) return rc;
  CU_CHECK_GOTO(cu->cuDeviceGetCount(&n), GRAPHD_UNAVAILABLE, fail);
  if (n <= 0) {
    snprintf(err, errlen, "the CUDA driver reports no GPU");
    rc = -GRAPHD_UNAVAILABLE;
    goto fail;
  }
  be = calloc(1, sizeof *be);
  f = calloc((size_t)n, sizeof *f);
  if (!be || !f) {
    snprintf(err, errlen, "out of memory enumerating %d GPUs", n);
    rc = -GRAPHD_RESOURCE_EXHAUSTED;
    goto fail;
  }
  for (int i = 0; i < n; i++) {
    CUdevice dev;
    CUuuid uuid;
    size_t total = 0;
    int mps = 0;
    CU_CHECK_GOTO(cu->cuDeviceGet(&dev, i), GRAPHD_UNAVAILABLE, fail);
    CU_CHECK_GOTO(cu->cuDeviceGetName(f[i].name, (int)sizeof f[i].name, dev), GRAPHD_UNAVAILABLE,
                  fail);
    CU_CHECK_GOTO(cu->cuDeviceGetUuid(&uuid, dev), GRAPHD_UNAVAILABLE, fail);
    CU_CHECK_GOTO(cu->cuDeviceTotalMem(&total, dev), GRAPHD_UNAVAILABLE, fail);
    CU_CHECK_GOTO(cu->cuDeviceGetAttribute(&mps, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, dev),
                  GRAPHD_UNAVAILABLE, fail);
    f[i].backend_index = i;
    memcpy(f[i].uuid, uuid.bytes, 16);
    gd_uuid_format(f[i].uuid, "GPU-", f[i].uuid_str);
    f[i].total_memory = total;
    f[i].mps_enabled = mps != 0;
  }
  be->name = "cuda";
  be->thread_prefix = "gpu";
  be->runs_under_mps = true;
  be->ops = &cuda_ops;
  be->ndevices = n;
  be->devices = f;
  be->priv = (void *)cu;
  *out = be;
  return 0;

fail:
  free(f);
  free(be);
  return rc;
}
