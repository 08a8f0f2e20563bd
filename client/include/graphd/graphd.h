/* libgraphd: the C client of graphd.
 *
 * A graphd_client is one session with the daemon: a control session
 * (status, stats, list, evict) or a data session bound to one device, named
 * by UUID. The library uses blocking I/O with timeouts and no event loop;
 * it never aborts and never prints. Every call returns a graphd_status and
 * leaves a message for graphd_last_error().
 *
 * Threads: a handle may be used from several threads at once. Calls on one
 * handle are serialised by a mutex inside it, so they run one at a time in
 * the order the threads get the lock. Different handles are independent.
 * graphd_last_error_r() copies the message of the calling thread's own last
 * failure on a handle into the caller's buffer; graphd_last_error() returns
 * a copy of the handle's last message, whichever thread failed. Both are
 * safe from any thread at any time (graphd_connect() reports into errbuf).
 * graphd_close() must not race other calls on the same handle.
 *
 * fork(): a handle belongs to the process that connected it. A child of
 * fork() must not use an inherited handle, nor close it in the usual sense:
 * the parent's session, its flag page and submission ring are shared with
 * the child, and a close that released stream waits or spoke to the daemon
 * would corrupt the parent's replays. libgraphd sees the child (getpid()
 * is not the handle's): there graphd_close() and graphd_stream_detach()
 * only forget (they free the child's memory and descriptors and touch
 * nothing shared; graphd_forget() does it by name), and every other call
 * on an inherited handle fails with FAILED_PRECONDITION before it takes
 * any lock (graphd_host_free too: the mapping is the parent's memory as
 * well, and stays). A child that wants graphd connects afresh. */
#ifndef GRAPHD_GRAPHD_H
#define GRAPHD_GRAPHD_H

#include <stddef.h>
#include <stdint.h>

#include "graphd/program.h"
#include "graphd/status.h"
#include "graphd/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Limits and defaults, as libgraphd applies them ------------------------ */
#define GRAPHD_ERRMAX 512                    /* bytes of an error message, the NUL included */
#define GRAPHD_TIMEOUT_MS_DEFAULT 30000      /* graphd_connect_options.timeout_ms of 0 */
#define GRAPHD_RECONNECT_MS_DEFAULT 30000    /* graphd_set_reconnect_wait's default */
#define GRAPHD_MAX_STREAMS 128               /* streams attached to one handle at once */
#define GRAPHD_REGION_CAP_DEFAULT 4096       /* regions one handle caches (graphd_set_region_cap) */
#define GRAPHD_RING_ENTRIES_MIN 2            /* graphd_set_ring_entries: a power of two ... */
#define GRAPHD_RING_ENTRIES_MAX 4096         /* ... up to this */
#define GRAPHD_RING_ENTRIES_DEFAULT 256      /* the ring's size when not set */
#define GRAPHD_RING_ENTRY_BINDINGS 20        /* bindings in an async replay's own ring slot */
#define GRAPHD_RING_CONT_BINDINGS 21         /* ... and in each slot after it */
#define GRAPHD_MAX_BINDINGS GRAPHD_MAX_SLOTS /* bindings of one replay */
#define GRAPHD_CLIENT_NAME_MAX 128           /* bytes of graphd_connect_options.client_name */

/* ---- Growing the ABI --------------------------------------------------------
 * The structures below that existed in 0.1.0 keep their layout: binaries
 * built against that header allocate them or index arrays of them. What a
 * later version adds to a record goes into a record with a `size` member
 * that the library fills (graphd_device_record, graphd_session_record:
 * the caller passes its sizeof; the library fills what both know, zeroes
 * the rest and sets size to what it filled; a field is there when
 * offsetof(field) < size), never into a parallel array again. Every
 * array the library returns has its own free function. */

typedef struct graphd_client graphd_client;

typedef enum graphd_session_kind {
  GRAPHD_SESSION_CONTROL = 2,
  GRAPHD_SESSION_DATA = 1,
} graphd_session_kind;

typedef struct graphd_connect_options {
  /* Socket path; NULL means $GRAPHD_SOCKET, else /run/graphd/graphd.sock
   * for root, else $XDG_RUNTIME_DIR/graphd.sock (/tmp/graphd-UID.sock
   * without XDG_RUNTIME_DIR); when $GRAPHD_SOCKET is unset and that
   * per-user socket does not exist, /run/graphd/graphd.sock if it does. */
  const char *socket_path;
  graphd_session_kind kind;
  /* Data sessions: the device's 16-byte UUID (cuDeviceGetUuid, or a host
   * device's UUID from status). Ignored for control sessions. */
  uint8_t device_uuid[16];
  /* Timeout for connecting and for each call, in milliseconds; 0 means
   * GRAPHD_TIMEOUT_MS_DEFAULT. */
  int timeout_ms;
  /* Shown in the daemon's logs and stats; may be NULL; at most
   * GRAPHD_CLIENT_NAME_MAX bytes. */
  const char *client_name;
} graphd_connect_options;

/* Fills opts with defaults: control session, default socket and timeout. */
GRAPHD_EXPORT void graphd_connect_options_init(graphd_connect_options *opts);

