/* A graceful restart on the host backend: the daemon is stopped with
 * SIGTERM and a new one started on the same socket while clients replay.
 * What the old daemon had not started is answered "not started" and sent
 * again to the new one by libgraphd, once; a replay cut off mid-flight is
 * reported and never sent again; with no daemon coming back, a call fails
 * within the reconnect bound.
 *
 * The program adds 1 to every element of an in-out buffer, so a replay
 * that ran twice, or not at all, shows in the buffer. */
#define _GNU_SOURCE
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/memfd.h"
#include "harness.h"
#include "graphd/wire.h"

#define N 1024u /* floats per slot */

static gd_test_daemon d;
static uint8_t *plugin;
static size_t plugin_len;

static void setup(void) {
  /* --ready-timeout 0: a held ready flag is never cut off, so the worker
   * stays held until the stop. */
  td_start(&d, "--host-devices", "1", "--ready-timeout", "0", NULL);
  plugin = td_read_file(HOST_KERNELS_SO, &plugin_len);
}

static void teardown(void) {
  free(plugin);
  if (d.pid > 0) ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* Registers the host kernels in the client-side registry and the program
 * x += ones (slot 0: ones, staged input; slot 1: x, staged in-out), or, with
 * sleep_ms > 0, a program that sleeps that long first; syncs it to c. */
static void add_one_program(graphd_client *c, uint32_t sleep_ms, uint8_t pid[32]) {
  uint8_t mod[32];
  ck_assert_int_eq(graphd_registry_add_module(GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, N * 4, 1);
  graphd_program_add_slot(p, GRAPHD_SLOT_INOUT, N * 4, 1);
  uint32_t grid[3] = {N / 256, 1, 1}, block[3] = {256, 1, 1}, one[3] = {1, 1, 1}, n = N;
  if (sleep_ms) {
    int s = graphd_program_add_launch(p, mod, "sleep_ms", one, one, 0);
    graphd_program_param(p, (uint32_t)s, 0, &sleep_ms, 4);
  }
  int s = graphd_program_add_launch(p, mod, "accumulate", grid, block, 0);
  graphd_program_param_slot(p, (uint32_t)s, 0, 0, 0);
  graphd_program_param_slot(p, (uint32_t)s, 8, 1, 0);
  graphd_program_param(p, (uint32_t)s, 16, &n, 4);
  ck_assert_int_eq(graphd_program_finish(p, pid), GRAPHD_OK);
  const uint8_t *enc;
  size_t len;
  ck_assert_int_eq(graphd_program_encoding(p, &enc, &len), GRAPHD_OK);
  ck_assert_int_eq(graphd_registry_add_program(pid, enc, len), GRAPHD_OK);
  graphd_program_free(p);
  ck_assert_int_eq(graphd_registry_sync(c, pid), GRAPHD_OK);
}

/* A data session on device 0 with the program, a stream, ones and x. */
typedef struct client {
  graphd_client *c;
  graphd_stream *s;
  uint8_t pid[32];
  float *ones, *x;
  graphd_status st; /* of a replay run in a thread */
  char err[GRAPHD_ERRMAX];
} client;

static void client_open(client *k, uint32_t sleep_ms) {
  k->c = td_data(&d, 0);
  add_one_program(k->c, sleep_ms, k->pid);
  ck_assert_int_eq(graphd_stream_attach(k->c, NULL, &k->s), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(k->c, N * 4, (void **)&k->ones), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(k->c, N * 4, (void **)&k->x), GRAPHD_OK);
  for (uint32_t i = 0; i < N; i++) k->ones[i] = 1.0f, k->x[i] = 0.0f;
}

static void client_close(client *k) {
  graphd_stream_detach(k->s);
  graphd_close(k->c);
}

static graphd_status add_one(client *k) {
  graphd_binding b[2] = {{0, (uint64_t)(uintptr_t)k->ones, N * 4},
                         {1, (uint64_t)(uintptr_t)k->x, N * 4}};
  graphd_status st = graphd_replay(k->c, k->s, k->pid, b, 2, NULL);
  snprintf(k->err, sizeof k->err, "%s", graphd_last_error(k->c));
  return st;
}

/* Every element of x equals v. */
static void expect_x(const client *k, float v) {
  for (uint32_t i = 0; i < N; i++)
    ck_assert_msg(k->x[i] == v, "x[%u] = %g, want %g", i, (double)k->x[i], (double)v);
}

static uint64_t replays_on_daemon(void) {
  graphd_client *ctl = td_control(&d);
  uint64_t n = td_device_info(ctl, 0).counters.replays;
  graphd_close(ctl);
  return n;
}

/* --- a loop of replays across a restart -------------------------------------- */

#define LOOP 600

typedef struct looper {
  client k;
  _Atomic int done;  /* replays returned OK */
  _Atomic int fails; /* replays that failed */
  char first_err[GRAPHD_ERRMAX + 64];
} looper;

static void *loop_replays(void *arg) {
  looper *l = arg;
  for (int i = 0; i < LOOP; i++) {
    graphd_status st = add_one(&l->k);
    if (st != GRAPHD_OK) {
      if (!atomic_fetch_add(&l->fails, 1))
        snprintf(l->first_err, sizeof l->first_err, "%s: %s", graphd_status_name(st), l->k.err);
      continue;
    }
    /* Exactly once: one more than before, every element. */
    float want = (float)atomic_load(&l->done) + 1.0f;
    for (uint32_t e = 0; e < N; e++)
      if (l->k.x[e] != want) {
        atomic_fetch_add(&l->fails, 1);
        snprintf(l->first_err, sizeof l->first_err, "replay %d: x[%u] = %g, want %g", i, e,
                 (double)l->k.x[e], (double)want);
        return NULL;
      }
    atomic_fetch_add(&l->done, 1);
  }
  return NULL;
}

START_TEST(test_restart_replay_loop_goes_on_across_sigterm_and_a_new_daemon) {
  looper l = {0};
  client_open(&l.k, 0);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, loop_replays, &l), 0);
  while (atomic_load(&l.done) < 100 && !atomic_load(&l.fails)) usleep(1000);
  int st = td_stop(&d); /* SIGTERM while the loop runs */
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
  int at_stop = atomic_load(&l.done);
  usleep(200000); /* the client waits for the socket meanwhile */
  td_start_again(&d, "--host-devices", "1", NULL);
  pthread_join(t, NULL);
  ck_assert_msg(!atomic_load(&l.fails), "%d replays failed; the first: %s", atomic_load(&l.fails),
                l.first_err);
  /* Every replay ran exactly once, each on one daemon or the other. */
  ck_assert_int_eq(atomic_load(&l.done), LOOP);
  expect_x(&l.k, (float)LOOP);
  uint64_t on_new = replays_on_daemon();
  ck_assert_uint_gt(on_new, 0);
  ck_assert_uint_le(on_new, (uint64_t)(LOOP - at_stop) + 1);
  printf(
      "FIGURE restart: %d replays before SIGTERM, %llu on the new daemon, none lost or doubled\n",
      at_stop, (unsigned long long)on_new);
  client_close(&l.k);
}
END_TEST

