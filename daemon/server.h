/* The listener, accepting sessions, and the daemon's lifecycle on the loop:
 * it wires accepted sessions to the request router, and signals start a
 * graceful shutdown.
 *
 * DESIGN: everything here runs on the loop thread, but server_listen()
 * (main thread, before the loop runs). The listening socket is never
 * unlinked when it was inherited from systemd. */
#ifndef GRAPHD_SERVER_H
#define GRAPHD_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "daemon/sessions/daemon.h"
#include "daemon/base/options.h"

/* Opens or adopts the listening socket. Main thread, before the loop runs.
 * A socket of its own is made under an exclusive flock on "<socket>.lock"
 * (kept after exit), so that two daemons never replace the same stale
 * socket at once; the second is refused ("another graphd holds ...").
 * Returns 0 or a negated status with err filled. */
int server_listen(gd_daemon *s, const gd_options *opt, char *err, size_t errlen);

/* Tests only: when set, called with the path after server_listen() found
 * a stale socket there and before it removes it (NULL in the daemon). */
extern void (*server_probed_hook)(const char *path);

/* Handles SIGTERM and SIGINT on loop. Call before the socket listens, so
 * that a signal never meets the default action once a client can connect. */
int server_signals_start(gd_daemon *s, uv_loop_t *loop);

/* Starts accepting. */
int server_start(gd_daemon *s, uv_loop_t *loop);

/* Begins graceful shutdown (idempotent): stop accepting, stop reading,
 * fail or finish in-flight work, close sessions, stop the workers. */
void server_shutdown(gd_daemon *s, const char *why);

/* Removes the socket if we created it. After the loop has ended. */
void server_cleanup(gd_daemon *s);

#endif
