/* Captures and replays on a device (DESIGN.md, Decisions 6 to 8).
 *
 * A capture is a program made real on one device: one staging allocation
 * sub-allocated into its slots, a graph built node by node from the
 * program's steps (keeping every node handle), its executable graph, and a
 * last-use event that orders replays from different sessions on the shared
 * staging. Two devices never share any of it: captures hang off their
 * worker.
 *
 * DESIGN: worker thread only. The loop thread resolves a Replay request to
 * device addresses (replay.c) and hands it over as a job; this file runs it
 * in the order of Decisions 7 on the session's stream. */
#ifndef GRAPHD_CAPTURE_H
#define GRAPHD_CAPTURE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "registry.h"
#include "worker.h"

#define GD_FLAG_STRIDE 32u /* bytes per (ready, done) pair in the flag page */
#define GD_MAX_FLAG_SLOTS 1024u

/* The worker's half of a data session: its stream and flag mapping. Made
 * on the loop thread (zeroed), filled and freed by the worker. */
typedef struct gd_wsess {
  uint64_t session_id;
  gd_stream stream;
  bool has_stream;
  gd_flags_map flags;
  bool has_flags;
  uint32_t nslots;
  _Atomic int client_gone; /* set by the loop when the session closes */
  bool cut_off;            /* worker: released as hung; its waits are not watched */
  uint64_t epoch;          /* worker: the device epoch its stream and flags were made in */
} gd_wsess;

typedef struct gd_bound {
  bool bound;
  uint64_t addr;  /* device address of the client's bytes */
  uint64_t bytes;
} gd_bound;

/* One replay, resolved. */
typedef struct gd_replay_args {
  const gd_prog *prog;
  gd_wsess *ws;
  uint32_t stream_slot;
  uint64_t seq;
  gd_bound bind[GD_MAX_SLOTS];
  double ready_timeout_s;
  uint32_t client_pid;
  uint64_t epoch;                 /* the device epoch the bindings were resolved in */
  /* Set by the worker: */
  bool captured;
  bool recaptured;
  uint64_t capture_ns;
  uint64_t staging_bytes;
  uint32_t budget_evicted;        /* captures the budget evicted to fit this one */
  uint64_t budget_evicted_bytes;
} gd_replay_args;

/* Runs one replay. Whatever happens once the flags are known, done = seq is
 * written after the work ordered before it (Decisions 7). */
int capture_replay(gd_worker *w, gd_replay_args *a, char *err, size_t errlen);

/* Maps the session's flag page (fd is not closed here). */
int capture_flags_register(gd_worker *w, gd_wsess *ws, int fd, uint32_t slots, char *err,
                           size_t errlen);

/* Releases every stream wait on one word of each of the session's flag
 * slots (GD_FLAG_READY or GD_FLAG_DONE) by writing it from the host; the
 * values written go to `written` (nslots of them) unless it is NULL. Any
 * thread: it touches only the shared page, which stays mapped while the
 * session holds ws. */
#define GD_FLAG_READY 0u
#define GD_FLAG_DONE 1u
void capture_release_flags(gd_wsess *ws, uint32_t word, uint64_t *written);

/* True while a replay queued on the device may still run (its capture's
 * last-use event has not completed). */
int capture_busy(gd_worker *w);

/* Waits for the session's stream to drain (before unmapping its regions). */
void capture_session_sync(gd_worker *w, gd_wsess *ws);

/* Ends the worker's half of a session. When the client died its stream may
 * wait on ready flags that will never come: release them from the host
 * first, then drain the stream, unmap the session's regions (maps) and its
 * flags, and free ws (which may be NULL). */
void capture_session_end(gd_worker *w, gd_wsess *ws, gd_region_map *maps, size_t nmaps);

/* The head-of-line policy where ready waits are queued on the device
 * (Decisions 7): the worker checks the waits it queued, from the host.
 * A wait older than the ready timeout while another session's replay of
 * the same capture waits behind it is released from the host, and its
 * session's id is written to cut[] (at most ncut) for the loop to close.
 * Returns how many; *pending says whether waits are still watched (the
 * worker then wakes up periodically). */
int capture_watch(gd_worker *w, uint64_t *cut, int ncut, int *pending);

/* What list and evict report about one capture. */
#define GD_CAPTURE_PIDS 16
typedef struct gd_capture_info {
  uint8_t program_id[GD_ID_LEN];
  uint32_t device;
  uint32_t mode;
  uint64_t staging_bytes;
  uint32_t nodes;
  uint64_t replays;
  uint64_t idle_ms;
  uint32_t pids[GD_CAPTURE_PIDS];
  uint32_t npids;
  bool busy;
} gd_capture_info;

/* Which captures an eviction takes (all given selectors must match). */
typedef struct gd_evict_sel {
  uint8_t prefix[GD_ID_LEN];
  uint32_t prefix_nibbles;  /* 0: any program */
  uint32_t client_pid;      /* 0: any */
  uint64_t idle_ms;
  bool all;
  bool dry_run;
  bool admin;               /* the requester may evict shared captures */
  uint32_t requester_pid;
} gd_evict_sel;

/* Every capture on w's device; *out is malloc'd (n entries). */
int capture_list(gd_worker *w, gd_capture_info **out, size_t *n);

/* Evicts the selected captures: waits for each one's last replay (by its
 * event, in stream order), frees its executable graph, graph and staging,
 * and unloads modules no remaining capture uses. A non-admin requester may
 * only take captures its own process alone used: another's gives
 * PERMISSION_DENIED naming it, and nothing is evicted. With dry_run,
 * reports and changes nothing. */
int capture_evict(gd_worker *w, const gd_evict_sel *sel, gd_capture_info **out, size_t *n,
                  uint64_t *bytes, char *err, size_t errlen);

/* Frees every capture (worker exit). */
void capture_close_all(gd_worker *w);

#endif
