/* One-line usage errors (usage.h). */
#define _GNU_SOURCE
#include "usage.h"

#include <stdarg.h>
#include <string.h>

void gd_usage_error(FILE *f, const char *prog, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(f, "%s: %s; try '%s --help'\n", prog, msg, prog);
}

void gd_getopt_error(FILE *f, const char *prog, char *const *argv, const struct option *opts) {
  const char *arg = optind > 0 ? argv[optind - 1] : "";
  if (!arg) arg = "";
  if (strncmp(arg, "--", 2) != 0) {
    /* A short option, which optopt names: one whose long form takes a
     * value lacked it; any other is unknown. */
    for (const struct option *o = opts; optopt && o->name; o++)
      if (!o->flag && o->val == optopt && o->has_arg == required_argument) {
        gd_usage_error(f, prog, "option -%c needs a value", optopt);
        return;
      }
    if (optopt)
      gd_usage_error(f, prog, "unknown option '-%c'", optopt);
    else
      gd_usage_error(f, prog, "unknown option '%s'", arg);
    return;
  }
  const char *name = arg + 2;
  const char *eq = strchr(name, '=');
  size_t len = eq ? (size_t)(eq - name) : strlen(name);
  const struct option *exact = NULL, *prefix = NULL;
  int prefixes = 0;
  for (const struct option *o = opts; o->name; o++) {
    if (strncmp(o->name, name, len) != 0) continue;
    if (o->name[len] == '\0') {
      exact = o;
      break;
    }
    prefix = o;
    prefixes++;
  }
  if (!exact && prefixes == 1) exact = prefix;
  if (!exact) {
    gd_usage_error(f, prog, prefixes > 1 ? "ambiguous option '--%.*s'" : "unknown option '--%.*s'",
                   (int)len, name);
  } else if (eq && exact->has_arg == no_argument) {
    gd_usage_error(f, prog, "option --%s takes no value", exact->name);
  } else {
    gd_usage_error(f, prog, "option --%s needs a value", exact->name);
  }
}
