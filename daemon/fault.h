/* Sticky GPU errors (DESIGN.md, Decisions 10).
 *
 * A kernel fault (illegal address and its kin) leaves a CUDA context
 * unusable: every later call in it fails the same way. The worker asks
 * the backend after a job that failed (on the host backend, after every
 * job: its faults happen inside the job), and every WATCH_PERIOD while it
 * sleeps with replays in flight. When the device has faulted,
 * fault_check() drops the worker's captures, loaded modules and imported
 * regions, resets the device's context and bumps its epoch; the loop then
 * releases every wait its data sessions' streams have on the device and
 * closes them (replay.c). Clients reconnect and register their regions
 * again; programs and modules stay registered. Other devices never notice:
 * each has its own worker and context. If the reset fails (CUDA 13 makes
 * no new context in a process after an illegal address), the worker is
 * marked failed and the loop stops graphd with exit status 3, for its
 * service manager to restart it (replay_device_reset).
 *
 * Imports made before the reset are gone with the old context, so the
 * worker keeps its own list of live imports: it releases each once, either
 * when the session lets it go or at the reset, never twice.
 *
 * DESIGN: worker thread only. */
#ifndef GRAPHD_FAULT_H
#define GRAPHD_FAULT_H

#include "backend.h"
#include "worker.h"

/* After a successful import: stamps m with a serial and the epoch, and
 * remembers it. */
void fault_track_map(gd_worker *w, gd_region_map *m);

/* Releases m unless the reset already did (or it was never tracked). */
void fault_release_map(gd_worker *w, gd_region_map *m);

/* Asks the backend whether the device has faulted; if so recovers it as
 * above and returns 1 (the caller tells the loop), else 0. On a failed
 * reset the worker is marked failed. */
int fault_check(gd_worker *w);

/* Frees the list at worker exit (the maps are released by then). */
void fault_close(gd_worker *w);

#endif
