/* libgraphd: one request, one reply on a handle's socket, and the handle's
 * error text. Below everything that talks to the daemon (internal.h lists
 * the layers); a call that finds the daemon gone releases the handle's
 * streams (watcher.c).
 *
 * DESIGN: blocking I/O with poll() timeouts, under the handle's lock,
 * which the caller holds. A call records how it failed when the daemon
 * went away (c->fail): before the request reached it (the daemon shuts a
 * stopping session's socket for reading, so a send then fails at once),
 * answered "not started", or lost after it was sent. Requests that are
 * safe to send twice are sent again after c->reconnect. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "graphd/frame.h"
#include "graphd.pb-c.h"
#include "graphd/graphd.h"
#include "internal.h"
#include "graphd/wire.h"

/* The calling thread's last failure: which handle (by serial), its status
 * and text (graphd_last_error_r). */
static __thread struct {
  uint64_t serial;
  graphd_status status;
  char text[GRAPHD_ERRMAX];
} thread_err;

graphd_status gd_client_set_err(graphd_client *c, graphd_status st, const char *fmt, ...) {
  char text[GRAPHD_ERRMAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&c->err_lock);
  memcpy(c->err, text, sizeof text);
  c->err_status = st;
  pthread_mutex_unlock(&c->err_lock);
  thread_err.serial = c->serial;
  thread_err.status = st;
  memcpy(thread_err.text, text, sizeof text);
  return st;
}

void gd_client_clear_err(graphd_client *c) {
  pthread_mutex_lock(&c->err_lock);
  c->err[0] = '\0';
  c->err_status = GRAPHD_OK;
  pthread_mutex_unlock(&c->err_lock);
}

bool gd_client_foreign(const graphd_client *c) { return c->owner != getpid(); }

graphd_status gd_client_foreign_err(const graphd_client *c) {
  thread_err.serial = c->serial;
  thread_err.status = GRAPHD_FAILED_PRECONDITION;
  snprintf(thread_err.text, sizeof thread_err.text,
           "this handle was inherited through fork() from process %ld: a child of fork must not "
           "use it (graphd_close or graphd_forget only forget it there); connect afresh",
           (long)c->owner);
  return GRAPHD_FAILED_PRECONDITION;
}

const char *graphd_last_error(const graphd_client *c) {
  /* A copy: the handle's text may be rewritten by a call in another
   * thread at any moment. Valid until this thread's next call of it. */
  static __thread char copy[GRAPHD_ERRMAX];
  graphd_client *m = (graphd_client *)c;
  pthread_mutex_lock(&m->err_lock);
  memcpy(copy, c->err, sizeof copy);
  pthread_mutex_unlock(&m->err_lock);
  return copy;
}

graphd_status graphd_last_error_r(const graphd_client *c, char *buf, size_t len) {
  graphd_status st;
  char text[GRAPHD_ERRMAX];
  if (thread_err.serial == c->serial && thread_err.status != GRAPHD_OK) {
    st = thread_err.status;
    memcpy(text, thread_err.text, sizeof text);
  } else {
    graphd_client *m = (graphd_client *)c;
    pthread_mutex_lock(&m->err_lock);
    st = c->err_status;
    memcpy(text, c->err, sizeof text);
    pthread_mutex_unlock(&m->err_lock);
  }
  if (buf && len) snprintf(buf, len, "%s", text);
  return st;
}

/* The daemon is gone: release our streams' waits now (the watcher would
 * within its period) and say what that means for the outputs. */
static graphd_status lost(graphd_client *c, const char *why) {
  gd_client_debug(c, "lost the daemon: %s", why);
  c->broken = true;
  atomic_store(&c->dead, true);
  if (c->flags) {
    gd_client_release_streams(c);
    return gd_client_set_err(c, GRAPHD_UNAVAILABLE,
                             "graphd closed the connection (%s); the outputs of replays in "
                             "flight are undefined",
                             why);
  }
  return gd_client_set_err(c, GRAPHD_UNAVAILABLE, "graphd closed the connection (%s)", why);
}

/* Waits for events on c->fd until deadline. 1 ready, 0 timeout, -1 error. */
static int wait_fd(graphd_client *c, short events, int64_t deadline) {
  for (;;) {
    int64_t left = deadline - gd_mono_ms();
    if (left <= 0) return 0;
    struct pollfd p = {.fd = c->fd, .events = events};
    int r = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
    if (r > 0) return 1;
    if (r == 0) continue;
    if (errno != EINTR) return -1;
  }
}

/* Sends a whole frame. A failure because the daemon is gone marks the call
 * GD_FAIL_UNSENT: a frame cut short is never decoded. */
static graphd_status send_frame(graphd_client *c, const uint8_t *buf, size_t len, const int *fds,
                                int nfds, int64_t deadline) {
  size_t off = 0;
  while (off < len) {
    /* The fds ride on the first sendmsg, whose data starts the frame. */
    ssize_t n = gd_frame_sendmsg(c->fd, buf + off, len - off, off == 0 ? fds : NULL,
                                 off == 0 ? nfds : 0, MSG_DONTWAIT);
    if (n > 0) {
      off += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      int w = wait_fd(c, POLLOUT, deadline);
      if (w == 0) {
        c->broken = true;
        return gd_client_set_err(c, GRAPHD_DEADLINE_EXCEEDED,
                                 "timed out after %d ms sending to graphd", c->timeout_ms);
      }
      if (w > 0) continue;
    }
    c->fail = GD_FAIL_UNSENT;
    return lost(c, n < 0 ? strerror(errno) : "short write");
  }
  return GRAPHD_OK;
}

