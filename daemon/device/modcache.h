/* The module cache of a device, and the device stage of validation it
 * serves: each module loaded once per device, each function looked up,
 * loaded and checked against the launches that use it once.
 *
 * DESIGN: worker thread only. The tables hang off the device (d->mods) and
 * are indexed by the registry's dense module and program indexes. */
#ifndef GRAPHD_MODCACHE_H
#define GRAPHD_MODCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/backend/backend.h"
#include "daemon/base/registry.h"
#include "device.h"

typedef struct gd_dev_func {
  void *fn;
  gd_func_info info;
  uint32_t shared_opted_in; /* dynamic shared bytes allowed so far */
} gd_dev_func;

/* Loads what p needs on w's device and checks every launch against the
 * real function: it exists, its parameter offsets and sizes match, and the
 * block and shared memory fit. Cached per device once it succeeds.
 * *loaded and *load_ns report module loads done by this call. Errors name
 * the step. */
int modcache_prepare(gd_device *d, const gd_regprog *p, uint64_t *loaded, uint64_t *load_ns,
                     char *err, size_t errlen);

/* The prepared function of launch step `step` (after modcache_prepare). */
gd_dev_func *modcache_function(gd_device *d, const gd_regprog *p, uint32_t step);

/* Unloads module m on this device (no capture uses it any more); programs
 * prepared against it will prepare again. */
void modcache_release_module(gd_device *d, const gd_module *m);

/* The registry frees p or m: what this device keeps under its index goes
 * (a module is unloaded), so that the index can serve another entry. A
 * program goes before the modules it launches. */
void modcache_forget_program(gd_device *d, const gd_regprog *p);
void modcache_forget_module(gd_device *d, const gd_module *m);

/* Unloads everything (worker exit, device reset). */
void modcache_close(gd_device *d);

#endif