/* --- a replay queued behind a held ready flag -------------------------------- */

/* A raw data session on device 0 whose replay of pid waits on a ready
 * flag it never writes: the device's worker is held in that wait. */
typedef struct holder {
  int fd, flags, mem;
  volatile uint64_t *page;
} holder;

static Graphd__Wire__Reply *raw_call(int fd, Graphd__Wire__Request *req, const int *fds, int n) {
  td_raw_send_request(fd, req, fds, n);
  Graphd__Wire__Reply *r = td_raw_recv(fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_msg(r->code == 0, "%s", r->message);
  return r;
}

static void hold_worker(holder *h, graphd_client *c, const uint8_t pid[32]) {
  graphd_device_info dev;
  ck_assert_int_eq(graphd_session_device(c, &dev), GRAPHD_OK);
  h->fd = td_raw_connect(&d);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Hello hello = GRAPHD__WIRE__HELLO__INIT;
  req.request_id = 1;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_HELLO;
  req.hello = &hello;
  hello.protocol_version = GRAPHD_PROTOCOL_VERSION;
  hello.kind = GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_DATA;
  hello.device_uuid.data = dev.uuid;
  hello.device_uuid.len = 16;
  graphd__wire__reply__free_unpacked(raw_call(h->fd, &req, NULL, 0), NULL);

  h->flags = gd_memfd_new_shared("flags", 4096);
  h->page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, h->flags, 0);
  ck_assert_ptr_ne((void *)h->page, MAP_FAILED);
  td_expect_reply(td_raw_register_flags(h->fd, 2, h->flags, 4), GRAPHD_OK, NULL);

  h->mem = gd_memfd_new_shared("region", 2 * N * 4);
  Graphd__Wire__Request rr = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterRegion rg = GRAPHD__WIRE__REGISTER_REGION__INIT;
  rr.request_id = 3;
  rr.nfds = 1;
  rr.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_REGION;
  rr.register_region = &rg;
  rg.kind = GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD;
  rg.size = 2 * N * 4;
  Graphd__Wire__Reply *r = raw_call(h->fd, &rr, &h->mem, 1);
  uint32_t region = r->register_region->region_id;
  graphd__wire__reply__free_unpacked(r, NULL);

  /* Replay seq 1 on slot 0, whose ready word stays 0. */
  Graphd__Wire__Request q = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Replay rp = GRAPHD__WIRE__REPLAY__INIT;
  Graphd__Wire__Binding b0 = GRAPHD__WIRE__BINDING__INIT, b1 = GRAPHD__WIRE__BINDING__INIT;
  Graphd__Wire__Binding *bs[2] = {&b0, &b1};
  b0.slot = 0;
  b0.region_id = region;
  b0.bytes = N * 4;
  b1.slot = 1;
  b1.region_id = region;
  b1.offset = N * 4;
  b1.bytes = N * 4;
  q.request_id = 10;
  q.body_case = GRAPHD__WIRE__REQUEST__BODY_REPLAY;
  q.replay = &rp;
  rp.program_id.data = (uint8_t *)pid;
  rp.program_id.len = 32;
  rp.stream_slot = 0;
  rp.seq = 1;
  rp.n_bindings = 2;
  rp.bindings = bs;
  td_raw_send_request(h->fd, &q, NULL, 0);
  /* Then a Ping, which the daemon does not read while the replay is in
   * flight (one request at a time). */
  Graphd__Wire__Request pq = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Ping ping = GRAPHD__WIRE__PING__INIT;
  pq.request_id = 11;
  pq.body_case = GRAPHD__WIRE__REQUEST__BODY_PING;
  pq.ping = &ping;
  td_raw_send_request(h->fd, &pq, NULL, 0);
}

