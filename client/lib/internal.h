/* libgraphd internals shared by its source files. Not installed. */
#ifndef GRAPHD_CLIENT_INTERNAL_H
#define GRAPHD_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "graphd/frame.h"
#include "graphd.pb-c.h"
#include "graphd/graphd.h"
#include "graphd/protocol.h"

#define GD_CLIENT_DEFAULT_REGION_CAP 4096 /* the daemon takes 4096 a session */
#define GD_CLIENT_MAX_FRAME (64u << 20)   /* the largest reply frame taken */

/* One cached region registration, keyed by the allocation's base. */
typedef struct gd_region_entry {
  uint64_t base;
  uint64_t size;
  uint64_t identity; /* CU_POINTER_ATTRIBUTE_BUFFER_ID, or the host alloc's serial */
  uint32_t region_id;
  uint64_t last_use;  /* LRU clock */
  int kind;           /* wire RegionKind */
  uint64_t import_ns; /* reported once, by the call that registered it */
  uint64_t checked;   /* the client's check_serial when its allocation was last seen live */
} gd_region_entry;

/* A graphd_host_alloc allocation. */
typedef struct gd_host_alloc {
  void *ptr;
  uint64_t size;
  int fd;
  uint64_t serial;
} gd_host_alloc;

typedef struct gd_seq_range {
  uint64_t lo, hi; /* the seqs above lo, up to hi */
} gd_seq_range;
#define GD_LOST_RANGES 4

/* A handle's flag page: one 4 KiB page of GRAPHD_FLAG_STRIDE-byte slots. */
#define GD_CLIENT_FLAG_PAGE_BYTES 4096
#define GD_CLIENT_FLAG_SLOTS (GD_CLIENT_FLAG_PAGE_BYTES / GRAPHD_FLAG_STRIDE)
_Static_assert(GD_CLIENT_FLAG_SLOTS <= GRAPHD_MAX_FLAG_SLOTS, "flag page too large");

/* The handle's flag page, shared with the daemon (docs/design.md, "Ordering"). */
typedef struct gd_flag_page {
  int fd;
  volatile uint64_t *host;                       /* 4 KiB */
  uint64_t dev;                                  /* device address when registered with CUDA */
  bool cuda;                                     /* registered with cuMemHostRegister */
  _Atomic uint64_t issued[GD_CLIENT_FLAG_SLOTS]; /* highest seq sent per slot */
  bool used[GD_CLIENT_FLAG_SLOTS];               /* guarded by the handle's lock */
  /* The done words as they were when the daemon was first seen gone,
   * before any release from here (guarded by the watcher's lock), so that
   * a reconnect can tell whether the daemon finished what it had taken. */
  bool snapped;
  uint64_t hangup_done[GD_CLIENT_FLAG_SLOTS];
  /* Guarded by the handle's lock, cleared by a reconnect: per slot, a seq
   * the gone daemon never ran (unsent, or answered not started), and a seq
   * already reported as cut off; the reconnect's check leaves both out. */
  uint64_t unrun[GD_CLIENT_FLAG_SLOTS];
  uint64_t reported[GD_CLIENT_FLAG_SLOTS];
  /* Per slot, the seqs that daemons which went away had been sent but
   * never finished, as ranges (lo, hi], the newest GD_LOST_RANGES of them.
   * Kept across reconnects: the release wrote their done words, so only
   * these tell graphd_stream_wait that such a replay never ran. Guarded by
   * the watcher's lock. */
  gd_seq_range lost[GD_CLIENT_FLAG_SLOTS][GD_LOST_RANGES];
  uint8_t lost_next[GD_CLIENT_FLAG_SLOTS];
  _Atomic bool any_lost; /* set with the first range: until then a wait takes no lock */
} gd_flag_page;

/* Fills a sized record (see "Growing the ABI" in graphd.h) of `size` bytes
 * at out from the library's full record rec of rec_size bytes: what both
 * know copied, the rest zeroed, and its leading uint32_t size member set
 * to the bytes filled, which it returns. size is at least 4. */
