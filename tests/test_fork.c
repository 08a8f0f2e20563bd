/* fork() and libgraphd on the host backend: a child that drops a handle it
 * inherited (graphd_close, graphd_forget) touches nothing the parent's
 * session shares with it, while the parent's replays are in flight; every
 * other call on an inherited handle is refused; a child connects afresh.
 *
 * The parent's stream is stood for by a thread that waits on the done word
 * of the flag page, as a CUDA stream's wait does (cuStreamWaitValue64):
 * once it sees the replay done it reads the output, which must then be
 * exact. A close in the child that released the parent's waits from the
 * host would let it read the output before the daemon wrote it. */
#define _GNU_SOURCE
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../client/lib/internal.h"
#include "harness.h"

#define N 4096u
#define SLEEP_MS 3000u /* longer than graphd_close's wait for the streams (2 s) */

static gd_test_daemon d;
static uint8_t *plugin;
static size_t plugin_len;

static void setup(void) {
  td_start(&d, "--host-devices", "1", NULL);
  plugin = td_read_file(HOST_KERNELS_SO, &plugin_len);
}

static void teardown(void) {
  free(plugin);
  if (d.pid > 0) ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* y = 2 x after sleep_ms(ms): slot 0 x (input), slot 1 y (output). */
static void slow_program(graphd_client *c, uint32_t ms, uint8_t pid[32]) {
  uint8_t mod[32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  int x = graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, N * 4, 1);
  int y = graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, N * 4, 1);
  uint32_t one[3] = {1, 1, 1}, grid[3] = {N / 256, 1, 1}, block[3] = {256, 1, 1};
  int s0 = graphd_program_add_launch(p, mod, "sleep_ms", one, one, 0);
  ck_assert_int_eq(graphd_program_param(p, (uint32_t)s0, 0, &ms, 4), GRAPHD_OK);
  int s1 = graphd_program_add_launch(p, mod, "scale", grid, block, 0);
  float a = 2.0f;
  uint32_t n = N;
  ck_assert_int_eq(graphd_program_param_slot(p, (uint32_t)s1, 0, (uint32_t)x, 0), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_param_slot(p, (uint32_t)s1, 8, (uint32_t)y, 0), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_param(p, (uint32_t)s1, 16, &a, 4), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_param(p, (uint32_t)s1, 20, &n, 4), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_finish(p, pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_OK);
  graphd_program_free(p);
}

typedef struct replay_job {
  graphd_client *c;
  graphd_stream *s;
  const uint8_t *pid;
  float *x, *y;
  graphd_status st;
} replay_job;

static void *replay_thread(void *arg) {
  replay_job *j = arg;
  graphd_binding b[2] = {{.slot = 0, .ptr = (uint64_t)(uintptr_t)j->x, .bytes = N * 4},
                         {.slot = 1, .ptr = (uint64_t)(uintptr_t)j->y, .bytes = N * 4}};
  j->st = graphd_replay(j->c, j->s, j->pid, b, 2, NULL);
  return NULL;
}

/* The parent's stream, as a GPU stream waits: until the done word of the
 * slot reaches seq (at most 20 s); then it reads y, which must be 2 x. */
typedef struct stream_job {
  graphd_client *c;
  graphd_stream *s;
  uint64_t seq;
  const float *x, *y;
  int bad;    /* the first wrong element + 1, 0 when exact; -1 when never done */
  float seen; /* its value then */
} stream_job;

static void *stream_thread(void *arg) {
  stream_job *j = arg;
  volatile uint64_t *done = gd_flag_word(j->c->flags, j->s->slot, GRAPHD_FLAG_WORD_DONE);
  double end = td_now_s() + 20;
  j->bad = -1;
  while (!graphd_seq_reached(__atomic_load_n(done, __ATOMIC_ACQUIRE), j->seq)) {
    if (td_now_s() > end) return NULL;
    struct timespec nap = {0, 100000};
    nanosleep(&nap, NULL);
  }
  j->bad = 0;
  for (uint32_t i = 0; i < N && !j->bad; i++)
    if (j->y[i] != 2.0f * j->x[i]) {
      j->bad = (int)i + 1;
      j->seen = j->y[i];
    }
  return NULL;
}

/* Forks a child that drops c (close, or forget) and exits; returns the
 * child's exit status and how long it took. */
static int fork_and_drop(graphd_client *c, graphd_stream *s, bool forget, double *took) {
  double t0 = td_now_s();
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    graphd_stream_detach(s);
    if (forget)
      graphd_forget(c);
    else
      graphd_close(c);
    _exit(0);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(child, &status, 0), child);
  *took = td_now_s() - t0;
  return status;
}

