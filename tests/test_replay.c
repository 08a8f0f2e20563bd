/* Captures and replays on the host backend: results, bindings that change
 * every call, both modes, sessions sharing a capture, and the ordering
 * rules when a client hangs or dies and when the daemon dies. */
#define _GNU_SOURCE
#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/memfd.h"
#include "harness.h"
#include "program3.h"
#include "graphd/wire.h"

#define N 1024u /* floats per slot */

static gd_test_daemon d;
static uint8_t *plugin;
static size_t plugin_len;

static void setup(void) {
  td_start(&d, "--host-devices", "2", "--ready-timeout", "0.5", NULL);
  plugin = td_read_file(HOST_KERNELS_SO, &plugin_len);
}

static void teardown(void) {
  free(plugin);
  if (d.pid > 0) ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* The shared 3-kernel program (program3.h) on the host test kernels. */
static void build(graphd_client *c, graphd_mode mode, uint8_t pid[32]) {
  uint8_t mod[32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  ck_assert_int_eq(program3_register(c, mod, mode, N, pid), GRAPHD_OK);
}

typedef struct bufs {
  float *x[8], *y[8], *c;
} bufs;

static void alloc_bufs(graphd_client *c, bufs *b) {
  for (int i = 0; i < 8; i++) {
    ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&b->x[i]), GRAPHD_OK);
    ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&b->y[i]), GRAPHD_OK);
  }
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&b->c), GRAPHD_OK);
  for (uint32_t k = 0; k < N; k++) b->c[k] = (float)k * 0.5f;
}

static graphd_status run_one(graphd_client *c, graphd_stream *s, const uint8_t pid[32], bufs *b,
                             int i, unsigned *rng, graphd_replay_info *info, int bind_c) {
  float *x = b->x[i % 8], *y = b->y[i % 8];
  for (uint32_t k = 0; k < N; k++) x[k] = (float)(rand_r(rng) % 1000) - 500.0f;
  memset(y, 0xff, N * 4);
  graphd_binding bd[3] = {
      {.slot = 0, .ptr = (uint64_t)(uintptr_t)x, .bytes = N * 4},
      {.slot = 3, .ptr = (uint64_t)(uintptr_t)y, .bytes = N * 4},
      {.slot = 1, .ptr = (uint64_t)(uintptr_t)b->c, .bytes = N * 4},
  };
  graphd_status st = graphd_replay(c, s, pid, bd, bind_c ? 3 : 2, info);
  if (st != GRAPHD_OK) return st;
  for (uint32_t k = 0; k < N; k++) {
    float want = (2.0f * x[k] + (float)k * 0.5f) * 2.0f + 1.0f;
    if (y[k] != want) {
      ck_abort_msg("replay %d: y[%u] = %g, want %g", i, k, (double)y[k], (double)want);
    }
  }
  return GRAPHD_OK;
}

static graphd_device_counters counters(graphd_client *c, int dev) {
  return td_device_info(c, dev).counters;
}

/* Loops and branches through the C builder, the wire and the daemon, in
 * both modes: the loop runs its count of passes, the branch takes its
 * side, and a count of 0 skips the body. */
START_TEST(test_replay_runs_conditional_loops_and_branches) {
  graphd_client *c = td_data(&d, 0);
  uint8_t mod[32], pid[2][32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  ck_assert_int_eq(cond_program_register(c, mod, GRAPHD_MODE_STAGED, N, pid[0]), GRAPHD_OK);
  ck_assert_int_eq(cond_program_register(c, mod, GRAPHD_MODE_STAGED_EX, N, pid[1]), GRAPHD_OK);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  float *x;
  uint32_t *ctl;
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&x), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, 8, (void **)&ctl), GRAPHD_OK);
  uint32_t cases[][2] = {{3, 1}, {0, 0}, {7, 0}, {1, 1}, {0, 1}};
  for (int m = 0; m < 2; m++)
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
      for (uint32_t i = 0; i < N; i++) x[i] = (float)i - 100.0f;
      ctl[0] = cases[k][0];
      ctl[1] = cases[k][1];
      graphd_binding bd[2] = {{.slot = 0, .ptr = (uint64_t)(uintptr_t)x, .bytes = N * 4},
                              {.slot = 1, .ptr = (uint64_t)(uintptr_t)ctl, .bytes = 8}};
      ck_assert_msg(graphd_replay(c, s, pid[m], bd, 2, NULL) == GRAPHD_OK, "%s",
                    graphd_last_error(c));
      for (uint32_t i = 0; i < N; i++)
        ck_assert_float_eq(x[i], cond_program_expect((float)i - 100.0f, cases[k][0], cases[k][1]));
      ck_assert_uint_eq(ctl[0], 0);
      ck_assert_uint_eq(ctl[1], cases[k][1]);
    }
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