static void holder_close(holder *h) {
  close(h->fd);
  munmap((void *)h->page, 4096);
  close(h->flags);
  close(h->mem);
}

static void *replay_in_thread(void *arg) {
  client *k = arg;
  k->st = add_one(k);
  return NULL;
}

/* The loop's count of replays in flight on device 0 (busy workers answer
 * Status late, but the count is the loop's). */
static void wait_inflight(uint64_t n) {
  graphd_client *ctl = td_control(&d);
  uint64_t have = 0;
  for (int i = 0; i < 500 && have != n; i++) {
    have = td_device_info(ctl, 0).counters.inflight;
    if (have != n) usleep(10000);
  }
  graphd_close(ctl);
  ck_assert_uint_eq(have, n);
}

static void replay_behind_held_flag(bool reconnect) {
  client k;
  client_open(&k, 0);
  if (!reconnect) graphd_set_reconnect_wait(k.c, 0);
  ck_assert_int_eq(add_one(&k), GRAPHD_OK); /* captured, x = 1 */
  holder h;
  hold_worker(&h, k.c, k.pid);
  wait_inflight(1);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, replay_in_thread, &k), 0);
  wait_inflight(2); /* ours is queued behind the held one */
  int st = td_stop(&d);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
  /* The held replay had not started: answered so, and its done word is
   * left alone (the next daemon may run it under the same ordering). The
   * Ping sent behind it was never read: answered the same way. */
  for (uint64_t id = 10; id <= 11; id++) {
    Graphd__Wire__Reply *r = td_raw_recv(h.fd, 5000);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->request_id, id);
    ck_assert_uint_eq(r->code, GRAPHD_UNAVAILABLE);
    ck_assert_msg(r->not_started, "request %llu: %s", (unsigned long long)id, r->message);
    ck_assert_msg(strstr(r->message, "not started"), "%s", r->message);
    graphd__wire__reply__free_unpacked(r, NULL);
  }
  ck_assert(td_raw_eof(h.fd, 5000));
  ck_assert_uint_eq(h.page[1], 0);
  if (reconnect) {
    usleep(200000);
    td_start_again(&d, "--host-devices", "1", NULL);
  }
  pthread_join(t, NULL);
  if (reconnect) {
    /* Sent again to the new daemon, once: x went from 1 to 2 there. */
    ck_assert_msg(k.st == GRAPHD_OK, "%s: %s", graphd_status_name(k.st), k.err);
    expect_x(&k, 2.0f);
    ck_assert_uint_eq(replays_on_daemon(), 1);
    ck_assert_int_eq(add_one(&k), GRAPHD_OK);
    expect_x(&k, 3.0f);
  } else {
    ck_assert_int_eq(k.st, GRAPHD_UNAVAILABLE);
    ck_assert_msg(strstr(k.err, "not started"), "%s", k.err);
    expect_x(&k, 1.0f); /* never ran */
  }
  holder_close(&h);
  client_close(&k);
}

