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
 * graphd_last_error() returns the message of the last call that failed on
 * that handle, whichever thread made it; read it right after the failing
 * call, or use the errbuf of graphd_connect(). */
#ifndef GRAPHD_GRAPHD_H
#define GRAPHD_GRAPHD_H

#include <stddef.h>
#include <stdint.h>

#include "graphd/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GRAPHD_PROTOCOL_VERSION 1
#define GRAPHD_ERRMAX 512

typedef struct graphd_client graphd_client;

typedef enum graphd_session_kind {
  GRAPHD_SESSION_CONTROL = 2,
  GRAPHD_SESSION_DATA = 1,
} graphd_session_kind;

typedef struct graphd_connect_options {
  /* Socket path; NULL means $GRAPHD_SOCKET, else /run/graphd/graphd.sock
   * for root, else $XDG_RUNTIME_DIR/graphd.sock. */
  const char *socket_path;
  graphd_session_kind kind;
  /* Data sessions: the device's 16-byte UUID (cuDeviceGetUuid, or a host
   * device's UUID from status). Ignored for control sessions. */
  uint8_t device_uuid[16];
  /* Timeout for connecting and for each call, in milliseconds; 0 means the
   * default of 30000. */
  int timeout_ms;
  /* Shown in the daemon's logs and stats; may be NULL. */
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

/* Closes the session and frees the handle. NULL is a no-op. Must not race
 * with other calls on the same handle. */
GRAPHD_EXPORT void graphd_close(graphd_client *c);

/* The daemon's session id for this handle. */
GRAPHD_EXPORT uint64_t graphd_session_id(const graphd_client *c);

/* Message of the last failed call on this handle ("" if none). The pointer
 * stays valid until the next call on the handle. */
GRAPHD_EXPORT const char *graphd_last_error(const graphd_client *c);

/* Round trip with an echo payload of len bytes (may be 0). */
GRAPHD_EXPORT graphd_status graphd_ping(graphd_client *c, const void *payload, size_t len);

typedef struct graphd_device_counters {
  uint64_t sessions;
  uint64_t regions;
  uint64_t region_bytes;
  uint64_t captures;
  uint64_t replays;
  uint64_t errors;
} graphd_device_counters;

typedef struct graphd_device_info {
  uint32_t ordinal;         /* the daemon's device index */
  char name[256];
  uint8_t uuid[16];
  char uuid_str[48];        /* "GPU-…" or "HOST-…" */
  uint64_t total_memory;
  uint64_t free_memory;
  char backend[16];         /* "cuda" or "host" */
  uint64_t epoch;           /* bumped when the device is reset */
  int mps_enabled;
  char state[16];           /* "ok" or "failed" */
  graphd_device_counters counters;
} graphd_device_info;

typedef struct graphd_daemon_status {
  char version[64];
  uint64_t uptime_ms;
  uint32_t pid;
  uint64_t sessions;
  uint32_t ndevices;
  graphd_device_info *devices; /* ndevices entries */
} graphd_daemon_status;

/* Asks the daemon for its status. On success *out must be released with
 * graphd_daemon_status_free(). */
GRAPHD_EXPORT graphd_status graphd_get_status(graphd_client *c, graphd_daemon_status **out);
GRAPHD_EXPORT void graphd_daemon_status_free(graphd_daemon_status *s);

/* The device a data session is bound to, as reported at Hello. */
GRAPHD_EXPORT graphd_status graphd_session_device(const graphd_client *c, graphd_device_info *out);

/* Formats a UUID as "GPU-xxxxxxxx-…" (prefix may be NULL). out must hold 48
 * bytes. Parses the same forms back ("GPU-", "HOST-" or bare hex). */
GRAPHD_EXPORT void graphd_uuid_format(const uint8_t uuid[16], const char *prefix, char out[48]);
GRAPHD_EXPORT graphd_status graphd_uuid_parse(const char *s, uint8_t uuid[16]);

/* The library's version string. */
GRAPHD_EXPORT const char *graphd_version(void);

#ifdef __cplusplus
}
#endif
#endif
