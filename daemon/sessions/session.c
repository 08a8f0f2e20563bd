/* See session.h for the threading design (loop thread only). */
#define _GNU_SOURCE
#include "session.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/base/clock.h"
#include "graphd/status.h"
#include "common/log.h"
#include "graphd/wire.h"

#define READS_PER_WAKEUP 16
#define MAX_QUEUED_OUTPUT (64u << 20)

static void update_poll(gd_session *s);
static void request_done(gd_session *s);
static void close_fds(int *fds, int n);

void session_ref(gd_session *s) { s->refs++; }

/* The socket, what was read from it and what waits to be written: let go
 * as soon as the session closes, whatever jobs still refer to it, so that
 * clients that hang up during long jobs cannot pile up fds. Caller holds
 * send_lock, or is the last holder. */
static void drop_socket_locked(gd_session *s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
  for (gd_outbuf *b = s->out_head, *n; b; b = n) {
    n = b->next;
    free(b);
  }
  s->out_head = s->out_tail = NULL;
  s->out_bytes = 0;
}

void session_unref(gd_session *s) {
  if (--s->refs > 0) return;
  drop_socket_locked(s);
  pthread_mutex_destroy(&s->send_lock);
  gd_frame_reader_close(&s->rd);
  free(s);
}

static void close_cb(uv_handle_t *h) {
  gd_session *s = h->data;
  /* The poll handle is closed, so the fd may go: a worker no longer sends
   * on it either (session_send_direct checks `closing` under send_lock). */
  pthread_mutex_lock(&s->send_lock);
  drop_socket_locked(s);
  pthread_mutex_unlock(&s->send_lock);
  gd_frame_reader_close(&s->rd);
  session_unref(s);
}

/* Writes what the socket takes now. Returns 0, or -1 when the peer is gone.
 * Caller holds send_lock. */
static int flush_locked(gd_session *s) {
  while (s->out_head) {
    gd_outbuf *b = s->out_head;
    ssize_t n = send(s->fd, b->data + b->off, b->len - b->off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
      return -1;
    }
    b->off += (size_t)n;
    s->out_bytes -= (size_t)n;
    if (b->off < b->len) continue;
    s->out_head = b->next;
    if (!s->out_head) s->out_tail = NULL;
    free(b);
  }
  return 0;
}

/* Loop thread: whether replies wait to be written (a worker may have queued
 * the rest of a direct reply). */
static bool has_output(gd_session *s) {
  pthread_mutex_lock(&s->send_lock);
  bool o = s->out_head != NULL;
  pthread_mutex_unlock(&s->send_lock);
  return o;
}

static int flush(gd_session *s) {
  pthread_mutex_lock(&s->send_lock);
  int rc = flush_locked(s);
  pthread_mutex_unlock(&s->send_lock);
  return rc;
}

void session_close(gd_session *s, const char *why) {
  if (s->closing) return;
  pthread_mutex_lock(&s->send_lock);
  s->closing = true;
  if (s->out_head) (void)flush_locked(s); /* best effort */
  pthread_mutex_unlock(&s->send_lock);
  GD_LOG(GD_DEBUG, "session", "session %llu (pid %d uid %u) closed: %s", (unsigned long long)s->id,
         (int)s->pid, (unsigned)s->uid, why);
  gd_session_set *set = s->set;
  if (s->prev)
    s->prev->next = s->next;
  else
    set->head = s->next;
  if (s->next) s->next->prev = s->prev;
  s->prev = s->next = NULL;
  set->n--;
  if (set->on_close) set->on_close(s);
  uv_poll_stop(&s->poll);
  uv_close((uv_handle_t *)&s->poll, close_cb);
}

void session_close_after_flush(gd_session *s) {
  s->close_after_flush = true;
  if (!has_output(s))
    session_close(s, "closed by the daemon");
  else
    update_poll(s);
}

