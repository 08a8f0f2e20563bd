#include "paths.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int gd_default_socket_path(char *buf, size_t len) {
  const char *env = getenv("GRAPHD_SOCKET");
  int n;
  if (env && *env) {
    n = snprintf(buf, len, "%s", env);
  } else if (geteuid() == 0) {
    n = snprintf(buf, len, "%s", GD_SYSTEM_SOCKET);
  } else {
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg)
      n = snprintf(buf, len, "%s/graphd.sock", xdg);
    else
      n = snprintf(buf, len, "/tmp/graphd-%u.sock", (unsigned)geteuid());
  }
  return (n < 0 || (size_t)n >= len) ? -1 : 0;
}