/* Connects and performs the Hello handshake.
 * Returns GRAPHD_OK with *out set, or:
 *  - UNAVAILABLE when no daemon listens on the socket;
 *  - NOT_FOUND when the daemon serves no device with that UUID;
 *  - FAILED_PRECONDITION on a protocol version mismatch;
 *  - DEADLINE_EXCEEDED when the daemon does not answer in time.
 * errbuf (may be NULL) gets a one-line reason on failure. Thread-safe. */
GRAPHD_EXPORT graphd_status graphd_connect(const graphd_connect_options *opts, graphd_client **out,
                                           char *errbuf, size_t errlen);

/* RECONNECTING. When a call finds that the daemon went away (a restart:
 * `systemctl restart graphd`), the handle waits for a daemon on the same
 * socket, at most `ms` milliseconds in all (retrying with backoff), gives
 * the new session what the old one had (the flag page and streams, regions
 * as they are next used, and the programs graphd_registry_sync gave it),
 * and sends the call again, once, when it is sure the call never ran:
 * it never reached the daemon, or a stopping daemon answered that it had
 * not started it. A replay that may have run (the daemon went away after
 * taking it, without an answer) is never sent again: it fails with
 * UNAVAILABLE, its outputs undefined. Calls that change nothing but the
 * daemon's registry (ping, status, registrations, prepare, list, evict)
 * are sent again in either case. A reconnect that finds the old daemon had
 * not finished a replay it had answered (GPU work cut off by a crash or a
 * device reset) fails that call at once with UNAVAILABLE saying so, once,
 * without waiting for a new daemon; the next call connects again. Region
 * ids from before a reconnect are stale. The default is
 * GRAPHD_RECONNECT_MS_DEFAULT, or $GRAPHD_RECONNECT_MS at connect; 0 turns
 * reconnecting off (every call after the daemon went away then
 * fails with UNAVAILABLE). */
GRAPHD_EXPORT graphd_status graphd_set_reconnect_wait(graphd_client *c, int ms);

/* Closes the session and frees the handle. NULL is a no-op. Must not race
 * with other calls on the same handle. In a child of fork() that inherited
 * the handle it is graphd_forget(). */
GRAPHD_EXPORT void graphd_close(graphd_client *c);

/* Frees the handle without closing its session: closes this process's
 * descriptors of it and frees its memory, and touches nothing it shares with
 * the daemon or with another process (no request, no write to the flag page
 * or the ring, no stream released). Memory from graphd_host_alloc stays
 * mapped (the caller may still read it; munmap it when done). For a child of
 * fork() with an inherited handle: the parent's session goes on untouched.
 * In the process that connected, it ends the session as a hang-up would,
 * and leaves the flag page mapped for streams that may still wait on it. */
GRAPHD_EXPORT void graphd_forget(graphd_client *c);

/* The daemon's session id for this handle. */
GRAPHD_EXPORT uint64_t graphd_session_id(const graphd_client *c);

/* Message of the last failed call on this handle, whichever thread made it
 * ("" if none): a copy, taken under the handle's lock for its text, in a
 * buffer of the calling thread's that stays valid until that thread calls
 * graphd_last_error() again. Safe from any thread. */
GRAPHD_EXPORT const char *graphd_last_error(const graphd_client *c);

/* Copies the message of the calling thread's last failed call on c into buf
 * (at most len bytes with the NUL; GRAPHD_ERRMAX always holds it) and
 * returns that call's status. When this thread's last failure was on
 * another handle, or it had none, it copies the handle's last message (as
 * graphd_last_error) and returns its status, GRAPHD_OK with "" if none.
 * Safe from any thread, with no buffer shared between threads, as libuv's
 * uv_strerror_r. */
GRAPHD_EXPORT graphd_status graphd_last_error_r(const graphd_client *c, char *buf, size_t len);

/* Round trip with an echo payload of len bytes (may be 0). */
GRAPHD_EXPORT graphd_status graphd_ping(graphd_client *c, const void *payload, size_t len);

typedef struct graphd_device_counters {
  uint64_t sessions;
  uint64_t regions;
  uint64_t region_bytes;
  uint64_t captures;       /* captures held now */
  uint64_t replays;        /* replays that ran */
  uint64_t errors;         /* requests on the device that failed */
  uint64_t recaptures;     /* captures built again after an eviction */
  uint64_t inflight;       /* replays with the device's worker now */
  uint64_t captures_built; /* captures built since start */
  uint64_t staging_bytes;  /* staging held by the captures */
  uint64_t evictions;      /* captures evicted since start */
  /* Replay latency in the daemon, request read to reply ready, over the
   * successful replays since start; within 12.5%. */
  uint64_t replay_p50_ns;
  uint64_t replay_p90_ns;
  uint64_t replay_p99_ns;
  uint64_t replay_max_ns;
} graphd_device_counters;

typedef struct graphd_device_info {
  uint32_t ordinal; /* the daemon's device index */
  char name[256];
  uint8_t uuid[16];
  char uuid_str[48]; /* "GPU-…" or "HOST-…" */
  uint64_t total_memory;
  uint64_t free_memory;
  char backend[16]; /* "cuda" or "host" */
  uint64_t epoch;   /* bumped when the device is reset */
  int mps_enabled;
  char state[16]; /* "ok" or "failed" */
  graphd_device_counters counters;
} graphd_device_info;

