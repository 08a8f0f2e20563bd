/* The session's first request and the liveness check: Hello (the protocol
 * version, the client's name, the session's kind and device, who is
 * admin) and Ping. Loop thread only. */
#ifndef GRAPHD_HELLO_H
#define GRAPHD_HELLO_H

#include "graphd.pb-c.h"
#include "daemon/sessions/session.h"

/* Request handlers, as the router calls them (router.h): they take no
 * fds. */
void hello_handle_hello(gd_session *s, Graphd__Wire__Request *req, int *fds);
void hello_handle_ping(gd_session *s, Graphd__Wire__Request *req, int *fds);

#endif