START_TEST(test_restart_replay_queued_behind_a_held_ready_flag_runs_on_the_new_daemon) {
  replay_behind_held_flag(true);
}
END_TEST

/* Without reconnecting, the same replay fails: what the test above sees
 * is the retry's doing. */
START_TEST(test_restart_without_reconnecting_the_not_started_replay_fails) {
  replay_behind_held_flag(false);
}
END_TEST

/* --- async replays a stop dropped ---------------------------------------------- */

static graphd_status add_one_async(client *k, uint64_t *seq) {
  graphd_binding b[2] = {{0, (uint64_t)(uintptr_t)k->ones, N * 4},
                         {1, (uint64_t)(uintptr_t)k->x, N * 4}};
  graphd_status st = graphd_replay_async(k->c, k->s, k->pid, b, 2, seq);
  snprintf(k->err, sizeof k->err, "%s", graphd_last_error(k->c));
  return st;
}

/* Async replays queued in the ring behind a held worker when graphd stops
 * gracefully are never taken: the wait for them says so (UNAVAILABLE,
 * naming the seq) instead of OK over outputs nothing wrote, and still does
 * after the handle reconnected; the next replay runs on the new daemon. */
START_TEST(test_restart_wait_reports_async_replays_the_stop_dropped) {
  client k;
  client_open(&k, 0);
  uint64_t seq;
  ck_assert_int_eq(add_one(&k), GRAPHD_OK);             /* captured, x = 1 */
  ck_assert_int_eq(add_one_async(&k, &seq), GRAPHD_OK); /* the ring, x = 2 */
  ck_assert_int_eq(graphd_stream_wait(k.s, seq, 5000), GRAPHD_OK);
  expect_x(&k, 2.0f);
  holder h;
  hold_worker(&h, k.c, k.pid);
  wait_inflight(1);
  uint64_t first = 0;
  for (int i = 0; i < 8; i++) {
    ck_assert_msg(add_one_async(&k, &seq) == GRAPHD_OK, "%s", k.err);
    if (!first) first = seq;
  }
  int st = td_stop(&d);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
  for (uint64_t q = first; q <= seq; q++) {
    ck_assert_int_eq(graphd_stream_wait(k.s, q, 5000), GRAPHD_UNAVAILABLE);
    ck_assert_msg(strstr(graphd_last_error(k.c),
                         td_fmt("before it finished replay seq %llu", (unsigned long long)q)),
                  "%s", graphd_last_error(k.c));
  }
  expect_x(&k, 2.0f); /* none of the 8 ran */
  td_start_again(&d, "--host-devices", "1", NULL);
  ck_assert_msg(add_one(&k) == GRAPHD_OK, "%s", k.err);
  expect_x(&k, 3.0f);
  ck_assert_int_eq(graphd_stream_wait(k.s, seq, 5000), GRAPHD_UNAVAILABLE);
  holder_close(&h);
  client_close(&k);
}
END_TEST

/* --- cut off mid-flight ------------------------------------------------------ */

static void *slow_in_thread(void *arg) {
  client *k = arg;
  k->st = add_one(k);
  return NULL;
}