typedef struct graphd_session_info {
  uint64_t id;
  uint32_t pid;
  uint32_t uid;
  int data;       /* 1 for a data session, 0 for control */
  int32_t device; /* the daemon's device index, -1 for control */
  char client_name[129];
  uint64_t regions;
  uint64_t region_bytes;
} graphd_session_info;

/* A device worker's time in the replay path since start: checking a
 * replay, resolving its bindings, the capture on first use and queueing
 * it (on a host device, running it too). Its mean per replay is
 * replay_ns / replays. And the device's time running replays, sampled:
 * one replay in 16 chosen at random (the daemon's --gpu-time-sample), is
 * timed on the GPU from its first copy or launch to the end of its last;
 * the mean GPU time of a replay is gpu_ns / gpu_replays. */
typedef struct graphd_device_work {
  uint64_t replay_ns;
  uint64_t replays; /* replays the worker took, run or refused */
  uint64_t gpu_ns;
  uint64_t gpu_replays; /* replays sampled */
} graphd_device_work;

/* A device's replay latency (request read to reply ready in the daemon,
 * over the successful replays since start) as a histogram, for Prometheus:
 * le_count[k] replays took at most le_ns[k] nanoseconds (cumulative; the
 * bounds ascend and are the daemon's, today 1, 2.5 and 5 times each power
 * of ten from 1 us to 10 s), count is all of them and sum_ns their sum.
 * nbounds is 0 from a daemon that does not send them; a daemon that sends
 * more than GRAPHD_LATENCY_BOUNDS has its largest left out. */
#define GRAPHD_LATENCY_BOUNDS 32
typedef struct graphd_latency_histogram {
  uint32_t nbounds;
  uint64_t le_ns[GRAPHD_LATENCY_BOUNDS];
  uint64_t le_count[GRAPHD_LATENCY_BOUNDS];
  uint64_t count;
  uint64_t sum_ns;
} graphd_latency_histogram;

typedef struct graphd_daemon_status {
  char version[64];
  uint64_t uptime_ms;
  uint32_t pid;
  uint64_t sessions;
  uint32_t ndevices;
  graphd_device_info *devices; /* ndevices entries */
  uint32_t nsession_info;
  graphd_session_info *session_info; /* every open session */
  uint64_t modules;                  /* registered modules, daemon-wide */
  uint64_t module_bytes;
  uint64_t programs; /* registered programs, daemon-wide */
  /* ndevices entries, in the order of devices. Kept apart from
   * graphd_device_info, whose size programs built against an earlier
   * header rely on (graphd_session_device fills one they allocate). */
  graphd_device_work *work;
  /* ndevices entries: of each work[i].replay_ns, the time in the driver's
   * launches of the replays' graphs, where the worker waits while the
   * device's queue is full; the rest is the worker's own work. 0 from a
   * daemon that does not report it. */
  uint64_t *launch_ns;
  /* ndevices entries: how old each device's free memory and sampled GPU
   * time are (ms): 0 when its worker answered this request; else the time
   * since it last answered (a device in a long job, or any device for
   * graphd_get_status_now). */
  uint64_t *figures_age_ms;
  /* work, launch_ns and figures_age_ms stay for binaries built against
   * 0.1.0; every per-device figure, those and any later one, is in
   * graphd_daemon_status_device's record, and every per-session figure,
   * session_info's and any later one, in graphd_daemon_status_session's. */
} graphd_daemon_status;

/* One device of a status, with every per-device figure. `size` is the
 * bytes of the record the library filled (see "Growing the ABI"). */
typedef struct graphd_device_record {
  uint32_t size;
  uint32_t index; /* its place in devices[] */
  graphd_device_info info;
  graphd_device_work work;
  /* Of work.replay_ns, the time in the driver's launches of the replays'
   * graphs (0 from a daemon that does not report it). */
  uint64_t launch_ns;
  /* How old info.free_memory and the sampled GPU time are (ms): 0 when the
   * device's worker answered this request. */
  uint64_t figures_age_ms;
  /* The replay latency as a histogram. */
  graphd_latency_histogram replay_latency;
  /* The staging bytes captures may hold (the daemon's --device-budget);
   * 0: no limit. */
  uint64_t staging_budget_bytes;
  /* The captures' instances and executable graphs on the device, as its
   * worker last counted them (ListCaptures' figures, summed). */
  uint64_t instances;
  uint64_t graphs;
  /* The device's worker thread at work (running jobs and ring replays, as
   * against waiting for work) since it began serving, and its clock (how
   * long it has served), read by the daemon at one instant when it answered:
   * the share
   * of an interval the worker was busy is the change in worker_busy_ns
   * over the change in worker_clock_ns (near 1, the worker thread and
   * not the device bounds the replay rate). Both 0 from a daemon that does
   * not report them. */
  uint64_t worker_busy_ns;
  uint64_t worker_clock_ns;
  /* Every device counter added since, a uint64_t each, named as on the
   * wire: the TAIL entries of graphd/device_counters.def, in its order,
   * where each says what it counts. graphd_device_metric lists all of
   * them, those above included. */
#define GRAPHD_RECORD_OLD_(path)
#define GRAPHD_RECORD_TAIL_(path) uint64_t path;
#define GRAPHD_DEVICE_COUNTER(name, field, kind, unit, source, place, path, ...)                   \
  GRAPHD_RECORD_##place##_(path)
#include "graphd/device_counters.def"
#undef GRAPHD_RECORD_OLD_
#undef GRAPHD_RECORD_TAIL_
} graphd_device_record;

