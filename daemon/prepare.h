/* The device stage of validation (Decisions 4) and the per-device caches
 * it fills: each module loaded once per device, each function looked up,
 * loaded and checked once.
 *
 * DESIGN: worker thread only. The tables hang off the worker (w->ds) and
 * are indexed by the registry's dense module and program indexes. */
#ifndef GRAPHD_PREPARE_H
#define GRAPHD_PREPARE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "registry.h"
#include "worker.h"

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
int prepare_program(gd_worker *w, const gd_prog *p, uint64_t *loaded, uint64_t *load_ns,
                    char *err, size_t errlen);

/* The prepared function of launch step `step` (after prepare_program). */
gd_dev_func *prepare_step_function(gd_worker *w, const gd_prog *p, uint32_t step);

/* Number of modules loaded on this device. */
uint32_t prepare_modules_loaded(gd_worker *w);

/* Unloads module m on this device (no capture uses it any more); programs
 * prepared against it will prepare again. */
void prepare_release_module(gd_worker *w, const gd_module *m);

/* Unloads everything (worker exit, device reset). */
void prepare_close(gd_worker *w);

#endif
