/* The request router: one table row per request kind says its name, how
 * many fds it may carry and whether its handler keeps them, whether it
 * needs a data session, and its handler. The router answers what the
 * table rules out (a request before Hello, a stray fd, a control session
 * asking for device work, an unknown or empty request), hands each
 * request to its handler, and closes the fds the handler does not keep.
 * Each row has its counters in the daemon (gd_request_counters): the
 * requests of its kind, those answered with a status other than OK, and
 * the loop's time in the handler. Loop thread only. */
#ifndef GRAPHD_ROUTER_H
#define GRAPHD_ROUTER_H

#include "graphd.pb-c.h"
#include "daemon/sessions/daemon.h"
#include "daemon/sessions/session.h"

/* A request handler: req stays the router's; fds holds the request's fds
 * (-1 where none came, two entries), which the handler closes or keeps
 * when its row says it keeps them, and must leave alone otherwise. */
typedef void (*gd_request_handler)(gd_session *s, Graphd__Wire__Request *req, int *fds);

/* Sets d's session hooks to the router's (on_request, on_close, on_failed)
 * and names d's request counters after the table's rows. Before the
 * daemon serves. */
void router_attach(gd_daemon *d);

/* The session's hook for a request: takes ownership of req and of the
 * nfds fds (already checked against req->nfds). */
void router_request(gd_session *s, Graphd__Wire__Request *req, int *fds, int nfds);

/* The session's hook at its close: it lets go of the registry entries it
 * held, and of its data session. */
void router_session_closed(gd_session *s);

#endif