/* One device counter as this library knows it (graphd/device_counters.def),
 * for programs that show every counter without naming each: graphctl
 * stats --json, the Prometheus exporter, Python's Client.status(). The
 * library hands them out one at a time from static storage: a later
 * version may add members at the end. */
typedef struct graphd_metric_info {
  const char *name; /* DeviceCounters' field, and the key in stats --json and Python */
  uint32_t field;   /* its field number in DeviceCounters */
  uint32_t offset;  /* of its uint64_t in graphd_device_record */
  const char *kind; /* "counter" (never goes down while the daemon runs) or "gauge" */
  const char *unit; /* "ns", "bytes" or "count" */
  /* The /metrics family that carries it ("" if none), and whether that
   * family is its own, one sample per device (else it is a part of a
   * summary or histogram that the exporter writes whole). */
  const char *prometheus;
  int prometheus_own;
  const char *help; /* one sentence */
} graphd_metric_info;

/* Device counter i of this library's list (0 up), or NULL past its last.
 * Thread-safe. */
GRAPHD_EXPORT const graphd_metric_info *graphd_device_metric(uint32_t i);

/* The value of counter m in record r (filled by graphd_daemon_status_device):
 * 0 when r was filled with fewer bytes than hold it, and when the daemon
 * does not report it. Thread-safe. */
GRAPHD_EXPORT uint64_t graphd_device_record_value(const graphd_device_record *r,
                                                  const graphd_metric_info *m);

/* Copies device i of s into *out, a record of `size` bytes (the caller's
 * sizeof *out): what both sides know is filled, the rest zeroed, and
 * out->size set to the bytes filled. INVALID_ARGUMENT when i is not below
 * s->ndevices or size is smaller than the record's first two members. */
GRAPHD_EXPORT graphd_status graphd_daemon_status_device(const graphd_daemon_status *s, uint32_t i,
                                                        graphd_device_record *out, size_t size);

/* One open session of a status (session_info[index] and what 0.1.0's
 * graphd_session_info has no room for), as a sized record: `size` is the
 * bytes the library filled (see "Growing the ABI"). Every figure is the
 * daemon's loop thread's when it answered; a daemon that does not report
 * one gives 0. */
typedef struct graphd_session_record {
  uint32_t size;
  uint32_t index; /* its place in session_info[] */
  graphd_session_info info;
  uint64_t age_ms; /* since the daemon accepted its connection */
  /* Since its last request came in or was answered, or it was seen with
   * new or untaken ring entries or replays still running (within about a
   * second); while busy, since the request being handled came in (the
   * daemon's --idle-timeout closes a session that is not busy once this
   * passes it). */
  uint64_t idle_ms;
  uint32_t gid; /* the peer's gid, from the kernel as info.pid and info.uid are */
  /* A data session's flag page slots (libgraphd gives 128 at its first
   * graphd_stream_attach); 0 before. */
  uint32_t flag_slots;
  /* 1: it may use admin-only requests (evict any capture, list every
   * program id, register host modules). */
  int admin;
  /* 1: a request of it is with a device's worker, held back, or waiting on
   * the devices (a status's asker is busy with that status). */
  int busy;
  int has_ring; /* 1: a data session with a submission ring (graphd_replay_async) */
} graphd_session_record;

/* Copies session i of s into *out, a record of `size` bytes (the caller's
 * sizeof *out), as graphd_daemon_status_device copies a device: what both
 * sides know is filled, the rest zeroed, and out->size set to the bytes
 * filled. INVALID_ARGUMENT when i is not below s->nsession_info or size is
 * smaller than the record's first two members. Thread-safe. */
GRAPHD_EXPORT graphd_status graphd_daemon_status_session(const graphd_daemon_status *s, uint32_t i,
                                                         graphd_session_record *out, size_t size);

/* What the daemon counted of one kind of request since it started (a row
 * of its request table), as a sized record (see "Growing the ABI"):
 * `size` is the bytes the library filled. */
typedef struct graphd_request_record {
  uint32_t size;
  char request[32];    /* the request's name: "Hello", "Ping", "Replay", ... */
  uint64_t calls;      /* requests of this kind read, those the daemon refused among them */
  uint64_t errors;     /* of them, answered with a status other than OK */
  uint64_t handler_ns; /* the daemon's loop thread's time in their handler (not a worker's) */
} graphd_request_record;

/* The request counters of status s: *out is an array of *n records of
 * `size` bytes each (the caller's sizeof(graphd_request_record), so that
 * (*out)[i] is kind i), one per kind of request the daemon knows, each
 * filled as graphd_daemon_status_device fills a device record. *n is 0
 * and *out NULL from a daemon that does not report them. Free *out with
 * graphd_request_records_free(). INVALID_ARGUMENT when size is smaller
 * than the record's first two members. Thread-safe. */