static inline uint32_t gd_record_fill(void *out, size_t size, const void *rec, size_t rec_size) {
  uint32_t filled = (uint32_t)(size < rec_size ? size : rec_size);
  memset(out, 0, size);
  memcpy(out, rec, filled);
  memcpy(out, &filled, sizeof filled);
  return filled;
}

/* Word `word` (GRAPHD_FLAG_WORD_*) of flag slot `slot`: its address on the
 * host, and as the device sees it. */
static inline volatile uint64_t *gd_flag_word(const gd_flag_page *f, uint32_t slot, int word) {
  return f->host + (size_t)slot * GRAPHD_FLAG_WORDS_PER_SLOT + word;
}
static inline uint64_t gd_flag_word_dev(const gd_flag_page *f, uint32_t slot, int word) {
  return f->dev + (uint64_t)slot * GRAPHD_FLAG_STRIDE + sizeof(uint64_t) * (uint64_t)word;
}

typedef struct gd_order gd_order;

/* The session's submission ring (ring.c; graphd/protocol.h). */
typedef struct gd_ring {
  int fd, doorbell;
  volatile graphd_ring_header *hdr;
  volatile graphd_ring_sqe *sq;
  volatile graphd_ring_cqe *cq;
  uint32_t entries;
  uint64_t bytes;
  uint64_t tail;      /* slots published */
  uint64_t cq_head;   /* completions reaped */
  uint8_t (*ids)[32]; /* programs named to the session, by handle */
  uint32_t nids, ids_cap;
  uint32_t max_bindings; /* one entry's, in its slots: the daemon's word and the ring's size */
  uint64_t issued;       /* entries published */
  uint64_t completed, failed;
  uint64_t gen; /* the handle's count of rings made, this one included */
  /* The first failure not yet reported. */
  bool has_err;
  graphd_status err_status;
  uint64_t err_seq;
  uint32_t err_slot;
  char err_text[240];
} gd_ring;

struct graphd_stream {
  graphd_client *c;
  void *cu_stream;
  uint32_t slot;
  uint64_t seq;
  uint64_t ring_seq;  /* the last async replay's seq */
  uint64_t ring_tail; /* the ring's tail once it was published */
  uint64_t ring_gen;  /* ... in the ring of this generation */
};

/* How a call that got no answer from the daemon failed (the handle's
 * `fail`), which decides whether it may be sent again to a new daemon. */
enum gd_call_fail {
  GD_FAIL_NONE = 0,    /* answered (OK or an error), or failed here */
  GD_FAIL_UNSENT,      /* the daemon was gone before the request reached it */
  GD_FAIL_NOT_STARTED, /* the daemon is stopping and answered that it did not start it */
  GD_FAIL_LOST,        /* sent, and the daemon went away without an answer: it may have run */
};

