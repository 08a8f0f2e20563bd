/* Host backend: devices that live in this process's memory, for CI and for
 * machines without a GPU (DESIGN.md, "The host backend"). It is not a CUDA
 * simulator.
 *
 * DESIGN: the facts are built at start on the main thread; each device's
 * state is touched only by its worker. The used-bytes counter is atomic so
 * status can read it from any worker. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/uuid.h"
#include "backend.h"
#include "../proto/program.h"
#include "graphd/host_kernel.h"
#include "graphd/status.h"
#include <openssl/sha.h>

struct gd_backend_dev {
  int index;
  uint64_t total;
  _Atomic uint64_t used;
};

static int host_open(gd_backend *be, int i, gd_backend_dev **out, char *err, size_t errlen) {
  gd_backend_dev *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of memory opening host device %d", i);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  d->index = i;
  d->total = be->devices[i].total_memory;
  *out = d;
  return 0;
}

static void host_close(gd_backend *be, gd_backend_dev *d) {
  (void)be;
  free(d);
}

static int host_mem_info(gd_backend *be, gd_backend_dev *d, uint64_t *free_b, uint64_t *total_b,
                         char *err, size_t errlen) {
  (void)be, (void)err, (void)errlen;
  uint64_t used = atomic_load(&d->used);
  *total_b = d->total;
  *free_b = used > d->total ? 0 : d->total - used;
  return 0;
}

/* Modules are ELF shared objects: the bytes go into a memfd that dlopen
 * loads through /proc/self/fd, so nothing touches the file system. */
static int host_module_load(gd_backend *be, gd_backend_dev *d, uint32_t kind, const void *bytes,
                            size_t len, void **mod, char *err, size_t errlen) {
  (void)be;
  if (kind != GD_MODULE_HOST_ELF) {
    snprintf(err, errlen, "host devices run host ELF modules only (this module is kind %u)",
             kind);
    return -GRAPHD_FAILED_PRECONDITION;
  }
  char name[32];
  snprintf(name, sizeof name, "graphd-host%d-module", d->index);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) {
    snprintf(err, errlen, "memfd_create: %s", strerror(errno));
    return -GRAPHD_INTERNAL;
  }
  size_t off = 0;
  while (off < len) {
    ssize_t n = write(fd, (const char *)bytes + off, len - off);
    if (n <= 0) {
      snprintf(err, errlen, "writing the module to a memfd: %s", strerror(errno));
      close(fd);
      return -GRAPHD_INTERNAL;
    }
    off += (size_t)n;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  dlerror();
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  close(fd);
  if (!h) {
    const char *e = dlerror();
    snprintf(err, errlen, "cannot load the host module: %s", e ? e : "unknown dlopen error");
    return -GRAPHD_INVALID_ARGUMENT;
  }
  *mod = h;
  return 0;
}

static void host_module_unload(gd_backend *be, gd_backend_dev *d, void *mod) {
  (void)be, (void)d;
  dlclose(mod);
}

static int host_function_get(gd_backend *be, gd_backend_dev *d, void *mod, const char *name,
                             void **fn, gd_func_info *info, char *err, size_t errlen) {
  (void)be, (void)d;
  void *f = dlsym(mod, name);
  if (!f) {
    snprintf(err, errlen, "the module has no function '%s'", name);
    return -GRAPHD_NOT_FOUND;
  }
  memset(info, 0, sizeof *info);
  char pname[GD_MAX_NAME + 32];
  snprintf(pname, sizeof pname, "graphd_params_%s", name);
  const uint32_t *desc = dlsym(mod, pname);
  if (desc && desc[0] <= GD_FUNC_MAX_PARAMS) {
    info->params_known = 1;
    info->nparams = desc[0];
    for (uint32_t i = 0; i < desc[0]; i++) {
      info->param_offset[i] = desc[1 + 2 * i];
      info->param_size[i] = desc[2 + 2 * i];
    }
  }
  info->max_threads_per_block = GD_MAX_BLOCK_THREADS;
  info->max_shared_optin = GD_MAX_SHARED_BYTES;
  info->default_shared_limit = 48u << 10;
  memcpy(fn, &f, sizeof f);
  return 0;
}

