/* The device worker's busy clock, end to end on the host backend, where a
 * replay's kernels run on the worker thread: Status reports per device the
 * worker's busy time and its clock, the time it has served
 * (graphd_device_record's worker_busy_ns over worker_clock_ns). An idle
 * worker is barely busy, one running replays back to back mostly is, and
 * one held in a long replay is busy all the while, before the replay ends;
 * the busy time never passes the clock. */
#define _GNU_SOURCE
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static gd_test_daemon d;

static void setup(void) { td_start(&d, "--host-devices", "2", NULL); }

static void teardown(void) {
  if (d.pid > 0) ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* One reading of a worker's busy time and its clock. */
typedef struct busy_reading {
  uint64_t busy_ns, clock_ns;
} busy_reading;

/* Device dev's reading, without waiting on a busy worker. */
static busy_reading reading(graphd_client *ctl, uint32_t dev) {
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status_now(ctl, &st), GRAPHD_OK);
  graphd_device_record r;
  ck_assert_int_eq(graphd_daemon_status_device(st, dev, &r, sizeof r), GRAPHD_OK);
  graphd_daemon_status_free(st);
  ck_assert_uint_ge(r.size, offsetof(graphd_device_record, worker_clock_ns) + 8);
  ck_assert_uint_gt(r.worker_clock_ns, 0);
  ck_assert_uint_le(r.worker_busy_ns, r.worker_clock_ns);
  return (busy_reading){r.worker_busy_ns, r.worker_clock_ns};
}

/* The share of the time between a and b the worker was busy. */
static double share(busy_reading a, busy_reading b) {
  ck_assert_uint_ge(b.busy_ns, a.busy_ns);
  ck_assert_uint_gt(b.clock_ns, a.clock_ns);
  return (double)(b.busy_ns - a.busy_ns) / (double)(b.clock_ns - a.clock_ns);
}

/* A data session on device 1 replaying a host kernel that sleeps ms. */
typedef struct sleeper {
  graphd_client *c;
  graphd_stream *s;
  uint8_t pid[32];
  void *out;
  atomic_bool stop;
  int replays;
} sleeper;

static void sleeper_open(sleeper *k, uint32_t ms) {
  memset(k, 0, sizeof *k);
  k->c = td_data(&d, 1);
  size_t len;
  void *so = td_read_file(HOST_KERNELS_SO, &len);
  uint8_t mod[32];
  ck_assert_int_eq(graphd_register_module(k->c, GRAPHD_MODULE_HOST_ELF, so, len, mod), GRAPHD_OK);
  free(so);
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, 256, 1);
  uint32_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  int s0 = graphd_program_add_launch(p, mod, "sleep_ms", grid, block, 0);
  graphd_program_param(p, (uint32_t)s0, 0, &ms, 4);
  ck_assert_int_eq(graphd_program_finish(p, k->pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_register_program(k->c, p), GRAPHD_OK);
  graphd_program_free(p);
  ck_assert_int_eq(graphd_stream_attach(k->c, NULL, &k->s), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(k->c, 256, &k->out), GRAPHD_OK);
}

static void sleeper_close(sleeper *k) {
  graphd_stream_detach(k->s);
  graphd_close(k->c);
}

static graphd_status sleep_once(sleeper *k) {
  graphd_binding b = {.slot = 0, .ptr = (uint64_t)(uintptr_t)k->out, .bytes = 256};
  return graphd_replay(k->c, k->s, k->pid, &b, 1, NULL);
}

/* Replays until told to stop. */
static void *sleep_replays(void *arg) {
  sleeper *k = arg;
  while (!atomic_load(&k->stop)) {
    if (sleep_once(k) != GRAPHD_OK) return (void *)1;
    k->replays++;
  }
  return NULL;
}

/* One replay, which holds the worker as long as it sleeps. */
static void *sleep_one(void *arg) { return sleep_once(arg) == GRAPHD_OK ? NULL : (void *)1; }

START_TEST(test_worker_an_idle_worker_is_barely_busy) {
  graphd_client *ctl = td_control(&d);
  busy_reading a = reading(ctl, 0);
  usleep(300000);
  busy_reading b = reading(ctl, 0);
  double s = share(a, b);
  printf("FIGURE idle worker: busy %.2f%% of %.0f ms\n", 100 * s,
         (double)(b.clock_ns - a.clock_ns) / 1e6);
  ck_assert_uint_ge(b.clock_ns - a.clock_ns, 250000000u);
  ck_assert_double_lt(s, 0.05);
  graphd_close(ctl);
}
END_TEST

START_TEST(test_worker_replays_back_to_back_keep_it_busy) {
  sleeper k;
  sleeper_open(&k, 20);
  ck_assert_int_eq(sleep_once(&k), GRAPHD_OK); /* the capture is built */
  graphd_client *ctl = td_control(&d);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, sleep_replays, &k), 0);
  usleep(100000);
  busy_reading a1 = reading(ctl, 1), a0 = reading(ctl, 0);
  usleep(600000);
  busy_reading b1 = reading(ctl, 1), b0 = reading(ctl, 0);
  atomic_store(&k.stop, true);
  void *rc;
  pthread_join(t, &rc);
  ck_assert_ptr_null(rc);
  double s1 = share(a1, b1), s0 = share(a0, b0);
  printf("FIGURE 20 ms replays back to back: worker 1 busy %.1f%%, idle worker 0 %.2f%%\n",
         100 * s1, 100 * s0);
  ck_assert_double_ge(s1, 0.5);
  ck_assert_double_le(s1, 1.0);
  ck_assert_double_lt(s0, 0.05);
  ck_assert_int_ge(k.replays, 10);
  graphd_close(ctl);
  sleeper_close(&k);
}
END_TEST

/* A spell still running counts up to the reading: a worker held in one
 * 1.5 s replay reads as busy the whole time it is held, and the spell is
 * all in the sum once it ends. */
START_TEST(test_worker_held_in_a_long_replay_is_busy_all_the_while) {
  sleeper k;
  sleeper_open(&k, 1500);
  graphd_client *ctl = td_control(&d);
  busy_reading before = reading(ctl, 1);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, sleep_one, &k), 0);
  usleep(300000);
  busy_reading a = reading(ctl, 1);
  usleep(500000);
  busy_reading b = reading(ctl, 1);
  void *rc;
  pthread_join(t, &rc);
  ck_assert_ptr_null(rc);
  double s = share(a, b);
  printf("FIGURE worker held in a 1.5 s replay: busy %.2f%% of %.0f ms\n", 100 * s,
         (double)(b.clock_ns - a.clock_ns) / 1e6);
  ck_assert_double_ge(s, 0.99);
  ck_assert_double_le(s, 1.0);
  busy_reading after = reading(ctl, 1);
  ck_assert_uint_ge(after.busy_ns - before.busy_ns, 1400000000u);
  ck_assert_uint_ge(after.busy_ns, b.busy_ns);
  graphd_close(ctl);
  sleeper_close(&k);
}
END_TEST

int main(void) {
  Suite *s = suite_create("worker");
  TCase *tc = tcase_create("busy");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_worker_an_idle_worker_is_barely_busy);
  tcase_add_test(tc, test_worker_replays_back_to_back_keep_it_busy);
  tcase_add_test(tc, test_worker_held_in_a_long_replay_is_busy_all_the_while);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
