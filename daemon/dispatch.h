/* Request dispatch: the Hello handshake, then one handler per request body.
 * Loop thread only. Handlers that need a device hand a job to its worker
 * and reply from the job's completion. */
#ifndef GRAPHD_DISPATCH_H
#define GRAPHD_DISPATCH_H

#include "graphd.pb-c.h"
#include "session.h"

/* Takes ownership of req and of the nfds fds (already checked against
 * req->nfds). */
void dispatch_request(gd_session *s, Graphd__Wire__Request *req, int *fds, int nfds);

/* The session closed: it lets go of the registry entries it held, and of
 * its data session. */
void dispatch_session_closed(gd_session *s);

#endif
