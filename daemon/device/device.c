/* See device.h. Worker thread only, but for device_init. */
#include "device.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "graphd/status.h"
#include "common/log.h"

typedef struct gd_live_import {
  uint64_t serial;
  gd_region_map map;
  UT_hash_handle hh;
} gd_live_import;

void device_init(gd_device *d, int index, gd_backend *be, int backend_index, uint64_t budget) {
  memset(d, 0, sizeof *d);
  d->index = index;
  d->be = be;
  d->backend_index = backend_index;
  d->budget = budget;
  d->gpu_sample_every = GD_GPU_SAMPLE_DEFAULT;
  d->ready_hold_rings = GD_READY_HOLD_RINGS_DEFAULT;
  d->ready_hold_max_ns = GD_READY_HOLD_MAX_US_DEFAULT * 1000ull;
  atomic_init(&d->state, GD_DEVICE_STARTING);
  atomic_init(&d->epoch, 0);
}

void device_fail(gd_device *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->fail_msg, sizeof d->fail_msg, fmt, ap);
  va_end(ap);
  atomic_store(&d->state, GD_DEVICE_FAILED);
}

int device_attach(gd_device *d) {
  const gd_device_facts *f = &d->be->devices[d->backend_index];
  char err[160] = "";
  int rc = d->be->ops->device_open(d->be, d->backend_index, &d->dev, err, sizeof err);
  if (rc < 0) {
    device_fail(d, "device %d (%s) could not be opened: %s", d->index, f->uuid_str, err);
    GD_LOG(GD_ERROR, "device", "%s", d->fail_msg);
    return rc;
  }
  atomic_store(&d->state, GD_DEVICE_OK);
  GD_LOG(GD_INFO, "device", "serving device %d: %s %s", d->index, f->name, f->uuid_str);
  return 0;
}

void device_tag(const gd_device *d, char *tag, size_t len) {
  snprintf(tag, len, "%s%d", d->be->thread_prefix, d->index);
}

int device_faulted(gd_device *d, char *why, size_t whylen) {
  const gd_backend_ops *ops = d->be->ops;
  if (d->wedged[0]) {
    snprintf(why, whylen, "%s", d->wedged);
    d->wedged[0] = 0;
    return -GRAPHD_UNAVAILABLE;
  }
  if (!ops->device_health) return 0;
  return ops->device_health(d->be, d->dev, why, whylen);
}

int device_import(gd_device *d, const gd_region_import *in, gd_region_map *out, char *err,
                  size_t errlen) {
  int rc = d->be->ops->region_import(d->be, d->dev, in, out, err, errlen);
  if (rc < 0) return rc;
  out->serial = ++d->import_serial;
  out->epoch = atomic_load(&d->epoch);
  gd_live_import *l = malloc(sizeof *l);
  if (!l) {
    /* Untracked: released when the session lets it go, but a reset would
     * leave it to the old context (which frees it, or not). */
    GD_LOG(GD_WARN, "device", "out of memory tracking region import %llu",
           (unsigned long long)out->serial);
    return 0;
  }
  l->serial = out->serial;
  l->map = *out;
  HASH_ADD(hh, d->imports, serial, sizeof l->serial, l);
  return 0;
}

void device_release_import(gd_device *d, gd_region_map *m) {
  gd_live_import *l = NULL;
  HASH_FIND(hh, d->imports, &m->serial, sizeof m->serial, l);
  if (!l) {
    if (m->epoch == atomic_load(&d->epoch)) d->be->ops->region_release(d->be, d->dev, m);
    return; /* else released at the reset */
  }
  HASH_DEL(d->imports, l);
  d->be->ops->region_release(d->be, d->dev, &l->map);
  free(l);
}

void device_release_imports(gd_device *d) {
  gd_live_import *l, *tmp;
  HASH_ITER(hh, d->imports, l, tmp) {
    HASH_DEL(d->imports, l);
    d->be->ops->region_release(d->be, d->dev, &l->map);
    free(l);
  }
}

void device_detach(gd_device *d) {
  gd_live_import *l, *tmp;
  HASH_ITER(hh, d->imports, l, tmp) {
    HASH_DEL(d->imports, l);
    free(l);
  }
  if (d->dev) d->be->ops->device_close(d->be, d->dev);
  d->dev = NULL;
}
