/* One client connection: credentials, framing, the reply queue, and the
 * state later capabilities hang off it (regions, flags, session stream).
 *
 * DESIGN: loop thread only. A session reads its socket itself through a
 * uv_poll_t (libuv streams cannot hand over arbitrary fds), takes one
 * request at a time (the next frame is not decoded while a request is with
 * a worker), and writes replies through a non-blocking queue. It is freed
 * only when its poll handle has closed and no job refers to it (`refs`). */
#ifndef GRAPHD_SESSION_H
#define GRAPHD_SESSION_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "frame.h"
#include "graphd.pb-c.h"

struct gd_server;

enum gd_session_kind { GD_SESSION_NONE = 0, GD_SESSION_DATA = 1, GD_SESSION_CONTROL = 2 };

typedef struct gd_outbuf {
  struct gd_outbuf *next;
  size_t len, off;
  uint8_t data[];
} gd_outbuf;

typedef struct gd_session {
  struct gd_session *prev, *next;
  struct gd_server *srv;
  uint64_t id;
  int fd;
  uv_poll_t poll;
  int poll_events;
  uid_t uid;
  gid_t gid;
  pid_t pid;
  int kind;            /* enum gd_session_kind; NONE until Hello */
  int device;          /* graphd device index for data sessions, else -1 */
  bool admin;
  char client_name[129];
  gd_frame_reader rd;
  /* The socket's writes, the reply queue and `closing` are guarded by
   * send_lock, since a worker may send a reply itself (see
   * session_send_direct); everything else is loop-thread only. */
  pthread_mutex_t send_lock;
  gd_outbuf *out_head, *out_tail; /* guarded by send_lock */
  size_t out_bytes;               /* guarded by send_lock */
  bool busy;           /* a request is in flight */
  bool closing;        /* written under send_lock */
  bool close_after_flush;
  int refs;            /* the poll handle + jobs in flight */
  struct gd_region *regions; /* region.c's table (uthash) */
  uint32_t next_region_id;
  uint64_t nregions;
  uint64_t region_bytes;
  struct gd_wsess *ws;  /* the worker's half (capture.c); data sessions */
  uint32_t flag_slots;  /* 0 until RegisterFlags */
  uint64_t *last_seq;   /* per flag slot */
} gd_session;

/* Adopts an accepted socket. Returns 0 or a negated status (fd closed). */
int session_new(struct gd_server *srv, int fd, gd_session **out);

/* Queues a reply. code is a graphd status (positive or negated); the
 * message is printf-style and may be NULL for OK. */
void session_reply(gd_session *s, Graphd__Wire__Reply *r);
void session_reply_error(gd_session *s, uint64_t request_id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Marks the in-flight request finished and resumes reading. */
void session_request_done(gd_session *s);

/* Sends what is queued, then closes. */
void session_close_after_flush(gd_session *s);

/* Closes now; queued replies are written best-effort first. */
void session_close(gd_session *s, const char *why);

/* Stops reading new requests (shutdown). */
void session_stop_reading(gd_session *s);

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
