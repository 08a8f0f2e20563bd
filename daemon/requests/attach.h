/* What a data session attaches on its device: its flag page
 * (RegisterFlags), its regions (RegisterRegion, UnregisterRegion), its
 * submission ring (RegisterRing) and the ring's program handles
 * (RingProgram). The session's life (its open and end, cut-off and device
 * reset) is data_session.c's.
 *
 * DESIGN: loop thread only; the jobs' run functions run on the device's
 * worker. */
#ifndef GRAPHD_ATTACH_H
#define GRAPHD_ATTACH_H

#include "graphd.pb-c.h"
#include "daemon/sessions/session.h"

/* Request handlers, as the router calls them (router.h), on data sessions
 * only. RegisterFlags and RegisterRegion take fds[0], RegisterRing fds[0]
 * (the ring's memfd) and fds[1] (its doorbell). */
void attach_handle_register_flags(gd_session *s, Graphd__Wire__Request *req, int *fds);
void attach_handle_register_region(gd_session *s, Graphd__Wire__Request *req, int *fds);
void attach_handle_unregister_region(gd_session *s, Graphd__Wire__Request *req, int *fds);
void attach_handle_register_ring(gd_session *s, Graphd__Wire__Request *req, int *fds);
void attach_handle_ring_program(gd_session *s, Graphd__Wire__Request *req, int *fds);

#endif
