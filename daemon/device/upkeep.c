/* See upkeep.h. Worker thread only. */
#include "upkeep.h"

#include <stdio.h>

#include "capture.h"
#include "session_stream.h"
#include "graphd/status.h"
#include "holwatch.h"
#include "common/log.h"
#include "modcache.h"

/* Drops everything the faulted context holds and resets it. */
static void recover(gd_device *d, const char *why) {
  const gd_backend_ops *ops = d->be->ops;
  char err[256] = "";
  uint64_t epoch = atomic_load(&d->epoch) + 1;
  GD_LOG(GD_ERROR, "upkeep",
         "device %d: %s: resetting the device (epoch %llu); its captures are dropped and its "
         "sessions closed, other devices go on",
         d->index, why, (unsigned long long)epoch);
  /* Free what the old context holds while it still exists: the calls fail
   * fast on a faulted context, and the reset destroys whatever is left. */
  holwatch_close(d);
  d->watching = false;
  capture_close_all(d);
  modcache_close(d);
  device_release_imports(d);
  int rc = ops->device_reset(d->be, d->dev, err, sizeof err);
  atomic_store(&d->epoch, epoch);
  if (rc < 0) {
    device_fail(d, "device %d faulted (%.100s) and could not be reset: %.150s", d->index, why, err);
    GD_LOG(GD_ERROR, "upkeep", "%s", d->fail_msg);
  } else {
    GD_LOG(GD_INFO, "upkeep", "device %d: reset; serving again at epoch %llu", d->index,
           (unsigned long long)epoch);
  }
}

bool upkeep_wants_tick(gd_device *d) {
  /* With replays still running, keep waking to notice a fault (asked
   * here, not after every job). */
  if (d->maybe_busy) d->maybe_busy = capture_any_busy(d);
  return d->watching || d->maybe_busy;
}

void upkeep_after(gd_device *d, bool had_job, bool ran, int status, gd_upkeep_news *news) {
  news->reset = false;
  news->ncut = 0;
  if (!device_ok(d)) return;
  if (ran) d->maybe_busy = true;
  /* When to ask whether the device faulted: on a tick; after a failed job
   * (a fault fails every later call in its context); after any job where
   * the worker runs the work itself (host). */
  bool ask = !had_job || d->be->waits_on_worker || (ran && status < 0);
  char why[256];
  if (ask && device_faulted(d, why, sizeof why) < 0) {
    recover(d, why);
    news->reset = true;
    return;
  }
  if (!d->be->waits_on_worker) {
    bool pending = false;
    news->ncut = holwatch_check(d, news->cut, GD_UPKEEP_MAX_CUTS, &pending);
    d->watching = pending;
  }
}

void upkeep_close(gd_device *d) {
  /* A graceful stop finishes what the session streams were given (replays
   * already answered, their done writes included) before anything they
   * use is freed and before the sessions close. A stream held by a ready
   * flag that never comes holds this until --shutdown-grace. */
  char err[256];
  if (d->dev && device_ok(d) && d->be->ops->device_sync(d->be, d->dev, err, sizeof err) < 0)
    GD_LOG(GD_WARN, "upkeep", "device %d: finishing its streams at stop failed: %s", d->index, err);
  holwatch_close(d);
  capture_close_all(d);
  modcache_close(d);
  /* What sessions whose end was refused at shutdown still hold. */
  session_stream_close_all(d);
  device_release_imports(d);
  device_detach(d);
}
