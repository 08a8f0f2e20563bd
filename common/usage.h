/* The one line a command prints for a usage error, the same for graphd and
 * graphctl: "PROG: WHAT; try 'PROG --help'" (graphd-demo, which uses
 * libgraphd's public API alone, prints the same line itself). The full
 * usage is for --help only. Thread-safe (no state). */
#ifndef GRAPHD_COMMON_USAGE_H
#define GRAPHD_COMMON_USAGE_H

#include <getopt.h>
#include <stdio.h>

/* Writes "prog: " and the message to f, then "; try 'prog --help'" and a
 * newline, as one line. */
void gd_usage_error(FILE *f, const char *prog, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* After getopt_long returned '?' or ':' for argv (opterr set to 0): says in
 * one line on f what was wrong with the option getopt stopped at (unknown,
 * ambiguous, missing its value, or given one it does not take), from
 * optind and optopt as getopt left them and the option table opts. */
void gd_getopt_error(FILE *f, const char *prog, char *const *argv, const struct option *opts);

#endif
