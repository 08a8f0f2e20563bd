/* Requests about every device: Status, ListCaptures and Evict. Each asks
 * the devices' workers through one fan-out and replies once every device
 * has answered, or after a bounded wait without the busy ones. Status and
 * ListCaptures share one job per device and kind with every request that
 * waits for it; an Evict sends its own (a few per uid at once). A device
 * whose worker cannot run the job answers as failed (Status then shows it
 * without free memory). A request whose client hangs up holds nothing.
 *
 * DESIGN: loop thread, except the jobs' run functions (workers). */
#ifndef GRAPHD_CONTROL_H
#define GRAPHD_CONTROL_H

#include "daemon/sessions/daemon.h"
#include "graphd.pb-c.h"
#include "daemon/sessions/session.h"

void control_handle_status(gd_session *s, Graphd__Wire__Request *req, int *fds);
void control_handle_list(gd_session *s, Graphd__Wire__Request *req, int *fds);
void control_handle_evict(gd_session *s, Graphd__Wire__Request *req, int *fds);

/* s is closing: its request in flight, if it is one of these, ends now,
 * unanswered; its Evict jobs still run. */
void control_session_closed(gd_session *s);

#endif
