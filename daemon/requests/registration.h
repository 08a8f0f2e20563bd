/* Registrations: modules and programs into the daemon-wide registry (the
 * session's user pays for them and the session holds them; large ones are
 * hashed or decoded on libuv's thread pool), and PrepareProgram, which
 * loads a program's modules on the session's device ahead of its first
 * replay. Loop thread only. */
#ifndef GRAPHD_REGISTRATION_H
#define GRAPHD_REGISTRATION_H

#include "graphd.pb-c.h"
#include "daemon/sessions/session.h"

/* Request handlers, as the router calls them (router.h). A module or a
 * program may come in a memfd, fds[0]; the router closes it after. */
void registration_handle_module(gd_session *s, Graphd__Wire__Request *req, int *fds);
void registration_handle_program(gd_session *s, Graphd__Wire__Request *req, int *fds);
void registration_handle_prepare(gd_session *s, Graphd__Wire__Request *req, int *fds);

#endif
