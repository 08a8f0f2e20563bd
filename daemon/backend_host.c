/* Host backend: devices that live in this process's memory, for CI and for
 * machines without a GPU (DESIGN.md, "The host backend"). It is not a CUDA
 * simulator.
 *
 * DESIGN: the facts are built at start on the main thread; each device's
 * state is touched only by its worker. The used-bytes counter is atomic so
 * status can read it from any worker. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/uuid.h"
#include "backend.h"
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

static void host_destroy(gd_backend *be) {
  free(be->devices);
  free(be);
}

static const gd_backend_ops host_ops = {
    .device_open = host_open,
    .device_close = host_close,
    .mem_info = host_mem_info,
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
