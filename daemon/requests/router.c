/* See router.h. Loop thread. */
#include "router.h"

#include <stdbool.h>
#include <stddef.h>
#include <unistd.h>

#include "attach.h"
#include "control.h"
#include "daemon/sessions/daemon.h"
#include "daemon/sessions/data_session.h"
#include "graphd/status.h"
#include "hello.h"
#include "reclaim.h"
#include "registration.h"
#include "daemon/base/registry.h"
#include "replay.h"
#include "graphd/wire.h"

typedef struct gd_route {
  Graphd__Wire__Request__BodyCase body;
  const char *name;
  int max_fds;     /* the most fds the request may carry */
  bool keeps_fds;  /* the handler owns them from the call on */
  bool needs_data; /* only on a data session (one bound to a device) */
  gd_request_handler handle;
} gd_route;

#define ROUTE(b, n, fds, keeps, data, fn)                                                          \
  { GRAPHD__WIRE__REQUEST__BODY_##b, n, fds, keeps, data, fn }

static const gd_route routes[] = {
    ROUTE(HELLO, "Hello", 0, false, false, hello_handle_hello),
    ROUTE(PING, "Ping", 0, false, false, hello_handle_ping),
    ROUTE(STATUS, "Status", 0, false, false, control_handle_status),
    ROUTE(LIST_CAPTURES, "ListCaptures", 0, false, false, control_handle_list),
    ROUTE(EVICT, "Evict", 0, false, false, control_handle_evict),
    ROUTE(REGISTER_MODULE, "RegisterModule", 1, false, false, registration_handle_module),
    ROUTE(REGISTER_PROGRAM, "RegisterProgram", 1, false, false, registration_handle_program),
    ROUTE(PREPARE_PROGRAM, "PrepareProgram", 0, false, true, registration_handle_prepare),
    ROUTE(REGISTER_FLAGS, "RegisterFlags", 1, true, true, attach_handle_register_flags),
    ROUTE(REGISTER_REGION, "RegisterRegion", 1, true, true, attach_handle_register_region),
    ROUTE(UNREGISTER_REGION, "UnregisterRegion", 0, false, true, attach_handle_unregister_region),
    ROUTE(REGISTER_RING, "RegisterRing", 2, true, true, attach_handle_register_ring),
    ROUTE(RING_PROGRAM, "RingProgram", 0, false, true, attach_handle_ring_program),
    ROUTE(REPLAY, "Replay", 0, false, true, replay_handle_replay),
};

#define NROUTES (sizeof routes / sizeof routes[0])
_Static_assert(NROUTES <= GD_REQUEST_KINDS_MAX, "the request counters have a row per route");

static const gd_route *route_of(Graphd__Wire__Request__BodyCase body) {
  for (size_t i = 0; i < NROUTES; i++)
    if (routes[i].body == body) return &routes[i];
  return NULL;
}

/* Whether the table lets req through to its handler; if not, the answer
 * is sent (and a session that skipped Hello is closed after it). */
static bool admitted(gd_session *s, Graphd__Wire__Request *req, const gd_route *r, int nfds) {
  const char *name = r ? r->name : "unknown";
  int max_fds = r ? r->max_fds : 0;
  if (nfds > max_fds) {
    if (max_fds)
      session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                          "%s takes at most %s, but %d were sent", name,
                          max_fds == 1 ? "one file descriptor" : "two file descriptors", nfds);
    else
      session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                          "%s takes no file descriptors, but %d were sent", name, nfds);
    return false;
  }
  if (req->body_case == GRAPHD__WIRE__REQUEST__BODY__NOT_SET) {
    uint32_t field = gd_wire_first_unknown_field(&req->base);
    if (field)
      session_reply_error(s, req->request_id, GRAPHD_UNIMPLEMENTED,
                          "unknown request (field %u): this daemon speaks protocol version %u",
                          field, GRAPHD_PROTOCOL_VERSION);
    else
      session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                          "empty request: no request body was set");
    return false;
  }
  if (!r) {
    session_reply_error(s, req->request_id, GRAPHD_UNIMPLEMENTED, "request %d is not handled",
                        (int)req->body_case);
    return false;
  }
  if (s->kind == GD_SESSION_NONE && r->body != GRAPHD__WIRE__REQUEST__BODY_HELLO) {
    session_reply_error(s, req->request_id, GRAPHD_FAILED_PRECONDITION,
                        "the first request on a session must be Hello, not %s; closing", r->name);
    session_close_after_flush(s);
    return false;
  }
  if (r->needs_data && s->kind != GD_SESSION_DATA) {
    session_reply_error(s, req->request_id, GRAPHD_FAILED_PRECONDITION,
                        "%s needs a data session (one bound to a device)", r->name);
    return false;
  }
  return true;
}

void router_request(gd_session *s, Graphd__Wire__Request *req, int *fds, int nfds) {
  const gd_route *r = route_of(req->body_case);
  int two[2] = {nfds >= 1 ? fds[0] : -1, nfds >= 2 ? fds[1] : -1};
  bool kept = false;
  /* The row's counters: a call now, an error when a reply other than OK
   * goes out for it (request_failed, through the session, whether now or
   * from a worker's job), and the loop's time in the handler. A request
   * the table does not know has no row. */
  gd_request_counters *rc = r ? &daemon_of(s)->requests[r - routes] : NULL;
  s->request_kind = r ? (int)(r - routes) : -1;
  s->request_failed = false;
  if (rc) rc->calls++;
  if (admitted(s, req, r, nfds)) {
    uint64_t t0 = gd_now_ns();
    r->handle(s, req, two);
    rc->handler_ns += gd_now_ns() - t0;
    kept = r->keeps_fds;
  }
  /* Answered here and now: later replies (the shutdown's to what was not
   * read) are not this request's. */
  if (!s->busy) s->request_kind = -1;
  for (int i = 0; i < nfds && !kept; i++) close(fds[i]);
  graphd__wire__request__free_unpacked(req, NULL);
  reclaim_flush(daemon_of(s)); /* what a registration made room by */
}

static void request_failed(gd_session *s) { daemon_of(s)->requests[s->request_kind].errors++; }

void router_attach(gd_daemon *d) {
  d->sessions.on_request = router_request;
  d->sessions.on_close = router_session_closed;
  d->sessions.on_failed = request_failed;
  for (size_t i = 0; i < NROUTES; i++) d->requests[i].name = routes[i].name;
  d->nrequest_kinds = (uint32_t)NROUTES;
}

void router_session_closed(gd_session *s) {
  control_session_closed(s);
  registry_release(&daemon_of(s)->reg, &s->holds);
  data_session_close(s);
}
