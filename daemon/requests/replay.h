/* The Replay request, the socket's front end of the one replay path
 * (execute.h). On the loop: the program found by id and held by the
 * session, the bindings copied out of the request, and the hold past
 * --max-inflight-replays; on the device's worker: the ring entries the
 * client published before it taken first, then the request checked and
 * run as a ring entry is (exec_replay). The worker answers the client
 * itself; the loop adds the counts when the job comes back.
 *
 * DESIGN: loop thread, except replay_run (worker). */
#ifndef GRAPHD_REPLAY_H
#define GRAPHD_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/device/capture.h"
#include "graphd.pb-c.h"
#include "daemon/sessions/region.h"
#include "daemon/sessions/session.h"

#include "daemon/sessions/daemon.h"

/* The Replay request's handler, as the router calls them (router.h): it
 * takes no fds. */
void replay_handle_replay(gd_session *s, Graphd__Wire__Request *req, int *fds);

/* Shutdown: the replays held back by --max-inflight-replays fail with
 * UNAVAILABLE, not run. */
void replay_release_held(gd_daemon *d);

#endif
