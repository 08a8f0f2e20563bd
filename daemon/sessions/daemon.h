/* The daemon's state on the loop thread: options, the backend and its
 * devices with their workers, the registry, the sessions and the counters.
 * Every request handler reaches it from its session (daemon_of).
 *
 * DESIGN: loop thread only, but for the devices (each touched by its own
 * worker, see device.h) and the fields read atomically there. */
#ifndef GRAPHD_DAEMON_H
#define GRAPHD_DAEMON_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "daemon/base/allowlist.h"
#include "daemon/backend/backend.h"
#include "daemon/base/clock.h"
#include "daemon/device/device.h"
#include "daemon/base/hist.h"
#include "daemon/base/options.h"
#include "daemon/base/registry.h"
#include "session.h"
#include "daemon/device/worker.h"

/* A Status or ListCaptures request that waits on the job of its kind
 * already out to a device's worker, rather than queueing another behind it
 * (control.c). */
typedef struct gd_control_wait {
  struct gd_control_wait *prev, *next;
  void *request;           /* the request waiting; NULL when not linked */
  struct control_job *job; /* the job it waits on */
} gd_control_wait;

/* The kinds of control job one device runs at most one of at a time,
 * shared by every request that waits for it (control.c). */
enum gd_control_shared { GD_CONTROL_STATUS = 0, GD_CONTROL_LIST = 1, GD_CONTROL_SHARED = 2 };

/* Counters per device kept by the loop thread. */
typedef struct gd_device_counters {
  /* A field for each counter of device_counters.def that the loop holds
   * (source TALLY or KEPT), by the counter's name; Status reads the others
   * (READ) when it answers (device_info.c). */
#define GRAPHD_DEVICE_COUNTER(name, field, kind, unit, source, ...) GD_HELD_##source(name)
#include "graphd/device_counters.def"
  gd_hist replay_latency; /* request read to reply, successful replays (ns) */
  /* Status and ListCaptures ask each worker with one job of each kind
   * that has not started, whoever asks: a worker in a long job, or wedged,
   * collects no job per request or scrape (loop thread). */
  struct control_job *jobs[GD_CONTROL_SHARED]; /* out, oldest first; one at most not started */
  uint64_t last_free_memory;                   /* what the last Status job found (0 before any) */
  uint64_t answered_ns;                        /* when that job came back (0: never) */
  uint64_t last_instances, last_graphs; /* what it counted of the captures' instances and graphs */
  uint64_t last_busy_ns; /* the worker's busy time last reported: it never goes back */
} gd_device_counters;

/* Counts n captures evicted (by request or by the budget), giving back their
 * staging bytes. */
static inline void gd_counters_evicted(gd_device_counters *c, uint64_t n, uint64_t bytes) {
  c->captures -= n;
  c->staging_bytes -= bytes;
  c->evictions += n;
}

/* Adds what replays did (the ring's, or one Replay's) to the counters:
 * each counter of the list that replays count, then the captures they
 * built and their staging, and what the budget evicted. */
static inline void gd_counters_add_tally(gd_device_counters *c, const gd_replay_tally *t) {
#define GRAPHD_DEVICE_COUNTER(name, field, kind, unit, source, ...) GD_ADD_##source(c, t, name)
#include "graphd/device_counters.def"
  c->captures += t->captures;
  c->captures_built += t->captures;
  c->staging_bytes += t->staging_bytes;
  c->staging_bytes -= t->trimmed_bytes;
  gd_counters_evicted(c, t->evicted, t->evicted_bytes);
}

/* What the router counts of each kind of request, a row of its table
 * each (router.c), as redis counts its commands. Loop thread. */
typedef struct gd_request_counters {
  const char *name;    /* the request's name ("Ping"), from the router's table */
  uint64_t calls;      /* read and routed, those the table refused among them */
  uint64_t errors;     /* of them, answered with a status other than OK */
  uint64_t handler_ns; /* the loop thread's time in their handler */
} gd_request_counters;

/* Rows of the request table the counters have room for. */
#define GD_REQUEST_KINDS_MAX 32

/* graphd's exit status after a device faulted and could not be reset in
 * this process: the service manager restarts it. */
#define GD_EXIT_FAULT 3

typedef struct gd_daemon {
  uv_loop_t *loop;
  const gd_options *opt;
  gd_backend *be;
  int ndevices;
  const gd_device_facts **facts; /* ndevices entries, into be->devices */
  gd_device *devices;            /* ndevices entries, each its worker's */
  gd_device_counters *counters;  /* ndevices entries */
  gd_pool pool;                  /* worker i serves devices[i] */
  gd_registry reg;               /* modules and programs */
  gd_allowlist host_allow;       /* host modules non-admins may register */
  gd_session_set sessions;
  gd_request_counters requests[GD_REQUEST_KINDS_MAX]; /* per kind of request (router_attach) */
  uint32_t nrequest_kinds;                            /* the rows of requests in use */
  /* Client memory graphd has mapped, or is mapping: regions, flag pages
   * and rings, one mapping each (data_session.c), within max_host_maps (from
   * the kernel's vm.max_map_count, kernel_max_maps; 0: no bound); and per
   * uid (uthash), for the fair shares, with how many uids have any. */
  uint64_t host_maps, max_host_maps, kernel_max_maps;
  struct gd_uid_maps *uid_maps;
  uint32_t map_users;

  int listen_fd;
  bool listen_inherited; /* came from systemd: never unlink */
  bool listen_active;
  char socket_path[108];
  uv_poll_t listen_poll;
  uv_timer_t accept_timer;         /* resumes accepting after running out of fds */
  uv_timer_t sweep_timer;          /* Hello deadline and idle timeout */
  uv_timer_t wait_timer;           /* polls replays held back by --max-inflight-replays */
  struct replay_job *held_replays; /* ... those replays (replay.c) */
  struct fanout *evicts;           /* Evicts whose jobs are still out (control.c) */
  uint32_t nevicts;
  bool accept_resting;
  dev_t socket_dev; /* the socket file we made: only it is removed at exit */
  ino_t socket_ino;
  uv_signal_t sig_term, sig_int;

  uint64_t start_ns;
  bool shutting_down;
  int exit_code; /* main's status once the loop ends (0, or GD_EXIT_FAULT) */
  uid_t euid;
  /* Called once during shutdown so the owner can close its own handles. */
  void (*on_shutdown)(struct gd_daemon *d);
  void *owner;
} gd_daemon;

/* The daemon a session belongs to. */
static inline gd_daemon *daemon_of(const gd_session *s) {
  return gd_container_of(s->set, gd_daemon, sessions);
}

/* The worker of device i. */
static inline gd_worker *daemon_worker(gd_daemon *d, int i) { return &d->pool.workers[i]; }

#endif