static graphd_status recv_frame(graphd_client *c, gd_frame *f, int64_t deadline) {
  for (;;) {
    int r = gd_frame_reader_next(&c->rd, f);
    if (r > 0) return GRAPHD_OK;
    if (r < 0) {
      c->broken = true;
      return gd_client_set_err(c, GRAPHD_DATA_LOSS, "graphd sent a frame over %u bytes",
                               GD_CLIENT_MAX_FRAME);
    }
    /* Blocking, bounded by SO_RCVTIMEO (the call's timeout, set at
     * connect): the reply usually comes within tens of microseconds. */
    ssize_t n = gd_frame_reader_recv_wait(&c->rd, c->fd);
    if (n > 0) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (gd_mono_ms() >= deadline) {
        c->broken = true;
        return gd_client_set_err(c, GRAPHD_DEADLINE_EXCEEDED, "graphd did not answer within %d ms",
                                 c->timeout_ms);
      }
      continue;
    }
    c->fail = GD_FAIL_LOST;
    return lost(c, n < 0 ? strerror(errno) : "end of stream");
  }
}

/* One request, one reply. On GRAPHD_OK *out holds the reply (free it with
 * graphd__wire__reply__free_unpacked); on a daemon error the message is in
 * c->err. Caller holds c->lock. */
static graphd_status call_once(graphd_client *c, Graphd__Wire__Request *req, const int *fds,
                               int nfds, Graphd__Wire__Reply **out) {
  c->fail = GD_FAIL_NONE;
  if (atomic_load(&c->dead)) {
    c->fail = GD_FAIL_UNSENT;
    if (!c->broken) {
      c->broken = true;
      return gd_client_set_err(c, GRAPHD_UNAVAILABLE,
                               "graphd went away; outputs of replays in flight are undefined; "
                               "reconnect");
    }
  }
  if (c->broken)
    return gd_client_set_err(c, GRAPHD_UNAVAILABLE,
                             "the session with graphd is broken by an earlier error; reconnect");
  int64_t deadline = gd_mono_ms() + c->timeout_ms;
  req->request_id = ++c->next_request;
  req->nfds = (uint32_t)nfds;
  uint8_t *buf;
  size_t len;
  /* Over the daemon's cap, the daemon would close the session: refuse here
   * instead, and the session stays open. */
  uint32_t cap = c->max_frame ? c->max_frame : GD_CLIENT_MAX_FRAME;
  if (gd_wire_pack_request(req, cap, &buf, &len) < 0) {
    size_t need = graphd__wire__request__get_packed_size(req);
    if (need <= cap) return gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    return gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED,
                             "request of %zu bytes is over graphd's %u-byte frame cap; start "
                             "graphd with a larger --max-frame",
                             need, cap);
  }
  graphd_status st = send_frame(c, buf, len, fds, nfds, deadline);
  free(buf);
  if (st != GRAPHD_OK) return st;
  for (;;) {
    gd_frame f;
    st = recv_frame(c, &f, deadline);
    if (st != GRAPHD_OK) return st;
    for (int i = 0; i < f.nfds; i++) close(f.fds[i]); /* replies carry none yet */
    Graphd__Wire__Reply *rep = graphd__wire__reply__unpack(NULL, f.len, f.data);
    if (!rep) {
      c->broken = true;
      return gd_client_set_err(c, GRAPHD_DATA_LOSS, "graphd sent a malformed reply");
    }
    /* Request id 0 is the daemon speaking about the stream itself. */
    if (rep->request_id != req->request_id && rep->request_id != 0) {
      graphd__wire__reply__free_unpacked(rep, NULL);
      continue;
    }
    if (rep->code != GRAPHD_OK) {
      graphd_status code =
          graphd_status_valid((int)rep->code) ? (graphd_status)rep->code : GRAPHD_INTERNAL;
      /* A stopping daemon that did not start it: the next one may. */
      if (code == GRAPHD_UNAVAILABLE && rep->not_started) c->fail = GD_FAIL_NOT_STARTED;
      gd_client_set_err(c, code, "%s",
                        rep->message && *rep->message ? rep->message : graphd_strerror((int)code));
      graphd__wire__reply__free_unpacked(rep, NULL);
      return code;
    }
    *out = rep;
    gd_client_clear_err(c);
    return GRAPHD_OK;
  }
}

/* Requests that may reach a daemon twice: they change nothing or only the
 * daemon-wide registry, which takes the same content again. */
static bool resendable(const Graphd__Wire__Request *req) {
  switch (req->body_case) {
    case GRAPHD__WIRE__REQUEST__BODY_PING:
    case GRAPHD__WIRE__REQUEST__BODY_STATUS:
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_MODULE:
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_PROGRAM:
    case GRAPHD__WIRE__REQUEST__BODY_PREPARE_PROGRAM:
    case GRAPHD__WIRE__REQUEST__BODY_LIST_CAPTURES:
    case GRAPHD__WIRE__REQUEST__BODY_EVICT: return true;
    default: return false;
  }
}

graphd_status gd_client_call(graphd_client *c, Graphd__Wire__Request *req, const int *fds, int nfds,
                             Graphd__Wire__Reply **out) {
  graphd_status st = call_once(c, req, fds, nfds, out);
  if (st != GRAPHD_UNAVAILABLE || c->fail == GD_FAIL_NONE || c->reconnecting || !c->reconnect ||
      c->reconnect_ms <= 0 || !resendable(req))
    return st;
  gd_client_debug(c, "the daemon went away during a request of type %d; reconnecting",
                  (int)req->body_case);
  st = c->reconnect(c);
  if (st != GRAPHD_OK) return st;
  return call_once(c, req, fds, nfds, out);
}
