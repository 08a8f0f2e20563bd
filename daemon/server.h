/* The listener, the set of sessions and the daemon's lifecycle on the loop.
 *
 * DESIGN: everything here runs on the loop thread. The server owns the
 * listening socket (never unlinking one it inherited), the session list and
 * the worker pool; signals start a graceful shutdown. */
#ifndef GRAPHD_SERVER_H
#define GRAPHD_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "backend.h"
#include "hist.h"
#include "options.h"
#include "registry.h"
#include "worker.h"

typedef struct gd_session gd_session;

/* Counters per device kept by the loop thread. */
typedef struct gd_device_counters {
  uint64_t sessions;
  uint64_t regions;
  uint64_t region_bytes;
  uint64_t captures;
  uint64_t replays;
  uint64_t errors;
  uint64_t recaptures;
  uint64_t inflight;
  uint64_t captures_built;
  uint64_t staging_bytes;
  uint64_t evictions;
  gd_hist replay_latency; /* request read to reply, successful replays (ns) */
} gd_device_counters;

/* Counts n captures evicted (by request or by the budget), giving back their
 * staging bytes. Loop thread. */
static inline void gd_counters_evicted(gd_device_counters *c, uint64_t n, uint64_t bytes) {
  c->captures -= n;
  c->staging_bytes -= bytes;
  c->evictions += n;
}

typedef struct gd_server {
  uv_loop_t *loop;
  const gd_options *opt;
  gd_backend *be;
  int ndevices;
  const gd_device_facts **facts; /* ndevices entries, into be->devices */
  gd_device_counters *counters;  /* ndevices entries */
  gd_pool pool;
  gd_registry reg; /* modules and programs */

  int listen_fd;
  bool listen_inherited; /* came from systemd: never unlink */
  bool listen_active;
  char socket_path[108];
  uv_poll_t listen_poll;
  uv_signal_t sig_term, sig_int;

  gd_session *sessions;  /* doubly linked through session->prev/next */
  uint64_t nsessions;
  uint64_t next_session_id;
  uint64_t start_ns;
  bool shutting_down;
  int exit_code; /* main's status once the loop ends (0, or GD_EXIT_FAULT) */
  uid_t euid;
  /* Called once during shutdown so the owner can close its own handles. */
  void (*on_shutdown)(struct gd_server *s);
  void *owner;
} gd_server;

/* graphd's exit status after a device faulted and could not be reset in
 * this process: the service manager restarts it. */
#define GD_EXIT_FAULT 3

/* Opens or adopts the listening socket. Main thread, before the loop runs.
 * Returns 0 or a negated status with err filled. */
int server_listen(gd_server *s, const gd_options *opt, char *err, size_t errlen);

/* Handles SIGTERM and SIGINT on loop. Call before the socket listens, so
 * that a signal never meets the default action once a client can connect. */
int server_signals_start(gd_server *s, uv_loop_t *loop);

/* Starts accepting. */
int server_start(gd_server *s, uv_loop_t *loop);

/* Begins graceful shutdown (idempotent): stop accepting, stop reading,
 * fail or finish in-flight work, close sessions, stop the workers. */
void server_shutdown(gd_server *s, const char *why);

/* Removes the socket if we created it. After the loop has ended. */
void server_cleanup(gd_server *s);

#endif
