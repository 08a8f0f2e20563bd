/* What a device's worker does besides jobs: after each job and on each
 * idle tick, the device policy; at exit, teardown.
 *
 * Sticky GPU errors: a kernel fault (illegal address and its kin) leaves a
 * CUDA context unusable, and every later call in it fails the same way.
 * The worker asks the backend after a job that failed (on the host
 * backend, after every job: its faults happen inside the job), and on each
 * tick while it sleeps with replays in flight, never on the replay path.
 * When the device has faulted, the captures, module loads and imports are
 * dropped, the context reset and the epoch bumped; the loop then releases
 * the waits of that device's sessions and closes them. If the reset fails
 * (CUDA 13 makes no new context in a process after an illegal address),
 * the device is marked failed and the loop stops graphd with exit status
 * 3 for its service manager to restart it. See docs/design.md, "Sticky GPU
 * errors".
 *
 * The head-of-line watch (holwatch.c) runs on the same ticks.
 *
 * DESIGN: worker thread only. What the loop must hear of comes back in a
 * gd_upkeep_news, which the caller hands on. */
#ifndef GRAPHD_UPKEEP_H
#define GRAPHD_UPKEEP_H

#include <stdbool.h>
#include <stdint.h>

#include "device.h"

#define GD_UPKEEP_MAX_CUTS 8

typedef struct gd_upkeep_news {
  bool reset;                       /* the device faulted and was reset (or failed) */
  uint64_t cut[GD_UPKEEP_MAX_CUTS]; /* sessions cut off as hung */
  int ncut;
} gd_upkeep_news;

/* About to sleep with nothing queued: whether to tick (replays may still
 * run, or ready waits are watched). */
bool upkeep_wants_tick(gd_device *d);

/* After a job (had_job; ran and status say how it went) or a tick. */
void upkeep_after(gd_device *d, bool had_job, bool ran, int status, gd_upkeep_news *news);

/* Frees everything made on the device and closes it (worker exit). */
void upkeep_close(gd_device *d);

#endif