GRAPHD_EXPORT graphd_status graphd_daemon_status_requests(const graphd_daemon_status *s,
                                                          size_t size, graphd_request_record **out,
                                                          size_t *n);

/* Frees an array from graphd_daemon_status_requests. NULL is a no-op. */
GRAPHD_EXPORT void graphd_request_records_free(graphd_request_record *list);

/* Asks the daemon for its status. A device whose worker is in a long job
 * is waited for up to 500 ms, then reported with state "busy" and its last
 * figures. On success *out must be released with
 * graphd_daemon_status_free(). */
GRAPHD_EXPORT graphd_status graphd_get_status(graphd_client *c, graphd_daemon_status **out);
/* The same, answered at once from each device's last figures
 * (figures_age_ms says how old), without waiting on any worker: what a
 * metrics scrape wants. Until every device has answered once, it waits as
 * graphd_get_status does. */
GRAPHD_EXPORT graphd_status graphd_get_status_now(graphd_client *c, graphd_daemon_status **out);
GRAPHD_EXPORT void graphd_daemon_status_free(graphd_daemon_status *s);

/* The device a data session is bound to, as reported at Hello. */
GRAPHD_EXPORT graphd_status graphd_session_device(const graphd_client *c, graphd_device_info *out);

/* Formats a UUID as "GPU-xxxxxxxx-…" (prefix may be NULL). out must hold 48
 * bytes. Parses the same forms back ("GPU-", "HOST-" or bare hex). */
GRAPHD_EXPORT void graphd_uuid_format(const uint8_t uuid[16], const char *prefix, char out[48]);
GRAPHD_EXPORT graphd_status graphd_uuid_parse(const char *s, uint8_t uuid[16]);

/* ---- Modules and programs ------------------------------------------------
 * Modules and programs are daemon-wide and named by content (SHA-256), so
 * any session may register them and registering twice is cheap. */

/* Registers GPU code (PTX, CUBIN, fatbin) or a host ELF module. Bytes over
 * 256 KiB travel as a sealed memfd. id_out (may be NULL) gets the module id
 * that programs name. */
GRAPHD_EXPORT graphd_status graphd_register_module(graphd_client *c, graphd_module_kind kind,
                                                   const void *bytes, size_t len,
                                                   uint8_t id_out[32]);

/* Registers a finished program (graphd_program_finish). The daemon checks its
 * structure and that its modules are registered. */
GRAPHD_EXPORT graphd_status graphd_register_program(graphd_client *c, graphd_program *p);

/* Registers a program from its canonical encoding and id. */
GRAPHD_EXPORT graphd_status graphd_register_program_encoding(graphd_client *c, const uint8_t id[32],
                                                             const void *encoding, size_t len);

/* ---- The client-side registry -----------------------------------------------
 * A process-wide store of module and program bytes, so that any session (a
 * new one, or one reconnected after the daemon restarted) can be given what
 * a replay needs, on demand. The JAX integration registers programs here at
 * trace time and syncs them to sessions at run time. Thread-safe. */

/* Keeps module bytes (copied) under their id; id_out may be NULL. */
GRAPHD_EXPORT graphd_status graphd_registry_add_module(graphd_module_kind kind, const void *bytes,
                                                       size_t len, uint8_t id_out[32]);

/* Keeps a program's canonical encoding (copied), checked against its id;
 * its modules must be added first. */
GRAPHD_EXPORT graphd_status graphd_registry_add_program(const uint8_t id[32], const void *encoding,
                                                        size_t len);

/* Registers the program and its modules on c, once per handle (later calls
 * return at once). NOT_FOUND when the program is not in the registry. */
GRAPHD_EXPORT graphd_status graphd_registry_sync(graphd_client *c, const uint8_t id[32]);

typedef struct graphd_prepare_info {
  uint64_t modules_loaded; /* loads this call caused (0: all were cached) */
  uint64_t load_ns;        /* time they took on the daemon's device */
} graphd_prepare_info;

/* Runs the device stage of validation on this data session's device: loads
 * the program's modules there (once per device) and checks every launch
 * against the real function (parameter sizes, block and shared memory
 * limits). The first replay does the same; this reports errors earlier.
 * info may be NULL. */
GRAPHD_EXPORT graphd_status graphd_prepare_program(graphd_client *c, const uint8_t id[32],
                                                   graphd_prepare_info *info);