START_TEST(test_replay_thousand_replays_with_changing_bindings_are_exact) {
  graphd_client *c = td_data(&d, 0);
  uint8_t pid[32];
  build(c, GRAPHD_MODE_STAGED, pid);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  bufs b;
  alloc_bufs(c, &b);
  unsigned rng = 1;
  graphd_replay_info info;
  for (int i = 0; i < 1200; i++) {
    graphd_status st = run_one(c, s, pid, &b, i, &rng, &info, i == 0);
    ck_assert_msg(st == GRAPHD_OK, "replay %d: %s", i, graphd_last_error(c));
    ck_assert_int_eq(info.captured, i == 0);
  }
  graphd_device_counters k = counters(c, 0);
  ck_assert_uint_eq(k.captures, 1);
  ck_assert_uint_eq(k.replays, 1200);
  ck_assert_uint_eq(k.recaptures, 0);
  ck_assert_uint_eq(k.errors, 0);
  ck_assert_uint_eq(k.inflight, 0);
  ck_assert_uint_gt(k.staging_bytes, 0);
  /* 17 regions went through a cap of 256: all registered once. */
  ck_assert_uint_eq(k.regions, 17);
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

/* The mode pid's capture runs as, and its staging bytes, from
 * ListCaptures. */
static uint32_t capture_mode(graphd_client *c, const uint8_t pid[32], uint64_t *staging) {
  graphd_capture_info *ci;
  size_t n;
  ck_assert_int_eq(graphd_list_captures(c, &ci, &n), GRAPHD_OK);
  uint32_t mode = 99;
  for (size_t i = 0; i < n; i++)
    if (!memcmp(ci[i].program_id, pid, 32)) {
      mode = ci[i].mode;
      if (staging) *staging = ci[i].staging_bytes;
    }
  free(ci);
  return mode;
}

/* Direct mode: the kernels work on the bound buffers themselves, re-pointed
 * as they move over eight binding sets. Exact over 1200 replays. */
START_TEST(test_replay_direct_mode_follows_changing_buffers_exactly) {
  graphd_client *c = td_data(&d, 0);
  uint8_t pid[32];
  build(c, GRAPHD_MODE_DIRECT, pid);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  bufs b;
  alloc_bufs(c, &b);
  unsigned rng = 5;
  graphd_replay_info info;
  for (int i = 0; i < 1200; i++) {
    graphd_status st = run_one(c, s, pid, &b, (i * 7) % 11, &rng, &info, i == 0);
    ck_assert_msg(st == GRAPHD_OK, "replay %d: %s", i, graphd_last_error(c));
  }
  graphd_device_counters k = counters(c, 0);
  ck_assert_uint_eq(k.captures, 1);
  ck_assert_uint_eq(k.recaptures, 0);
  ck_assert_uint_eq(capture_mode(c, pid, NULL), GRAPHD_MODE_DIRECT);
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

/* Loops and branches in direct mode, their condition words and the slots
 * of launches inside them bound to the client's buffers, which change
 * between replays: results are exact in every case. */
START_TEST(test_replay_direct_mode_binds_conditional_slots) {
  graphd_client *c = td_data(&d, 0);
  uint8_t mod[32], pid[32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  ck_assert_int_eq(cond_program_register(c, mod, GRAPHD_MODE_DIRECT, N, pid), GRAPHD_OK);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  float *x[2];
  uint32_t *ctls[2];
  for (int j = 0; j < 2; j++) {
    ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&x[j]), GRAPHD_OK);
    ck_assert_int_eq(graphd_host_alloc(c, 8, (void **)&ctls[j]), GRAPHD_OK);
  }
  uint32_t cases[][2] = {{3, 1}, {0, 0}, {7, 0}, {1, 1}, {0, 1}};
  for (size_t k = 0; k < 2 * sizeof cases / sizeof cases[0]; k++) {
    const uint32_t *cs = cases[k % 5];
    float *xx = x[k % 2];
    uint32_t *ctl = ctls[(k / 2) % 2], *other = ctls[1 - (k / 2) % 2];
    other[0] = 5; /* a loop that read it would run 5 more passes */
    for (uint32_t i = 0; i < N; i++) xx[i] = (float)i - 100.0f;
    ctl[0] = cs[0];
    ctl[1] = cs[1];
    graphd_binding bd[2] = {{.slot = 0, .ptr = (uint64_t)(uintptr_t)xx, .bytes = N * 4},
                            {.slot = 1, .ptr = (uint64_t)(uintptr_t)ctl, .bytes = 8}};
    ck_assert_msg(graphd_replay(c, s, pid, bd, 2, NULL) == GRAPHD_OK, "%s", graphd_last_error(c));
    for (uint32_t i = 0; i < N; i++)
      ck_assert_float_eq(xx[i], cond_program_expect((float)i - 100.0f, cs[0], cs[1]));
    ck_assert_uint_eq(ctl[0], 0);
    ck_assert_uint_eq(other[0], 5);
  }
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

/* Auto mode chooses by the bound bytes against the kernel nodes to
 * re-point: 1024 floats a slot over three launches stay staged; 64 Ki
 * floats go direct, with staging for the scratch slot and the unstaged
 * input only; 120 slots of 256 floats over 60 launches go direct too
 * (more slots than nodes). All exact. */
START_TEST(test_replay_auto_mode_chooses_by_bytes_against_nodes) {
  graphd_client *c = td_data(&d, 0);
  uint8_t mod[32], small[32], big[32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  ck_assert_int_eq(program3_register(c, mod, GRAPHD_MODE_AUTO, N, small), GRAPHD_OK);
  uint32_t nb = 64u * 1024u;
  ck_assert_int_eq(program3_register(c, mod, GRAPHD_MODE_AUTO, nb, big), GRAPHD_OK);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  bufs b;
  alloc_bufs(c, &b);
  unsigned rng = 9;
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(run_one(c, s, small, &b, i, &rng, NULL, i == 0), GRAPHD_OK);
  ck_assert_uint_eq(capture_mode(c, small, NULL), GRAPHD_MODE_STAGED);
  float *x, *y, *cc;
  ck_assert_int_eq(graphd_host_alloc(c, nb * 4, (void **)&x), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, nb * 4, (void **)&y), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, nb * 4, (void **)&cc), GRAPHD_OK);
  for (uint32_t i = 0; i < nb; i++) {
    x[i] = (float)(i % 301) - 7.0f;
    cc[i] = (float)(i % 13);
  }
  graphd_binding bd[3] = {{0, (uint64_t)(uintptr_t)x, nb * 4},
                          {3, (uint64_t)(uintptr_t)y, nb * 4},
                          {1, (uint64_t)(uintptr_t)cc, nb * 4}};
  ck_assert_int_eq(graphd_replay(c, s, big, bd, 3, NULL), GRAPHD_OK);
  for (uint32_t i = 0; i < nb; i++) ck_assert(y[i] == (2.0f * x[i] + cc[i]) * 2.0f + 1.0f);
  uint64_t staging = 0;
  ck_assert_uint_eq(capture_mode(c, big, &staging), GRAPHD_MODE_DIRECT);
  ck_assert_uint_eq(staging, 2ull * nb * 4); /* t and c only: x and y are the client's */
  uint8_t wide[32];
  ck_assert_int_eq(wide_program_register(c, mod, GRAPHD_MODE_AUTO, 60, 256, wide), GRAPHD_OK);
  float *w[120];
  graphd_binding wb[120];
  for (uint32_t j = 0; j < 120; j++) {
    ck_assert_int_eq(graphd_host_alloc(c, 256 * 4, (void **)&w[j]), GRAPHD_OK);
    for (uint32_t i = 0; i < 256; i++) w[j][i] = (float)(i + j);
    wb[j] = (graphd_binding){j, (uint64_t)(uintptr_t)w[j], 256 * 4};
  }
  ck_assert_int_eq(graphd_replay(c, s, wide, wb, 120, NULL), GRAPHD_OK);
  for (uint32_t k = 0; k < 60; k++)
    for (uint32_t i = 0; i < 256; i++) ck_assert(w[2 * k + 1][i] == (float)(k + 1) * w[2 * k][i]);
  ck_assert_uint_eq(capture_mode(c, wide, &staging), GRAPHD_MODE_DIRECT);
  ck_assert_uint_lt(staging, 120u * 256u * 4u); /* not a copy of every slot */
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

START_TEST(test_replay_staged_and_staged_ex_agree) {
  graphd_client *c = td_data(&d, 0);
  uint8_t a[32], e[32];
  build(c, GRAPHD_MODE_STAGED, a);
  build(c, GRAPHD_MODE_STAGED_EX, e);
  ck_assert(memcmp(a, e, 32) != 0); /* the mode is part of the program */
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  bufs b;
  alloc_bufs(c, &b);
  unsigned r1 = 7, r2 = 7;
  for (int i = 0; i < 100; i++) {
    ck_assert_int_eq(run_one(c, s, a, &b, i, &r1, NULL, i == 0), GRAPHD_OK);
    ck_assert_int_eq(run_one(c, s, e, &b, i, &r2, NULL, i == 0), GRAPHD_OK);
  }
  ck_assert_uint_eq(counters(c, 0).captures, 2);
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

typedef struct worker_arg {
  const gd_test_daemon *d;
  const uint8_t *pid;
  int id;
  int ok;
  char err[512];
} worker_arg;

static void *session_thread(void *p) {
  worker_arg *w = p;
  graphd_client *c = td_data(w->d, 0);
  graphd_stream *s;
  graphd_stream_attach(c, NULL, &s);
  bufs b;
  alloc_bufs(c, &b);
  unsigned rng = (unsigned)w->id * 77 + 1;
  for (int i = 0; i < 400; i++) {
    /* Only the capturing replay needs c bound; bind it always here, since
     * either session may be the one that captures. */
    graphd_status st = run_one(c, s, w->pid, &b, i, &rng, NULL, 1);
    if (st != GRAPHD_OK) {
      snprintf(w->err, sizeof w->err, "%s", graphd_last_error(c));
      graphd_stream_detach(s);
      graphd_close(c);
      return NULL;
    }
  }
  w->ok = 1;
  graphd_stream_detach(s);
  graphd_close(c);
  return NULL;
}

START_TEST(test_replay_two_sessions_share_a_capture_without_disturbing_each_other) {
  graphd_client *c = td_data(&d, 0);
  uint8_t pid[32];
  build(c, GRAPHD_MODE_STAGED, pid);
  pthread_t th[2];
  worker_arg wa[2] = {{.d = &d, .pid = pid, .id = 1}, {.d = &d, .pid = pid, .id = 2}};
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, session_thread, &wa[i]);
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    ck_assert_msg(wa[i].ok, "session %d: %s", i, wa[i].err);
  }
  graphd_device_counters k = counters(c, 0);
  ck_assert_uint_eq(k.captures, 1);
  ck_assert_uint_eq(k.replays, 800);
  /* A session on the other device gets its own capture. */
  graphd_client *c1 = td_data(&d, 1);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c1, NULL, &s), GRAPHD_OK);
  bufs b;
  alloc_bufs(c1, &b);
  unsigned rng = 3;
  graphd_replay_info info;
  ck_assert_int_eq(run_one(c1, s, pid, &b, 0, &rng, &info, 1), GRAPHD_OK);
  ck_assert_int_eq(info.captured, 1);
  ck_assert_uint_eq(counters(c, 1).captures, 1);
  ck_assert_uint_eq(counters(c, 0).captures, 1);
  graphd_stream_detach(s);
  graphd_close(c1);
  graphd_close(c);
}
END_TEST

