/* See reclaim.h. */
#include "reclaim.h"

#include <stdlib.h>

#include "daemon/device/capture.h"
#include "common/log.h"
#include "daemon/device/modcache.h"

typedef struct reclaim_batch {
  gd_daemon *d;
  gd_regprog *programs; /* through next_dead */
  gd_module *modules;
  int pending; /* device jobs not back yet */
} reclaim_batch;

typedef struct forget_job {
  gd_job job;
  reclaim_batch *b;
  uint32_t dropped; /* captures dropped on this device */
  uint64_t bytes;   /* ... and their staging */
} forget_job;

static void free_batch(reclaim_batch *b) {
  uint32_t np = 0, nm = 0;
  for (gd_regprog *p = b->programs, *next; p; p = next, np++) {
    next = p->next_dead;
    registry_free_dead_program(&b->d->reg, p);
  }
  for (gd_module *m = b->modules, *next; m; m = next, nm++) {
    next = m->next_dead;
    registry_free_dead_module(&b->d->reg, m);
  }
  GD_LOG(GD_DEBUG, "reclaim", "freed %u programs and %u modules", np, nm);
  free(b);
}

/* Worker: programs first, then the modules they launched. */
static void forget_run(gd_job *j, void *ctx) {
  forget_job *fj = gd_container_of(j, forget_job, job);
  gd_device *dev = ctx;
  for (gd_regprog *p = fj->b->programs; p; p = p->next_dead) {
    uint64_t bytes;
    if (capture_forget_program(dev, p, &bytes)) {
      fj->dropped++;
      fj->bytes += bytes;
    }
  }
  for (gd_module *m = fj->b->modules; m; m = m->next_dead) modcache_forget_module(dev, m);
}

static void forget_done(gd_job *j) {
  forget_job *fj = gd_container_of(j, forget_job, job);
  reclaim_batch *b = fj->b;
  /* A job that did not run found its device without tables (failed, or
   * shutting down): nothing there names the entries. */
  if (fj->dropped) gd_counters_evicted(&b->d->counters[j->worker->index], fj->dropped, fj->bytes);
  free(fj);
  if (--b->pending == 0) free_batch(b);
}

void reclaim_flush(gd_daemon *d) {
  gd_regprog *programs;
  gd_module *modules;
  registry_take_dead(&d->reg, &programs, &modules);
  if (!programs && !modules) return;
  reclaim_batch *b = calloc(1, sizeof *b);
  if (!b) {
    /* Nothing can be freed safely now; the entries are freed at exit. */
    GD_LOG(GD_WARN, "reclaim", "out of memory: unlinked registry entries stay until exit");
    for (gd_regprog *p = programs, *next; p; p = next) {
      next = p->next_dead;
      p->next_dead = d->reg.dead_programs;
      d->reg.dead_programs = p;
    }
    for (gd_module *m = modules, *next; m; m = next) {
      next = m->next_dead;
      m->next_dead = d->reg.dead_modules;
      d->reg.dead_modules = m;
    }
    return;
  }
  b->d = d;
  b->programs = programs;
  b->modules = modules;
  b->pending = 1; /* until every job is submitted */
  for (int i = 0; i < d->ndevices; i++) {
    forget_job *fj = calloc(1, sizeof *fj);
    if (!fj) {
      /* This device can't be told: nothing may be freed. Keep the batch
       * pending for ever (a leak, not a use after free). */
      GD_LOG(GD_WARN, "reclaim", "out of memory: unlinked registry entries are kept");
      b->pending++;
      continue;
    }
    fj->b = b;
    fj->job.run = forget_run;
    fj->job.done = forget_done;
    b->pending++;
    worker_submit(daemon_worker(d, i), &fj->job);
  }
  if (--b->pending == 0) free_batch(b);
}
