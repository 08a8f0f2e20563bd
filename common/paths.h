/* The default socket path, shared by graphd, libgraphd and graphctl:
 * $GRAPHD_SOCKET if set; /run/graphd/graphd.sock for root;
 * $XDG_RUNTIME_DIR/graphd.sock otherwise; /tmp/graphd-UID.sock when
 * XDG_RUNTIME_DIR is unset. Thread-safe (reads the environment). */
#ifndef GRAPHD_COMMON_PATHS_H
#define GRAPHD_COMMON_PATHS_H

#include <stddef.h>

#define GD_SYSTEM_SOCKET "/run/graphd/graphd.sock"

/* Writes the path into buf. Returns 0, or -1 when it does not fit. */
int gd_default_socket_path(char *buf, size_t len);

#endif