/* A graph is made pointing at the memory of the replay that captured it;
 * once that memory is unmapped (its session ended), the driver must not
 * see the graph instantiated again (it reads the addresses), so binding
 * sets that come back re-point an executable graph instead. Results stay
 * exact. */
START_TEST(test_replay_graph_of_a_closed_sessions_memory_is_not_instantiated_again) {
  graphd_client *keep = td_data(&d, 0); /* keeps the program registered */
  uint8_t pid[32];
  build(keep, GRAPHD_MODE_STAGED, pid);
  graphd_client *a = td_data(&d, 0);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(a, NULL, &s), GRAPHD_OK);
  bufs b;
  alloc_bufs(a, &b);
  unsigned rng = 11;
  graphd_replay_info info;
  ck_assert_int_eq(run_one(a, s, pid, &b, 0, &rng, &info, 1), GRAPHD_OK);
  ck_assert_int_eq(info.captured, 1);
  graphd_stream_detach(s);
  graphd_close(a);
  for (int i = 0; i < 200 && counters(keep, 0).sessions > 1; i++) usleep(10000);
  ck_assert_uint_eq(counters(keep, 0).sessions, 1);
  graphd_client *c = td_data(&d, 0);
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  alloc_bufs(c, &b);
  /* Two binding sets in turn: the third call brings the first one back. */
  for (int i = 0; i < 6; i++) {
    ck_assert_int_eq(run_one(c, s, pid, &b, (i % 2) * 9, &rng, &info, 0), GRAPHD_OK);
    ck_assert_int_eq(info.captured, 0);
  }
  ck_assert(td_log_contains(&d, "its graph points at memory unmapped since"));
  graphd_stream_detach(s);
  graphd_close(c);
  graphd_close(keep);
}
END_TEST

START_TEST(test_replay_bindings_are_checked) {
  graphd_client *c = td_data(&d, 0);
  uint8_t pid[32];
  build(c, GRAPHD_MODE_STAGED, pid);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  bufs b;
  alloc_bufs(c, &b);
  graphd_binding ok[3] = {{0, (uint64_t)(uintptr_t)b.x[0], N * 4},
                          {3, (uint64_t)(uintptr_t)b.y[0], N * 4},
                          {1, (uint64_t)(uintptr_t)b.c, N * 4}};
  /* The capturing replay needs the unstaged input. */
  ck_assert_int_eq(graphd_replay(c, s, pid, ok, 2, NULL), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c),
                       "slot 1 is an unstaged input: bind it on the replay that captures"),
                "%s", graphd_last_error(c));
  graphd_binding missing[1] = {ok[0]};
  ck_assert_int_eq(graphd_replay(c, s, pid, missing, 1, NULL), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c), "slot 3 (staged output) is not bound"), "%s",
                graphd_last_error(c));
  graphd_binding scratch[3] = {ok[0], ok[1], {2, (uint64_t)(uintptr_t)b.x[1], N * 4}};
  ck_assert_int_eq(graphd_replay(c, s, pid, scratch, 3, NULL), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c), "slot 2 is scratch"), "%s", graphd_last_error(c));
  graphd_binding twice[3] = {ok[0], ok[1], ok[0]};
  ck_assert_int_eq(graphd_replay(c, s, pid, twice, 3, NULL), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c), "slot 0 is bound twice"), "%s", graphd_last_error(c));
  graphd_binding small[2] = {{0, (uint64_t)(uintptr_t)b.x[0], N * 2}, ok[1]};
  ck_assert_int_eq(graphd_replay(c, s, pid, small, 2, NULL), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(
      strstr(graphd_last_error(c), "slot 0 (input) is 4096 bytes, but its binding covers 2048"),
      "%s", graphd_last_error(c));
  graphd_binding past[2] = {{0, (uint64_t)(uintptr_t)b.x[0] + 8, N * 4}, ok[1]};
  ck_assert_int_eq(graphd_replay(c, s, pid, past, 2, NULL), GRAPHD_OUT_OF_RANGE);
  graphd_binding nosuch[2] = {{9, (uint64_t)(uintptr_t)b.x[0], N * 4}, ok[1]};
  ck_assert_int_eq(graphd_replay(c, s, pid, nosuch, 2, NULL), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c), "names slot 9"), "%s", graphd_last_error(c));
  uint8_t unknown[32] = {1};
  ck_assert_int_eq(graphd_replay(c, s, unknown, ok, 3, NULL), GRAPHD_NOT_FOUND);
  /* After all that, the proper call works and captures. */
  graphd_replay_info info;
  ck_assert_msg(graphd_replay(c, s, pid, ok, 3, &info) == GRAPHD_OK, "%s", graphd_last_error(c));
  ck_assert_int_eq(info.captured, 1);
  graphd_device_counters k = counters(c, 0);
  ck_assert_uint_eq(k.replays, 1);
  /* The binding past the allocation's end never left the client. */
  ck_assert_uint_eq(k.errors, 7);
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

