/* CUDA backend: one device per visible GPU, through the dlopen'd driver.
 *
 * DESIGN: enumeration runs once on the main thread before the loop starts
 * (context-free driver queries only). Afterwards each gd_backend_dev is
 * used by its own worker thread only, which retains the device's primary
 * context and keeps it current. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/cuda_driver.h"
#include "../common/uuid.h"
#include "../proto/program.h"
#include "backend.h"
#include "check.h"
#include "graphd/status.h"

struct gd_backend_dev {
  CUdevice dev;
  int ordinal;
  CUcontext ctx;
  size_t vmm_granularity;
};

#define JIT_LOG 8192

static int cuda_open(gd_backend *be, int i, gd_backend_dev **out, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  gd_backend_dev *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of memory opening GPU %d", i);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  CU_CHECK_GOTO(cu->cuDeviceGet(&d->dev, be->devices[i].backend_index), GRAPHD_UNAVAILABLE,
                fail);
  CU_CHECK_GOTO(cu->cuDevicePrimaryCtxRetain(&d->ctx, d->dev), GRAPHD_UNAVAILABLE, fail);
  CU_CHECK_GOTO(cu->cuCtxSetCurrent(d->ctx), GRAPHD_UNAVAILABLE, fail_release);
  d->ordinal = be->devices[i].backend_index;
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
  CU_CHECK_IGNORE(cu->cuCtxSetCurrent(NULL));
  CU_CHECK_IGNORE(cu->cuDevicePrimaryCtxRelease(d->dev));
  free(d);
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
    snprintf(err, errlen, "cuModuleLoadDataEx failed: %s%s%s", e, log && log[0] ? "; JIT log: " : "",
             log ? log : "");
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
  CU_CHECK_GOTO(cu->cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f),
                GRAPHD_INTERNAL, exit);
  info->static_shared_bytes = (uint32_t)v;
  CU_CHECK_GOTO(cu->cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                         d->dev),
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
  CU_CHECK_GOTO(cu->cuMemGetAllocationGranularity(&gran, &prop,
                                                  CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                GRAPHD_INTERNAL, fail);
  size = (in->size + gran - 1) / gran * gran;
  CU_CHECK_GOTO(cu->cuMemAddressReserve(&va, size, 0, 0, 0), GRAPHD_RESOURCE_EXHAUSTED, fail);
  reserved = 1;
  r = cu->cuMemMap(va, size, 0, h, 0);
  if (r != CUDA_SUCCESS) {
    char e[160];
    snprintf(err, errlen, "cannot map %zu bytes of the allocation (is the declared size %llu "
             "larger than the allocation?): %s", size, (unsigned long long)in->size,
             gd_cuda_strerror(cu, r, e, sizeof e));
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

static int import_legacy(gd_backend *be, gd_backend_dev *d, const gd_region_import *in,
                         gd_region_map *out, char *err, size_t errlen) {
  const gd_cuda *cu = be->priv;
  int rc = 0;
  CUipcMemHandle h;
  memcpy(h.reserved, in->ipc_handle, sizeof h.reserved);
  CUdeviceptr p = 0;
  CUresult r = cu->cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != CUDA_SUCCESS) {
    char e[160];
    snprintf(err, errlen, "cannot open the legacy IPC handle (was the memory freed, or is the "
             "client in another PID namespace?): %s", gd_cuda_strerror(cu, r, e, sizeof e));
    return -GRAPHD_INVALID_ARGUMENT;
  }
  int ordinal = -1;
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
  CUdeviceptr base = 0;
  size_t size = 0;
  CU_CHECK_GOTO(cu->cuMemGetAddressRange(&base, &size, p), GRAPHD_INTERNAL, fail);
  if (in->size > size - (size_t)(p - base)) {
    snprintf(err, errlen, "the region declares %llu bytes but the allocation has %zu",
             (unsigned long long)in->size, size - (size_t)(p - base));
    rc = -GRAPHD_INVALID_ARGUMENT;
    goto fail;
  }
  out->ptr = p;
  out->size = in->size;
  out->mapped = in->size;
  out->kind = in->kind;
  out->handle = NULL;
  return 0;
fail:
  CU_CHECK_IGNORE(cu->cuIpcCloseMemHandle(p));
  return rc;
}

static int cuda_region_import(gd_backend *be, gd_backend_dev *d, const gd_region_import *in,
                              gd_region_map *out, char *err, size_t errlen) {
  if (in->kind == GD_REGION_VMM_FD) return import_vmm(be, d, in, out, err, errlen);
  if (in->kind == GD_REGION_LEGACY_IPC) return import_legacy(be, d, in, out, err, errlen);
  snprintf(err, errlen, "GPUs take VMM or legacy IPC memory, not host memfds");
  return -GRAPHD_FAILED_PRECONDITION;
}

static void cuda_region_release(gd_backend *be, gd_backend_dev *d, gd_region_map *m) {
  const gd_cuda *cu = be->priv;
  (void)d;
  if (m->kind == GD_REGION_VMM_FD) {
    CU_CHECK_IGNORE(cu->cuMemUnmap(m->ptr, m->mapped));
    CU_CHECK_IGNORE(cu->cuMemAddressFree(m->ptr, m->mapped));
  } else {
    CU_CHECK_IGNORE(cu->cuIpcCloseMemHandle(m->ptr));
  }
}

static void cuda_destroy(gd_backend *be) {
  free(be->devices);
  free(be);
}

static const gd_backend_ops cuda_ops = {
    .device_open = cuda_open,
    .device_close = cuda_close,
    .mem_info = cuda_mem_info,
    .module_load = cuda_module_load,
    .module_unload = cuda_module_unload,
    .function_get = cuda_function_get,
    .function_set_shared = cuda_function_set_shared,
    .region_import = cuda_region_import,
    .region_release = cuda_region_release,
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
