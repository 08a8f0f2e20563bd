/* graphctl top [--interval SECONDS] [--count N]: per device, from two
 * Status replies an interval apart (graphd_get_status_now, so a busy
 * worker costs a refresh nothing): its state, replays a second, the
 * worker's busy share (the change in its busy time, worker_busy_ns, over
 * the change in its time served, worker_clock_ns: the daemon reads both
 * at one instant, a job still running counted), free and total memory,
 * captures and their staging, and errors a second.
 *
 * On a terminal each refresh clears the screen; otherwise (a pipe, a
 * file, a test) refreshes follow one another, each with its header, with
 * a blank line between. Ctrl-C (SIGINT) or SIGTERM ends it with status 0.
 * A daemon that restarts between two replies (another pid, or its uptime
 * went back) shows no rates for that refresh. */
#define _GNU_SOURCE
#include "top.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

/* Sleeps s seconds, or less when a signal asks to stop. */
static void nap(double s) {
  struct timespec t = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  while (!stop && nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

/* A rate of a counter between two replies, or "-" without a span. */
static void rate(char *out, size_t n, uint64_t before, uint64_t after, double dt) {
  if (dt <= 0 || after < before)
    snprintf(out, n, "-");
  else
    snprintf(out, n, "%.1f", (double)(after - before) / dt);
}

/* The device of `then` that is device i of `now` (by UUID: a restarted
 * daemon may order them otherwise), or -1. */
static int same_device(const graphd_daemon_status *then, const graphd_device_info *d) {
  for (uint32_t k = 0; then && k < then->ndevices; k++)
    if (memcmp(then->devices[k].uuid, d->uuid, 16) == 0) return (int)k;
  return -1;
}

static void frame(const graphd_daemon_status *then, const graphd_daemon_status *now,
                  double interval, bool tty) {
  /* The daemon's clock between the replies; none across a restart. */
  double dt = then && then->pid == now->pid && now->uptime_ms > then->uptime_ms
                  ? (double)(now->uptime_ms - then->uptime_ms) / 1e3
                  : 0;
  time_t wall = time(NULL);
  struct tm tm;
  char clock[16];
  strftime(clock, sizeof clock, "%H:%M:%S", localtime_r(&wall, &tm));
  if (tty) printf("\033[H\033[2J");
  printf("graphd %s, pid %u, up %.0f s, %llu session(s); %s, every %g s%s\n", now->version,
         now->pid, (double)now->uptime_ms / 1e3, (unsigned long long)now->sessions, clock, interval,
         tty ? " (Ctrl-C ends)" : "");
  printf("%-6s %-8s %10s %6s %23s %8s %10s %9s\n", "DEVICE", "STATE", "REPLAYS/s", "BUSY",
         "MEMORY FREE / TOTAL", "CAPTURES", "STAGING", "ERRORS/s");
  for (uint32_t i = 0; i < now->ndevices; i++) {
    const graphd_device_info *d = &now->devices[i];
    int k = dt > 0 ? same_device(then, d) : -1;
    char reps[32] = "-", busy[32] = "-", errs[32] = "-", fre[32], tot[32], mem[80], sb[32];
    if (k >= 0) {
      const graphd_device_info *p = &then->devices[k];
      rate(reps, sizeof reps, p->counters.replays, d->counters.replays, dt);
      rate(errs, sizeof errs, p->counters.errors, d->counters.errors, dt);
      graphd_device_record r0, r1;
      if (graphd_daemon_status_device(then, (uint32_t)k, &r0, sizeof r0) == GRAPHD_OK &&
          graphd_daemon_status_device(now, i, &r1, sizeof r1) == GRAPHD_OK)
        cli_busy_share(busy, sizeof busy, r0.worker_busy_ns, r1.worker_busy_ns, r0.worker_clock_ns,
                       r1.worker_clock_ns);
    }
    cli_human_bytes(d->free_memory, fre, sizeof fre);
    cli_human_bytes(d->total_memory, tot, sizeof tot);
    snprintf(mem, sizeof mem, "%s / %s", fre, tot);
    cli_human_bytes(d->counters.staging_bytes, sb, sizeof sb);
    printf("%-6u %-8s %10s %6s %23s %8llu %10s %9s\n", d->ordinal, d->state, reps, busy, mem,
           (unsigned long long)d->counters.captures, sb, errs);
  }
  fflush(stdout);
}

int cmd_top(graphd_client *c, int argc, char **argv) {
  double interval = 2;
  long count = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end;
    if (strcmp(a, "--interval") == 0 && v) {
      interval = strtod(v, &end);
      if (!*v || *end || !(interval >= 0.1 && interval <= 3600))
        return cli_usage_error("top: --interval takes seconds from 0.1 to 3600, not '%s'", v);
      i++;
    } else if (strcmp(a, "--count") == 0 && v) {
      count = strtol(v, &end, 10);
      if (!*v || *end || count < 1 || count > 1000000)
        return cli_usage_error("top: --count takes a number of refreshes from 1, not '%s'", v);
      i++;
    } else if (strcmp(a, "--interval") == 0 || strcmp(a, "--count") == 0) {
      return cli_usage_error("top: %s needs a value", a);
    } else {
      return cli_usage_error("top: unknown argument '%s'", a);
    }
  }
  if (!c) return EXIT_OK;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal; /* no SA_RESTART: the nap ends at once */
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  bool tty = isatty(STDOUT_FILENO) == 1;
  graphd_daemon_status *then = NULL, *now = NULL;
  graphd_status st = graphd_get_status_now(c, &then);
  if (st != GRAPHD_OK) return cli_call_failed(c, "top", st);
  int rc = EXIT_OK;
  for (long n = 0; !stop && (count == 0 || n < count); n++) {
    nap(interval);
    if (stop) break;
    st = graphd_get_status_now(c, &now);
    if (st != GRAPHD_OK) {
      rc = stop ? EXIT_OK : cli_call_failed(c, "top", st);
      break;
    }
    if (n && !tty) printf("\n");
    frame(then, now, interval, tty);
    graphd_daemon_status_free(then);
    then = now;
    now = NULL;
  }
  graphd_daemon_status_free(then);
  return rc;
}
