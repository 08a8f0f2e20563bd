/* One client connection: credentials, framing, the reply queue, and the
 * life of a request that goes to a worker. What a data session adds
 * (regions, flags, its stream) hangs off `data` (data_session.c).
 *
 * DESIGN: the loop thread owns a session, with two exceptions: a worker
 * may pack a reply (session_pack_reply) and send it straight to the
 * socket (session_send_direct), under send_lock, which guards the
 * socket's writes, the reply queue and `closing`. A session reads its
 * socket itself through a uv_poll_t (libuv streams cannot hand over
 * arbitrary fds), takes one request at a time (the next frame is not
 * decoded while a request is with a worker), and writes replies through a
 * non-blocking queue. Its socket, read buffer and reply queue go back
 * as soon as its poll handle has closed after session_close, whatever
 * still refers to it; the struct itself is freed only when no job refers
 * to it either (`refs`).
 * Decoded requests go to the set's on_request, and a closing session to
 * its on_close, so this file knows no request. */
#ifndef GRAPHD_SESSION_H
#define GRAPHD_SESSION_H

#include <pthread.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "graphd/frame.h"
#include "graphd.pb-c.h"
#include "daemon/device/worker.h"

typedef struct gd_session gd_session;

/* Every session of a daemon, and what it does with them. */
typedef struct gd_session_set {
  uv_loop_t *loop;
  uint32_t max_frame;
  gd_session *head; /* doubly linked through session->prev/next */
  uint64_t n;
  uint64_t next_id;
  /* Takes ownership of req and of the nfds fds (checked against req->nfds). */
  void (*on_request)(gd_session *s, Graphd__Wire__Request *req, int *fds, int nfds);
  /* The session is closing (once); its data is let go here. */
  void (*on_close)(gd_session *s);
  /* The request being handled was answered with a status other than OK
   * (once per request; may be NULL): the router counts it. */
  void (*on_failed)(gd_session *s);
} gd_session_set;

enum gd_session_kind { GD_SESSION_NONE = 0, GD_SESSION_DATA = 1, GD_SESSION_CONTROL = 2 };

typedef struct gd_outbuf {
  struct gd_outbuf *next;
  size_t len, off;
  uint8_t data[];
} gd_outbuf;

struct gd_session {
  gd_session *prev, *next;
  gd_session_set *set;
  uint64_t id;
  int fd;
  uv_poll_t poll;
  int poll_events;
  uid_t uid;
  gid_t gid;
  pid_t pid;
  int kind;   /* enum gd_session_kind; NONE until Hello */
  int device; /* graphd device index for data sessions, else -1 */
  bool admin;
  char client_name[129];
  gd_frame_reader rd;
  /* The socket's writes, the reply queue and `closing` are guarded by
   * send_lock, since a worker may send a reply itself (see
   * session_send_direct); everything else is loop-thread only. */
  pthread_mutex_t send_lock;
  gd_outbuf *out_head, *out_tail; /* guarded by send_lock */
  size_t out_bytes;               /* guarded by send_lock */
  bool busy;                      /* a request is in flight */
  bool closing;                   /* written under send_lock */
  bool close_after_flush;
  bool stopped_reading; /* shutdown: the socket is shut for reading */
  int refs;             /* the poll handle + jobs in flight */
  void *data;           /* a data session's state (data_session.c), NULL once closed */
  /* Registry entries it holds (registration.c, replay.c, data_session.c). */
  struct gd_reg_holds *holds;
  void *control;         /* its Status, List or Evict in flight (control.c), or NULL */
  const void *last_held; /* the program it held last, to skip the lookup */
  uint64_t opened_ns;    /* accepted */
  uint64_t active_ns;    /* its last request came in or ended */
  /* The request in flight whose job was not started because graphd is
   * stopping: its error reply says so (Reply.not_started). 0: none. */
  uint64_t unrun_request_id;
  /* The request being handled as the set's on_request names it (its kind,
   * an index of the router's; -1 between requests) and whether a reply
   * other than OK went out for it: what on_failed counts. */
  int request_kind;
  bool request_failed;
};

/* Adopts an accepted socket. Returns 0 or a negated status (fd closed). */
int session_new(gd_session_set *set, int fd, gd_session **out);

/* Queues a reply. code is a graphd status (positive or negated); the
 * message is printf-style and may be NULL for OK. */
void session_reply(gd_session *s, Graphd__Wire__Reply *r);
void session_reply_error(gd_session *s, uint64_t request_id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The request being handled failed: a reply other than OK went out for it.
 * session_reply says so of the replies it sends; a handler whose worker
 * sent the reply itself (session_send_direct) says so on the loop. Calls
 * the set's on_failed once per request, and never between requests. */
void session_request_failed(gd_session *s);

/* A request that goes to a worker: its job, and whom to answer. */
typedef struct gd_request {
  gd_job job;
  gd_session *s;
  uint64_t request_id;
  gd_job_done_fn done; /* the handler's; session_submit puts its own first */
} gd_request;

/* The session's request in flight begins: nothing more is read from the
 * session, and it stays allocated, until session_end_request(). */
void session_begin_request(gd_session *s);
/* It ended (replied or not): reading resumes, the request is no longer
 * the one being handled; drops the reference. */
void session_end_request(gd_session *s);

/* Begins the request and hands rq to worker w, which runs `run`; `done`
 * gets rq->job back on the loop and must end the request. */
void session_submit(gd_session *s, uint64_t request_id, gd_request *rq, gd_worker *w,
                    gd_job_run_fn run, gd_job_done_fn done);

/* The gd_request a job belongs to. */
static inline gd_request *session_request_of(gd_job *j) {
  return (gd_request *)((char *)j - offsetof(gd_request, job));
}

/* Sends what is queued, then closes. */
void session_close_after_flush(gd_session *s);

/* Closes now; queued replies are written best-effort first. */
void session_close(gd_session *s, const char *why);

/* Stops reading new requests (shutdown): the socket is shut for reading,
 * so that a client's later send fails (EPIPE) instead of being lost, and a
 * session with no request in flight answers what it had been sent
 * (session_refuse_unread) and closes. */
void session_stop_reading(gd_session *s);

/* Shutdown, once reading has stopped and no request is in flight: answers
 * every whole request the client sent before reading stopped with
 * UNAVAILABLE and Reply.not_started (nothing of it ran), closing the fds
 * it carried. */
void session_refuse_unread(gd_session *s);

/* Packs a reply into a new frame. Any thread. Returns 0 or a negated
 * status. */
int session_pack_reply(gd_session *s, Graphd__Wire__Reply *r, uint8_t **frame, size_t *len);

/* Worker thread: sends a reply frame at once, skipping the hop back to the
 * loop, when the session is open and nothing is queued ahead of it. A part
 * the socket did not take is queued for the loop to flush. Returns true
 * when the frame is handled (sent or queued), false to leave it to the
 * loop. Takes ownership of frame only when it returns true. */
bool session_send_direct(gd_session *s, uint8_t *frame, size_t len);

void session_ref(gd_session *s);
void session_unref(gd_session *s);

#endif
