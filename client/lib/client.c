/* libgraphd: a handle's life (connect, reconnect, close) and the session
 * calls (ping, status, the session's device). The top layer (internal.h
 * lists them): close tears down the handle's streams (replay.c) and regions
 * (region.c); a reconnect gives a new session what the old one had.
 *
 * DESIGN: each handle has one mutex that serialises every call on it
 * (connect creates the handle, close destroys it). Never aborts, never
 * prints. A reconnect runs inside the call that found the daemon gone,
 * with the lock held, reached through c->reconnect. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/paths.h"
#include "common/uuid.h"
#include "graphd/encoding.h"
#include "graphd/frame.h"
#include "graphd.pb-c.h"
#include "graphd/graphd.h"
#include "internal.h"
#include "version.h"
#include "graphd/wire.h"

#define DEFAULT_TIMEOUT_MS GRAPHD_TIMEOUT_MS_DEFAULT
#define DEFAULT_RECONNECT_MS GRAPHD_RECONNECT_MS_DEFAULT

/* The limits graphd.h and program.h publish are the ones the code applies. */
_Static_assert(GRAPHD_MAX_STREAMS == GD_CLIENT_FLAG_SLOTS, "GRAPHD_MAX_STREAMS");
_Static_assert(GRAPHD_REGION_CAP_DEFAULT == GD_CLIENT_DEFAULT_REGION_CAP, "region cap");
_Static_assert(GRAPHD_RING_ENTRIES_MIN == GRAPHD_RING_MIN_ENTRIES, "ring entries");
_Static_assert(GRAPHD_RING_ENTRIES_MAX == GRAPHD_RING_MAX_ENTRIES, "ring entries");
_Static_assert(GRAPHD_RING_ENTRY_BINDINGS == GRAPHD_RING_MAX_BINDINGS, "ring bindings");
_Static_assert(GRAPHD_CLIENT_NAME_MAX == GD_CLIENT_NAME_MAX, "client name");
_Static_assert(GRAPHD_MAX_SLOTS == GD_MAX_SLOTS, "slots");
_Static_assert(GRAPHD_MAX_STEPS == GD_MAX_STEPS, "steps");
_Static_assert(GRAPHD_MAX_SLOT_BYTES == GD_MAX_SLOT_BYTES, "slot bytes");
_Static_assert(GRAPHD_MAX_PARAM_BYTES == GD_MAX_PARAM_BYTES, "parameter bytes");
_Static_assert(GRAPHD_MAX_PARAMS == GD_MAX_PARAMS, "parameters");
_Static_assert(GRAPHD_MAX_PATCHES == GD_MAX_PATCHES, "patches");
_Static_assert(GRAPHD_MAX_NESTING == GD_MAX_COND_DEPTH, "nesting");
_Static_assert(GRAPHD_MAX_NAME == GD_MAX_NAME, "name");
_Static_assert(GRAPHD_MAX_SHARED_BYTES == GD_MAX_SHARED_BYTES, "shared bytes");
_Static_assert(GRAPHD_MAX_MODULE_BYTES == GD_MAX_MODULE_BYTES, "module bytes");
_Static_assert(GRAPHD_MAX_PROGRAM_BYTES == GD_MAX_PROGRAM_BYTES, "program bytes");
#define BACKOFF_FIRST_MS 10
#define BACKOFF_MAX_MS 500

void graphd_connect_options_init(graphd_connect_options *o) {
  memset(o, 0, sizeof *o);
  o->kind = GRAPHD_SESSION_CONTROL;
}

static void copy_device(graphd_device_info *d, const Graphd__Wire__DeviceInfo *w) {
  memset(d, 0, sizeof *d);
  d->ordinal = w->ordinal;
  snprintf(d->name, sizeof d->name, "%s", w->name ? w->name : "");
  if (w->uuid.len == 16) memcpy(d->uuid, w->uuid.data, 16);
  snprintf(d->backend, sizeof d->backend, "%s", w->backend ? w->backend : "");
  gd_uuid_format(d->uuid, strcmp(d->backend, "cuda") == 0 ? "GPU-" : "HOST-", d->uuid_str);
  d->total_memory = w->total_memory;
  d->free_memory = w->free_memory;
  d->epoch = w->epoch;
  d->mps_enabled = w->mps_enabled;
  snprintf(d->state, sizeof d->state, "%s", w->state ? w->state : "");
  if (w->counters) {
    /* Through a whole record, whose info.counters holds 0.1.0's counters. */
    graphd_device_record r;
    memset(&r, 0, sizeof r);
    gd_record_counters(&r, w->counters);
    d->counters = r.info.counters;
  }
}