START_TEST(test_restart_replay_cut_off_mid_flight_is_reported_and_not_sent_again) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_start_again(&d, "--host-devices", "1", "--shutdown-grace", "0.3", NULL);
  client k;
  client_open(&k, 3000); /* sleeps 3 s, then adds one */
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, slow_in_thread, &k), 0);
  wait_inflight(1);
  usleep(100000); /* the kernel runs on the worker */
  int st = td_stop_sig(&d, SIGTERM, 20000);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st); /* past the grace */
  pthread_join(t, NULL);
  ck_assert_int_eq(k.st, GRAPHD_UNAVAILABLE);
  ck_assert_msg(strstr(k.err, "may have run") && strstr(k.err, "not sent again"), "%s", k.err);
  /* The next call reconnects and runs; the cut-off one never ran there. */
  td_start_again(&d, "--host-devices", "1", NULL);
  ck_assert_uint_eq(replays_on_daemon(), 0);
  for (uint32_t i = 0; i < N; i++) k.x[i] = 10.0f;
  ck_assert_msg(add_one(&k) == GRAPHD_OK, "%s", k.err);
  expect_x(&k, 11.0f);
  ck_assert_uint_eq(replays_on_daemon(), 1);
  client_close(&k);
}
END_TEST

/* --- no daemon comes back -------------------------------------------------------- */

START_TEST(test_restart_gives_up_within_the_reconnect_bound) {
  client k;
  client_open(&k, 0);
  ck_assert_int_eq(graphd_set_reconnect_wait(k.c, 1000), GRAPHD_OK);
  ck_assert_int_eq(add_one(&k), GRAPHD_OK);
  ck_assert_int_eq(td_stop(&d), 0);
  double t0 = td_now_s();
  ck_assert_int_eq(add_one(&k), GRAPHD_UNAVAILABLE);
  double took = td_now_s() - t0;
  ck_assert_msg(strstr(k.err, "did not come back within 1000 ms"), "%s", k.err);
  ck_assert_double_ge(took, 0.9);
  ck_assert_double_lt(took, 10.0); /* the bound, not a performance figure */
  expect_x(&k, 1.0f);
  /* Calls that change nothing give up the same way. */
  t0 = td_now_s();
  ck_assert_int_eq(graphd_ping(k.c, NULL, 0), GRAPHD_UNAVAILABLE);
  ck_assert_double_lt(td_now_s() - t0, 10.0);
  ck_assert_msg(strstr(graphd_last_error(k.c), "did not come back"), "%s", graphd_last_error(k.c));
  /* And the handle recovers once a daemon is back. */
  td_start_again(&d, "--host-devices", "1", NULL);
  ck_assert_msg(add_one(&k) == GRAPHD_OK, "%s", k.err);
  expect_x(&k, 2.0f);
  client_close(&k);
}
END_TEST

START_TEST(test_restart_reconnect_wait_comes_from_the_environment) {
  setenv("GRAPHD_RECONNECT_MS", "soon", 1);
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = d.socket;
  graphd_client *c = NULL;
  char err[256];
  ck_assert_int_eq(graphd_connect(&o, &c, err, sizeof err), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err, "GRAPHD_RECONNECT_MS"), "%s", err);
  setenv("GRAPHD_RECONNECT_MS", "300", 1);
  ck_assert_int_eq(graphd_connect(&o, &c, err, sizeof err), GRAPHD_OK);
  unsetenv("GRAPHD_RECONNECT_MS");
  ck_assert_int_eq(td_stop(&d), 0);
  double t0 = td_now_s();
  ck_assert_int_eq(graphd_ping(c, NULL, 0), GRAPHD_UNAVAILABLE);
  ck_assert_double_ge(td_now_s() - t0, 0.25);
  ck_assert_msg(strstr(graphd_last_error(c), "within 300 ms"), "%s", graphd_last_error(c));
  ck_assert_int_eq(graphd_set_reconnect_wait(c, -1), GRAPHD_INVALID_ARGUMENT);
  graphd_close(c);
}
END_TEST

int main(void) {
  Suite *su = suite_create("restart");
  TCase *tc = tcase_create("restart");
  tcase_set_timeout(tc, 60);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_restart_replay_loop_goes_on_across_sigterm_and_a_new_daemon);
  tcase_add_test(tc, test_restart_replay_queued_behind_a_held_ready_flag_runs_on_the_new_daemon);
  tcase_add_test(tc, test_restart_without_reconnecting_the_not_started_replay_fails);
  tcase_add_test(tc, test_restart_replay_cut_off_mid_flight_is_reported_and_not_sent_again);
  tcase_add_test(tc, test_restart_wait_reports_async_replays_the_stop_dropped);
  tcase_add_test(tc, test_restart_gives_up_within_the_reconnect_bound);
  tcase_add_test(tc, test_restart_reconnect_wait_comes_from_the_environment);
  suite_add_tcase(su, tc);
  return td_run_suite(su);
}