void session_stop_reading(gd_session *s) {
  if (s->closing) return;
  /* From here a client's send fails with EPIPE: it knows that request
   * never arrived. What arrived before is answered as not started. */
  (void)shutdown(s->fd, SHUT_RD);
  s->stopped_reading = true;
  s->close_after_flush = true; /* reads nothing more; closes once replies are out */
  if (!s->busy) session_refuse_unread(s);
  if (!s->closing && !s->busy && !has_output(s))
    session_close(s, "daemon shutting down");
  else if (!s->closing)
    update_poll(s);
}

/* Bounds the requests answered at shutdown for one session; libgraphd
 * sends one at a time. */
#define MAX_REFUSED 1024

void session_refuse_unread(gd_session *s) {
  for (int i = 0; i < MAX_REFUSED && !s->closing;) {
    gd_frame f;
    int r = gd_frame_reader_next(&s->rd, &f);
    if (r < 0) return; /* over the cap: no request id to answer */
    if (r == 0) {
      /* The socket is shut for reading: recv gives what was queued, then 0. */
      if (gd_frame_reader_recv(&s->rd, s->fd) <= 0) return;
      continue;
    }
    i++;
    close_fds(f.fds, f.nfds);
    Graphd__Wire__Request *req = graphd__wire__request__unpack(NULL, f.len, f.data);
    if (!req) continue; /* nothing a client waits on by id */
    Graphd__Wire__Reply rep = GRAPHD__WIRE__REPLY__INIT;
    rep.request_id = req->request_id;
    rep.code = GRAPHD_UNAVAILABLE;
    rep.message = "graphd is shutting down; the request was not started (send it again)";
    rep.not_started = true;
    graphd__wire__request__free_unpacked(req, NULL);
    session_reply(s, &rep);
  }
}

static void queue_frame(gd_session *s, uint8_t *frame, size_t len) {
  gd_outbuf *b = malloc(sizeof *b + len);
  if (!b) {
    free(frame);
    session_close(s, "out of memory queueing a reply");
    return;
  }
  memcpy(b->data, frame, len);
  free(frame);
  b->len = len;
  b->off = 0;
  b->next = NULL;
  pthread_mutex_lock(&s->send_lock);
  if (s->out_tail)
    s->out_tail->next = b;
  else
    s->out_head = b;
  s->out_tail = b;
  s->out_bytes += len;
  bool over = s->out_bytes > MAX_QUEUED_OUTPUT;
  int rc = over ? 0 : flush_locked(s);
  pthread_mutex_unlock(&s->send_lock);
  if (over) {
    session_close(s, "client does not read its replies");
    return;
  }
  if (rc < 0) {
    session_close(s, "peer went away while we replied");
    return;
  }
  if (s->close_after_flush && !has_output(s) && !s->busy) {
    session_close(s, "closed by the daemon");
    return;
  }
  update_poll(s);
}

int session_pack_reply(gd_session *s, Graphd__Wire__Reply *r, uint8_t **frame, size_t *len) {
  int rc = gd_wire_pack_reply(r, s->set->max_frame, frame, len);
  if (rc < 0) {
    /* The reply itself is too large: say so instead. */
    Graphd__Wire__Reply e = GRAPHD__WIRE__REPLY__INIT;
    e.request_id = r->request_id;
    e.code = GRAPHD_RESOURCE_EXHAUSTED;
    e.message = "the reply is larger than the frame cap (--max-frame)";
    rc = gd_wire_pack_reply(&e, s->set->max_frame, frame, len);
  }
  return rc;
}

void session_request_failed(gd_session *s) {
  if (s->request_kind < 0 || s->request_failed) return;
  s->request_failed = true;
  if (s->set->on_failed) s->set->on_failed(s);
}

void session_reply(gd_session *s, Graphd__Wire__Reply *r) {
  /* Counted though the client may be gone: the request failed all the same. */
  if (r->code != GRAPHD_OK) session_request_failed(s);
  if (s->closing) return;
  if (r->code != GRAPHD_OK && r->request_id && r->request_id == s->unrun_request_id)
    r->not_started = true;
  uint8_t *frame;
  size_t len;
  if (session_pack_reply(s, r, &frame, &len) < 0) {
    session_close(s, "cannot encode a reply");
    return;
  }
  queue_frame(s, frame, len);
}

