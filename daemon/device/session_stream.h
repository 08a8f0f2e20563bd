/* A data session's half on its device: the session stream on which its
 * replays run, and the flag page shared with the client, through which the
 * client's streams and the session stream order each other (see
 * docs/design.md, "Ordering", and graphd/protocol.h for the layout).
 *
 * DESIGN: made on the loop thread (session_stream_new) when the session opens,
 * then filled and used by the device's worker; the loop only reads
 * session_id and sets client_gone. session_stream_release() touches only the
 * shared page and may run on any thread while the session holds it.
 * Two holders keep it: the session, until its end job ran or was refused,
 * and the device's list while the flag page is mapped. At shutdown a
 * refused end job (loop thread) and the stopping worker's teardown
 * (session_stream_close_all) let go of it in either order; the last one frees. */
#ifndef GRAPHD_SESSION_STREAM_H
#define GRAPHD_SESSION_STREAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/backend/backend.h"
#include "device.h"
#include "binding.h"
#include "submit_ring.h"
#include "graphd/protocol.h"

/* Replays' bindings kept as sent and as resolved (see gd_session_stream's
 * `resolved`). */
#define GD_RESOLVED_KEPT 4
typedef struct gd_resolved {
  const gd_regprog *prog; /* NULL: nothing kept */
  uint64_t regions_gen, epoch;
  uint64_t used; /* the stream's resolved_clock at its last use */
  gd_bind_req *b;
  uint32_t n, b_cap;
  gd_bound *bind;
  uint32_t bind_cap;
} gd_resolved;

typedef struct gd_session_stream {
  uint64_t session_id;
  gd_stream stream;
  bool has_stream;
  gd_flags_map flags;
  bool has_flags;
  uint32_t nslots;
  _Atomic bool client_gone; /* set by the loop when the session closes */
  bool cut_off;             /* released as hung; its waits are not watched */
  uint64_t epoch;           /* the device epoch its stream and flags were made in */
  /* In the device's session streams while its flag page is mapped. */
  struct gd_session_stream *prev, *next;
  atomic_int holders; /* the session, and the device's list while mapped */
  /* The worker's own view of the session, which both front ends of the replay
   * path are checked against: */
  struct gd_stream_region *regions; /* the regions imported, by the loop's ids (uthash) */
  gd_submit_ring *ring;             /* NULL until RegisterRing; unmapped with the flag page */
  uint64_t *seen;                   /* per flag slot: the highest seq the worker took */
  uint32_t *used;                   /* the slots with a seq seen, for the in-flight count */
  uint32_t nused;
  uint64_t regions_gen; /* bumped whenever `regions` changes */
  /* The last few replays' bindings, as sent and as resolved: a replay of
   * one of their programs that names the same ranges of the same regions,
   * with the view and the device epoch unchanged, takes them as they are
   * (execute.c). A few, not one: a step that calls two programs in turn
   * (MJX's scan step), or one over two sets of buffers in turn (a scan's
   * carry), repeats with a period of two to four. */
  gd_resolved resolved[GD_RESOLVED_KEPT];
  uint64_t resolved_clock; /* stamps their use, for the least recently used */
  gd_bind_req *entry_b;    /* the ring's bindings of the entry at hand */
  uint32_t entry_b_cap;
} gd_session_stream;

/* A fresh session stream for a data session. Loop thread. NULL when out of memory. */
gd_session_stream *session_stream_new(uint64_t session_id);

/* The session lets go of ds without ending it on the device (its end job
 * was refused: the worker is stopping or gone). Any thread. */
void session_stream_drop(gd_session_stream *ds);

/* Makes the session stream and maps the flag page of `slots` slots (fd is
 * not closed here). */
int session_stream_map_flags(gd_device *d, gd_session_stream *ds, int fd, uint32_t slots, char *err,
                             size_t errlen);

/* The device's first session with a flag page mapped (then ds->next);
 * NULL when none. */
gd_session_stream *session_stream_first(gd_device *d);

/* A count that changes whenever a session of d maps or unmaps its ring
 * (ring_replay.c keeps what it derives from the set of rings until it does). */
uint64_t session_stream_rings_gen(gd_device *d);
void session_stream_rings_changed(gd_device *d);

/* The worker's view of the session's regions: a region imported under
 * the loop's id, and one let go. Either forgets the last replay's
 * resolution. */
int session_stream_region_add(gd_session_stream *ds, uint32_t id, const gd_region_map *m);
void session_stream_region_remove(gd_session_stream *ds, uint32_t id);

/* The mapping of region id in ds's view; NULL when it has none. */
const gd_region_map *session_stream_region_find(const gd_session_stream *ds, uint32_t id);

/* At least n entries of *buf (of *cap); false when out of memory (*buf is
 * kept). */
bool session_stream_reserve(void **buf, uint32_t *cap, uint32_t n, size_t size);

/* Whether `seq` may come next on slot: not 0, and at most
 * GRAPHD_SEQ_MAX_STEP above the last seq taken there, cyclically (a slot's
 * first seq may be any other). */
bool session_stream_seq_next(const gd_session_stream *ds, uint32_t slot, uint64_t seq);

/* Records that the worker took replay `seq` on slot (session_stream_seq_next
 * allowed it): the slot's last seq from now on. */
void session_stream_saw(gd_session_stream *ds, uint32_t slot, uint64_t seq);

/* Replays taken on the session's slots whose done word is still behind.
 * Any thread (the loop asks it for --max-inflight-replays). */
uint64_t session_stream_inflight(const gd_session_stream *ds);

/* Word `word` (GRAPHD_FLAG_WORD_*) of flag slot `slot`: the daemon's host
 * mapping, and its device address. */
static inline volatile uint64_t *session_stream_word(const gd_session_stream *ds, uint32_t slot,
                                                     uint32_t word) {
  return ds->flags.host + (uint64_t)slot * GRAPHD_FLAG_WORDS_PER_SLOT + word;
}
static inline uint64_t session_stream_word_dev(const gd_session_stream *ds, uint32_t slot,
                                               uint32_t word) {
  return ds->flags.dev + (uint64_t)slot * GRAPHD_FLAG_STRIDE + 8u * word;
}

/* Releases every stream wait on one word of each flag slot by writing it
 * from the host: the ready word to the last seq the worker took on the
 * slot (unless it is there already), the others well ahead of what the
 * page held. The values written go to `written` (nslots of them) unless it
 * is NULL. Any thread. */
void session_stream_release(gd_session_stream *ds, uint32_t word, uint64_t *written);

/* Waits for the session stream to drain (before its regions are unmapped). */
void session_stream_sync(gd_device *d, gd_session_stream *ds);

/* Ends the session on the device. When the client died its stream may
 * wait on ready flags that will never come: they are released from the
 * host first; then the stream drains, the session's imports (maps) are
 * released, the flags unmapped and ds freed (it may be NULL). A stream
 * that would not drain leaves the device wedged (d->wedged) and returns
 * -GRAPHD_UNAVAILABLE: the worker resets the device next. */
int session_stream_end(gd_device *d, gd_session_stream *ds, gd_region_map *maps, size_t nmaps);

/* The worker is stopping: destroys the stream and unmaps the flag page of
 * every session whose end did not run (a job queued as graphd shuts down
 * is refused). Each is freed here or by its refused end job's completion,
 * whichever comes last. */
void session_stream_close_all(gd_device *d);

#endif
