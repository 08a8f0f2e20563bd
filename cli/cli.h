/* What graphctl's command files share: the exit codes, the reading of a
 * command's switches, and the report of a failed call. */
#ifndef GRAPHD_CLI_H
#define GRAPHD_CLI_H

#include <stdbool.h>
#include <stddef.h>

#include "graphd/graphd.h"

/* graphctl's exit codes: 1 the daemon reported an error, 2 usage error,
 * 3 cannot connect. */
enum { EXIT_OK = 0, EXIT_DAEMON = 1, EXIT_USAGE = 2, EXIT_CONNECT = 3 };

/* Reads the arguments argv[1..argc) of command cmd, each of which must be
 * one of the n switches in names; on[i] is set for each one given. Returns
 * EXIT_OK, or EXIT_USAGE after a one-line error naming the argument. */
int cli_switches(const char *cmd, int argc, char **argv, const char *const *names, bool *on,
                 size_t n);

/* Says on stderr that command cmd's call on c failed with st (its status
 * name and c's last error), and returns EXIT_DAEMON. */
int cli_call_failed(const graphd_client *c, const char *cmd, graphd_status st);

#endif
