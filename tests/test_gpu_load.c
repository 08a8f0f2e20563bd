/* Load on a real GPU: 32 client processes, each with its own data session
 * and CUDA context, replay the one staged program at once (a shared
 * capture), every result checked bit for bit by the client. Nothing may be
 * lost or fail, the daemon must count every replay, and its memory must
 * stay flat between a first and a second round of the same load. Prints the
 * daemon's latency percentiles and the wall time of each round.
 *
 * The clients are exec'd (gpu_replay_client share N); this process never
 * initialises CUDA. GRAPHD_LOAD_REPLAYS sets N (default 2000). */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define CLIENTS 32

static gd_test_daemon d;
static int replays_each = 2000;

static void setup(void) { td_start(&d, "--backend", "cuda", NULL); }

static void teardown(void) {
  if (d.pid > 0) ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* Runs CLIENTS helpers to the end; returns how many did not report every
 * replay checked. */
static int round_of_clients(int round) {
  char n[16];
  snprintf(n, sizeof n, "%d", replays_each);
  pid_t kids[CLIENTS];
  FILE *out[CLIENTS];
  double t0 = td_now_s();
  for (int k = 0; k < CLIENTS; k++) {
    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    kids[k] = fork();
    ck_assert_int_ge(kids[k], 0);
    if (kids[k] == 0) {
      dup2(pfd[1], 1);
      close(pfd[0]);
      close(pfd[1]);
      execl(GPU_CLIENT_BIN, GPU_CLIENT_BIN, d.socket, TEST_KERNEL_DIR, "share", n, (char *)NULL);
      _exit(127);
    }
    close(pfd[1]);
    out[k] = fdopen(pfd[0], "r");
    ck_assert_ptr_nonnull(out[k]);
  }
  int failed = 0;
  for (int k = 0; k < CLIENTS; k++) {
    char line[512] = "";
    if (!fgets(line, sizeof line, out[k])) strcpy(line, "(nothing)\n");
    fclose(out[k]);
    int st;
    ck_assert_int_eq(waitpid(kids[k], &st, 0), kids[k]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !strstr(line, " ok")) {
      fprintf(stderr, "round %d client %d: %s %d: %s", round, k, WIFEXITED(st) ? "exit" : "signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), line);
      failed++;
    }
  }
  printf("FIGURE round %d: %d clients x %d checked replays in %.2f s\n", round, CLIENTS,
         replays_each, td_now_s() - t0);
  return failed;
}

START_TEST(test_gpu_load_32_clients_lose_nothing_and_memory_stays_flat) {
  ck_assert_int_eq(round_of_clients(1), 0);
  long after_first = td_rss_kib(d.pid);
  ck_assert_int_eq(round_of_clients(2), 0);
  long after_second = td_rss_kib(d.pid);

  graphd_client *ctl = td_control(&d);
  graphd_device_counters c = td_device_info(ctl, 0).counters;
  graphd_close(ctl);
  printf(
      "FIGURE GPU load, daemon time per replay: p50 %.1f us, p90 %.1f us, p99 %.1f us, "
      "max %.1f us\n",
      c.replay_p50_ns / 1e3, c.replay_p90_ns / 1e3, c.replay_p99_ns / 1e3, c.replay_max_ns / 1e3);
  printf("FIGURE daemon RSS after the first round %ld KiB, after the second %ld KiB\n", after_first,
         after_second);
  ck_assert_uint_eq(c.errors, 0);
  ck_assert_uint_eq(c.replays, 2ull * CLIENTS * (uint64_t)replays_each);
  /* One capture serves every client: a second round adds none. */
  ck_assert_uint_eq(c.captures_built, 1);
  /* Sessions, imports and streams of the second round come and go like
   * the first's; the driver's own caches may settle, hence the margin. */
  ck_assert_msg(after_second - after_first < 32 * 1024,
                "the daemon grew by %ld KiB over a second round", after_second - after_first);
}
END_TEST

int main(void) {
  td_gpu_or_skip();
  const char *n = getenv("GRAPHD_LOAD_REPLAYS");
  if (n && atoi(n) > 0) replays_each = atoi(n);
  Suite *s = suite_create("gpu_load");
  TCase *tc = tcase_create("gpu_load");
  tcase_set_timeout(tc, 540);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_gpu_load_32_clients_lose_nothing_and_memory_stays_flat);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