static void drop_in_child_during_replay(bool forget) {
  graphd_client *c = td_data(&d, 0);
  uint8_t pid[32];
  slow_program(c, SLEEP_MS, pid);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  float *x, *y;
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&x), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&y), GRAPHD_OK);
  for (uint32_t i = 0; i < N; i++) x[i] = (float)i - 100.0f;
  memset(y, 0xff, N * 4);
  replay_job j = {.c = c, .s = s, .pid = pid, .x = x, .y = y};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, replay_thread, &j), 0);
  /* The replay is issued (its ready word written) and the daemon is
   * sleeping in it. */
  volatile uint64_t *ready = gd_flag_word(c->flags, s->slot, GRAPHD_FLAG_WORD_READY);
  while (__atomic_load_n(ready, __ATOMIC_ACQUIRE) < 1) usleep(1000);
  usleep(200000);
  stream_job sj = {.c = c, .s = s, .seq = 1, .x = x, .y = y};
  pthread_t sth;
  ck_assert_int_eq(pthread_create(&sth, NULL, stream_thread, &sj), 0);
  double took;
  int status = fork_and_drop(c, s, forget, &took);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  /* The stream saw the replay done only once the daemon had run it. */
  ck_assert_int_eq(pthread_join(sth, NULL), 0);
  ck_assert_msg(sj.bad >= 0, "replay 1 was never done");
  ck_assert_msg(sj.bad == 0,
                "the stream saw replay 1 done with y[%d] = %g, want %g: the child's %s released "
                "the parent's stream wait before the daemon ran the replay",
                sj.bad - 1, (double)sj.seen, 2.0 * (double)x[sj.bad - 1],
                forget ? "graphd_forget" : "graphd_close");
  ck_assert_int_eq(pthread_join(th, NULL), 0);
  ck_assert_msg(j.st == GRAPHD_OK, "replay: %s", graphd_last_error(c));
  /* Dropping an inherited handle waits for nothing of the parent's. */
  ck_assert_msg(took < 1.5, "the child took %.2f s to drop the handle", took);
  /* The parent's session goes on: another replay, exact. */
  memset(y, 0, N * 4);
  for (uint32_t i = 0; i < N; i++) x[i] = (float)i * 0.25f;
  slow_program(c, 1, pid);
  replay_thread(&j);
  ck_assert_msg(j.st == GRAPHD_OK, "replay: %s", graphd_last_error(c));
  for (uint32_t i = 0; i < N; i++) ck_assert_float_eq(y[i], 2.0f * x[i]);
  graphd_stream_detach(s);
  graphd_close(c);
}

START_TEST(test_child_close_while_parent_replays) { drop_in_child_during_replay(false); }
END_TEST

START_TEST(test_child_forget_while_parent_replays) { drop_in_child_during_replay(true); }
END_TEST

/* In the child, every call on the inherited handle is refused with a
 * message that says why, before any lock is taken; a new handle works. */
static int child_calls(const void *arg) {
  graphd_client *c = (graphd_client *)arg;
  if (graphd_ping(c, "x", 1) != GRAPHD_FAILED_PRECONDITION) return 2;
  char msg[GRAPHD_ERRMAX];
  if (graphd_last_error_r(c, msg, sizeof msg) != GRAPHD_FAILED_PRECONDITION) return 3;
  if (!strstr(msg, "fork")) return 4;
  graphd_daemon_status *st = NULL;
  if (graphd_get_status(c, &st) != GRAPHD_FAILED_PRECONDITION || st) return 5;
  graphd_stream *s = NULL;
  if (graphd_stream_attach(c, NULL, &s) != GRAPHD_FAILED_PRECONDITION) return 6;
  graphd_close(c);
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = d.socket;
  graphd_client *fresh = NULL;
  char err[GRAPHD_ERRMAX];
  if (graphd_connect(&o, &fresh, err, sizeof err) != GRAPHD_OK) return 7;
  if (graphd_ping(fresh, "y", 1) != GRAPHD_OK) return 8;
  graphd_close(fresh);
  return 0;
}

START_TEST(test_inherited_handle_refused_fresh_one_works) {
  graphd_client *c = td_data(&d, 0);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  uint64_t session = graphd_session_id(c);
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) _exit(child_calls(c));
  int status = 0;
  ck_assert_int_eq(waitpid(child, &status, 0), child);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed at step %d",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  /* The parent's session is the same one, and answers. */
  ck_assert_int_eq(graphd_ping(c, "z", 1), GRAPHD_OK);
  ck_assert_uint_eq(graphd_session_id(c), session);
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

int main(void) {
  Suite *s = suite_create("fork");
  TCase *tc = tcase_create("fork");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_child_close_while_parent_replays);
  tcase_add_test(tc, test_child_forget_while_parent_replays);
  tcase_add_test(tc, test_inherited_handle_refused_fresh_one_works);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