/* The client process that gets killed: replays in a loop until told off. */
static void client_loop(const gd_test_daemon *dd, int ready_fd) {
  graphd_client *c = td_data(dd, 0);
  uint8_t pid[32];
  build(c, GRAPHD_MODE_STAGED, pid);
  graphd_stream *s;
  graphd_stream_attach(c, NULL, &s);
  bufs b;
  alloc_bufs(c, &b);
  unsigned rng = 5;
  for (int i = 0;; i++) {
    if (run_one(c, s, pid, &b, i, &rng, NULL, 1) != GRAPHD_OK) _exit(3);
    if (i == 20 && write(ready_fd, "r", 1) != 1) _exit(4);
  }
}

START_TEST(test_replay_killed_client_leaves_nothing_behind) {
  graphd_client *ctl = td_control(&d);
  graphd_client *other = td_data(&d, 0);
  uint8_t pid[32];
  build(other, GRAPHD_MODE_STAGED, pid);
  graphd_stream *os;
  graphd_stream_attach(other, NULL, &os);
  bufs ob;
  alloc_bufs(other, &ob);
  unsigned rng = 11;
  /* Touch all 8 buffer pairs, so the other session's regions stay put. */
  for (int i = 0; i < 8; i++)
    ck_assert_int_eq(run_one(other, os, pid, &ob, i, &rng, NULL, 1), GRAPHD_OK);
  graphd_device_counters base = counters(ctl, 0);
  int base_fds = td_count_fds(d.pid);
  for (int round = 0; round < 3; round++) {
    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    pid_t child = fork();
    if (child == 0) {
      close(pfd[0]);
      client_loop(&d, pfd[1]);
    }
    close(pfd[1]);
    char ch;
    ck_assert_int_eq(read(pfd[0], &ch, 1), 1);
    close(pfd[0]);
    /* In the middle of its replays. */
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    /* The other session keeps replaying meanwhile. */
    for (int i = 1; i < 30; i++)
      ck_assert_int_eq(run_one(other, os, pid, &ob, i, &rng, NULL, 0), GRAPHD_OK);
    graphd_device_counters k;
    for (int i = 0;; i++) {
      k = counters(ctl, 0);
      if ((k.sessions == base.sessions && k.regions == base.regions &&
           td_count_fds(d.pid) == base_fds) ||
          i > 300)
        break;
      usleep(10000);
    }
    ck_assert_uint_eq(k.sessions, base.sessions);
    ck_assert_uint_eq(k.regions, base.regions);
    ck_assert_uint_eq(k.region_bytes, base.region_bytes);
    ck_assert_uint_eq(k.inflight, 0);
    ck_assert_int_eq(td_count_fds(d.pid), base_fds);
  }
  graphd_stream_detach(os);
  graphd_close(other);
  graphd_close(ctl);
}
END_TEST

/* A data session on device 0 with the staged program, a stream and
 * buffers. */
static graphd_client *staged_session(uint8_t pid[32], graphd_stream **s, bufs *b) {
  graphd_client *c = td_data(&d, 0);
  build(c, GRAPHD_MODE_STAGED, pid);
  ck_assert_int_eq(graphd_stream_attach(c, NULL, s), GRAPHD_OK);
  alloc_bufs(c, b);
  return c;
}

START_TEST(test_replay_daemon_killed_mid_call_returns_unavailable_within_a_second) {
  uint8_t pid[32];
  graphd_stream *s;
  bufs b;
  graphd_client *c = staged_session(pid, &s, &b);
  graphd_set_reconnect_wait(c, 0); /* the daemon stays dead: no waiting for another */
  unsigned rng = 9;
  graphd_status st = GRAPHD_OK;
  double killed = 0, failed = 0;
  for (int i = 0; i < 100000; i++) {
    if (i == 50) {
      killed = td_now_s();
      kill(d.pid, SIGKILL);
    }
    st = run_one(c, s, pid, &b, i, &rng, NULL, i == 0);
    if (st != GRAPHD_OK) {
      failed = td_now_s();
      break;
    }
  }
  ck_assert_int_eq(st, GRAPHD_UNAVAILABLE);
  ck_assert_double_lt(failed - killed, 1.0);
  ck_assert_msg(strstr(graphd_last_error(c), "undefined"), "%s", graphd_last_error(c));
  /* A replay the daemon took and never answered may have run: never sent
   * again (with reconnecting on as well). One that never reached it (the
   * kill came between two calls) says that it did not run. */
  ck_assert_msg(strstr(graphd_last_error(c), "not sent again") ||
                    strstr(graphd_last_error(c), "went away;") ||
                    strstr(graphd_last_error(c), "did not run"),
                "%s", graphd_last_error(c));
  /* Later calls fail the same way, at once, and the process goes on. */
  ck_assert_int_eq(graphd_ping(c, NULL, 0), GRAPHD_UNAVAILABLE);
  graphd_stream_detach(s);
  graphd_close(c);
  waitpid(d.pid, NULL, 0);
  d.pid = 0;
}
END_TEST

/* This process's mapping of libgraphd's flag page (memfd "graphd-flags"). */
static volatile uint64_t *own_flag_page(void) {
  FILE *m = fopen("/proc/self/maps", "r");
  ck_assert_ptr_nonnull(m);
  char line[512];
  unsigned long lo = 0;
  while (!lo && fgets(line, sizeof line, m))
    if (strstr(line, "/memfd:graphd-flags")) lo = strtoul(line, NULL, 16);
  fclose(m);
  ck_assert_msg(lo != 0, "no graphd-flags mapping in /proc/self/maps");
  return (volatile uint64_t *)lo;
}

static uint64_t word(volatile uint64_t *w, int i) {
  return __atomic_load_n(&w[i], __ATOMIC_ACQUIRE);
}
static void put_word(volatile uint64_t *w, int i, uint64_t v) {
  __atomic_store_n(&w[i], v, __ATOMIC_RELEASE);
}

/* After the daemon dies, GPU work it queued can still land a done write
 * lower than libgraphd's release. The watcher writes the release again
 * until the stream has passed what it issued, then stops. Simulated here
 * on slot 0's words: (ready, done, passed) at words 0, 1, 2, written and
 * read atomically, as the watcher thread reads them meanwhile. */