static int host_function_set_shared(gd_backend *be, gd_backend_dev *d, void *fn, uint32_t bytes,
                                    char *err, size_t errlen) {
  (void)be, (void)d, (void)fn, (void)bytes, (void)err, (void)errlen;
  return 0; /* shared memory is a heap buffer the worker provides */
}

/* Host regions are memfds from graphd_host_alloc, mapped shared. */
static int host_region_import(gd_backend *be, gd_backend_dev *d, const gd_region_import *in,
                              gd_region_map *out, char *err, size_t errlen) {
  (void)be, (void)d;
  if (in->kind != GD_REGION_HOST_MEMFD) {
    snprintf(err, errlen, "host devices take memory from graphd_host_alloc only");
    return -GRAPHD_FAILED_PRECONDITION;
  }
  struct stat st;
  if (fcntl(in->fd, F_GET_SEALS) < 0 || fstat(in->fd, &st) < 0) {
    snprintf(err, errlen, "the region's fd is not a memfd from graphd_host_alloc");
    return -GRAPHD_INVALID_ARGUMENT;
  }
  if ((uint64_t)st.st_size < in->size || in->size == 0) {
    snprintf(err, errlen, "the region declares %llu bytes but its memfd holds %lld",
             (unsigned long long)in->size, (long long)st.st_size);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  void *p = mmap(NULL, in->size, PROT_READ | PROT_WRITE, MAP_SHARED, in->fd, 0);
  if (p == MAP_FAILED) {
    snprintf(err, errlen, "mmap of the region: %s", strerror(errno));
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  out->ptr = (uint64_t)(uintptr_t)p;
  out->size = in->size;
  out->mapped = in->size;
  out->kind = in->kind;
  out->handle = p;
  return 0;
}

static void host_region_release(gd_backend *be, gd_backend_dev *d, gd_region_map *m) {
  (void)be, (void)d;
  munmap(m->handle, m->mapped);
}

static void host_destroy(gd_backend *be) {
  free(be->devices);
  free(be);
}

static const gd_backend_ops host_ops = {
    .device_open = host_open,
    .device_close = host_close,
    .mem_info = host_mem_info,
    .module_load = host_module_load,
    .module_unload = host_module_unload,
    .function_get = host_function_get,
    .function_set_shared = host_function_set_shared,
    .region_import = host_region_import,
    .region_release = host_region_release,
    .destroy = host_destroy,
};

int backend_host_new(int n, uint64_t mem_bytes, gd_backend **out, char *err, size_t errlen) {
  gd_backend *be = calloc(1, sizeof *be);
  gd_device_facts *f = calloc((size_t)n, sizeof *f);
  if (!be || !f) {
    free(be);
    free(f);
    snprintf(err, errlen, "out of memory creating %d host devices", n);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  for (int i = 0; i < n; i++) {
    /* A stable UUID per ordinal, so scripts and tests can name a host
     * device across restarts. */
    char seed[64];
    unsigned char md[SHA256_DIGEST_LENGTH];
    int k = snprintf(seed, sizeof seed, "graphd host device %d", i);
    SHA256((const unsigned char *)seed, (size_t)k, md);
    f[i].backend_index = i;
    snprintf(f[i].name, sizeof f[i].name, "graphd host device %d", i);
    memcpy(f[i].uuid, md, 16);
    gd_uuid_format(f[i].uuid, "HOST-", f[i].uuid_str);
    f[i].total_memory = mem_bytes;
    f[i].mps_enabled = 0;
  }
  be->name = "host";
  be->ops = &host_ops;
  be->ndevices = n;
  be->devices = f;
  *out = be;
  return 0;
}
