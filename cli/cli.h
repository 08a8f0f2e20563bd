/* What graphctl's command files share: the exit codes, one-line usage
 * errors, the reading of a command's switches, the report of a failed call,
 * and byte counts and busy shares for people. */
#ifndef GRAPHD_CLI_H
#define GRAPHD_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graphd/graphd.h"

/* graphctl's exit codes: 1 the daemon reported an error, 2 usage error,
 * 3 cannot connect. */
enum { EXIT_OK = 0, EXIT_DAEMON = 1, EXIT_USAGE = 2, EXIT_CONNECT = 3 };

/* Says in one line on stderr, "graphctl: MESSAGE; try 'graphctl --help'",
 * what is wrong with the command line, and returns EXIT_USAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Reads the arguments argv[1..argc) of command cmd, each of which must be
 * one of the n switches in names; on[i] is set for each one given. Returns
 * EXIT_OK, or EXIT_USAGE after a one-line error naming the argument. */
int cli_switches(const char *cmd, int argc, char **argv, const char *const *names, bool *on,
                 size_t n);

/* Says on stderr that command cmd's call on c failed with st (its status
 * name and c's last error), and returns EXIT_DAEMON. */
int cli_call_failed(const graphd_client *c, const char *cmd, graphd_status st);

/* Writes bytes b to out for people, in binary units with the unit named:
 * "512 B", "1.5 KiB", "3.0 GiB" (one decimal from KiB on). */
void cli_human_bytes(uint64_t b, char *out, size_t n);

/* Writes to out the share of the time a device's worker was busy between
 * two readings of its busy time (busy0, busy1) and its time served
 * (clock0, clock1), as a percentage with one decimal ("97.5%", at most
 * "100.0%"), or "-" when the readings span no time or went back (a
 * restarted daemon, or one that does not report them). */
void cli_busy_share(char *out, size_t n, uint64_t busy0, uint64_t busy1, uint64_t clock0,
                    uint64_t clock1);

#endif