START_TEST(test_dead_daemon_release_is_rewritten_until_the_stream_is_past) {
  uint8_t pid[32];
  graphd_stream *s;
  bufs b;
  graphd_client *c = staged_session(pid, &s, &b);
  graphd_set_reconnect_wait(c, 0); /* the watcher's work, without a reconnect */
  unsigned rng = 5;
  for (int i = 0; i < 10; i++) ck_assert_int_eq(run_one(c, s, pid, &b, i, &rng, NULL, i == 0), 0);
  volatile uint64_t *w = own_flag_page();
  ck_assert_uint_eq(word(w, 1), 10); /* done, from the daemon */
  ck_assert_uint_eq(word(w, 2), 10); /* passed */
  /* A stream behind: passed back to 7, done still 10 when the daemon dies. */
  put_word(w, 2, 7);
  kill(d.pid, SIGKILL);
  waitpid(d.pid, NULL, 0);
  d.pid = 0;
  ck_assert_int_eq(graphd_ping(c, NULL, 0), GRAPHD_UNAVAILABLE);
  /* A late write from the dead daemon's GPU work: done falls to 8. */
  put_word(w, 1, 8);
  double t0 = td_now_s();
  while (word(w, 1) != 10 && td_now_s() - t0 < 1.0) usleep(100);
  ck_assert_uint_eq(word(w, 1), 10);
  double again = td_now_s() - t0;
  /* And again, later. */
  usleep(20000);
  put_word(w, 1, 9);
  t0 = td_now_s();
  while (word(w, 1) != 10 && td_now_s() - t0 < 1.0) usleep(100);
  ck_assert_uint_eq(word(w, 1), 10);
  printf("FIGURE late done writes after the daemon died were overwritten after %.2f ms\n",
         again * 1e3);
  /* The stream gets past: the watcher stops writing. */
  put_word(w, 2, 10);
  usleep(20000);
  put_word(w, 1, 3);
  usleep(50000);
  ck_assert_uint_eq(word(w, 1), 3);
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

/* A raw client: a data session with a 4-slot flag page and one region of
 * 2N floats, whose replays' ready flags the test writes (or not) itself. */
typedef struct raw_client {
  int fd, flags, mem;
  uint32_t region;
  volatile uint64_t *page;
} raw_client;

static void raw_open(raw_client *rc, graphd_client *c) {
  rc->fd = td_raw_connect(&d);
  td_raw_data_hello(c, rc->fd, 0);
  Graphd__Wire__Reply *r;

  rc->flags = gd_memfd_new_shared("flags", 4096);
  ck_assert_int_ge(rc->flags, 0);
  rc->page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rc->flags, 0);
  td_expect_reply(td_raw_register_flags(rc->fd, 2, rc->flags, 4), GRAPHD_OK, NULL);

  rc->mem = gd_memfd_new_shared("region", 2 * N * 4);
  ck_assert_int_ge(rc->mem, 0);
  Graphd__Wire__Request rr = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterRegion rg = GRAPHD__WIRE__REGISTER_REGION__INIT;
  rr.request_id = 3;
  rr.nfds = 1;
  rr.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_REGION;
  rr.register_region = &rg;
  rg.kind = GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD;
  rg.size = 2 * N * 4;
  td_raw_send_request(rc->fd, &rr, &rc->mem, 1);
  r = td_raw_recv(rc->fd, 5000);
  ck_assert_msg(r->code == 0, "%s", r->message);
  rc->region = r->register_region->region_id;
  graphd__wire__reply__free_unpacked(r, NULL);
}

static void raw_replay(raw_client *rc, const uint8_t pid[32], uint64_t seq) {
  Graphd__Wire__Request rq = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Replay rp = GRAPHD__WIRE__REPLAY__INIT;
  Graphd__Wire__Binding b0 = GRAPHD__WIRE__BINDING__INIT, b3 = GRAPHD__WIRE__BINDING__INIT;
  Graphd__Wire__Binding *bs[2] = {&b0, &b3};
  b0.slot = 0;
  b0.region_id = rc->region;
  b0.bytes = N * 4;
  b3.slot = 3;
  b3.region_id = rc->region;
  b3.offset = N * 4;
  b3.bytes = N * 4;
  rq.request_id = 10 + seq;
  rq.body_case = GRAPHD__WIRE__REQUEST__BODY_REPLAY;
  rq.replay = &rp;
  rp.program_id.data = (uint8_t *)pid;
  rp.program_id.len = 32;
  rp.stream_slot = 0;
  rp.seq = seq;
  rp.n_bindings = 2;
  rp.bindings = bs;
  td_raw_send_request(rc->fd, &rq, NULL, 0);
}

static void raw_close(raw_client *rc) {
  munmap((void *)rc->page, 4096);
  if (rc->fd >= 0) close(rc->fd);
  close(rc->flags);
  close(rc->mem);
}

/* A libgraphd client with the test program captured on device 0 (its
 * first replay), and a raw client of the same program whose replays the
 * tests hold back through its ready flag. */
typedef struct held {
  graphd_client *c;
  uint8_t pid[32];
  graphd_stream *s;
  bufs b;
  unsigned rng;
  raw_client rc;
} held;

static void held_open(held *h, unsigned seed) {
  h->c = td_data(&d, 0);
  build(h->c, GRAPHD_MODE_STAGED, h->pid);
  graphd_stream_attach(h->c, NULL, &h->s);
  alloc_bufs(h->c, &h->b);
  h->rng = seed;
  ck_assert_int_eq(run_one(h->c, h->s, h->pid, &h->b, 0, &h->rng, NULL, 1), GRAPHD_OK);
  raw_open(&h->rc, h->c);
}

static void held_close(held *h) {
  raw_close(&h->rc);
  graphd_stream_detach(h->s);
  graphd_close(h->c);
}

/* A client that dies while its replay waits for its ready flag is noticed
 * at once (its socket hangs up), not after the ready timeout: the wait is
 * released and whoever was behind it goes on. */
START_TEST(test_replay_client_dying_mid_wait_is_noticed_at_once) {
  held h;
  held_open(&h, 17);
  raw_replay(&h.rc, h.pid, 1); /* ready[0] stays 0 */
  usleep(50000);
  double t0 = td_now_s();
  close(h.rc.fd); /* the client dies */
  h.rc.fd = -1;
  ck_assert_int_eq(run_one(h.c, h.s, h.pid, &h.b, 1, &h.rng, NULL, 0), GRAPHD_OK);
  double behind = td_now_s() - t0;
  printf("FIGURE client died mid-wait: the replay behind it ran %.1f ms later\n", behind * 1e3);
  ck_assert_msg(behind < 0.3, "the replay behind waited %.3f s (the ready timeout is 0.5 s)",
                behind);
  ck_assert(td_log_contains(&d, "peer hung up during a request"));
  held_close(&h);
}
END_TEST

/* --max-inflight-replays: a session whose replays are not done (by its
 * flag page's done word) past the limit has its next replay held, unread
 * and unanswered, until the count drops; held longer than the ready
 * timeout, it fails naming the limit. (The raw client writes its own done
 * word down to stand for replays still queued on a GPU.) */
START_TEST(test_replay_past_the_inflight_limit_waits_then_fails) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
  td_start(&d, "--host-devices", "1", "--ready-timeout", "0.5", "--max-inflight-replays", "2",
           NULL);
  held h;
  held_open(&h, 29);
  h.rc.page[0] = 100; /* ready: every replay may run */
  for (uint64_t seq = 1; seq <= 3; seq++) {
    raw_replay(&h.rc, h.pid, seq);
    Graphd__Wire__Reply *r = td_raw_recv(h.rc.fd, 5000);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->code == 0, "%s", r->message);
    graphd__wire__reply__free_unpacked(r, NULL);
  }
  ck_assert_uint_eq(h.rc.page[1], 3);
  h.rc.page[1] = 0; /* three not done: over the limit of 2 */
  raw_replay(&h.rc, h.pid, 4);
  ck_assert_ptr_null(td_raw_recv(h.rc.fd, 200)); /* held */
  h.rc.page[1] = 3;                              /* they finished */
  Graphd__Wire__Reply *r = td_raw_recv(h.rc.fd, 2000);
  ck_assert_ptr_nonnull(r);
  ck_assert_msg(r->code == 0, "%s", r->message);
  graphd__wire__reply__free_unpacked(r, NULL);
  ck_assert_uint_eq(h.rc.page[1], 4);
  /* Held past the ready timeout: refused, naming the limit. */
  h.rc.page[1] = 0;
  double t0 = td_now_s();
  raw_replay(&h.rc, h.pid, 5);
  r = td_raw_recv(h.rc.fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->code, GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(r->message, "--max-inflight-replays 2"), "%s", r->message);
  ck_assert_double_ge(td_now_s() - t0, 0.45);
  graphd__wire__reply__free_unpacked(r, NULL);
  /* Nothing ran for it. */
  ck_assert_uint_eq(h.rc.page[1], 0);
  held_close(&h);
}
END_TEST

