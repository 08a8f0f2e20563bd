#include "env.h"

#include <stdlib.h>
#include <strings.h>

bool gd_env_flag(const char *name) {
  const char *v = getenv(name);
  if (!v) return false;
  return !strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
         !strcasecmp(v, "on");
}