static graphd_status fail_connect(graphd_client *c, graphd_status st, char *errbuf, size_t errlen) {
  if (errbuf && errlen) snprintf(errbuf, errlen, "%s", c->err);
  if (c->fd >= 0) close(c->fd);
  gd_frame_reader_close(&c->rd);
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->err_lock);
  free(c);
  return st;
}

/* Connects c's socket and says Hello as c's kind, device and name. On
 * failure c->fd is -1 and c->err says why. Lock held, or c not yet shared. */
static graphd_status open_session(graphd_client *c) {
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0) return gd_client_set_err(c, GRAPHD_INTERNAL, "socket: %s", strerror(errno));
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path, c->socket_path, strlen(c->socket_path) + 1);
  struct timeval tv = {.tv_sec = c->timeout_ms / 1000, .tv_usec = (c->timeout_ms % 1000) * 1000};
  (void)setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  graphd_status st;
  if (connect(c->fd, (struct sockaddr *)&a, sizeof a) < 0) {
    int e = errno;
    st = (e == EACCES || e == EPERM) ? GRAPHD_PERMISSION_DENIED : GRAPHD_UNAVAILABLE;
    gd_client_set_err(c, st, "cannot connect to graphd at %s: %s%s", c->socket_path, strerror(e),
                      (e == ENOENT || e == ECONNREFUSED) ? " (is the daemon running?)" : "");
    goto fail;
  }
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Hello h = GRAPHD__WIRE__HELLO__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_HELLO;
  req.hello = &h;
  h.protocol_version = GRAPHD_PROTOCOL_VERSION;
  h.client_name = c->client_name;
  if (c->kind == GRAPHD_SESSION_DATA) {
    h.kind = GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_DATA;
    h.device_uuid.data = c->device_uuid;
    h.device_uuid.len = 16;
  } else {
    h.kind = GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_CONTROL;
  }
  Graphd__Wire__Reply *rep = NULL;
  st = gd_client_call(c, &req, NULL, 0, &rep);
  if (st != GRAPHD_OK) goto fail;
  if (rep->body_case != GRAPHD__WIRE__REPLY__BODY_HELLO) {
    graphd__wire__reply__free_unpacked(rep, NULL);
    st = gd_client_set_err(c, GRAPHD_DATA_LOSS, "graphd answered Hello with another message");
    goto fail;
  }
  c->session_id = rep->hello->session_id;
  c->max_frame = rep->hello->max_frame;
  if (rep->hello->device) {
    copy_device(&c->device, rep->hello->device);
    c->has_device = true;
  }
  graphd__wire__reply__free_unpacked(rep, NULL);
  return GRAPHD_OK;
fail:
  close(c->fd);
  c->fd = -1;
  return st;
}

/* Waits (until deadline) for the old daemon to close the connection: a
 * stopping daemon answers what it will not run, then closes; replies to
 * nothing are dropped. */
static void wait_hangup(graphd_client *c, int64_t deadline) {
  while (c->fd >= 0) {
    int64_t left = deadline - gd_mono_ms();
    if (left <= 0) return;
    struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
    int r = poll(&p, 1, left > 1000 ? 1000 : (int)left);
    if (r < 0 && errno != EINTR) return;
    if (r <= 0) continue;
    char buf[4096];
    ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
  }
}

/* The reconnect behind c->reconnect (internal.h): the daemon went away
 * (or is stopping). Waits for its end, checks that it finished every
 * replay it had taken, releases the streams, waits with backoff for a
 * daemon on the socket (at most reconnect_ms in all), then gives the new
 * session the flag page, an empty region cache and the programs the
 * client-side registry gave the old one. Lock held. */
