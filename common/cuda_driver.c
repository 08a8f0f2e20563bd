#define _GNU_SOURCE
#include "cuda_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphd/status.h"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static gd_cuda table;
static int load_rc;
static char load_err[256];

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);
typedef CUresult (*driver_version_fn)(int *);

static void fail(int rc, const char *fmt, const char *a, int b, int c) {
  load_rc = rc;
  snprintf(load_err, sizeof load_err, fmt, a, b, c);
}

/* Names whose newest ABI at CUDA_VERSION is not the prototype cuda.h
 * declares for them, with the version of that prototype (cuda_driver.h). */
static const struct {
  const char *name;
  int version;
} GD_CUDA_OLD_ABI[] = {
    {"cuCtxSynchronize", 2000}, /* 13000: cuCtxSynchronize(CUcontext) */
};

static int abi_version(const char *name) {
  for (size_t i = 0; i < sizeof GD_CUDA_OLD_ABI / sizeof GD_CUDA_OLD_ABI[0]; i++)
    if (strcmp(name, GD_CUDA_OLD_ABI[i].name) == 0) return GD_CUDA_OLD_ABI[i].version;
  return CUDA_VERSION;
}

static void load(void) {
  const char *name = getenv("GRAPHD_LIBCUDA");
  if (!name || !*name) name = "libcuda.so.1";
  void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fail(-GRAPHD_UNAVAILABLE, "no CUDA driver: cannot load %s", name, 0, 0);
    return;
  }
  driver_version_fn get_version = (driver_version_fn)dlsym(lib, "cuDriverGetVersion");
  get_proc_fn get_proc = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
  int version = 0;
  if (!get_version || get_version(&version) != CUDA_SUCCESS) {
    fail(-GRAPHD_FAILED_PRECONDITION, "%s does not report its version", name, 0, 0);
    goto fail_close;
  }
  if (version < GD_CUDA_MIN_DRIVER || !get_proc) {
    fail(-GRAPHD_FAILED_PRECONDITION,
         "driver too old: need CUDA 13 (driver API %s%d.%d found); update the NVIDIA driver", "",
         version / 1000, (version % 1000) / 10);
    goto fail_close;
  }
  table.lib = lib;
  table.driver_version = version;
#define GD_CUDA_RESOLVE_(fname)                                                                    \
  do {                                                                                             \
    void *p_ = NULL;                                                                               \
    CUdriverProcAddressQueryResult q_ = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;                      \
    if (get_proc(#fname, &p_, abi_version(#fname), CU_GET_PROC_ADDRESS_DEFAULT, &q_) !=            \
            CUDA_SUCCESS ||                                                                        \
        !p_) {                                                                                     \
      fail(-GRAPHD_FAILED_PRECONDITION, "driver too old: need CUDA 13 (%s is missing)", #fname, 0, \
           0);                                                                                     \
      goto fail_close;                                                                             \
    }                                                                                              \
    memcpy(&table.fname, &p_, sizeof p_);                                                          \
  } while (0);
  GD_CUDA_FUNCS(GD_CUDA_RESOLVE_)
#undef GD_CUDA_RESOLVE_

  CUresult r = table.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char *s = "unknown";
    table.cuGetErrorName(r, &s);
    fail(-GRAPHD_UNAVAILABLE, "CUDA driver present but cuInit failed: %s (%d)", s, (int)r, 0);
    goto fail_close;
  }
  load_rc = 0;
  return;

fail_close:
  memset(&table, 0, sizeof table);
  dlclose(lib);
}

int gd_cuda_load(const gd_cuda **out, char *err, size_t errlen) {
  pthread_once(&load_once, load);
  if (load_rc < 0) {
    if (err && errlen) snprintf(err, errlen, "%s", load_err);
    *out = NULL;
    return load_rc;
  }
  *out = &table;
  return 0;
}

unsigned gd_cuda_mem_kind(const gd_cuda *cu, CUdeviceptr ptr) {
  unsigned kind = 0;
  unsigned int type = 0;
  int legacy = 0;
  unsigned long long allowed = 0;
  CUmemoryPool pool = NULL;
  if (cu->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) == CUDA_SUCCESS &&
      type == CU_MEMORYTYPE_DEVICE)
    kind |= GD_CUDA_MEM_DEVICE;
  if (cu->cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr) ==
          CUDA_SUCCESS &&
      legacy)
    kind |= GD_CUDA_MEM_LEGACY_IPC;
  if (cu->cuPointerGetAttribute(&allowed, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, ptr) ==
          CUDA_SUCCESS &&
      (allowed & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    kind |= GD_CUDA_MEM_VMM_FD;
  if (cu->cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr) == CUDA_SUCCESS &&
      pool)
    kind |= GD_CUDA_MEM_POOL;
  return kind;
}

unsigned long long gd_cuda_buffer_id(const gd_cuda *cu, CUdeviceptr ptr) {
  unsigned long long id = 0;
  if (cu->cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) != CUDA_SUCCESS) id = 0;
  return id;
}

const char *gd_cuda_strerror(const gd_cuda *cu, CUresult r, char *buf, size_t len) {
  const char *name = NULL, *desc = NULL;
  if (cu) {
    cu->cuGetErrorName(r, &name);
    cu->cuGetErrorString(r, &desc);
  }
  snprintf(buf, len, "%s: %s", name ? name : "CUDA_ERROR_UNKNOWN", desc ? desc : "unknown");
  return buf;
}
