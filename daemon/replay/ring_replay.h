/* Asynchronous replays on the worker: the entries of each session's
 * submission ring (submit_ring.h, graphd/protocol.h), read by the device's
 * worker itself between jobs, each read into a request for the one
 * replay path a Replay request also takes (execute.h: checked against the
 * worker's view of the session, its flag slots and regions, and run in
 * order), the program named by a handle the session registered, and
 * answered through the ring's completions. No loop thread and no protobuf on this path.
 *
 * Ordering with the session's requests: a job of the session that a ring
 * entry may precede (a Replay, an UnregisterRegion) first takes what the
 * client published before sending it (ring_replay_drain), so a replay and a
 * release follow the entries the client queued before them. A refused
 * entry whose flag slot and seq are sound still writes done = seq in
 * stream order, as a failed replay does, so no client stream waits on it.
 *
 * DESIGN: worker thread only. */
#ifndef GRAPHD_RING_REPLAY_H
#define GRAPHD_RING_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/device/device.h"
#include "daemon/device/session_stream.h"
#include "execute.h"
#include "daemon/base/registry.h"
#include "daemon/device/worker.h"

/* The session's settings for its ring's entries. */
typedef struct gd_ring_params {
  uint32_t entries;
  double ready_timeout_s;
  uint32_t max_inflight;
  uint32_t client_pid, client_uid;
} gd_ring_params;

/* RegisterRing on the worker: maps the ring (memfd fd, not closed here)
 * and adds its doorbell (owned from here on) to w's wake set. 0 or a
 * negated status with err saying why. */
int ring_replay_attach(gd_device *d, gd_worker *w, gd_session_stream *ds, const gd_ring_params *pr,
                       int fd, int doorbell, char *err, size_t errlen);

/* RingProgram on the worker: program p gets handle h in ds's ring. */
int ring_replay_set_program(gd_session_stream *ds, uint32_t h, const gd_regprog *p, char *err,
                            size_t errlen);

/* Runs the entries ds's client had published when the job began (before
 * a job of its session), and those its order group numbered before them:
 * no more, so that a client that keeps its ring full cannot hold the
 * worker. An entry held back by --max-inflight-replays is waited for, as
 * the poll would; past the ready timeout while other work waits, its
 * session is marked hung (ring_replay_take_hung) and the drain stops. ds may be
 * NULL. */
void ring_replay_drain(gd_device *d, gd_worker *w, gd_session_stream *ds);

/* Whether another session's ring (not ds's order group) has an entry that
 * may run now: ds's ready wait holds it up (the host backend's give-up). */
bool ring_replay_others_waiting(gd_device *d, const gd_session_stream *ds);

/* Sessions whose ring was marked hung since they were last asked (an
 * entry's ready flag, or a drain's held entry, did not come within the
 * ready timeout while others waited): at most n ids go to ids[]; returns
 * how many. Their rings are read no more; the loop closes them. */
int ring_replay_take_hung(gd_device *d, uint64_t *ids, int n);

/* Some ring of d has entries that may run now. */
bool ring_replay_pending(gd_device *d);

/* Some ring of d has entries held back by --max-inflight-replays (the
 * worker then ticks, to look again). */
bool ring_replay_held(gd_device *d);

/* Runs entries of the rings, one from each ring in turn for a bounded
 * number of rounds, returning early when a job waits; returns the first
 * failure's status, else 0. */
int ring_replay_poll(gd_device *d, gd_worker *w);

/* Before sleeping (asleep): asks the clients to ring, and says whether an
 * entry came meanwhile; after (!asleep): they need not. */
bool ring_replay_sleep(gd_device *d, bool asleep);

/* What the rings ran since they were last asked, summed into *st (zeroed
 * first), from each ring last asked at least 1 ms ago, or from all with
 * `all` (an idle tick); false when nothing. The loop hears at most once a
 * millisecond per ring, not once an entry. */
bool ring_replay_take_stats(gd_device *d, bool all, gd_replay_tally *st);

/* Some ring ran entries the loop has not heard of (the worker ticks until
 * it has). */
bool ring_replay_has_stats(gd_device *d);

#endif