bool session_send_direct(gd_session *s, uint8_t *frame, size_t len) {
  bool handled = false;
  pthread_mutex_lock(&s->send_lock);
  if (s->closing || s->out_head) goto exit;
  ssize_t n = send(s->fd, frame, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n == (ssize_t)len) {
    free(frame);
    handled = true;
  } else if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) {
    /* The rest waits for the loop, which polls for writability once this
     * job's completion reaches it. */
    size_t sent = n > 0 ? (size_t)n : 0;
    gd_outbuf *b = malloc(sizeof *b + len - sent);
    if (b) {
      memcpy(b->data, frame + sent, len - sent);
      b->len = len - sent;
      b->off = 0;
      b->next = NULL;
      s->out_head = s->out_tail = b;
      s->out_bytes = b->len;
      free(frame);
      handled = true;
    }
  }
  /* Any other error: the loop sees the peer gone and closes the session. */
exit:
  pthread_mutex_unlock(&s->send_lock);
  return handled;
}

void session_reply_error(gd_session *s, uint64_t request_id, int code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  r.request_id = request_id;
  r.code = (uint32_t)(code < 0 ? -code : code);
  r.message = msg;
  GD_LOG(GD_DEBUG, "session", "session %llu request %llu: %s: %s", (unsigned long long)s->id,
         (unsigned long long)request_id, graphd_status_name(code), msg);
  session_reply(s, &r);
}

static void close_fds(int *fds, int n) {
  for (int i = 0; i < n; i++) close(fds[i]);
}

static void handle_frame(gd_session *s, gd_frame *f) {
  s->active_ns = gd_now_ns();
  Graphd__Wire__Request *req = graphd__wire__request__unpack(NULL, f->len, f->data);
  if (!req) {
    close_fds(f->fds, f->nfds);
    session_reply_error(s, 0, GRAPHD_INVALID_ARGUMENT,
                        "malformed request: %zu bytes are not a valid Request message", f->len);
    return;
  }
  if (req->nfds != (uint32_t)f->nfds) {
    close_fds(f->fds, f->nfds);
    session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                        "request declares %u file descriptors but %d arrived with it; "
                        "closing the session",
                        req->nfds, f->nfds);
    graphd__wire__request__free_unpacked(req, NULL);
    session_close_after_flush(s);
    return;
  }
  s->set->on_request(s, req, f->fds, f->nfds);
}

/* Decodes buffered frames while no request is in flight. */
static void process(gd_session *s) {
  while (!s->busy && !s->closing && !s->close_after_flush) {
    gd_frame f;
    int r = gd_frame_reader_next(&s->rd, &f);
    if (r == 0) break;
    if (r < 0) {
      session_reply_error(s, 0, GRAPHD_RESOURCE_EXHAUSTED,
                          "frame of %u bytes is over the %u-byte cap (--max-frame); "
                          "closing the session",
                          gd_frame_reader_pending_len(&s->rd), (unsigned)s->rd.max_frame);
      session_close_after_flush(s);
      break;
    }
    handle_frame(s, &f);
  }
}

static void on_readable(gd_session *s) {
  for (int i = 0; i < READS_PER_WAKEUP && !s->busy && !s->closing && !s->close_after_flush; i++) {
    ssize_t n = gd_frame_reader_recv(&s->rd, s->fd);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
      if (errno == EMSGSIZE) {
        session_reply_error(s, 0, GRAPHD_RESOURCE_EXHAUSTED,
                            "more than %d file descriptors sent at once; closing the session",
                            GD_FRAME_MAX_FDS);
        session_close_after_flush(s);
      } else {
        session_close(s, strerror(errno));
      }
      return;
    }
    if (n == 0) {
      session_close(s, "peer closed the connection");
      return;
    }
    process(s);
  }
}

