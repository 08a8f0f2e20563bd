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

#include "graphd.pb-c.h"
#include "session.h"

#include "daemon.h"

void replay_handle(gd_session *s, uint64_t request_id, const Graphd__Wire__Replay *m);

/* Shutdown: the replays held back by --max-inflight-replays fail with
 * UNAVAILABLE, not run. */
void replay_release_held(gd_daemon *d);

#endif
