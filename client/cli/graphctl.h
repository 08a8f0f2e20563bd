/* graphctl's commands, one file per group. */
#ifndef GRAPHD_GRAPHCTL_H
#define GRAPHD_GRAPHCTL_H

#include "graphd/graphd.h"

enum { EXIT_OK = 0, EXIT_DAEMON = 1, EXIT_USAGE = 2, EXIT_CONNECT = 3 };

/* graphctl stats [--json | --prometheus] (stats.c). */
int cmd_stats(graphd_client *c, int argc, char **argv);

#endif
