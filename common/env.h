/* Environment variables that are switches: one rule for graphd's C code
 * and its Python package (graphd._env). */
#ifndef GRAPHD_COMMON_ENV_H
#define GRAPHD_COMMON_ENV_H

#include <stdbool.h>

/* Whether the switch `name` is on: its value is 1, true, yes or on, in any
 * case. Unset, empty, 0, false, no, off and anything else are off. */
bool gd_env_flag(const char *name);

#endif