static graphd_status gd_client_reconnect(graphd_client *c) {
  char why[GRAPHD_ERRMAX];
  snprintf(why, sizeof why, "%s", c->err[0] ? c->err : "graphd went away");
  if (c->reconnect_ms <= 0)
    return gd_client_set_err(c, GRAPHD_UNAVAILABLE, "%s; reconnecting is off", why);
  int64_t deadline = gd_mono_ms() + c->reconnect_ms;
  c->reconnecting = true;
  wait_hangup(c, deadline);
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  c->broken = true;
  atomic_store(&c->dead, true);
  graphd_status st = GRAPHD_OK;
  uint32_t slot = 0;
  uint64_t done = 0, want = 0;
  bool cut = false;
  if (c->flags) {
    gd_client_release_streams(c); /* keeps the done words as the daemon left them */
    cut = gd_flags_cut_off(c, &slot, &done, &want);
    /* GPU work of a daemon that died can land a done write lower than the
     * release until its context is torn down: keep writing the release
     * until every stream is past (the watcher's work, which stops next). */
    int64_t left = deadline - gd_mono_ms();
    (void)gd_flags_wait_passed(c, left > 0 ? (int)left : 0, true);
    gd_watch_remove(c);
  }
  gd_frame_reader_close(&c->rd);
  gd_frame_reader_init(&c->rd, GD_CLIENT_MAX_FRAME);
  if (cut) {
    /* The daemon died with GPU work it had answered for unfinished (a
     * crash, not a graceful stop): the caller learns it now, not after a
     * wait for a daemon that may never come, and the next call connects
     * again. Reported once. */
    gd_flags_mark_reported(c);
    c->reconnecting = false;
    return gd_client_set_err(c, GRAPHD_UNAVAILABLE,
                             "%s before it finished a replay it had taken (stream slot %u: done "
                             "%llu, expected %llu): the outputs of the replays in flight then "
                             "are undefined; the next call connects again",
                             why, slot, (unsigned long long)done, (unsigned long long)want);
  }
  for (int backoff = BACKOFF_FIRST_MS;;) {
    atomic_store(&c->dead, false);
    c->broken = false;
    st = open_session(c);
    if (st == GRAPHD_OK) break;
    gd_frame_reader_close(&c->rd);
    gd_frame_reader_init(&c->rd, GD_CLIENT_MAX_FRAME);
    /* Not there yet (no socket, or nobody accepting in time), or not
     * serving yet: wait. Anything else will not change by waiting. */
    bool wait = st == GRAPHD_UNAVAILABLE || st == GRAPHD_DEADLINE_EXCEEDED;
    int64_t left = deadline - gd_mono_ms();
    if (!wait || left <= 0) {
      char e[GRAPHD_ERRMAX];
      snprintf(e, sizeof e, "%s", c->err);
      if (wait)
        gd_client_set_err(c, GRAPHD_UNAVAILABLE,
                          "%s; graphd did not come back within %d ms (the reconnect bound: "
                          "graphd_set_reconnect_wait, $GRAPHD_RECONNECT_MS): %s",
                          why, c->reconnect_ms, e);
      else
        gd_client_set_err(c, st, "%s; reconnecting failed: %s", why, e);
      st = wait ? GRAPHD_UNAVAILABLE : st;
      goto fail;
    }
    struct timespec nap = {.tv_sec = 0,
                           .tv_nsec = (long)(left < backoff ? left : backoff) * 1000000L};
    nanosleep(&nap, NULL);
    backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
  }
  gd_client_debug(c, "reconnected: session %llu", (unsigned long long)c->session_id);
  gd_client_regions_reset(c);
  gd_ring_free(c); /* the next async replay makes one for the new session */
  c->ring_off = false;
  if (c->flags && (st = gd_client_flags_again(c)) != GRAPHD_OK) goto fail_session;
  if ((st = gd_registry_sync_again(c)) != GRAPHD_OK) goto fail_session;
  c->reconnecting = false;
  gd_client_clear_err(c);
  return GRAPHD_OK;
fail_session : {
  char e[GRAPHD_ERRMAX];
  snprintf(e, sizeof e, "%s", c->err);
  gd_client_set_err(c, st, "%s; the new session could not be set up: %s", why, e);
}
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
fail:
  c->broken = true;
  atomic_store(&c->dead, true);
  c->reconnecting = false;
  return st;
}

graphd_status graphd_set_reconnect_wait(graphd_client *c, int ms) {
  GD_OWNED(c);
  if (ms < 0) return GRAPHD_INVALID_ARGUMENT;
  pthread_mutex_lock(&c->lock);
  c->reconnect_ms = ms;
  pthread_mutex_unlock(&c->lock);
  return GRAPHD_OK;
}

