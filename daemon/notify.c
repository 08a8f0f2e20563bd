/* See notify.h. DESIGN: loop thread only. */
#define _GNU_SOURCE
#include "notify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>

#include "daemon/base/check.h"
#include "graphd/status.h"
#include "common/log.h"

/* STATUS= is refreshed at least this often, even without a watchdog. */
#define STATUS_PERIOD_MS 5000u
/* Without a watchdog, a busy worker silent this long is still reported. */
#define DEFAULT_STALE_NS (30ull * 1000000000ull)

static void send_msg(gd_notify *n, const char *msg) {
  int rc = sd_notify(0, msg);
  if (rc < 0 && !n->send_failed) {
    n->send_failed = true;
    GD_LOG(GD_WARN, "notify", "sd_notify to $NOTIFY_SOCKET failed: %s", strerror(-rc));
  }
}

/* "2 of 2 device(s) up (cuda, MPS on 2), 3 session(s)", or the stuck state. */
static void format_status(const gd_notify *n, char *out, size_t len) {
  const gd_daemon *s = n->srv;
  int up = 0, mps = 0;
  for (int i = 0; s->devices && i < s->ndevices; i++) up += device_ok(&s->devices[i]);
  for (int i = 0; s->facts && i < s->ndevices; i++) mps += s->facts[i]->mps_enabled != 0;
  const char *be = s->be ? s->be->name : "?";
  char extra[48] = "";
  if (s->be && s->be->runs_under_mps) snprintf(extra, sizeof extra, ", MPS on %d", mps);
  if (n->stuck)
    snprintf(out, len, "%d device worker(s) stuck for over %g s; %s", n->stuck,
             (double)n->stale_ns / 1e9,
             n->watchdog_usec ? "watchdog pings stopped" : "see the log");
  else
    snprintf(out, len, "%d of %d device(s) up (%s%s), %llu session(s)", up, s->ndevices, be, extra,
             (unsigned long long)s->sessions.n);
}

static void tick_cb(uv_timer_t *t) {
  gd_notify *n = t->data;
  int stuck = worker_pool_stuck(&n->srv->pool, n->stale_ns);
  if (stuck && !n->stuck) {
    GD_LOG(GD_ERROR, "notify", "%d device worker(s) busy in one job for over %g s%s; stacks follow",
           stuck, (double)n->stale_ns / 1e9,
           n->watchdog_usec ? "; no longer pinging the systemd watchdog, so systemd will "
                              "restart graphd"
                            : "");
    worker_pool_dump_stuck(&n->srv->pool, n->stale_ns);
  } else if (!stuck && n->stuck)
    GD_LOG(GD_WARN, "notify", "device workers are making progress again%s",
           n->watchdog_usec ? "; watchdog pings resume" : "");
  n->stuck = stuck;

  char status[sizeof n->status];
  char msg[sizeof n->status + 32];
  size_t len = 0;
  format_status(n, status, sizeof status);
  if (n->watchdog_usec && !stuck)
    len += (size_t)snprintf(msg + len, sizeof msg - len, "WATCHDOG=1\n");
  if (strcmp(status, n->status) != 0) {
    len += (size_t)snprintf(msg + len, sizeof msg - len, "STATUS=%s\n", status);
    memcpy(n->status, status, sizeof status);
  }
  if (len) send_msg(n, msg);
}

int notify_start(gd_notify *n, gd_daemon *srv) {
  int rc = 0;
  memset(n, 0, sizeof *n);
  n->srv = srv;
  n->stale_ns = DEFAULT_STALE_NS;
  const char *sock = getenv("NOTIFY_SOCKET");
  if (!sock || !*sock) return 0;
  n->enabled = true;

  uint64_t usec = 0;
  int wd = sd_watchdog_enabled(0, &usec);
  if (wd < 0)
    GD_LOG(GD_WARN, "notify", "ignoring a malformed WATCHDOG_USEC/WATCHDOG_PID: %s", strerror(-wd));
  else if (wd > 0 && usec > 0) {
    n->watchdog_usec = usec;
    n->stale_ns = usec * 1000ull;
  }

  char msg[sizeof n->status + 32];
  format_status(n, n->status, sizeof n->status);
  snprintf(msg, sizeof msg, "READY=1\nSTATUS=%s\n%s", n->status,
           n->watchdog_usec ? "WATCHDOG=1\n" : "");
  send_msg(n, msg);

  uint64_t period_ms = STATUS_PERIOD_MS;
  if (n->watchdog_usec && n->watchdog_usec / 2000 < period_ms)
    period_ms = n->watchdog_usec / 2000 ? n->watchdog_usec / 2000 : 1;
  UV_CHECK_GOTO(uv_timer_init(srv->loop, &n->timer), GRAPHD_INTERNAL, exit);
  n->timer_open = true;
  n->timer.data = n;
  /* Unreferenced: the timer alone never keeps the loop alive. */
  uv_unref((uv_handle_t *)&n->timer);
  UV_CHECK_GOTO(uv_timer_start(&n->timer, tick_cb, period_ms, period_ms), GRAPHD_INTERNAL, exit);
  if (n->watchdog_usec)
    GD_LOG(GD_INFO, "notify", "systemd watchdog every %.1f s; pinging every %llu ms",
           (double)n->watchdog_usec / 1e6, (unsigned long long)period_ms);
exit:
  return rc;
}

void notify_stop(gd_notify *n) {
  if (n->stopped) return;
  n->stopped = true;
  if (n->enabled) send_msg(n, "STOPPING=1\nSTATUS=shutting down\n");
  if (n->timer_open) {
    n->timer_open = false;
    uv_close((uv_handle_t *)&n->timer, NULL);
  }
}

void notify_shutdown_cb(gd_daemon *s) { notify_stop(s->owner); }
