/* What graphctl's command files share (cli.h). */
#include "cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/usage.h"

int cli_usage_error(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  gd_usage_error(stderr, "graphctl", "%s", msg);
  return EXIT_USAGE;
}

int cli_switches(const char *cmd, int argc, char **argv, const char *const *names, bool *on,
                 size_t n) {
  for (size_t k = 0; k < n; k++) on[k] = false;
  for (int i = 1; i < argc; i++) {
    size_t k = 0;
    while (k < n && strcmp(argv[i], names[k]) != 0) k++;
    if (k == n) return cli_usage_error("%s: unknown argument '%s'", cmd, argv[i]);
    on[k] = true;
  }
  return EXIT_OK;
}

int cli_call_failed(const graphd_client *c, const char *cmd, graphd_status st) {
  fprintf(stderr, "graphctl: %s: %s: %s\n", cmd, graphd_status_name(st), graphd_last_error(c));
  return EXIT_DAEMON;
}

void cli_human_bytes(uint64_t b, char *out, size_t n) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    u++;
  }
  snprintf(out, n, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

void cli_busy_share(char *out, size_t n, uint64_t busy0, uint64_t busy1, uint64_t clock0,
                    uint64_t clock1) {
  if (clock1 <= clock0 || busy1 < busy0) {
    snprintf(out, n, "-");
    return;
  }
  double share = (double)(busy1 - busy0) / (double)(clock1 - clock0);
  snprintf(out, n, "%.1f%%", 100.0 * (share > 1 ? 1 : share));
}
