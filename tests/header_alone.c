/* graphd.h on its own: compiled with the installed headers only (the
 * build's public-include, with no protocol.h, wire header or source
 * tree on the include path), nothing else of the project included. It
 * reads the version macros, the limits, a device record and the error
 * calls, and prints the version it was built with and runs against. */
#include <graphd/graphd.h>
#include <stddef.h>
#include <stdio.h>

#if !defined(GRAPHD_VERSION_MAJOR) || !defined(GRAPHD_VERSION_NUMBER)
#error "graphd.h gives no version macros"
#endif
#ifdef GRAPHD_PROTOCOL_VERSION
#error "graphd.h pulls in the wire protocol's header"
#endif

_Static_assert(GRAPHD_MAX_SLOTS >= 4096, "GRAPHD_MAX_SLOTS");
_Static_assert(offsetof(graphd_device_record, size) == 0, "a record's size comes first");

int main(void) {
  graphd_device_record r;
  graphd_daemon_status s = {0};
  /* No device: refused, and the record is left alone. */
  if (graphd_daemon_status_device(&s, 0, &r, sizeof r) != GRAPHD_INVALID_ARGUMENT) return 1;
  if (graphd_version_number() < GRAPHD_VERSION_NUMBER) return 2;
  graphd_capture_info_free(NULL);
  printf("built with graphd %s (0x%06x), runs with %s (0x%06x)\n", GRAPHD_VERSION_STRING,
         GRAPHD_VERSION_NUMBER, graphd_version(), graphd_version_number());
  return 0;
}
