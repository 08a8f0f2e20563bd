/* graphctl stats [--json | --prometheus | --requests]: per-device and
 * per-client figures from one Status reply, or its request counters. */
#ifndef GRAPHD_CLI_STATS_H
#define GRAPHD_CLI_STATS_H

#include "graphd/graphd.h"

/* Runs the command on c with its arguments (argv[0] is "stats"); returns
 * graphctl's exit code. With c NULL it only checks the arguments (EXIT_OK,
 * or EXIT_USAGE after a one-line error). */
int cmd_stats(graphd_client *c, int argc, char **argv);

#endif
