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
#include "backend.h"
#include "check.h"
#include "graphd/status.h"

struct gd_backend_dev {
  CUdevice dev;
  CUcontext ctx;
};

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

static void cuda_destroy(gd_backend *be) {
  free(be->devices);
  free(be);
}

static const gd_backend_ops cuda_ops = {
    .device_open = cuda_open,
    .device_close = cuda_close,
    .mem_info = cuda_mem_info,
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
