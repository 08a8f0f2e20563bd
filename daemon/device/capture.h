/* Captures: a program made real on one device. A capture owns one staging
 * allocation sub-allocated into its slots, a graph built node by node from
 * the program's steps (keeping every node handle), its executable graph,
 * and a last-use event that orders replays from different sessions on the
 * shared staging. Two devices never share any of it: each device has its
 * own set (d->caps), indexed by the program's dense index.
 *
 * A program that keeps nothing in the daemon from one replay to the next
 * (no scratch slot, every slot staged) may get more instances of its
 * capture, each a capture of its own (staging, graphs, event), built when
 * another stream replays it while the instances it has are busy: sessions
 * replaying it at once then run side by side instead of one after the
 * other. The first instance is the capture the set holds and keeps the
 * totals (replays, users, last use); eviction takes all of them.
 *
 * This file builds, queues and frees captures; the order a replay follows
 * around them (ready flag, capture, done flag) is execute.c's, and which
 * captures to free is evict.c's.
 *
 * DESIGN: worker thread only. */
#ifndef GRAPHD_CAPTURE_H
#define GRAPHD_CAPTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/backend/backend.h"
#include "device.h"
#include "binding.h"
#include "daemon/base/registry.h"

#define GD_CAPTURE_PIDS 16
#define GD_CAPTURE_EXECS 4      /* executable graphs per capture, one per binding set */
#define GD_CAPTURE_RECENT 8     /* binding sets remembered to see one come back */
#define GD_CAPTURE_INSTANCES 32 /* instances of a program that keeps no state, at most */

/* One executable graph of a capture, and where its copy nodes point now.
 * A capture keeps a few, so that replays that alternate between binding
 * sets (a loop over two or three sets of buffers) find one already
 * pointing at theirs and update no node. */
typedef struct gd_exec {
  gd_graph_exec exec;
  uint64_t *node_src, *node_dst;  /* per slot: what the copy-in / copy-out node points at */
  bool *in_outside, *out_outside; /* per slot: the node is off; the copy runs outside */
  uint64_t used_ns;               /* its last replay */
  /* Direct mode: per slot, where its kernel nodes point now; per step, the
   * parameters it was last given (allocated when first re-pointed). */
  uint64_t *direct_addr;
  uint8_t **param_buf;
  void ***kparams;
} gd_exec;

typedef struct gd_capture {
  const gd_regprog *prog;
  uint32_t mode; /* how it runs: staged, staged_ex or direct (auto chose one) */
  /* Direct mode: per slot, whether the kernels use the bound buffer itself
   * (else a staged slot is copied outside the graph); per step, the kernel
   * node to re-point when a direct slot it uses moves (a launch at any
   * depth, or graphd's fill or copy kernel for a memset or copy step; for
   * a loop or a branch, the node that reads its condition word before it,
   * with loop_reader the one at the end of a loop's body and cond_handle
   * the condition); and the addresses the graph was built with. */
  bool *direct;
  gd_node *step_node;
  gd_node *loop_reader;
  uint64_t *cond_handle;
  uint64_t *built_direct;
  uint32_t direct_nodes;
  gd_staging staging;
  uint64_t *slot_addr; /* per slot: device address in staging */
  gd_graph graph;
  gd_exec execs[GD_CAPTURE_EXECS];
  uint32_t nexecs;
  uint64_t recent[GD_CAPTURE_RECENT]; /* keys of the latest binding sets */
  uint32_t recent_next;
  uint64_t *built_src, *built_dst; /* per slot: where the graph's copy nodes were made to point */
  /* Memory the graph's copy nodes were made to point at was unmapped since:
   * the driver reads those addresses when it instantiates the graph, so no
   * further executable graph is made from it (one is re-pointed instead). */
  bool template_stale;
  gd_node *in_node;    /* per slot: copy-in node (staged mode) or NULL */
  gd_node *out_node;   /* per slot: copy-out node (staged mode) or NULL */
  uint64_t repoints;   /* copy nodes re-pointed, over all replays */
  uint8_t **param_buf; /* per step: parameter bytes (launches, fill and copy kernels) */
  void ***kparams;     /* per step: kernelParams */
  gd_event last_use;
  bool has_event;
  gd_stream last_stream; /* the stream of the last replay */
  uint64_t queued;       /* replays queued on this instance */
  /* The first instance only: the others, and whether to add none (the
   * program keeps state, or one could not be built or would not fit the
   * budget). */
  struct gd_capture *more[GD_CAPTURE_INSTANCES - 1];
  uint32_t nmore;
  bool no_more;  /* (a program that keeps no state) */
  bool stateful; /* the program keeps state: an instance per session */
  /* Each instance: the session whose state it holds (a program that keeps
   * state; 0: none), whether its daemon-owned slots are to be zeroed
   * before its next replay (new, or passed to another session), and the
   * user its last replay ran for. */
  uint64_t owner;
  bool fresh;
  uint32_t last_uid;
  uint32_t uid;     /* the user it was built for: its staging counts to that user's share */
  uint64_t replays; /* the first instance: over all of them */
  /* The first instance: the worker's time to queue one replay of it
   * (capture_enqueue), a moving mean over all instances (0 before the
   * first); and whether the log said its replays are too costly to hold
   * for their ready writes (ring_replay.c). */
  uint64_t queue_ns;
  bool hold_cost_told;
  uint32_t nodes;
  uint64_t last_queued_ns;
  uint32_t pids[GD_CAPTURE_PIDS];     /* the first client processes that replayed it */
  uint32_t pid_uids[GD_CAPTURE_PIDS]; /* ... and the user each ran as */
  uint32_t npids;
  /* Every user whose processes replayed it, however many processes and
   * users they were: who may evict it (evict.c). users_lost: a user could
   * not be added (no memory), so none but an admin may evict it. */
  uint32_t *users;
  uint32_t nusers, users_cap;
  bool users_lost;
  uint32_t generation;      /* 1 for the program's first capture on the device, +1 per re-capture */
  uint64_t created_unix_ms; /* when it was built */
} gd_capture;