START_TEST(test_replay_hung_client_is_cut_off_after_the_ready_timeout) {
  held h;
  held_open(&h, 13);
  double t0 = td_now_s();
  raw_replay(&h.rc, h.pid, 1); /* ready[0] stays 0: this client never gets there */
  usleep(100000);
  /* Another client, blocked behind the hung one on the same device. */
  for (int i = 1; i < 5; i++) {
    graphd_status s2 = run_one(h.c, h.s, h.pid, &h.b, i, &h.rng, NULL, 0);
    ck_assert_msg(s2 == GRAPHD_OK, "%s", graphd_last_error(h.c));
  }
  double unblocked = td_now_s() - t0;
  ck_assert_double_ge(unblocked, 0.5);
  ck_assert_double_lt(unblocked, 3.0);
  Graphd__Wire__Reply *r = td_raw_recv(h.rc.fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->code, GRAPHD_DEADLINE_EXCEEDED);
  ck_assert_msg(strstr(r->message, "ready flag did not reach 1"), "%s", r->message);
  graphd__wire__reply__free_unpacked(r, NULL);
  ck_assert(td_raw_eof(h.rc.fd, 5000)); /* and its session is closed */
  /* The failed replay still wrote done = seq. */
  ck_assert_uint_eq(h.rc.page[1], 1);
  held_close(&h);
}
END_TEST