graphd_status graphd_connect(const graphd_connect_options *opts, graphd_client **out, char *errbuf,
                             size_t errlen) {
  graphd_connect_options def;
  if (!opts) {
    graphd_connect_options_init(&def);
    opts = &def;
  }
  *out = NULL;
  graphd_client *c = calloc(1, sizeof *c);
  if (!c) {
    if (errbuf && errlen) snprintf(errbuf, errlen, "out of memory");
    return GRAPHD_RESOURCE_EXHAUSTED;
  }
  static _Atomic uint64_t serials;
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->err_lock, NULL);
  c->serial = atomic_fetch_add(&serials, 1) + 1;
  c->owner = getpid();
  gd_frame_reader_init(&c->rd, GD_CLIENT_MAX_FRAME);
  c->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
  c->region_cap = GD_CLIENT_DEFAULT_REGION_CAP;
  c->watch_fd = -1;
  c->fd = -1;
  if (opts->socket_path && *opts->socket_path) {
    if (strlen(opts->socket_path) >= sizeof c->socket_path)
      return fail_connect(c,
                          gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT, "socket path is too long"),
                          errbuf, errlen);
    snprintf(c->socket_path, sizeof c->socket_path, "%s", opts->socket_path);
  } else if (gd_default_socket_path(c->socket_path, sizeof c->socket_path) < 0) {
    return fail_connect(c, gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT, "socket path is too long"),
                        errbuf, errlen);
  } else if (!getenv("GRAPHD_SOCKET") && access(c->socket_path, F_OK) != 0 &&
             access(GD_SYSTEM_SOCKET, F_OK) == 0) {
    /* No per-user daemon, but a system one (the systemd service): use it. */
    snprintf(c->socket_path, sizeof c->socket_path, "%s", GD_SYSTEM_SOCKET);
  }
  if (opts->kind != GRAPHD_SESSION_CONTROL && opts->kind != GRAPHD_SESSION_DATA)
    return fail_connect(
        c,
        gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT, "unknown session kind %d", (int)opts->kind),
        errbuf, errlen);
  if (opts->client_name && strlen(opts->client_name) > GD_CLIENT_NAME_MAX)
    return fail_connect(
        c,
        gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT, "client_name is longer than %d bytes",
                          GD_CLIENT_NAME_MAX),
        errbuf, errlen);

  c->kind = opts->kind;
  if (opts->kind == GRAPHD_SESSION_DATA) memcpy(c->device_uuid, opts->device_uuid, 16);
  snprintf(c->client_name, sizeof c->client_name, "%s", opts->client_name ? opts->client_name : "");
  c->reconnect_ms = DEFAULT_RECONNECT_MS;
  const char *rw = getenv("GRAPHD_RECONNECT_MS");
  if (rw && *rw) {
    char *end;
    long v = strtol(rw, &end, 10);
    if (*end || v < 0 || v > INT32_MAX)
      return fail_connect(c,
                          gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT,
                                            "GRAPHD_RECONNECT_MS=%s is not a number of "
                                            "milliseconds (0 turns reconnecting off)",
                                            rw),
                          errbuf, errlen);
    c->reconnect_ms = (int)v;
  }
  c->reconnect = gd_client_reconnect;
  graphd_status st = open_session(c);
  if (st != GRAPHD_OK) return fail_connect(c, st, errbuf, errlen);
  *out = c;
  return GRAPHD_OK;
}

/* The handle's own memory and socket, once its page, ring and regions are
 * dealt with; its locks too, unless a parent's thread may have held them
 * at the fork (they are never destroyed in a child, whose memory is freed
 * all the same). */
static void free_handle(graphd_client *c, bool destroy_locks) {
  free(c->synced);
  free(c->busy);
  if (c->fd >= 0) close(c->fd);
  gd_frame_reader_close(&c->rd);
  if (destroy_locks) {
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->err_lock);
  }
  free(c);
}

void graphd_forget(graphd_client *c) {
  if (!c) return;
  bool foreign = gd_client_foreign(c);
  gd_client_replay_forget(c);
  gd_client_regions_forget(c);
  free_handle(c, !foreign);
}

void graphd_close(graphd_client *c) {
  if (!c) return;
  if (gd_client_foreign(c)) {
    /* Inherited through fork: the session, the page and the ring are the
     * parent's. Closing here would release its stream waits. */
    graphd_forget(c);
    return;
  }
  gd_client_replay_close(c);
  gd_client_regions_close(c);
  free_handle(c, true);
}

uint64_t graphd_session_id(const graphd_client *c) { return c->session_id; }

