/* graphctl top: a live view of the daemon's devices, refreshed every few
 * seconds until Ctrl-C or a count of refreshes. */
#ifndef GRAPHD_CLI_TOP_H
#define GRAPHD_CLI_TOP_H

#include "graphd/graphd.h"

/* Runs the command on c with its arguments (argv[0] is "top"); returns
 * graphctl's exit code. With c NULL it only checks the arguments (EXIT_OK,
 * or EXIT_USAGE after a one-line error). */
int cmd_top(graphd_client *c, int argc, char **argv);

#endif