/* ---- Regions ---------------------------------------------------------------
 * A region is client memory made visible to the daemon on the session's
 * device. graphd_region_register() takes any pointer into an allocation and
 * returns the region and the pointer's offset in it. Registrations are
 * cached per handle, keyed by the allocation's identity
 * (CU_POINTER_ATTRIBUTE_BUFFER_ID), so calling it for every replay is cheap;
 * when an address has been reused by a new allocation, the old region is
 * unregistered and the new one registered. Each handle keeps at most
 * graphd_set_region_cap() regions (GRAPHD_REGION_CAP_DEFAULT, what the
 * daemon takes a session), unregistering the least recently used.
 *
 * Memory kinds:
 *  - CUDA VMM memory (cuMemCreate with POSIX fd handles: what JAX uses) is
 *    exported as an fd. The daemon's mapping keeps it alive even after the
 *    client frees it, until the region is unregistered.
 *  - cuMemAlloc / cudaMalloc memory travels as a legacy IPC handle.
 *    RULE: unregister such a region (graphd_region_forget) BEFORE freeing the
 *    memory; the daemon's mapping does not keep it alive.
 *  - Stream-ordered memory (cudaMallocAsync, memory pools) cannot be shared
 *    this way and gets FAILED_PRECONDITION naming the allocator and the fix.
 *  - On host devices: memory from graphd_host_alloc() on the same handle.
 * Memory on another device than the session's gets FAILED_PRECONDITION. */

typedef struct graphd_region_ref {
  uint32_t region_id;
  uint64_t offset;    /* of the pointer within the region */
  uint64_t size;      /* bytes of the region */
  uint64_t import_ns; /* the daemon's import time when this call registered it, else 0 */
} graphd_region_ref;

/* Registers (or finds in the cache) the region holding [ptr, ptr + bytes).
 * ptr is a CUdeviceptr or a graphd_host_alloc pointer, as an integer. */
GRAPHD_EXPORT graphd_status graphd_region_register(graphd_client *c, uint64_t ptr, uint64_t bytes,
                                                   graphd_region_ref *out);

/* Unregisters the cached region holding ptr, if any (GRAPHD_NOT_FOUND if
 * none). The daemon unmaps it once work in flight on it has finished. */
GRAPHD_EXPORT graphd_status graphd_region_forget(graphd_client *c, uint64_t ptr);

/* Unregisters a region by id. */
GRAPHD_EXPORT graphd_status graphd_region_unregister(graphd_client *c, uint32_t region_id);

/* Sets the LRU cap on cached regions (>= 1). */
GRAPHD_EXPORT graphd_status graphd_set_region_cap(graphd_client *c, uint32_t cap);

/* Number of regions in this handle's cache. */
GRAPHD_EXPORT uint32_t graphd_region_count(graphd_client *c);

/* Host backend memory: a shared memfd mapping that host devices can import.
 * Freed with graphd_host_free (which also unregisters its region). */
GRAPHD_EXPORT graphd_status graphd_host_alloc(graphd_client *c, size_t bytes, void **ptr);
GRAPHD_EXPORT graphd_status graphd_host_free(graphd_client *c, void *ptr);

/* ---- Replay ----------------------------------------------------------------
 * A replay runs a registered program's capture on the session's device,
 * on the caller's buffers, ordered with the caller's CUDA stream:
 *
 *   ORDERING CONTRACT. graphd_replay(c, s, ...) makes the replay wait for
 *   all work enqueued on s before the call, and makes work enqueued on s
 *   after the call returns GRAPHD_OK wait for the replay, outputs included.
 *   The host is never blocked on the GPU: the call writes a "ready" value
 *   on s, sends the request, and once the daemon has queued the replay
 *   enqueues a wait on the daemon's "done" value on s (stream memory
 *   operations on a host-pinned page shared with the daemon).
 *
 * On a host device the stream is the host itself: the replay has run when
 * the call returns.
 *
 * If the daemon dies, a watcher thread in this library writes every
 * outstanding "done" value from the host within about 200 ms, so no stream
 * waits forever; the call in progress returns UNAVAILABLE and the outputs
 * of the lost replays are undefined. A replay the daemon never started
 * (it was stopping: a restart) is sent again to the next daemon, under a
 * new seq on the same stream, so the ordering contract holds; see
 * RECONNECTING above graphd_close.
 * On an error reply no wait is enqueued on s; the ready write was enqueued
 * before the request went out and stays (harmless: the next replay writes a
 * higher value). */

typedef struct graphd_stream graphd_stream;

/* Attaches a CUDA stream (a CUstream; NULL is the legacy default stream) to
 * a data session, for replays. On a host device pass NULL. Thread-safe;
 * one graphd_stream should be used by one thread at a time, like its
 * CUstream. Up to GRAPHD_MAX_STREAMS streams per handle. */
GRAPHD_EXPORT graphd_status graphd_stream_attach(graphd_client *c, void *cuda_stream,
                                                 graphd_stream **out);

/* Detaches and frees s. Work already enqueued is not affected. Detach a
 * handle's streams before graphd_close(). */
GRAPHD_EXPORT void graphd_stream_detach(graphd_stream *s);

typedef struct graphd_binding {
  uint32_t slot;  /* program slot */
  uint64_t ptr;   /* CUdeviceptr, or a graphd_host_alloc pointer, as an integer */
  uint64_t bytes; /* the slot's size */
} graphd_binding;

typedef struct graphd_replay_info {
  int captured;        /* this replay built the capture on the device */
  uint64_t capture_ns; /* time to build it */
  uint64_t server_ns;  /* the daemon worker's time on the request */
} graphd_replay_info;

/* Replays a program on s with these bindings. Every staged input, output
 * and inout slot is bound; an unstaged input is bound on the replay that
 * captures (the first on the device) and copied once; unstaged outputs are
 * never written back; scratch slots are never bound. Regions are found or
 * registered through the handle's cache. info may be NULL. */
