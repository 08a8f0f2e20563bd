/* systemd readiness, status and watchdog (sd_notify).
 *
 * DESIGN: loop thread only. Once the server is listening and every worker
 * has opened its device (or failed to), notify_start() sends READY=1 and a
 * STATUS= line, then a uv_timer refreshes STATUS= (devices up, sessions)
 * and, when systemd set WatchdogSec=, sends WATCHDOG=1 at least every half
 * interval. Pinging from the loop thread proves the loop turns; before each
 * ping the timer asks worker_pool_stuck() whether a worker has been inside
 * one job for longer than the whole watchdog interval. While one is, the
 * pings stop, so systemd kills and restarts graphd (Restart=on-failure).
 * WatchdogSec= therefore also bounds how long one device job may run.
 *
 * Without NOTIFY_SOCKET (not started by systemd) every call is a no-op and
 * no timer runs. No locks: the worker state is read through atomics. */
#ifndef GRAPHD_NOTIFY_H
#define GRAPHD_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/sessions/daemon.h"

typedef struct gd_notify {
  gd_daemon *srv;
  uv_timer_t timer;
  bool enabled; /* NOTIFY_SOCKET is set */
  bool timer_open;
  bool stopped;
  bool send_failed;       /* a send failed once: logged, not repeated */
  uint64_t watchdog_usec; /* 0: no watchdog */
  uint64_t stale_ns;      /* a busy worker silent this long is stuck */
  int stuck;              /* stuck workers seen at the last tick */
  char status[256];       /* the last STATUS= sent */
} gd_notify;

/* Sends READY=1 and the first STATUS=, and starts the status/watchdog timer
 * on srv->loop. Call after server_start() has succeeded. Returns 0, or a
 * negated graphd status when the timer cannot start (graphd still serves;
 * the caller may go on). Loop thread. */
int notify_start(gd_notify *n, gd_daemon *srv);

/* Sends STOPPING=1 and closes the timer. Idempotent; safe on a gd_notify
 * that notify_start() left disabled. Loop thread; n must stay valid until
 * the loop has run the timer's close callback. */
void notify_stop(gd_notify *n);

/* A gd_daemon.on_shutdown callback that calls notify_stop(s->owner): set
 * srv.owner to the gd_notify. */
void notify_shutdown_cb(gd_daemon *s);

#endif
