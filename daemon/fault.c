/* See fault.h. Worker thread only. */
#include "fault.h"

#include <stdio.h>
#include <stdlib.h>
#include <uthash.h>

#include "capture.h"
#include "graphd/status.h"
#include "log.h"
#include "prepare.h"

typedef struct gd_live_map {
  uint64_t serial;
  gd_region_map map;
  UT_hash_handle hh;
} gd_live_map;

void fault_track_map(gd_worker *w, gd_region_map *m) {
  m->serial = ++w->map_serial;
  m->epoch = atomic_load(&w->epoch);
  gd_live_map *l = malloc(sizeof *l);
  if (!l) {
    /* Untracked: released when the session lets it go, but a reset would
     * leave it to the old context (which frees it, or not). */
    GD_LOG(GD_WARN, "fault", "out of memory tracking region mapping %llu",
           (unsigned long long)m->serial);
    return;
  }
  l->serial = m->serial;
  l->map = *m;
  HASH_ADD(hh, w->maps, serial, sizeof l->serial, l);
}

void fault_release_map(gd_worker *w, gd_region_map *m) {
  gd_live_map *l = NULL;
  HASH_FIND(hh, w->maps, &m->serial, sizeof m->serial, l);
  if (!l) {
    if (m->epoch == atomic_load(&w->epoch)) w->be->ops->region_release(w->be, w->dev, m);
    return; /* else released at the reset */
  }
  HASH_DEL(w->maps, l);
  w->be->ops->region_release(w->be, w->dev, &l->map);
  free(l);
}

int fault_check(gd_worker *w) {
  const gd_backend_ops *ops = w->be->ops;
  char why[256], err[256] = "";
  if (!ops->device_health || ops->device_health(w->be, w->dev, why, sizeof why) == 0) return 0;
  uint64_t epoch = atomic_load(&w->epoch) + 1;
  GD_LOG(GD_ERROR, "fault",
         "device %d: %s: resetting the device (epoch %llu); its captures are dropped and its "
         "sessions closed, other devices go on",
         w->index, why, (unsigned long long)epoch);
  /* Free what the old context holds while it still exists: the calls fail
   * fast on a faulted context, and the reset destroys whatever is left. */
  capture_close_all(w);
  prepare_close(w);
  gd_live_map *l, *tmp;
  HASH_ITER(hh, w->maps, l, tmp) {
    HASH_DEL(w->maps, l);
    ops->region_release(w->be, w->dev, &l->map);
    free(l);
  }
  int rc = ops->device_reset(w->be, w->dev, err, sizeof err);
  atomic_store(&w->epoch, epoch);
  if (rc < 0) {
    snprintf(w->fail_msg, sizeof w->fail_msg, "device %d faulted (%.100s) and could not be reset: %.150s",
             w->index, why, err);
    GD_LOG(GD_ERROR, "fault", "%s", w->fail_msg);
    atomic_store(&w->state, GD_WORKER_FAILED);
  } else {
    GD_LOG(GD_INFO, "fault", "device %d: reset; serving again at epoch %llu", w->index,
           (unsigned long long)epoch);
  }
  return 1;
}

void fault_close(gd_worker *w) {
  gd_live_map *l, *tmp;
  HASH_ITER(hh, w->maps, l, tmp) {
    HASH_DEL(w->maps, l);
    free(l);
  }
}