/* The next capture on d from index *i on (start with *i = 0), or NULL at
 * the end; *i moves past it. */
gd_capture *capture_next(gd_device *d, uint32_t *i);

/* The capture of p on d, or NULL. */
gd_capture *capture_find(gd_device *d, const gd_regprog *p);

/* Whether this replay, which captures p, binds p's unstaged inputs (the
 * capture copies them once, from it); 0, or INVALID_ARGUMENT with err. */
int capture_check_unstaged(const gd_regprog *p, const gd_bound *bind, char *err, size_t errlen);

/* Builds p's capture on d: staging, the graph (its copy nodes pointing at
 * this replay's bindings), instantiated and uploaded on s, and its event.
 * The capture is not yet in d's set. */
int capture_build(gd_device *d, const gd_regprog *p, const gd_bound *bind, gd_stream s,
                  gd_capture **out, char *err, size_t errlen);

/* Puts c in d's set, or takes it out again (without freeing it). */
int capture_insert(gd_device *d, gd_capture *c);
void capture_remove(gd_device *d, gd_capture *c);

/* Records that c's program was captured on d (c's generation and creation
 * time); returns whether it had been before (a re-capture). */
bool capture_mark_built(gd_device *d, gd_capture *c);

/* The registry frees p: its capture on d, if any, is dropped (the size
 * of its staging in *staging_bytes; returns whether there was one), and
 * everything d keeps under p's index is forgotten, so that the index can
 * serve another program. */
bool capture_forget_program(gd_device *d, const gd_regprog *p, uint64_t *staging_bytes);

/* Memory at [ptr, ptr + bytes) is about to be unmapped: captures whose
 * graph was made pointing into it stop instantiating it (template_stale). */
void capture_forget_memory(gd_device *d, uint64_t ptr, uint64_t bytes);

/* Adds the GPU time of the sampled replays read since the last call, and
 * how many they were, to *ns and *n (gpusample.h: which replays, and when
 * a sample is read). */
void capture_take_gpu_time(gd_device *d, uint64_t *ns, uint64_t *n);
/* Adds the worker's time in the driver's graph launches since the last
 * take to *ns (worker thread). */
void capture_take_launch_time(gd_device *d, uint64_t *ns);

/* Reads the samples that have finished, without waiting (worker). */
void capture_poll_gpu_time(gd_device *d);

/* Frees a capture that is not in the set. */
void capture_free(gd_device *d, gd_capture *c);

/* Queues one replay of c on s for a process (pid, running as uid) of
 * session `session`. A program that keeps state runs on the session's own
 * instance (else one no session holds, else a new one; RESOURCE_EXHAUSTED
 * when none can be had). Any other runs on the instance s used last, else
 * one that is idle, else a new one while the budget has room, else the
 * least recently used (then after its last replay, from whichever stream).
 * An instance's daemon-owned slots are zeroed when it is new or passes to
 * another session, its temporaries when it passes to another user. Then
 * it copies in (the unstaged inputs too when `first`), launches, copies
 * out, and records the instance's last-use event; the process joins c's
 * processes (the first GD_CAPTURE_PIDS are kept) and uid its users (all
 * are kept). *used (may be NULL) is the instance the replay went to. */
int capture_enqueue(gd_device *d, gd_capture *c, gd_stream s, const gd_bound *bind, bool first,
                    uint32_t pid, uint32_t uid, uint64_t session, gd_capture **used, char *err,
                    size_t errlen);

/* The session ended: the instances that held its state hold no one's, and
 * go to the next session that needs one, zeroed. */
void capture_release_session(gd_device *d, uint64_t session);

/* Frees idle extra instances (not a capture's first, nor one a session
 * holds), least recently used first, of every capture but keep, until
 * `want` bytes are freed or none is left. Returns the bytes freed. */
uint64_t capture_trim(gd_device *d, uint64_t want, const gd_capture *keep);

/* Adds the staging bytes capture_trim freed since the last take to *bytes. */
void capture_take_trimmed(gd_device *d, uint64_t *bytes);

/* c's staging bytes, over all its instances. */
uint64_t capture_staging_bytes(const gd_capture *c);

/* The staging bytes every capture on d holds, over all their instances,
 * but for `except` (NULL: none). */
uint64_t capture_held_bytes(gd_device *d, const gd_capture *except);

/* How many instances c has (1 and up). */
uint32_t capture_instances(const gd_capture *c);

/* The executable graphs of c over all its instances (what ListCaptures
 * shows as its graphs). */
uint32_t capture_graphs(const gd_capture *c);

/* The device's instances and executable graphs, over every capture. */
void capture_count(gd_device *d, uint64_t *instances, uint64_t *graphs);

/* True while a replay queued on any instance of c has not finished. */
bool capture_busy(gd_device *d, const gd_capture *c);

/* True while any capture on d has a replay that may still run. */
bool capture_any_busy(gd_device *d);

/* Frees c, which is in d's set, with its instances: in stream order their
 * last replays, from any session, are done before anything is freed; its watched waits are
 * forgotten; then modules that no remaining capture uses are unloaded. */
void capture_drop(gd_device *d, gd_capture *c);

/* Frees every capture (device reset, worker exit). */
void capture_close_all(gd_device *d);

#endif
