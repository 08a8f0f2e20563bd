/* Frees the registry entries it unlinked (see registry.h, "Removal"):
 * every device forgets them, in order after the jobs already queued there
 * (which may still use them), and then the registry frees them.
 *
 * DESIGN: loop thread; one job per device runs the forgetting. */
#ifndef GRAPHD_RECLAIM_H
#define GRAPHD_RECLAIM_H

#include "daemon/sessions/daemon.h"

/* Starts freeing whatever the registry has unlinked since the last call
 * (nothing when it has unlinked nothing). */
void reclaim_flush(gd_daemon *d);

#endif
