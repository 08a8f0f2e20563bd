/* The one replay path on the device's worker, with two front ends: a
 * Replay request (replay.c, through the loop) and an entry of the
 * session's submission ring (ring_replay.c, read by the worker itself). Each
 * front end reads its request into a gd_replay_req; exec_replay checks it
 * against the worker's view of the session (flag slot, the seq taken on
 * it, the regions), resolves its bindings and runs it in the order that
 * keeps a client's stream and the session stream in step (docs/design.md,
 * "Ordering"), and counts what it did in a gd_replay_tally that the loop
 * adds to the device's counters.
 *
 * DESIGN: exec_replay, exec_run and exec_write_done run on the worker;
 * exec_bind and the tallies are pure and run on either thread. */
#ifndef GRAPHD_EXECUTE_H
#define GRAPHD_EXECUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/device/capture.h"
#include "daemon/device/device.h"
#include "daemon/device/session_stream.h"
#include "daemon/base/registry.h"
#include "daemon/device/worker.h"

/* Whether a session other than ds has ring entries the worker could run:
 * the host backend's give-up of a ready flag asks it (ring_replay_others_waiting,
 * passed in so that this layer stays below the ring). */
typedef bool (*gd_others_waiting_fn)(gd_device *d, const gd_session_stream *ds);

/* The head-of-line policy where the worker itself waits for a client of
 * ds (its ready write on the host backend, or entries of its ring held
 * back by --max-inflight-replays), a wait begun at since_ns: whether to
 * stop. GD_GIVE_UP_GONE when the client has gone, GD_GIVE_UP_STOPPING
 * when graphd is stopping, GD_GIVE_UP_HUNG once the wait is past
 * timeout_s (gd_ready_overdue) while it blocks someone else: another job
 * waits on the worker, or others_waiting (may be NULL) finds another
 * session's ring entry to run; else 0, to go on waiting. A slow client in
 * nobody's way is left alone. Marks the worker alive. Worker thread. */
int exec_wait_verdict(gd_device *d, gd_worker *w, const gd_session_stream *ds, uint64_t since_ns,
                      double timeout_s, gd_others_waiting_fn others_waiting);

/* One replay, resolved. */
typedef struct gd_replay_exec {
  const gd_regprog *prog;
  gd_session_stream *ds;
  uint32_t stream_slot;
  uint64_t seq;
  double ready_timeout_s;
  uint32_t client_pid;
  uint32_t client_uid;
  uint64_t epoch;                      /* the device epoch the bindings were resolved in */
  gd_others_waiting_fn others_waiting; /* NULL: none counted */
  gd_bound *bind;                      /* one per slot of the program */
  /* Set by exec_run: */
  bool captured;
  bool recaptured;
  uint64_t capture_ns;
  uint64_t staging_bytes;
  uint64_t instance_bytes; /* staging of an instance of the capture added for this replay */
  uint32_t budget_evicted; /* captures the budget dropped to fit this one */
  uint64_t budget_evicted_bytes;
} gd_replay_exec;

/* One replay as a front end hands it over: the program (resolved by the
 * front end: the registry's on the loop, a ring handle on the worker), the
 * flag slot and seq, the bindings, and the session's terms. */
typedef struct gd_replay_req {
  const gd_regprog *prog;
  uint32_t stream_slot;
  uint64_t seq;
  const gd_bind_req *bindings;
  uint32_t nbindings;
  double ready_timeout_s;
  uint32_t client_pid;
  uint32_t client_uid;
  gd_others_waiting_fn others_waiting;
  /* Nonzero: the front end refuses it with this status and text once its
   * flag slot and seq are found sound (so that done = seq is written). */
  uint32_t refused;
  const char *refusal;
} gd_replay_req;

/* The one replay path: checks rq against ds (its flag slot in range, its
 * seq above the highest the worker took on that slot), notes the seq,
 * resolves the bindings against the worker's view of ds's regions
 * (exec_bind) and runs the replay (exec_run). Once the slot and seq are
 * sound, done = seq is written whatever happens, but for a replay not
 * started because graphd is stopping (*not_started). Counts the outcome in
 * *t; *ran_out (may be NULL) gets what exec_run set (captured, its time).
 * Returns 0 or a negated status with err saying why. */
int exec_replay(gd_device *d, gd_worker *w, gd_session_stream *ds, const gd_replay_req *rq,
                gd_replay_tally *t, gd_replay_exec *ran_out, bool *not_started, char *err,
                size_t errlen);

/* Runs one replay: the device stage and the capture on first use, the
 * budget, then on the session stream the wait for ready >= seq, the
 * capture and done = seq. Whatever happens once the flags are known,
 * done = seq is written after the work ordered before it; but for a replay
 * given up before it started because graphd is stopping (*not_started):
 * that one writes nothing, so that the next daemon may run it under the
 * same ordering. Returns 0 or a negated status with err saying why. */
int exec_run(gd_device *d, gd_worker *w, gd_replay_exec *ex, bool *not_started, char *err,
             size_t errlen);

/* done = seq on slot of ds, in stream order (from the host when the
 * stream cannot take it): a replay refused after its flags were known
 * releases what the client's stream waits for. */
void exec_write_done(gd_device *d, gd_session_stream *ds, uint32_t slot, uint64_t seq);

/* Looks a session's region up by id; NULL when it has none. */
typedef const gd_region_map *(*gd_region_lookup)(void *table, uint32_t id);

/* The checks of a replay's bindings, and their resolution: each of the n
 * bindings names a slot of p that is not scratch, once, with the slot's
 * size, and a range inside a region that find(table) knows, imported in
 * `epoch` (the device's now; dev names the device in the message); every
 * staged slot that is not scratch is bound. bind has p->nslots entries,
 * zeroed; on success each bound one holds its address (the region's plus
 * the offset) and bytes. Returns 0, or a negated status with err saying
 * why. Pure: no session, no device. */
int exec_bind(const gd_program *p, gd_region_lookup find, void *table, uint64_t epoch, int dev,
              const gd_bind_req *b, size_t n, gd_bound *bind, char *err, size_t errlen);

#endif