struct graphd_client {
  pthread_mutex_t lock;
  int fd;
  int timeout_ms;
  /* What a new session needs, from graphd_connect. */
  int kind; /* graphd_session_kind */
  uint8_t device_uuid[16];
  char client_name[129];
  int reconnect_ms;  /* guarded by lock: the bound on waiting for a new daemon; 0: off */
  bool reconnecting; /* guarded by lock: inside the reconnect (no retry within) */
  int fail;          /* guarded by lock: enum gd_call_fail of the last call */
  /* Set by client.c: waits for a daemon on the socket and gives the handle
   * a new session like the old one (client.c, gd_client_reconnect). Lock
   * held. A hook, so that call.c and replay.c below it can ask. */
  graphd_status (*reconnect)(struct graphd_client *c);
  bool broken;           /* guarded by lock: stream state unknown */
  uint64_t next_request; /* guarded by lock */
  uint64_t session_id;
  uint32_t max_frame; /* the daemon's request cap (HelloReply); 0: unknown */
  graphd_device_info device;
  bool has_device;
  char socket_path[108];
  gd_frame_reader rd; /* guarded by lock */
  /* The last failure's text and status. Written with both lock and
   * err_lock held (gd_client_set_err, gd_client_clear_err); read under
   * either: inside a call under lock, by graphd_last_error* under err_lock,
   * which no call holds for longer than a copy. */
  pthread_mutex_t err_lock;
  char err[GRAPHD_ERRMAX];
  graphd_status err_status;
  uint64_t serial; /* unique for the process's life: names the handle in a thread's last error */
  pid_t owner;     /* the process that connected: any other (a child of fork) only forgets */
  /* Region cache, guarded by lock. */
  gd_region_entry *regions;
  uint32_t nregions, region_cap_alloc;
  uint32_t region_cap; /* LRU cap */
  uint64_t lru_clock;
  /* One batch of lookups (a replay's bindings): an entry whose allocation
   * was seen live in this batch is not asked about again (gd_region_batch). */
  uint64_t check_serial;
  gd_host_alloc *host; /* guarded by lock */
  uint32_t nhost, host_cap;
  uint64_t host_serial;
  gd_flag_page *flags;    /* created with the first stream; freed at close */
  gd_ring *ring;          /* guarded by lock: made by the first async replay */
  struct gd_order *order; /* guarded by lock: this GPU's order (ring.c), once looked up */
  uint64_t rings_made;    /* guarded by lock */
  uint32_t ring_entries;  /* guarded by lock: the size of the ring to make */
  bool ring_off;          /* guarded by lock: the daemon has no rings: async goes sync */
  uint8_t (*synced)[32];  /* guarded by lock: programs graphd_registry_sync gave this handle */
  uint32_t nsynced, synced_cap;
  uint32_t *busy; /* guarded by lock: devices the last list or evict could not reach in time */
  size_t nbusy;
  atomic_bool dead;                 /* the daemon hung up (seen by the watcher or a call) */
  _Atomic uint64_t ring_wait_ns;    /* async replays' time waiting for ring space */
  int watch_fd;                     /* dup of fd for the watcher, -1 when not watched */
  struct graphd_client *watch_next; /* guarded by the watcher's lock */
  int64_t rewrite_until_us;         /* watcher: when it stops rewriting a dead handle's releases */
};

/* --- What the files give each other, in layers: each file uses only those
 * listed before it, so that none reaches back.
 *   trace.c    the $GRAPHD_CLIENT_DEBUG trace
 *   watcher.c  releasing stream waits from the host; the watcher thread
 *   call.c     one request, one reply; the handle's error text
 *   region.c   regions and host allocations
 *   ring.c     the submission ring of asynchronous replays
 *   replay.c   streams, replays and the flag page
 *   client.c   connect and close; ping and status
 * registry.c and captures.c stand on call.c; program.c and metrics.c (the
 * device counters' list) on none; client.c, which reconnects, on all of
 * them. */

/* trace.c: CLOCK_MONOTONIC in microseconds and in milliseconds. */
int64_t gd_mono_us(void);
int64_t gd_mono_ms(void);
/* trace.c: with $GRAPHD_CLIENT_DEBUG=1, libgraphd traces its stream
 * releases and failures on stderr (for hunting hangs in a client
 * process). */
