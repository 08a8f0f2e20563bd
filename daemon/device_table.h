/* The device table: the daemon's devices and their workers, one worker
 * thread per device, running the device's jobs and, between them, its
 * upkeep; what the upkeep finds (a reset, a session cut off as hung)
 * reaches the loop as a posted job.
 *
 * DESIGN: loop thread, except the hooks (each device's worker). */
#ifndef GRAPHD_DEVICE_TABLE_H
#define GRAPHD_DEVICE_TABLE_H

#include "daemon/sessions/daemon.h"

/* Makes d->devices for the backend devices idx[0..n) and starts their
 * workers, waiting until each has opened its device (or failed to).
 * Returns 0, or a negated status when no device could be opened. */
int device_table_start(gd_daemon *d, uv_loop_t *loop, const int *idx, int n, uint64_t budget);

/* Frees d->devices once the workers have stopped. */
void device_table_free(gd_daemon *d);

#endif