GRAPHD_EXPORT graphd_status graphd_replay(graphd_client *c, graphd_stream *s,
                                          const uint8_t program_id[32],
                                          const graphd_binding *bindings, size_t nbindings,
                                          graphd_replay_info *info);

/* ---- Asynchronous replay -----------------------------------------------------
 * graphd_replay_async queues the same replay as graphd_replay, under the
 * same ORDERING CONTRACT on a CUDA stream, without waiting for graphd: it
 * enqueues the ready write on s, writes an entry into the session's
 * submission ring (shared memory that the device's worker reads itself),
 * enqueues the wait for done on s, and returns. The first call makes the
 * ring (graphd_set_ring_entries) and each new program is named once to
 * the daemon; regions not in the cache are registered as for
 * graphd_replay. Replays of a handle run in the order they were issued,
 * sync and async alike.
 *
 * Errors come back later: a replay the daemon refuses or that fails still
 * writes done (the stream goes on; its outputs are undefined), and its
 * status is reported by the next call of the handle that replays or
 * collects (graphd_replay, graphd_replay_async, graphd_replay_collect,
 * graphd_stream_wait), which then returns that status, names the replay's
 * seq and stream slot in graphd_last_error, and does nothing else.
 *
 * On a host device the host is the stream, and graphd_replay_async does
 * not wait: call graphd_stream_wait before reading the outputs.
 *
 * A full ring blocks the call until the worker has taken an entry (at most
 * the handle's timeout: then DEADLINE_EXCEEDED, nothing queued); the
 * worker holds a session's entries while --max-inflight-replays of its
 * replays are unfinished, as a launch into a full queue waits. A replay
 * with more bindings than one entry may carry (GRAPHD_RING_ENTRY_BINDINGS,
 * 20, in its own slot and GRAPHD_RING_CONT_BINDINGS, 21, in each slot after
 * it: up to the ring's size and GRAPHD_MAX_BINDINGS), and every replay
 * on a daemon that has no rings, goes the synchronous way. If the daemon
 * dies, queued replays are released as for graphd_replay; a restart sends
 * none of them again (they may have run): the next call reports them, and
 * graphd_stream_wait for a replay the daemon had not finished when it went
 * away answers UNAVAILABLE (also after a reconnect), never OK.
 *
 * seq, when not NULL, gets the replay's sequence number on s (for
 * graphd_stream_wait). Thread-safe as graphd_replay. */
GRAPHD_EXPORT graphd_status graphd_replay_async(graphd_client *c, graphd_stream *s,
                                                const uint8_t program_id[32],
                                                const graphd_binding *bindings, size_t nbindings,
                                                uint64_t *seq);

typedef struct graphd_async_info {
  uint64_t completed; /* async replays the daemon has taken and answered, since connect */
  uint64_t failed;    /* of which failed */
  uint64_t queued;    /* issued and not answered yet */
} graphd_async_info;

/* Reads the ring's completions: returns the first error not yet reported
 * (as above), else GRAPHD_OK; info may be NULL. Never blocks. */
GRAPHD_EXPORT graphd_status graphd_replay_collect(graphd_client *c, graphd_async_info *info);

/* Waits on the host until replay `seq` of s has finished with its buffers
 * (its done value), then collects as graphd_replay_collect. timeout_ms < 0
 * waits as long as the handle's timeout. For host devices, before reading
 * the outputs of graphd_replay_async; on CUDA streams the stream orders
 * it and this is rarely needed. */
GRAPHD_EXPORT graphd_status graphd_stream_wait(graphd_stream *s, uint64_t seq, int timeout_ms);

/* Nanoseconds this handle's graphd_replay_async calls have spent waiting
 * for room in the ring since connect (the device behind: a full ring
 * waits as a launch into a full queue does). A caller's own time in the
 * call is its whole time less the change in this. */
GRAPHD_EXPORT uint64_t graphd_ring_wait_ns(graphd_client *c);

/* The ring's size in entries (a power of two, GRAPHD_RING_ENTRIES_MIN to
 * _MAX; default GRAPHD_RING_ENTRIES_DEFAULT), for a handle whose ring is
 * not made yet. INVALID_ARGUMENT otherwise. */
GRAPHD_EXPORT graphd_status graphd_set_ring_entries(graphd_client *c, uint32_t entries);

/* ---- Captures: list and evict -----------------------------------------------
 * Any session may list captures. Any session may evict captures that only
 * processes of its own user used; selected by client_pid, the ones that
 * process shares with others stay (no error). Captures another user's
 * process used, and `all`, need an admin session (root, the daemon's user,
 * or its admin group). The next replay of an evicted program captures
 * again. */