void gd_client_debug(const graphd_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* watcher.c: starts watching c's socket for the daemon's hang-up (c has a
 * flag page). False when the watcher cannot start. */
bool gd_watch_add(graphd_client *c);

/* Stops watching c; after it, the watcher no longer touches c's page. */
void gd_watch_remove(graphd_client *c);

/* A child of fork starts with no watcher and an empty list (the parent's
 * thread is not in the child): watcher.c resets its state at fork. */

/* Writes every issued seq into its done word from the host (the daemon is
 * gone), and has the watcher write them again until the streams are past.
 * The first release on a page (here or the watcher's) first keeps the done
 * words as they were (gd_flag_page.hangup_done). Safe from any thread. */
void gd_client_release_streams(graphd_client *c);

/* Whether the gone daemon left a replay it had taken unfinished: a slot
 * whose done word, when it was first seen gone, was not what it issued
 * (less the seqs in unrun and reported). Fills *slot, *done and *want for
 * the first such slot. Handle's lock held. */
bool gd_flags_cut_off(graphd_client *c, uint32_t *slot, uint64_t *done, uint64_t *want);

/* Whether a daemon that went away had been sent replay `seq` of `slot`
 * and never finished it (its done word was below seq when the daemon was
 * first seen gone); *done gets what it had finished there. Safe from any
 * thread. */
bool gd_flags_lost(graphd_client *c, uint32_t slot, uint64_t seq, uint64_t *done);

/* What every slot issued so far counts as reported: gd_flags_cut_off finds
 * it no more. Handle's lock held. */
void gd_flags_mark_reported(graphd_client *c);

/* Waits up to ms for every slot's stream to pass what it issued; with
 * rerelease, writing the done words again meanwhile (the watcher's work,
 * for a handle it no longer lists). True when every stream is past. */
bool gd_flags_wait_passed(graphd_client *c, int ms, bool rerelease);

/* Traces the words of every slot in use, under the heading `what`. */
void gd_flags_trace(graphd_client *c, const char *what);

/* call.c: sets c's error text, and the calling thread's last error (the
 * handle and the text, for graphd_last_error_r); returns st. */
graphd_status gd_client_set_err(graphd_client *c, graphd_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Empties c's error text (a call that succeeded). Lock held. */
void gd_client_clear_err(graphd_client *c);

/* Whether c was made by another process: this one is a child of fork that
 * inherited it, and must touch nothing it shares with the parent. */
bool gd_client_foreign(const graphd_client *c);

/* The refusal of a call on an inherited handle: sets the calling thread's
 * last error only (a parent's thread may have held c's locks at the fork)
 * and returns FAILED_PRECONDITION. */
graphd_status gd_client_foreign_err(const graphd_client *c);

/* The top of a public call on c: an inherited handle is refused before any
 * of its locks is taken. */
#define GD_OWNED(c)                                                                                \
  do {                                                                                             \
    if (gd_client_foreign(c)) return gd_client_foreign_err(c);                                     \
  } while (0)

/* One request, one reply; caller holds c->lock. On GRAPHD_OK *out holds the
 * reply (free with graphd__wire__reply__free_unpacked). c->fail says how a
 * call that got no answer failed. A request that changes nothing beyond the
 * daemon's registry (Ping, Status, registrations, PrepareProgram,
 * ListCaptures, Evict) is sent once more, after c->reconnect, when the
 * daemon went away; the others are the caller's to retry. */
graphd_status gd_client_call(graphd_client *c, Graphd__Wire__Request *req, const int *fds, int nfds,
                             Graphd__Wire__Reply **out);

/* region.c: starts a batch of gd_region_register_locked calls (lock held):
 * within it, each cached allocation is checked with the driver once, not
 * once a binding (one allocation holds many of a call's buffers). */
void gd_region_batch(graphd_client *c);
/* gd_region_register with the lock held. */
graphd_status gd_region_register_locked(graphd_client *c, uint64_t ptr, uint64_t bytes,
                                        graphd_region_ref *out);

/* Frees the region cache and host allocations (graphd_close). */
void gd_client_regions_close(graphd_client *c);

/* Forgets every cached region (a new session has none); host allocations
 * stay and register again on their next use. */
void gd_client_regions_reset(graphd_client *c);

/* ring.c: makes the ring and gives it to the session (RegisterRing).
 * GRAPHD_UNIMPLEMENTED from a daemon without rings. Lock held. */
graphd_status gd_ring_open(graphd_client *c);

/* The ring handle of a program (RingProgram, once per program). Lock held. */
graphd_status gd_ring_handle(graphd_client *c, const uint8_t id[32], uint32_t *h);

/* Reads the completions the worker wrote; remembers the first failure. */
void gd_ring_reap(graphd_client *c);

/* Reports the remembered failure once: sets the handle's error and
 * returns its status; GRAPHD_OK when there is none. */
graphd_status gd_ring_take_error(graphd_client *c);

/* Waits while the ring has fewer than nslots free slots (at most the
 * handle's timeout, and not once the daemon is gone), ringing the doorbell
 * when the worker sleeps; the time counts in ring_wait_ns. Lock held. */
graphd_status gd_ring_reserve(graphd_client *c, uint32_t nslots);
/* Continuation slot k (1 to nslots - 1) of the entry to be published next,
 * in the ring itself: written in place after gd_ring_reserve, read by the
 * worker only once published. Lock held. */
graphd_ring_cont *gd_ring_cont_slot(graphd_client *c, uint32_t k);
/* Publishes entry e with the nslots - 1 continuation slots written after
 * it (space reserved), and rings the doorbell when the worker sleeps.
 * Lock held. */
void gd_ring_publish(graphd_client *c, const graphd_ring_sqe *e, uint32_t nslots);

/* Waits up to ms for the worker to take every entry published. */
bool gd_ring_wait_taken(graphd_client *c, int ms);

/* The order of this process's async replays on c's GPU across all its
 * handles: gd_order_begin takes the GPU's order lock and numbers the
 * entry; the caller queues the stream operations and publishes the entry,
 * then calls gd_order_end. Lock held. */
uint32_t gd_order_begin(graphd_client *c);
void gd_order_end(graphd_client *c);

/* Unmaps and frees the ring (close, or a new session: the old ring died
 * with the old one). */
void gd_ring_free(graphd_client *c);

/* replay.c: forgets c's ring and flag page (graphd_forget): unmaps the
 * ring, and the page too in a child of fork (in the process that made it,
 * a stream may still wait on it: it stays mapped); no word is written. */
void gd_client_replay_forget(graphd_client *c);

/* region.c: frees the region cache and the host allocation table without
 * a request; the host allocations stay mapped (graphd_forget). */
void gd_client_regions_forget(graphd_client *c);

/* replay.c: stops watching c and frees its flag page once no stream still
 * has a write or wait on it queued; a page a stream never gets past is kept
 * (graphd_close). */
void gd_client_replay_close(graphd_client *c);

/* Gives a new session the handle's flag page (RegisterFlags with the same
 * memfd), so that its streams and slots go on: every ready word is set back
 * to what its slot issued (a daemon that closed the session may have
 * written it far ahead), and the watcher watches the new socket. Lock
 * held. */
graphd_status gd_client_flags_again(graphd_client *c);

/* A status as the library allocates it: what 0.1.0's callers see, then
 * every device's whole record (graphd_daemon_status_device) and the
 * request counters (graphd_daemon_status_requests). client.c makes it. */
typedef struct gd_status_priv {
  graphd_daemon_status pub;
  graphd_device_record *rec;  /* ndevices entries */
  graphd_session_record *ses; /* nsession_info entries */
  graphd_request_record *req; /* nreq entries */
  size_t nreq;
} gd_status_priv;

/* metrics.c: copies every counter of the device counters' list from w
 * into its place in r (info.counters among them). */
void gd_record_counters(graphd_device_record *r, const Graphd__Wire__DeviceCounters *w);

/* metrics.c: the request counters of a Status reply into p (none when it
 * has none). Returns GRAPHD_OK, or RESOURCE_EXHAUSTED. */
graphd_status gd_status_requests(gd_status_priv *p, const Graphd__Wire__StatusReply *sr);

/* registry.c: registers again, from the client-side registry, every
 * program graphd_registry_sync gave the handle (a new session after a
 * reconnect). Lock held. */
graphd_status gd_registry_sync_again(graphd_client *c);

#endif