graphd_status graphd_ping(graphd_client *c, const void *payload, size_t len) {
  GD_OWNED(c);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Ping ping = GRAPHD__WIRE__PING__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_PING;
  req.ping = &ping;
  ping.payload.data = (uint8_t *)payload;
  ping.payload.len = len;
  pthread_mutex_lock(&c->lock);
  Graphd__Wire__Reply *rep = NULL;
  graphd_status st = gd_client_call(c, &req, NULL, 0, &rep);
  if (st == GRAPHD_OK) {
    if (rep->body_case != GRAPHD__WIRE__REPLY__BODY_PONG || rep->pong->payload.len != len ||
        (len && memcmp(rep->pong->payload.data, payload, len) != 0))
      st = gd_client_set_err(c, GRAPHD_DATA_LOSS, "graphd's pong does not echo the ping payload");
    graphd__wire__reply__free_unpacked(rep, NULL);
  }
  pthread_mutex_unlock(&c->lock);
  return st;
}

/* The latency histogram's bounds of w, as sent while they ascend and have
 * a count each, at most GRAPHD_LATENCY_BOUNDS (its count and sum are in
 * the counters' list). */
static void copy_latency(graphd_latency_histogram *h, const Graphd__Wire__DeviceCounters *w) {
  size_t n = w->n_replay_latency_le_ns < w->n_replay_latency_le_count
                 ? w->n_replay_latency_le_ns
                 : w->n_replay_latency_le_count;
  uint32_t k = 0;
  for (; k < n && k < GRAPHD_LATENCY_BOUNDS; k++) {
    if (k && w->replay_latency_le_ns[k] <= w->replay_latency_le_ns[k - 1]) break;
    h->le_ns[k] = w->replay_latency_le_ns[k];
    h->le_count[k] = w->replay_latency_le_count[k];
  }
  h->nbounds = k;
}

/* The sessions of a Status reply into p: their records, and 0.1.0's
 * session_info array from them. Returns GRAPHD_OK, or RESOURCE_EXHAUSTED. */
static graphd_status copy_sessions(gd_status_priv *p, const Graphd__Wire__StatusReply *sr) {
  graphd_daemon_status *s = &p->pub;
  size_t n = sr->n_session_list;
  if (n && (!(s->session_info = calloc(n, sizeof *s->session_info)) ||
            !(p->ses = calloc(n, sizeof *p->ses))))
    return GRAPHD_RESOURCE_EXHAUSTED;
  s->nsession_info = (uint32_t)n;
  for (size_t i = 0; i < n; i++) {
    const Graphd__Wire__SessionInfo *w = sr->session_list[i];
    graphd_session_record *r = &p->ses[i];
    graphd_session_info *x = &r->info;
    r->size = sizeof *r;
    r->index = (uint32_t)i;
    x->id = w->id;
    x->pid = w->pid;
    x->uid = w->uid;
    x->data = w->kind == GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_DATA;
    x->device = w->device;
    snprintf(x->client_name, sizeof x->client_name, "%s", w->client_name ? w->client_name : "");
    x->regions = w->regions;
    x->region_bytes = w->region_bytes;
    r->age_ms = w->age_ms;
    r->idle_ms = w->idle_ms;
    r->gid = w->gid;
    r->flag_slots = w->flag_slots;
    r->admin = w->admin;
    r->busy = w->busy;
    r->has_ring = w->has_ring;
    s->session_info[i] = *x; /* 0.1.0's layout */
  }
  return GRAPHD_OK;
}

