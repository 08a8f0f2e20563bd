/* libgraphd: a handle's life (connect, close) and the session calls (ping,
 * status, the session's device). The top layer (internal.h lists them):
 * close tears down the handle's streams (replay.c) and regions (region.c).
 *
 * DESIGN: each handle has one mutex that serialises every call on it
 * (connect creates the handle, close destroys it). Never aborts, never
 * prints. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../common/paths.h"
#include "../../common/uuid.h"
#include "frame.h"
#include "graphd.pb-c.h"
#include "graphd/graphd.h"
#include "internal.h"
#include "version.h"
#include "wire.h"

#define DEFAULT_TIMEOUT_MS 30000

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
    d->counters.sessions = w->counters->sessions;
    d->counters.regions = w->counters->regions;
    d->counters.region_bytes = w->counters->region_bytes;
    d->counters.captures = w->counters->captures;
    d->counters.replays = w->counters->replays;
    d->counters.errors = w->counters->errors;
    d->counters.recaptures = w->counters->recaptures;
    d->counters.inflight = w->counters->inflight;
    d->counters.captures_built = w->counters->captures_built;
    d->counters.staging_bytes = w->counters->staging_bytes;
    d->counters.evictions = w->counters->evictions;
    d->counters.replay_p50_ns = w->counters->replay_p50_ns;
    d->counters.replay_p90_ns = w->counters->replay_p90_ns;
    d->counters.replay_p99_ns = w->counters->replay_p99_ns;
    d->counters.replay_max_ns = w->counters->replay_max_ns;
  }
}

static graphd_status fail_connect(graphd_client *c, graphd_status st, char *errbuf, size_t errlen) {
  if (errbuf && errlen) snprintf(errbuf, errlen, "%s", c->err);
  if (c->fd >= 0) close(c->fd);
  gd_frame_reader_close(&c->rd);
  pthread_mutex_destroy(&c->lock);
  free(c);
  return st;
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
  pthread_mutex_init(&c->lock, NULL);
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

  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0)
    return fail_connect(c, gd_client_set_err(c, GRAPHD_INTERNAL, "socket: %s", strerror(errno)),
                        errbuf, errlen);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path, c->socket_path, strlen(c->socket_path) + 1);
  struct timeval tv = {.tv_sec = c->timeout_ms / 1000, .tv_usec = (c->timeout_ms % 1000) * 1000};
  (void)setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(c->fd, (struct sockaddr *)&a, sizeof a) < 0) {
    int e = errno;
    graphd_status st = (e == EACCES || e == EPERM) ? GRAPHD_PERMISSION_DENIED : GRAPHD_UNAVAILABLE;
    return fail_connect(
        c,
        gd_client_set_err(c, st, "cannot connect to graphd at %s: %s%s", c->socket_path,
                          strerror(e),
                          (e == ENOENT || e == ECONNREFUSED) ? " (is the daemon running?)" : ""),
        errbuf, errlen);
  }

  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Hello h = GRAPHD__WIRE__HELLO__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_HELLO;
  req.hello = &h;
  h.protocol_version = GRAPHD_PROTOCOL_VERSION;
  h.client_name = (char *)(opts->client_name ? opts->client_name : "");
  if (opts->kind == GRAPHD_SESSION_DATA) {
    h.kind = GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_DATA;
    h.device_uuid.data = (uint8_t *)opts->device_uuid;
    h.device_uuid.len = 16;
  } else {
    h.kind = GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_CONTROL;
  }
  Graphd__Wire__Reply *rep = NULL;
  graphd_status st = gd_client_call(c, &req, NULL, 0, &rep);
  if (st != GRAPHD_OK) return fail_connect(c, st, errbuf, errlen);
  if (rep->body_case != GRAPHD__WIRE__REPLY__BODY_HELLO) {
    graphd__wire__reply__free_unpacked(rep, NULL);
    return fail_connect(
        c, gd_client_set_err(c, GRAPHD_DATA_LOSS, "graphd answered Hello with another message"),
        errbuf, errlen);
  }
  c->session_id = rep->hello->session_id;
  c->max_frame = rep->hello->max_frame;
  if (rep->hello->device) {
    copy_device(&c->device, rep->hello->device);
    c->has_device = true;
  }
  graphd__wire__reply__free_unpacked(rep, NULL);
  *out = c;
  return GRAPHD_OK;
}

void graphd_close(graphd_client *c) {
  if (!c) return;
  gd_client_replay_close(c);
  gd_client_regions_close(c);
  free(c->synced);
  free(c->busy);
  if (c->fd >= 0) close(c->fd);
  gd_frame_reader_close(&c->rd);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

uint64_t graphd_session_id(const graphd_client *c) { return c->session_id; }

const char *graphd_last_error(const graphd_client *c) { return c->err; }

graphd_status graphd_ping(graphd_client *c, const void *payload, size_t len) {
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

graphd_status graphd_get_status(graphd_client *c, graphd_daemon_status **out) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__StatusRequest sreq = GRAPHD__WIRE__STATUS_REQUEST__INIT;
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
  graphd_daemon_status *s = calloc(1, sizeof *s);
  if (!s || (sr->n_devices && !(s->devices = calloc(sr->n_devices, sizeof *s->devices)))) {
    free(s);
    st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    goto exit;
  }
  snprintf(s->version, sizeof s->version, "%s", sr->version ? sr->version : "");
  s->uptime_ms = sr->uptime_ms;
  s->pid = sr->pid;
  s->sessions = sr->sessions;
  s->ndevices = (uint32_t)sr->n_devices;
  for (size_t i = 0; i < sr->n_devices; i++) copy_device(&s->devices[i], sr->devices[i]);
  s->modules = sr->modules;
  s->module_bytes = sr->module_bytes;
  s->programs = sr->programs;
  if (sr->n_session_list &&
      !(s->session_info = calloc(sr->n_session_list, sizeof *s->session_info))) {
    graphd_daemon_status_free(s);
    st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    goto exit;
  }
  s->nsession_info = (uint32_t)sr->n_session_list;
  for (size_t i = 0; i < sr->n_session_list; i++) {
    const Graphd__Wire__SessionInfo *w = sr->session_list[i];
    graphd_session_info *x = &s->session_info[i];
    x->id = w->id;
    x->pid = w->pid;
    x->uid = w->uid;
    x->data = w->kind == GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_DATA;
    x->device = w->device;
    snprintf(x->client_name, sizeof x->client_name, "%s", w->client_name ? w->client_name : "");
    x->regions = w->regions;
    x->region_bytes = w->region_bytes;
  }
  *out = s;
exit:
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
  pthread_mutex_unlock(&c->lock);
  return st;
}

void graphd_daemon_status_free(graphd_daemon_status *s) {
  if (!s) return;
  free(s->session_info);
  free(s->devices);
  free(s);
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
