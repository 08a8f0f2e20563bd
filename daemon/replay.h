/* A Replay, from request to done flag. On the loop, the request is checked
 * (program, flags, bindings against regions and slots, without overflow)
 * and resolved to device addresses. On the device's worker it runs in the
 * order that keeps the client's stream and the session stream in step
 * (docs/design.md, "Ordering"): the device stage and the capture on first
 * use, the budget, then on the session stream: wait ready >= seq, the
 * capture (capture_enqueue), and done = seq, written even when the replay
 * failed. The worker answers the client itself; the loop keeps the
 * counters when the job comes back.
 *
 * DESIGN: loop thread, except replay_run (worker). */
#ifndef GRAPHD_REPLAY_H
#define GRAPHD_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "capture.h"
#include "graphd.pb-c.h"
#include "region.h"
#include "session.h"

#include "daemon.h"

/* The checks of a Replay's bindings, and their resolution: each of the n
 * bindings names a slot of p that is not scratch, once, with the slot's
 * size, and a range inside a region of the table imported in `epoch` (the
 * device's now; dev names the device in the message); every staged slot
 * that is not scratch is bound. bind has p->nslots entries, zeroed; on
 * success each bound one holds its address (the region's plus the
 * offset) and bytes. Returns 0, or a negated status with err saying why.
 * Pure: no session, no device. */
int replay_bind(const gd_program *p, gd_region_table *regions, uint64_t epoch, int dev,
                Graphd__Wire__Binding *const *bindings, size_t n, gd_bound *bind, char *err,
                size_t errlen);

void replay_handle(gd_session *s, Graphd__Wire__Request *req, int *fds);

/* Shutdown: the replays held back by --max-inflight-replays fail with
 * UNAVAILABLE, not run. */
void replay_release_held(gd_daemon *d);

#endif