static graphd_status get_status(graphd_client *c, bool no_wait, graphd_daemon_status **out) {
  GD_OWNED(c);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__StatusRequest sreq = GRAPHD__WIRE__STATUS_REQUEST__INIT;
  sreq.no_wait = no_wait;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_STATUS;
  req.status = &sreq;
  *out = NULL;
  pthread_mutex_lock(&c->lock);
  Graphd__Wire__Reply *rep = NULL;
  graphd_status st = gd_client_call(c, &req, NULL, 0, &rep);
  if (st != GRAPHD_OK) goto exit;
  if (rep->body_case != GRAPHD__WIRE__REPLY__BODY_STATUS) {
    st = gd_client_set_err(c, GRAPHD_DATA_LOSS, "graphd answered Status with another message");
    goto exit;
  }
  Graphd__Wire__StatusReply *sr = rep->status;
  gd_status_priv *p = calloc(1, sizeof *p);
  graphd_daemon_status *s = p ? &p->pub : NULL;
  if (!s ||
      (sr->n_devices && (!(s->devices = calloc(sr->n_devices, sizeof *s->devices)) ||
                         !(s->work = calloc(sr->n_devices, sizeof *s->work)) ||
                         !(s->launch_ns = calloc(sr->n_devices, sizeof *s->launch_ns)) ||
                         !(s->figures_age_ms = calloc(sr->n_devices, sizeof *s->figures_age_ms)) ||
                         !(p->rec = calloc(sr->n_devices, sizeof *p->rec))))) {
    graphd_daemon_status_free(s);
    st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    goto exit;
  }
  snprintf(s->version, sizeof s->version, "%s", sr->version ? sr->version : "");
  s->uptime_ms = sr->uptime_ms;
  s->pid = sr->pid;
  s->sessions = sr->sessions;
  s->ndevices = (uint32_t)sr->n_devices;
  for (size_t i = 0; i < sr->n_devices; i++) {
    const Graphd__Wire__DeviceInfo *w = sr->devices[i];
    graphd_device_record *r = &p->rec[i];
    r->size = sizeof *r;
    r->index = (uint32_t)i;
    copy_device(&r->info, w);
    r->figures_age_ms = w->figures_age_ms;
    r->staging_budget_bytes = w->staging_budget_bytes;
    if (w->counters) {
      gd_record_counters(r, w->counters);
      copy_latency(&r->replay_latency, w->counters);
    }
    /* The arrays of 0.1.0's layout. */
    s->devices[i] = r->info;
    s->work[i] = r->work;
    s->launch_ns[i] = r->launch_ns;
    s->figures_age_ms[i] = r->figures_age_ms;
  }
  s->modules = sr->modules;
  s->module_bytes = sr->module_bytes;
  s->programs = sr->programs;
  if (gd_status_requests(p, sr) != GRAPHD_OK || copy_sessions(p, sr) != GRAPHD_OK) {
    graphd_daemon_status_free(s);
    st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    goto exit;
  }
  *out = s;
exit:
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
  pthread_mutex_unlock(&c->lock);
  return st;
}

void graphd_daemon_status_free(graphd_daemon_status *s) {
  if (!s) return;
  gd_status_priv *p = (gd_status_priv *)s; /* pub is its first member */
  free(s->session_info);
  free(s->devices);
  free(s->work);
  free(s->launch_ns);
  free(s->figures_age_ms);
  free(p->rec);
  free(p->ses);
  free(p->req);
  free(p);
}

graphd_status graphd_daemon_status_device(const graphd_daemon_status *s, uint32_t i,
                                          graphd_device_record *out, size_t size) {
  if (!s || !out || i >= s->ndevices || size < offsetof(graphd_device_record, info))
    return GRAPHD_INVALID_ARGUMENT;
  const gd_status_priv *p = (const gd_status_priv *)s; /* pub is its first member */
  gd_record_fill(out, size, &p->rec[i], sizeof p->rec[i]);
  return GRAPHD_OK;
}

graphd_status graphd_daemon_status_session(const graphd_daemon_status *s, uint32_t i,
                                           graphd_session_record *out, size_t size) {
  if (!s || !out || i >= s->nsession_info || size < offsetof(graphd_session_record, info))
    return GRAPHD_INVALID_ARGUMENT;
  const gd_status_priv *p = (const gd_status_priv *)s; /* pub is its first member */
  gd_record_fill(out, size, &p->ses[i], sizeof p->ses[i]);
  return GRAPHD_OK;
}

graphd_status graphd_get_status(graphd_client *c, graphd_daemon_status **out) {
  return get_status(c, false, out);
}

graphd_status graphd_get_status_now(graphd_client *c, graphd_daemon_status **out) {
  return get_status(c, true, out);
}

graphd_status graphd_session_device(const graphd_client *c, graphd_device_info *out) {
  if (!c->has_device) return GRAPHD_FAILED_PRECONDITION;
  *out = c->device;
  return GRAPHD_OK;
}

void graphd_uuid_format(const uint8_t uuid[16], const char *prefix, char out[48]) {
  gd_uuid_format(uuid, prefix, out);
}

graphd_status graphd_uuid_parse(const char *s, uint8_t uuid[16]) {
  return gd_uuid_parse(s, uuid) == 0 ? GRAPHD_OK : GRAPHD_INVALID_ARGUMENT;
}

const char *graphd_version(void) { return GRAPHD_VERSION_STRING; }

uint32_t graphd_version_number(void) { return GRAPHD_VERSION_NUMBER; }
