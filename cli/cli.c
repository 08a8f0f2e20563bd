/* What graphctl's command files share (cli.h). */
#include "cli.h"

#include <stdio.h>
#include <string.h>

int cli_switches(const char *cmd, int argc, char **argv, const char *const *names, bool *on,
                 size_t n) {
  for (size_t k = 0; k < n; k++) on[k] = false;
  for (int i = 1; i < argc; i++) {
    size_t k = 0;
    while (k < n && strcmp(argv[i], names[k]) != 0) k++;
    if (k == n) {
      fprintf(stderr, "graphctl: %s: unknown argument '%s'\n", cmd, argv[i]);
      return EXIT_USAGE;
    }
    on[k] = true;
  }
  return EXIT_OK;
}

int cli_call_failed(const graphd_client *c, const char *cmd, graphd_status st) {
  fprintf(stderr, "graphctl: %s: %s: %s\n", cmd, graphd_status_name(st), graphd_last_error(c));
  return EXIT_DAEMON;
}