typedef struct graphd_capture_info {
  uint8_t program_id[32];
  uint32_t device; /* the daemon's device index */
  uint32_t
      mode; /* how it runs: GRAPHD_MODE_STAGED, _STAGED_EX or _DIRECT (auto shows its choice) */
  /* The staging its instances hold, over all of them (temporaries included). */
  uint64_t staging_bytes;
  uint32_t nodes; /* graph nodes */
  uint64_t replays;
  uint64_t idle_ms;  /* since its last replay was queued */
  uint32_t pids[16]; /* client processes that replayed it */
  uint32_t npids;
  int busy;                 /* its last replay has not finished */
  uint32_t generation;      /* 1 for the program's first capture on the device, +1 per re-capture */
  uint64_t created_unix_ms; /* when this capture was built (wall clock, ms since 1970) */
  uint64_t repoints;        /* node parameters updated because a replay's buffers had moved */
  uint32_t graphs;          /* executable graphs, over its instances */
} graphd_capture_info;

/* Every capture on every device; free *out with graphd_capture_info_free()
 * (plain free() also does, as binaries built against 0.1.0 do). */
GRAPHD_EXPORT graphd_status graphd_list_captures(graphd_client *c, graphd_capture_info **out,
                                                 size_t *n);

/* Frees an array from graphd_list_captures or graphd_evict. NULL is a
 * no-op. */
GRAPHD_EXPORT void graphd_capture_info_free(graphd_capture_info *list);

typedef struct graphd_evict_options {
  const char *program; /* a program id in hex, or a prefix of 6+ digits; NULL: any */
  int device;          /* the daemon's device index; -1: any */
  uint32_t client_pid; /* captures this process used; 0: any */
  uint64_t session;    /* captures the process of this session used; 0: any */
  uint64_t idle_ms;    /* idle at least this long; 0: any */
  int all;             /* every capture (admin only) */
  int dry_run;         /* report what would go, change nothing */
} graphd_evict_options;

/* No selector, device -1: fill in before setting what to evict. */
GRAPHD_EXPORT void graphd_evict_options_init(graphd_evict_options *o);

/* Evicts the captures the options select (at least one selector, or all):
 * waits for each one's last replay in stream order, frees its graph and
 * staging, unloads modules nothing else uses. evicted (may be NULL) gets
 * what went (free with graphd_capture_info_free()), bytes the staging
 * bytes freed. */
GRAPHD_EXPORT graphd_status graphd_evict(graphd_client *c, const graphd_evict_options *o,
                                         graphd_capture_info **evicted, size_t *n, uint64_t *bytes);

/* One capture with every figure (see "Growing the ABI"): graphd_capture_info
 * keeps 0.1.0's layout, and what later versions add comes here. `size` is
 * the bytes of the record the library filled. */
typedef struct graphd_capture_record {
  uint32_t size;
  /* Its instances (1 and up; 0 from a daemon that does not say): each with
   * staging, executable graphs and an event of its own, one per stream that
   * replays a program without state at once, or per session of a program
   * with state. info.staging_bytes and info.graphs are over all of them. */
  uint32_t instances;
  graphd_capture_info info;
  /* The worker's time to queue one replay of it (the graph's launch, its
   * copies and node updates), a moving mean over its recent replays, in
   * ns; 0 before the first. The daemon holds a replay for its ready write
   * only below --ready-hold-max-us. */
  uint64_t queue_ns;
} graphd_capture_record;

/* graphd_list_captures as records: *out is an array of *n records of
 * `size` bytes each (the caller's sizeof(graphd_capture_record), so that
 * (*out)[i] is capture i), each filled as graphd_daemon_status_device fills
 * a device record: what both sides know, the rest zeroed, its size set to
 * the bytes filled. Free *out with graphd_capture_records_free().
 * INVALID_ARGUMENT when size is smaller than the record's first two
 * members. Thread-safe as graphd_list_captures. */
GRAPHD_EXPORT graphd_status graphd_list_capture_records(graphd_client *c, size_t size,
                                                        graphd_capture_record **out, size_t *n);

/* graphd_evict with what went as records, as graphd_list_capture_records
 * gives them (evicted may be NULL). */
GRAPHD_EXPORT graphd_status graphd_evict_records(graphd_client *c, const graphd_evict_options *o,
                                                 size_t size, graphd_capture_record **evicted,
                                                 size_t *n, uint64_t *bytes);

/* Frees an array from graphd_list_capture_records or graphd_evict_records.
 * NULL is a no-op. */
GRAPHD_EXPORT void graphd_capture_records_free(graphd_capture_record *list);

/* The devices that the last graphd_list_captures or graphd_evict (or
 * their _records forms) on c could not reach: their worker was inside a long job (a replay waiting
 * for a client's ready flag, say) past the daemon's bound of 500 ms. A
 * list lacks their captures; an eviction there still runs, in order, when
 * the worker is free, and shows in that device's evictions counter, but
 * is not in the reply. Writes up to max device indexes to devs and returns
 * how many there are (0 after a call that failed). */
GRAPHD_EXPORT size_t graphd_busy_devices(graphd_client *c, uint32_t *devs, size_t max);

/* The library's version string ("0.1.0"), and as GRAPHD_VERSION_NUMBER
 * writes it (0xMMmmpp): the library's, which may be newer than the header a
 * program was built with (GRAPHD_VERSION_*). */
GRAPHD_EXPORT const char *graphd_version(void);
GRAPHD_EXPORT uint32_t graphd_version_number(void);

#ifdef __cplusplus
}
#endif
#endif