START_TEST(test_replay_slow_client_blocking_nobody_is_not_cut_off) {
  graphd_client *c = td_data(&d, 0);
  uint8_t pid[32];
  build(c, GRAPHD_MODE_STAGED, pid);
  raw_client rc;
  raw_open(&rc, c);
  float *mem = mmap(NULL, 2 * N * 4, PROT_READ | PROT_WRITE, MAP_SHARED, rc.mem, 0);
  for (uint32_t k = 0; k < N; k++) mem[k] = (float)k;
  /* The unstaged input must be bound on the capturing replay: capture with
   * libgraphd first. */
  graphd_stream *s;
  graphd_stream_attach(c, NULL, &s);
  bufs b;
  alloc_bufs(c, &b);
  unsigned rng = 17;
  ck_assert_int_eq(run_one(c, s, pid, &b, 0, &rng, NULL, 1), GRAPHD_OK);
  raw_replay(&rc, pid, 1);
  /* Twice the ready timeout, with nobody queued behind it. */
  usleep(1100000);
  __atomic_store_n(&rc.page[0], 1, __ATOMIC_RELEASE);
  Graphd__Wire__Reply *r = td_raw_recv(rc.fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_msg(r->code == 0, "%s", r->message);
  graphd__wire__reply__free_unpacked(r, NULL);
  ck_assert_uint_eq(rc.page[1], 1);
  for (uint32_t k = 0; k < N; k++)
    ck_assert_float_eq(mem[N + k], (2.0f * (float)k + (float)k * 0.5f) * 2.0f + 1.0f);
  munmap(mem, 2 * N * 4);
  raw_close(&rc);
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

/* --shutdown-grace: a device whose job does not finish (here a host kernel
 * that sleeps 8 s) does not hold shutdown past the grace; the daemon
 * removes its socket and exits with status 1. */
static void setup_grace(void) {
  td_start(&d, "--host-devices", "1", "--shutdown-grace", "0.5", NULL);
  plugin = td_read_file(HOST_KERNELS_SO, &plugin_len);
}

static void setup_no_timeout(void) {
  td_start(&d, "--host-devices", "1", "--ready-timeout", "0", "--socket-mode", "0666", NULL);
  ck_assert_int_eq(chmod(d.dir, 0755), 0); /* for uid 65534's clients */
  plugin = td_read_file(HOST_KERNELS_SO, &plugin_len);
}

/* A worker held in a long job (a replay waiting for a ready flag that
 * never times out) does not stall Status: it answers within its bound and
 * says which device is busy; once the job ends the device is ok again. */
START_TEST(test_status_list_and_evict_answer_while_a_worker_is_held) {
  held h;
  held_open(&h, 21);
  raw_replay(&h.rc, h.pid, 1); /* ready[0] stays 0: the worker waits */
  usleep(100000);
  graphd_client *ctl = td_control(&d);
  double t0 = td_now_s();
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  double took = td_now_s() - t0;
  printf("FIGURE status with the device's worker held: answered in %.0f ms, state %s\n", took * 1e3,
         st->devices[0].state);
  ck_assert_double_lt(took, 2.0);
  ck_assert_str_eq(st->devices[0].state, "busy");
  graphd_daemon_status_free(st);

  /* List and evict answer too, naming the busy device. */
  graphd_capture_info *ci;
  size_t n = 99;
  uint32_t busy[4] = {99};
  t0 = td_now_s();
  ck_assert_int_eq(graphd_list_captures(ctl, &ci, &n), GRAPHD_OK);
  took = td_now_s() - t0;
  free(ci);
  ck_assert_uint_eq(n, 0);
  ck_assert_uint_eq(graphd_busy_devices(ctl, busy, 4), 1);
  ck_assert_uint_eq(busy[0], 0);
  printf("FIGURE list with the device's worker held: answered in %.0f ms\n", took * 1e3);
  ck_assert_double_lt(took, 2.0);
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.all = 1;
  uint64_t bytes = 99;
  t0 = td_now_s();
  ck_assert_int_eq(graphd_evict(ctl, &o, NULL, &n, &bytes), GRAPHD_OK);
  took = td_now_s() - t0;
  ck_assert_uint_eq(n, 0);
  ck_assert_uint_eq(bytes, 0);
  ck_assert_uint_eq(graphd_busy_devices(ctl, busy, 4), 1);
  printf("FIGURE evict with the device's worker held: answered in %.0f ms\n", took * 1e3);
  ck_assert_double_lt(took, 2.0);

  h.rc.page[0] = 1; /* the client's stream gets there after all */
  Graphd__Wire__Reply *r = td_raw_recv(h.rc.fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->code, 0);
  graphd__wire__reply__free_unpacked(r, NULL);
  /* The eviction ran once the worker was free. */
  ck_assert_int_eq(graphd_list_captures(ctl, &ci, &n), GRAPHD_OK);
  free(ci);
  ck_assert_uint_eq(n, 0);
  ck_assert_uint_eq(graphd_busy_devices(ctl, busy, 4), 0);
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  ck_assert_str_eq(st->devices[0].state, "ok");
  ck_assert_uint_eq(st->devices[0].counters.captures, 0);
  ck_assert_uint_eq(st->devices[0].counters.evictions, 1);
  graphd_daemon_status_free(st);
  graphd_close(ctl);
  held_close(&h);
}
END_TEST

/* While a worker is held, Status sends it one job, not one per request:
 * eight control clients that each ask once and leave do not each leave a
 * job (and their session, which the job keeps open) queued behind the
 * held one. Each is answered with the device's last free memory, as busy. */
START_TEST(test_status_sends_a_held_worker_one_job) {
  held h;
  held_open(&h, 23);
  graphd_client *ctl = td_control(&d);
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  uint64_t free0 = st->devices[0].free_memory;
  ck_assert_uint_gt(free0, 0);
  graphd_daemon_status_free(st);
  graphd_close(ctl);
  raw_replay(&h.rc, h.pid, 1); /* ready[0] stays 0: the worker waits */
  usleep(100000);
  pid_t pid = td_daemon_pid(&d);
  int fds0 = td_settled_fds(pid);
  for (int k = 0; k < 8; k++) {
    ctl = td_control(&d);
    ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
    ck_assert_str_eq(st->devices[0].state, "busy");
    ck_assert_uint_eq(st->devices[0].free_memory, free0);
    graphd_daemon_status_free(st);
    graphd_close(ctl);
  }
  int fds1 = td_settled_fds(pid);
  printf("FIGURE 8 status requests while the worker is held: %d fds kept open\n", fds1 - fds0);
  /* The first request's job still waits, keeping its session: one fd. */
  ck_assert_int_le(fds1, fds0 + 1);
  /* The worker is let go; a Status sent at once finds the first
   * request's job still out, waits on it, and has its answer. */
  h.rc.page[0] = 1;
  ctl = td_control(&d);
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  ck_assert_str_eq(st->devices[0].state, "ok");
  ck_assert_uint_gt(st->devices[0].free_memory, 0);
  graphd_daemon_status_free(st);
  graphd_close(ctl);
  Graphd__Wire__Reply *r = td_raw_recv(h.rc.fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->code, 0);
  graphd__wire__reply__free_unpacked(r, NULL);
  /* The worker is free: Status asks it again and it answers. */
  ctl = td_control(&d);
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  ck_assert_str_eq(st->devices[0].state, "ok");
  graphd_daemon_status_free(st);
  graphd_close(ctl);
  ck_assert_int_le(td_settled_fds(pid), fds0);
  held_close(&h);
}
END_TEST

/* One control request of kind k (0 Status, 1 ListCaptures, 2 Evict of the
 * captures idle for a second), sent raw; the client then hangs up without
 * reading the answer. */
static void send_and_hang_up(int k) {
  int fd = td_raw_connect(&d);
  td_raw_hello(fd);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__StatusRequest st = GRAPHD__WIRE__STATUS_REQUEST__INIT;
  Graphd__Wire__ListCaptures li = GRAPHD__WIRE__LIST_CAPTURES__INIT;
  Graphd__Wire__Evict ev = GRAPHD__WIRE__EVICT__INIT;
  req.request_id = 2;
  if (k == 0) {
    req.body_case = GRAPHD__WIRE__REQUEST__BODY_STATUS;
    req.status = &st;
  } else if (k == 1) {
    req.body_case = GRAPHD__WIRE__REQUEST__BODY_LIST_CAPTURES;
    req.list_captures = &li;
  } else {
    req.body_case = GRAPHD__WIRE__REQUEST__BODY_EVICT;
    req.evict = &ev;
    ev.idle_ms = 1000;
  }
  td_raw_send_request(fd, &req, NULL, 0);
  close(fd);
}

#define HANGUPS 1000

static int hang_up_many(const void *arg) {
  (void)arg;
  for (int i = 0; i < HANGUPS; i++) send_and_hang_up(i % 3);
  return 0;
}

/* Evicts as uid 65534 while the worker is held, after the hang-ups above:
 * the uid's first four Evicts among those still have their jobs queued,
 * so each of these is refused at once with a clear error. */
static int evict_past_the_bound(const void *arg) {
  (void)arg;
  int fds[8];
  for (int i = 0; i < 8; i++) {
    fds[i] = td_raw_connect(&d);
    td_raw_hello(fds[i]);
  }
  int refused = 0;
  for (int i = 0; i < 8; i++) {
    Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
    Graphd__Wire__Evict ev = GRAPHD__WIRE__EVICT__INIT;
    req.request_id = 2;
    req.body_case = GRAPHD__WIRE__REQUEST__BODY_EVICT;
    req.evict = &ev;
    ev.idle_ms = 1000;
    td_raw_send_request(fds[i], &req, NULL, 0);
    Graphd__Wire__Reply *r = td_raw_recv(fds[i], 5000);
    if (!r) return 1;
    if (r->code == GRAPHD_RESOURCE_EXHAUSTED && strstr(r->message, "evictions")) refused++;
    graphd__wire__reply__free_unpacked(r, NULL);
  }
  for (int i = 0; i < 8; i++) close(fds[i]);
  return refused == 8 ? 0 : 2;
}

/* Clients that each send Status, ListCaptures or Evict and hang up while
 * the device's worker is in a long job keep no fd, no session and little
 * memory in the daemon: a thousand of them, as uid 65534, leave its fd
 * count where it was. Meanwhile root's graphctl and another client are
 * served as usual. */
START_TEST(test_control_hangups_behind_a_held_worker_keep_nothing) {
  held h;
  held_open(&h, 29);
  raw_replay(&h.rc, h.pid, 1); /* ready[0] stays 0: the worker waits */
  usleep(100000);
  pid_t pid = td_daemon_pid(&d);
  int fds0 = td_settled_fds(pid);
  long rss0 = td_rss_kib(pid);
  double t0 = td_now_s();
  ck_assert_int_eq(td_as_nobody(hang_up_many, NULL), 0);
  double took = td_now_s() - t0;
  int fds1 = td_settled_fds(pid);
  long rss1 = td_rss_kib(pid);
  printf("FIGURE %d hang-ups behind a held worker in %.2f s: %d fds and %ld KiB kept\n", HANGUPS,
         took, fds1 - fds0, rss1 - rss0);
  ck_assert_int_le(fds1, fds0);
#if !defined(__SANITIZE_ADDRESS__)
  /* (ASan's quarantine keeps what the daemon freed: there the fds tell.) */
  ck_assert_int_lt(rss1 - rss0, 16 * 1024);
#endif
  /* Another client is served while the worker is still held. */
  graphd_client *ctl = td_control(&d);
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  ck_assert_str_eq(st->devices[0].state, "busy");
  graphd_daemon_status_free(st);
  /* Without waiting: at once, from the last figures, with their age. */
  t0 = td_now_s();
  ck_assert_int_eq(graphd_get_status_now(ctl, &st), GRAPHD_OK);
  took = td_now_s() - t0;
  ck_assert_double_lt(took, 0.25);
  ck_assert_str_eq(st->devices[0].state, "busy");
  ck_assert_uint_gt(st->figures_age_ms[0], 100);
  ck_assert_uint_gt(st->devices[0].free_memory, 0);
  graphd_daemon_status_free(st);
  /* Evictions that would queue behind the held worker are bounded per
   * uid; an admin's are not. */
  ck_assert_int_eq(td_as_nobody(evict_past_the_bound, NULL), 0);
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.idle_ms = 1000;
  size_t n;
  uint64_t bytes;
  ck_assert_int_eq(graphd_evict(ctl, &o, NULL, &n, &bytes), GRAPHD_OK);
  /* The worker is let go: what was asked still runs, and all is well. */
  h.rc.page[0] = 1;
  Graphd__Wire__Reply *r = td_raw_recv(h.rc.fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->code, 0);
  graphd__wire__reply__free_unpacked(r, NULL);
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  ck_assert_str_eq(st->devices[0].state, "ok");
  ck_assert_uint_eq(st->figures_age_ms[0], 0);
  graphd_daemon_status_free(st);
  graphd_close(ctl);
  ck_assert_int_le(td_settled_fds(pid), fds0);
  held_close(&h);
}
END_TEST

typedef struct slow_call {
  graphd_client *c;
  graphd_stream *s;
  uint8_t pid[32];
  float *out;
  graphd_status st;
} slow_call;

static void *slow_replay(void *arg) {
  slow_call *k = arg;
  graphd_binding b = {.slot = 0, .ptr = (uint64_t)(uintptr_t)k->out, .bytes = 256};
  k->st = graphd_replay(k->c, k->s, k->pid, &b, 1, NULL);
  return NULL;
}

START_TEST(test_replay_shutdown_grace_bounds_a_stuck_device) {
  slow_call k = {0};
  k.c = td_data(&d, 0);
  uint8_t mod[32];
  ck_assert_int_eq(graphd_register_module(k.c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, 256, 1);
  uint32_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1}, ms = 8000;
  int s0 = graphd_program_add_launch(p, mod, "sleep_ms", grid, block, 0);
  graphd_program_param(p, (uint32_t)s0, 0, &ms, 4);
  ck_assert_int_eq(graphd_program_finish(p, k.pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_register_program(k.c, p), GRAPHD_OK);
  graphd_program_free(p);
  ck_assert_int_eq(graphd_stream_attach(k.c, NULL, &k.s), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(k.c, 256, (void **)&k.out), GRAPHD_OK);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, slow_replay, &k), 0);
  usleep(300000); /* the kernel is running on the device's worker */
  double t0 = td_now_s();
  int st = td_stop_sig(&d, SIGTERM, 20000);
  double took = td_now_s() - t0;
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
  ck_assert_msg(took < 4.0, "shutdown took %.1f s with a 0.5 s grace", took);
  /* The stuck worker wrote where it was (not under a wrapper, which owns
   * the signals). */
  if (!getenv("GRAPHD_TEST_WRAPPER")) {
    ck_assert(td_log_contains(&d, "its stack follows"));
    ck_assert(td_log_contains(&d, "graphd: stack of thread "));
    ck_assert(td_log_contains(&d, "graphd(+0x"));
  }
  ck_assert_int_eq(access(d.socket, F_OK), -1);
  pthread_join(t, NULL);
  ck_assert_int_eq(k.st, GRAPHD_UNAVAILABLE);
  graphd_stream_detach(k.s);
  graphd_close(k.c);
}
END_TEST

/* A flag page the client could shrink under the daemon's mapping (a SIGBUS
 * in graphd) is refused; the page libgraphd makes cannot shrink, and the
 * daemon goes on serving. */
START_TEST(test_replay_flag_page_must_be_sealed) {
  graphd_client *ctl = td_control(&d);
  int fd = td_raw_connect(&d);
  td_raw_data_hello(ctl, fd, 0);
  int loose = memfd_create("loose-flags", MFD_CLOEXEC);
  ck_assert_int_eq(ftruncate(loose, 4096), 0);
  td_expect_reply(td_raw_register_flags(fd, 2, loose, 4), GRAPHD_INVALID_ARGUMENT,
                  "the flag page memfd must be sealed against shrink and grow");
  close(loose);
  int sealed = gd_memfd_new_shared("flags", 4096);
  ck_assert_int_ge(sealed, 0);
  td_expect_reply(td_raw_register_flags(fd, 3, sealed, 4), GRAPHD_OK, NULL);
  ck_assert_int_lt(ftruncate(sealed, 0), 0); /* the seal holds */
  close(sealed);
  close(fd);
  ck_assert_int_eq(graphd_ping(ctl, NULL, 0), GRAPHD_OK);
  graphd_close(ctl);
}
END_TEST

int main(void) {
  Suite *su = suite_create("replay");
  TCase *tc = tcase_create("replay");
  tcase_set_timeout(tc, 60);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_replay_thousand_replays_with_changing_bindings_are_exact);
  tcase_add_test(tc, test_replay_flag_page_must_be_sealed);
  tcase_add_test(tc, test_replay_direct_mode_follows_changing_buffers_exactly);
  tcase_add_test(tc, test_replay_direct_mode_binds_conditional_slots);
  tcase_add_test(tc, test_replay_auto_mode_chooses_by_bytes_against_nodes);
  tcase_add_test(tc, test_replay_runs_conditional_loops_and_branches);
  tcase_add_test(tc, test_replay_client_dying_mid_wait_is_noticed_at_once);
  tcase_add_test(tc, test_replay_staged_and_staged_ex_agree);
  tcase_add_test(tc, test_replay_two_sessions_share_a_capture_without_disturbing_each_other);
  tcase_add_test(tc, test_replay_graph_of_a_closed_sessions_memory_is_not_instantiated_again);
  tcase_add_test(tc, test_replay_bindings_are_checked);
  tcase_add_test(tc, test_replay_killed_client_leaves_nothing_behind);
  tcase_add_test(tc, test_replay_daemon_killed_mid_call_returns_unavailable_within_a_second);
  tcase_add_test(tc, test_dead_daemon_release_is_rewritten_until_the_stream_is_past);
  tcase_add_test(tc, test_replay_hung_client_is_cut_off_after_the_ready_timeout);
  tcase_add_test(tc, test_replay_past_the_inflight_limit_waits_then_fails);
  tcase_add_test(tc, test_replay_slow_client_blocking_nobody_is_not_cut_off);
  suite_add_tcase(su, tc);
  TCase *tg = tcase_create("grace");
  tcase_set_timeout(tg, 60);
  tcase_add_checked_fixture(tg, setup_grace, teardown);
  TCase *tn = tcase_create("no_timeout");
  tcase_set_timeout(tn, 60);
  tcase_add_checked_fixture(tn, setup_no_timeout, teardown);
  tcase_add_test(tn, test_status_list_and_evict_answer_while_a_worker_is_held);
  tcase_add_test(tn, test_status_sends_a_held_worker_one_job);
  tcase_add_test(tn, test_control_hangups_behind_a_held_worker_keep_nothing);
  suite_add_tcase(su, tn);
  tcase_add_test(tg, test_replay_shutdown_grace_bounds_a_stuck_device);
  suite_add_tcase(su, tg);
  return td_run_suite(su);
}