static void poll_cb(uv_poll_t *h, int status, int events) {
  gd_session *s = h->data;
  if (s->closing) return;
  if (status < 0) {
    session_close(s, uv_strerror(status));
    return;
  }
  if (events & UV_WRITABLE) {
    if (flush(s) < 0) {
      session_close(s, "peer went away while we replied");
      return;
    }
    if (s->close_after_flush && !has_output(s) && !s->busy) {
      session_close(s, "closed by the daemon");
      return;
    }
  }
  if ((events & UV_DISCONNECT) && s->busy) {
    /* The client is gone while its request is with a worker (a replay
     * waiting for its ready flag, say): end the session now, so that the
     * wait is released, rather than after the ready timeout. */
    session_close(s, "peer hung up during a request");
    return;
  }
  if (events & UV_READABLE) on_readable(s);
  if (!s->closing) update_poll(s);
}

static void update_poll(gd_session *s) {
  if (s->closing) return;
  int ev = UV_DISCONNECT; /* a peer that hangs up is noticed, busy or not */
  if (!s->busy && !s->close_after_flush) ev |= UV_READABLE;
  if (has_output(s)) ev |= UV_WRITABLE;
  if (ev == s->poll_events) return;
  s->poll_events = ev;
  if (ev)
    uv_poll_start(&s->poll, ev, poll_cb);
  else
    uv_poll_stop(&s->poll);
}

void session_begin_request(gd_session *s) {
  s->busy = true;
  session_ref(s);
}

/* A request's job is back: a job graphd did not start because it is
 * stopping marks the handler's error reply as not started. */
static void submitted_done(gd_job *j) {
  gd_request *rq = session_request_of(j);
  if (j->not_started) rq->s->unrun_request_id = rq->request_id;
  rq->done(j); /* may free rq; ends the request */
}

void session_submit(gd_session *s, uint64_t request_id, gd_request *rq, gd_worker *w,
                    gd_job_run_fn run, gd_job_done_fn done) {
  rq->s = s;
  rq->request_id = request_id;
  rq->done = done;
  rq->job.run = run;
  rq->job.done = submitted_done;
  session_begin_request(s);
  worker_submit(w, &rq->job);
}

void session_end_request(gd_session *s) {
  s->active_ns = gd_now_ns();
  s->unrun_request_id = 0;
  s->request_kind = -1;
  request_done(s);
  session_unref(s);
}

static void request_done(gd_session *s) {
  s->busy = false;
  if (s->closing) return;
  if (s->stopped_reading) session_refuse_unread(s);
  if (s->closing) return;
  if (s->close_after_flush && !has_output(s)) {
    session_close(s, "closed by the daemon");
    return;
  }
  process(s);
  update_poll(s);
}

int session_new(gd_session_set *set, int fd, gd_session **out) {
  gd_session *s = calloc(1, sizeof *s);
  if (!s) {
    close(fd);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  struct ucred cred;
  socklen_t cl = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
    GD_LOG(GD_WARN, "session", "SO_PEERCRED failed: %s; refusing the connection", strerror(errno));
    close(fd);
    free(s);
    return -GRAPHD_PERMISSION_DENIED;
  }
  int rc = uv_poll_init(set->loop, &s->poll, fd);
  if (rc < 0) {
    GD_LOG(GD_WARN, "session", "uv_poll_init: %s", uv_strerror(rc));
    close(fd);
    free(s);
    return -GRAPHD_INTERNAL;
  }
  s->poll.data = s;
  s->set = set;
  s->fd = fd;
  pthread_mutex_init(&s->send_lock, NULL);
  s->uid = cred.uid;
  s->gid = cred.gid;
  s->pid = cred.pid;
  s->device = -1;
  s->request_kind = -1;
  s->refs = 1;
  s->id = ++set->next_id;
  s->opened_ns = s->active_ns = gd_now_ns();
  gd_frame_reader_init(&s->rd, set->max_frame);
  s->next = set->head;
  if (set->head) set->head->prev = s;
  set->head = s;
  set->n++;
  update_poll(s);
  GD_LOG(GD_DEBUG, "session", "session %llu accepted from pid %d uid %u", (unsigned long long)s->id,
         (int)s->pid, (unsigned)s->uid);
  *out = s;
  return 0;
}
