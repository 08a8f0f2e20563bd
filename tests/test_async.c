/* Asynchronous replays through the submission ring on the host backend:
 * exact results over thousands of calls with changing buffers and a ring
 * that wraps, the order of async and sync replays on one stream, errors
 * reported by the next call (and the stream released all the same), a full
 * ring, a client and a daemon killed with entries queued, many clients,
 * the order of one process's entries across its handles' rings, entries
 * of many bindings that take several slots of the ring, and long entries a
 * client could write by hand (more bindings than an entry may carry, or
 * slots it never published). */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../client/lib/internal.h"
#include "common/memfd.h"
#include "harness.h"
#include "program3.h"

#define N 1024u /* floats per slot */
#define PAIRS 8 /* buffer pairs a client cycles through */

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

/* A client with the staged 3-kernel program, a host stream and PAIRS
 * pairs of buffers; seq[k] is the last replay that used pair k. */
typedef struct client {
  graphd_client *c;
  graphd_stream *s;
  uint8_t pid[32];
  float *x[PAIRS], *y[PAIRS], *cst;
  float want[PAIRS][N];
  uint64_t seq[PAIRS];
  unsigned rng;
} client;

static void client_open(client *k, uint32_t ring_entries, unsigned seed) {
  memset(k, 0, sizeof *k);
  k->c = td_data(&d, 0);
  if (ring_entries) ck_assert_int_eq(graphd_set_ring_entries(k->c, ring_entries), GRAPHD_OK);
  uint8_t mod[32];
  ck_assert_int_eq(graphd_register_module(k->c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  ck_assert_int_eq(program3_register(k->c, mod, GRAPHD_MODE_STAGED, N, k->pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_stream_attach(k->c, NULL, &k->s), GRAPHD_OK);
  for (int i = 0; i < PAIRS; i++) {
    ck_assert_int_eq(graphd_host_alloc(k->c, N * 4, (void **)&k->x[i]), GRAPHD_OK);
    ck_assert_int_eq(graphd_host_alloc(k->c, N * 4, (void **)&k->y[i]), GRAPHD_OK);
  }
  ck_assert_int_eq(graphd_host_alloc(k->c, N * 4, (void **)&k->cst), GRAPHD_OK);
  for (uint32_t j = 0; j < N; j++) k->cst[j] = (float)j * 0.5f;
  k->rng = seed;
}

static void client_close(client *k) {
  graphd_stream_detach(k->s);
  graphd_close(k->c);
}

/* Waits for pair i's last replay and checks its output bit for bit. */
static void check_pair(client *k, int i) {
  if (!k->seq[i]) return;
  graphd_status st = graphd_stream_wait(k->s, k->seq[i], -1);
  ck_assert_msg(st == GRAPHD_OK, "wait: %s", graphd_last_error(k->c));
  for (uint32_t j = 0; j < N; j++)
    if (k->y[i][j] != k->want[i][j])
      ck_abort_msg("pair %d: y[%u] = %g, want %g", i, j, (double)k->y[i][j], (double)k->want[i][j]);
  k->seq[i] = 0;
}

/* Fills pair i with fresh input and its reference, once its last replay
 * is checked, and queues a replay on it (async, or sync). */
static graphd_status issue(client *k, int i, bool sync, bool bind_c) {
  check_pair(k, i);
  float *x = k->x[i], *y = k->y[i];
  for (uint32_t j = 0; j < N; j++) {
    x[j] = (float)(rand_r(&k->rng) % 1000) - 500.0f;
    k->want[i][j] = (2.0f * x[j] + (float)j * 0.5f) * 2.0f + 1.0f;
  }
  memset(y, 0xff, N * 4);
  graphd_binding bd[3] = {
      {.slot = 0, .ptr = (uint64_t)(uintptr_t)x, .bytes = N * 4},
      {.slot = 3, .ptr = (uint64_t)(uintptr_t)y, .bytes = N * 4},
      {.slot = 1, .ptr = (uint64_t)(uintptr_t)k->cst, .bytes = N * 4},
  };
  graphd_status st;
  if (sync) {
    st = graphd_replay(k->c, k->s, k->pid, bd, bind_c ? 3 : 2, NULL);
    k->seq[i] = st == GRAPHD_OK ? 1 : 0; /* done already */
  } else {
    st = graphd_replay_async(k->c, k->s, k->pid, bd, bind_c ? 3 : 2, &k->seq[i]);
  }
  return st;
}

/* Reads every completion, so that the ring holds no unread one. */
static void drain_completions(client *k) {
  graphd_async_info info;
  do ck_assert_int_eq(graphd_replay_collect(k->c, &info), GRAPHD_OK);
  while (info.queued);
}

/* Stops the daemon and waits until it has stopped (every thread). */
static void stop_daemon(void) {
  int status;
  ck_assert_int_eq(kill(d.pid, SIGSTOP), 0);
  ck_assert_int_eq(waitpid(d.pid, &status, WUNTRACED), d.pid);
  ck_assert(WIFSTOPPED(status));
}

static graphd_device_counters counters(int dev) {
  graphd_client *ctl = td_control(&d);
  graphd_device_counters k = td_device_info(ctl, dev).counters;
  graphd_close(ctl);
  return k;
}

START_TEST(test_async_thousands_of_replays_wrap_a_small_ring_exactly) {
  client k;
  client_open(&k, 4, 1);
  for (int i = 0; i < 3000; i++) {
    graphd_status st = issue(&k, i % PAIRS, false, i == 0);
    ck_assert_msg(st == GRAPHD_OK, "replay %d: %s", i, graphd_last_error(k.c));
  }
  for (int i = 0; i < PAIRS; i++) check_pair(&k, i);
  graphd_async_info info;
  ck_assert_int_eq(graphd_replay_collect(k.c, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.completed, 3000);
  ck_assert_uint_eq(info.failed, 0);
  ck_assert_uint_eq(info.queued, 0);
  /* The worker tells the loop within a tick: the counters catch up. */
  graphd_device_counters c;
  for (int i = 0; i < 500 && (c = counters(0)).replays < 3000; i++) usleep(10000);
  ck_assert_uint_eq(c.replays, 3000);
  ck_assert_uint_eq(c.captures, 1);
  ck_assert_uint_eq(c.errors, 0);
  client_close(&k);
}
END_TEST

START_TEST(test_async_and_sync_replays_on_one_stream_keep_their_order) {
  client k;
  client_open(&k, 8, 2);
  unsigned pick = 3;
  for (int i = 0; i < 2000; i++) {
    bool sync = rand_r(&pick) % 4 == 0;
    graphd_status st = issue(&k, i % PAIRS, sync, i == 0);
    ck_assert_msg(st == GRAPHD_OK, "replay %d: %s", i, graphd_last_error(k.c));
  }
  for (int i = 0; i < PAIRS; i++) check_pair(&k, i);
  /* A chain: each replay reads what the one before it wrote. */
  float *a = k.x[0], *b = k.y[0];
  for (uint32_t j = 0; j < N; j++) a[j] = (float)(j % 7) * 0.25f;
  float ref[N];
  memcpy(ref, a, sizeof ref);
  uint64_t last = 0;
  for (int step = 0; step < 40; step++) {
    float *in = step % 2 ? b : a, *out = step % 2 ? a : b;
    graphd_binding bd[2] = {{.slot = 0, .ptr = (uint64_t)(uintptr_t)in, .bytes = N * 4},
                            {.slot = 3, .ptr = (uint64_t)(uintptr_t)out, .bytes = N * 4}};
    graphd_status st = step % 5 == 4 ? graphd_replay(k.c, k.s, k.pid, bd, 2, NULL)
                                     : graphd_replay_async(k.c, k.s, k.pid, bd, 2, &last);
    ck_assert_msg(st == GRAPHD_OK, "step %d: %s", step, graphd_last_error(k.c));
    for (uint32_t j = 0; j < N; j++) ref[j] = (2.0f * ref[j] + (float)j * 0.5f) * 2.0f + 1.0f;
  }
  ck_assert_int_eq(graphd_stream_wait(k.s, last, -1), GRAPHD_OK);
  /* 40 steps end in a (even count: the last wrote a). */
  for (uint32_t j = 0; j < N; j++)
    if (a[j] != ref[j]) ck_abort_msg("chain: [%u] = %g, want %g", j, (double)a[j], (double)ref[j]);
  client_close(&k);
}
END_TEST

START_TEST(test_async_error_comes_back_on_the_next_call_and_releases_the_stream) {
  client k;
  client_open(&k, 0, 3);
  ck_assert_int_eq(issue(&k, 0, false, true), GRAPHD_OK);
  check_pair(&k, 0);
  /* The daemon refuses this one: slot 3 is N * 4 bytes. */
  graphd_binding bad[2] = {{.slot = 0, .ptr = (uint64_t)(uintptr_t)k.x[1], .bytes = N * 4},
                           {.slot = 3, .ptr = (uint64_t)(uintptr_t)k.y[1], .bytes = N * 4 - 4}};
  uint64_t seq = 0;
  ck_assert_int_eq(graphd_replay_async(k.c, k.s, k.pid, bad, 2, &seq), GRAPHD_OK);
  /* Its done value comes all the same, and the wait reports the failure. */
  ck_assert_int_eq(graphd_stream_wait(k.s, seq, -1), GRAPHD_INVALID_ARGUMENT);
  const char *e = graphd_last_error(k.c);
  char want[64];
  snprintf(want, sizeof want, "async replay seq %llu on stream slot", (unsigned long long)seq);
  ck_assert_msg(strstr(e, want) && strstr(e, "binding covers 4092"), "%s", e);
  /* Once. */
  ck_assert_int_eq(graphd_replay_collect(k.c, NULL), GRAPHD_OK);
  ck_assert_int_eq(issue(&k, 2, false, false), GRAPHD_OK);
  check_pair(&k, 2);
  /* A synchronous call reports it too: the sync replay's job runs the
   * ring's entries first, so the failure is in the ring by the time it is
   * answered, and this call or the next one reports it. */
  ck_assert_int_eq(graphd_replay_async(k.c, k.s, k.pid, bad, 2, &seq), GRAPHD_OK);
  graphd_status st1 = issue(&k, 3, true, false);
  graphd_status st2 = st1 == GRAPHD_OK ? issue(&k, 4, true, false) : GRAPHD_OK;
  ck_assert_int_eq(st1 == GRAPHD_OK ? st2 : st1, GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(k.c), "binding covers 4092"), "%s",
                graphd_last_error(k.c));
  ck_assert_int_eq(issue(&k, 5, true, false), GRAPHD_OK);
  check_pair(&k, 5);
  graphd_async_info info;
  ck_assert_int_eq(graphd_replay_collect(k.c, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.failed, 2);
  client_close(&k);
}
END_TEST

typedef struct blocked_call {
  client *k;
  graphd_status st;
  _Atomic bool finished;
} blocked_call;

static void *third_call(void *arg) {
  blocked_call *b = arg;
  b->st = issue(b->k, 3, false, false);
  atomic_store(&b->finished, true);
  return NULL;
}

START_TEST(test_async_full_ring_blocks_the_call_until_the_worker_takes_an_entry) {
  client k;
  client_open(&k, 2, 4);
  /* Every pair registered, the program named: no request is needed below. */
  for (int i = 0; i < PAIRS; i++) ck_assert_int_eq(issue(&k, i, false, i == 0), GRAPHD_OK);
  for (int i = 0; i < PAIRS; i++) check_pair(&k, i);
  drain_completions(&k);
  stop_daemon();
  ck_assert_int_eq(issue(&k, 1, false, false), GRAPHD_OK);
  ck_assert_int_eq(issue(&k, 2, false, false), GRAPHD_OK);
  blocked_call b = {.k = &k};
  pthread_t th;
  uint64_t waited = graphd_ring_wait_ns(k.c);
  ck_assert_int_eq(pthread_create(&th, NULL, third_call, &b), 0);
  usleep(200000);
  ck_assert_msg(!atomic_load(&b.finished), "the call returned with the ring full");
  ck_assert_int_eq(kill(d.pid, SIGCONT), 0);
  pthread_join(th, NULL);
  ck_assert_msg(b.st == GRAPHD_OK, "%s", graphd_last_error(k.c));
  /* The call's time waiting for room is counted: 200 ms at least. */
  waited = graphd_ring_wait_ns(k.c) - waited;
  ck_assert_msg(waited >= 190000000u, "%llu ns counted waiting for room in the ring",
                (unsigned long long)waited);
  for (int i = 1; i <= 3; i++) check_pair(&k, i);
  client_close(&k);
}
END_TEST

/* A client process that queues async replays until it is killed. */
static void async_loop(int ready_fd) {
  client k;
  client_open(&k, 16, 5);
  for (int i = 0;; i++) {
    int p = i % PAIRS;
    graphd_binding bd[2] = {
        {.slot = 0, .ptr = (uint64_t)(uintptr_t)k.x[p], .bytes = N * 4},
        {.slot = 3, .ptr = (uint64_t)(uintptr_t)k.y[p], .bytes = N * 4},
    };
    graphd_binding bc = {.slot = 1, .ptr = (uint64_t)(uintptr_t)k.cst, .bytes = N * 4};
    graphd_binding all[3] = {bd[0], bd[1], bc};
    if (graphd_replay_async(k.c, k.s, k.pid, i == 0 ? all : bd, i == 0 ? 3 : 2, NULL) != GRAPHD_OK)
      _exit(3);
    if (i == 40 && write(ready_fd, "r", 1) != 1) _exit(4);
  }
}

START_TEST(test_async_killed_client_with_entries_queued_leaves_nothing_behind) {
  client o;
  client_open(&o, 0, 6);
  for (int i = 0; i < PAIRS; i++) ck_assert_int_eq(issue(&o, i, false, i == 0), GRAPHD_OK);
  for (int i = 0; i < PAIRS; i++) check_pair(&o, i);
  graphd_device_counters base = counters(0);
  int base_fds = td_settled_fds(d.pid); /* counters()' session closes meanwhile */
  for (int round = 0; round < 3; round++) {
    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    pid_t child = fork();
    if (child == 0) {
      close(pfd[0]);
      async_loop(pfd[1]);
    }
    close(pfd[1]);
    char ch;
    ck_assert_int_eq(read(pfd[0], &ch, 1), 1);
    close(pfd[0]);
    /* Stop the daemon so the child's ring fills, then kill the child with
     * its entries queued. */
    stop_daemon();
    usleep(50000);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    ck_assert_int_eq(kill(d.pid, SIGCONT), 0);
    for (int i = 0; i < 200; i++)
      ck_assert_msg(issue(&o, i % PAIRS, i % 3 == 0, false) == GRAPHD_OK, "%s",
                    graphd_last_error(o.c));
    for (int i = 0; i < PAIRS; i++) check_pair(&o, i);
    graphd_device_counters c;
    for (double end = td_now_s() + 30;;) {
      c = counters(0);
      if ((c.sessions == base.sessions && c.regions == base.regions &&
           td_settled_fds(d.pid) == base_fds) ||
          td_now_s() > end)
        break;
      usleep(10000);
    }
    ck_assert_uint_eq(c.sessions, base.sessions);
    ck_assert_uint_eq(c.regions, base.regions);
    ck_assert_int_eq(td_settled_fds(d.pid), base_fds);
  }
  client_close(&o);
}
END_TEST

START_TEST(test_async_daemon_killed_with_entries_queued_releases_the_stream) {
  client k;
  client_open(&k, 16, 7);
  graphd_set_reconnect_wait(k.c, 0); /* the daemon stays dead */
  for (int i = 0; i < PAIRS; i++) ck_assert_int_eq(issue(&k, i, false, i == 0), GRAPHD_OK);
  for (int i = 0; i < PAIRS; i++) check_pair(&k, i);
  stop_daemon();
  uint64_t last = 0;
  for (int i = 0; i < 5; i++) {
    graphd_binding bd[2] = {{.slot = 0, .ptr = (uint64_t)(uintptr_t)k.x[i], .bytes = N * 4},
                            {.slot = 3, .ptr = (uint64_t)(uintptr_t)k.y[i], .bytes = N * 4}};
    ck_assert_int_eq(graphd_replay_async(k.c, k.s, k.pid, bd, 2, &last), GRAPHD_OK);
  }
  kill(d.pid, SIGKILL);
  waitpid(d.pid, NULL, 0);
  d.pid = 0;
  /* The watcher writes the done values the dead daemon never will, so the
   * wait returns; the replays never ran, and the wait says so. */
  ck_assert_int_eq(graphd_stream_wait(k.s, last, 10000), GRAPHD_UNAVAILABLE);
  ck_assert_msg(strstr(graphd_last_error(k.c), "before it finished replay seq"), "%s",
                graphd_last_error(k.c));
  graphd_binding bd[2] = {{.slot = 0, .ptr = (uint64_t)(uintptr_t)k.x[0], .bytes = N * 4},
                          {.slot = 3, .ptr = (uint64_t)(uintptr_t)k.y[0], .bytes = N * 4}};
  ck_assert_int_eq(graphd_replay_async(k.c, k.s, k.pid, bd, 2, NULL), GRAPHD_UNAVAILABLE);
  client_close(&k);
}
END_TEST

START_TEST(test_async_many_clients_at_once_are_exact) {
  enum { CLIENTS = 8 };
  pid_t kids[CLIENTS];
  for (int n = 0; n < CLIENTS; n++) {
    kids[n] = fork();
    if (kids[n] == 0) {
      client k;
      client_open(&k, n % 2 ? 4 : 64, 100 + (unsigned)n);
      for (int i = 0; i < 600; i++)
        if (issue(&k, i % PAIRS, i % 50 == 49, i == 0) != GRAPHD_OK) _exit(2);
      for (int i = 0; i < PAIRS; i++) check_pair(&k, i);
      client_close(&k);
      _exit(0);
    }
  }
  for (int n = 0; n < CLIENTS; n++) {
    int status;
    ck_assert_int_eq(waitpid(kids[n], &status, 0), kids[n]);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "client %d: status %d", n, status);
  }
}
END_TEST

/* Two handles of this process, each with its own session and ring, queue
 * entries by turns while the daemon is stopped; the worker, which would
 * otherwise take one ring's batch before the other's, runs them in the
 * order they were queued (each replay's stamp numbers its launch in the
 * daemon). */
START_TEST(test_async_handles_of_one_process_run_in_the_order_they_were_queued) {
  enum { HANDLES = 2, ROUNDS = 12 };
  graphd_client *c[HANDLES];
  graphd_stream *s[HANDLES];
  uint8_t pid[HANDLES][32], mod[32];
  uint64_t *out[HANDLES], seq[HANDLES] = {0};
  for (int h = 0; h < HANDLES; h++) {
    c[h] = td_data(&d, 0);
    ck_assert_int_eq(graphd_register_module(c[h], GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                     GRAPHD_OK);
    ck_assert_int_eq(stamp_program_register(c[h], mod, pid[h]), GRAPHD_OK);
    ck_assert_int_eq(graphd_stream_attach(c[h], NULL, &s[h]), GRAPHD_OK);
    ck_assert_int_eq(graphd_host_alloc(c[h], 8 * (ROUNDS + 1), (void **)&out[h]), GRAPHD_OK);
    /* The ring made, the program named and the region registered. */
    graphd_binding b = {.slot = 0, .ptr = (uint64_t)(uintptr_t)&out[h][ROUNDS], .bytes = 8};
    ck_assert_int_eq(graphd_replay_async(c[h], s[h], pid[h], &b, 1, &seq[h]), GRAPHD_OK);
    ck_assert_int_eq(graphd_stream_wait(s[h], seq[h], -1), GRAPHD_OK);
  }
  stop_daemon();
  /* Queued: 0 1, 1 0, 0 1, ...; so neither ring's entries all come first. */
  int order[ROUNDS * HANDLES][2], n = 0;
  for (int i = 0; i < ROUNDS; i++)
    for (int k = 0; k < HANDLES; k++) {
      int h = i % 2 ? HANDLES - 1 - k : k;
      graphd_binding b = {.slot = 0, .ptr = (uint64_t)(uintptr_t)&out[h][i], .bytes = 8};
      ck_assert_int_eq(graphd_replay_async(c[h], s[h], pid[h], &b, 1, &seq[h]), GRAPHD_OK);
      order[n][0] = h;
      order[n++][1] = i;
    }
  ck_assert_int_eq(kill(d.pid, SIGCONT), 0);
  for (int h = 0; h < HANDLES; h++)
    ck_assert_int_eq(graphd_stream_wait(s[h], seq[h], -1), GRAPHD_OK);
  for (int j = 1; j < n; j++) {
    uint64_t before = out[order[j - 1][0]][order[j - 1][1]], now = out[order[j][0]][order[j][1]];
    ck_assert_msg(now > before,
                  "entry %d (handle %d, round %d) ran as launch %llu, after entry %d's launch %llu",
                  j, order[j][0], order[j][1], (unsigned long long)now, j - 1,
                  (unsigned long long)before);
  }
  for (int h = 0; h < HANDLES; h++) {
    graphd_stream_detach(s[h]);
    graphd_close(c[h]);
  }
}
END_TEST

/* One process of the turn test: sets up its session (ring, program,
 * region) and says so on `ready`, queues ROUNDS entries when `go` says,
 * says so again, then copies each entry's stamp into its row of `stamps`.
 * Exit status 0, or the failed step. */
enum { TURN_ROUNDS = 12 };
static int turn_child(int ready, int go, uint64_t *stamps) {
  graphd_client *c = td_data(&d, 0);
  uint8_t mod[32], pid[32];
  graphd_stream *s;
  uint64_t *out, seq = 0;
  char byte = 'r';
  if (!c || graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod) ||
      stamp_program_register(c, mod, pid) || graphd_stream_attach(c, NULL, &s) ||
      graphd_host_alloc(c, 8 * (TURN_ROUNDS + 1), (void **)&out))
    return 2;
  graphd_binding b = {.slot = 0, .ptr = (uint64_t)(uintptr_t)&out[TURN_ROUNDS], .bytes = 8};
  if (graphd_replay_async(c, s, pid, &b, 1, &seq) || graphd_stream_wait(s, seq, -1)) return 3;
  if (write(ready, &byte, 1) != 1 || read(go, &byte, 1) != 1) return 4;
  for (int i = 0; i < TURN_ROUNDS; i++) {
    b.ptr = (uint64_t)(uintptr_t)&out[i];
    if (graphd_replay_async(c, s, pid, &b, 1, &seq)) return 5;
  }
  if (write(ready, &byte, 1) != 1 || graphd_stream_wait(s, seq, -1)) return 6;
  memcpy(stamps, out, sizeof *out * TURN_ROUNDS);
  graphd_stream_detach(s);
  graphd_close(c);
  return 0;
}

/* Two processes (sessions that share no order) queue entries of one
 * program while the daemon is stopped. The worker takes one entry from
 * each ring in turn, not one ring's run and then the other's (on a GPU
 * each entry of a session waits for its stream to see the previous one
 * done, and the sessions share the capture), so the launches alternate
 * (each replay's stamp numbers its launch in the daemon). */
START_TEST(test_async_rings_of_two_processes_are_taken_in_turn) {
  enum { KIDS = 2 };
  uint64_t *stamps = mmap(NULL, sizeof(uint64_t) * KIDS * TURN_ROUNDS, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(stamps, MAP_FAILED);
  int ready[2], go[KIDS][2];
  ck_assert_int_eq(pipe(ready), 0);
  pid_t kids[KIDS];
  for (int k = 0; k < KIDS; k++) {
    ck_assert_int_eq(pipe(go[k]), 0);
    kids[k] = fork();
    ck_assert_int_ge(kids[k], 0);
    if (kids[k] == 0) _exit(turn_child(ready[1], go[k][0], stamps + k * TURN_ROUNDS));
  }
  char byte;
  for (int k = 0; k < KIDS; k++) ck_assert_int_eq(read(ready[0], &byte, 1), 1);
  stop_daemon();
  for (int k = 0; k < KIDS; k++) ck_assert_int_eq(write(go[k][1], "g", 1), 1);
  for (int k = 0; k < KIDS; k++) ck_assert_int_eq(read(ready[0], &byte, 1), 1);
  ck_assert_int_eq(kill(d.pid, SIGCONT), 0);
  for (int k = 0; k < KIDS; k++) {
    int status;
    ck_assert_int_eq(waitpid(kids[k], &status, 0), kids[k]);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process %d: status %d", k,
                  status);
  }
  /* Launch number -> process: every launch's neighbours are the other's. */
  uint64_t lo = UINT64_MAX;
  for (int i = 0; i < KIDS * TURN_ROUNDS; i++) lo = stamps[i] < lo ? stamps[i] : lo;
  int owner[KIDS * TURN_ROUNDS];
  memset(owner, 0xff, sizeof owner);
  for (int i = 0; i < KIDS * TURN_ROUNDS; i++) {
    uint64_t at = stamps[i] - lo;
    ck_assert_uint_lt(at, KIDS * TURN_ROUNDS);
    owner[at] = i / TURN_ROUNDS;
  }
  for (int j = 1; j < KIDS * TURN_ROUNDS; j++)
    ck_assert_msg(owner[j] != owner[j - 1],
                  "launches %d and %d both ran process %d's entries: one ring's run went first",
                  j - 1, j, owner[j]);
  munmap(stamps, sizeof(uint64_t) * KIDS * TURN_ROUNDS);
}
END_TEST

/* A replay of many bindings: its entry continues in the slots after it,
 * wrapping around a small ring, and every output is exact. A ring too
 * small for the entry sends it the synchronous way. */
#define WIDE_K 60u  /* launches: 120 bindings, 6 slots an entry */
#define WIDE_N 256u /* floats per slot */
START_TEST(test_async_entries_of_many_bindings_take_several_slots) {
  for (int small = 0; small < 2; small++) {
    graphd_client *c = td_data(&d, 0);
    /* 8 slots: at most one entry queued, its slots wrapping at different
     * places; 2 slots hold 41 bindings, fewer than 120. */
    ck_assert_int_eq(graphd_set_ring_entries(c, small ? 2 : 8), GRAPHD_OK);
    uint8_t mod[32], pid[32];
    ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                     GRAPHD_OK);
    ck_assert_int_eq(wide_program_register(c, mod, GRAPHD_MODE_STAGED, WIDE_K, WIDE_N, pid),
                     GRAPHD_OK);
    graphd_stream *s;
    ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
    /* Two sets of buffers, used by turns. */
    float *buf[2][2 * WIDE_K];
    graphd_binding bd[2][2 * WIDE_K];
    for (int set = 0; set < 2; set++)
      for (uint32_t j = 0; j < 2 * WIDE_K; j++) {
        ck_assert_int_eq(graphd_host_alloc(c, WIDE_N * 4, (void **)&buf[set][j]), GRAPHD_OK);
        bd[set][j] = (graphd_binding){
            .slot = j, .ptr = (uint64_t)(uintptr_t)buf[set][j], .bytes = WIDE_N * 4};
      }
    unsigned rng = 7;
    int replays = small ? 20 : 300;
    for (int r = 0; r < replays; r++) {
      int set = r % 2;
      for (uint32_t i = 0; i < WIDE_K; i++)
        for (uint32_t j = 0; j < WIDE_N; j++) {
          buf[set][2 * i][j] = (float)(rand_r(&rng) % 1000);
          buf[set][2 * i + 1][j] = -1.0f;
        }
      uint64_t seq = 0;
      graphd_status st = graphd_replay_async(c, s, pid, bd[set], 2 * WIDE_K, &seq);
      ck_assert_msg(st == GRAPHD_OK, "replay %d: %s", r, graphd_last_error(c));
      ck_assert_int_eq(graphd_stream_wait(s, seq, -1), GRAPHD_OK);
      for (uint32_t i = 0; i < WIDE_K; i++)
        for (uint32_t j = 0; j < WIDE_N; j++)
          if (buf[set][2 * i + 1][j] != (float)(i + 1) * buf[set][2 * i][j])
            ck_abort_msg("replay %d: y_%u[%u] = %g, want %g", r, i, j,
                         (double)buf[set][2 * i + 1][j],
                         (double)((float)(i + 1) * buf[set][2 * i][j]));
    }
    if (!small) {
      /* A binding that cannot be resolved in the entry's last slot, whose
       * slots were being written in the ring: refused naming it, nothing
       * published, and the next replay's slots written over them. */
      graphd_binding bad[2 * WIDE_K];
      memcpy(bad, bd[0], sizeof bad);
      bad[2 * WIDE_K - 1].ptr = 8;
      graphd_status st = graphd_replay_async(c, s, pid, bad, 2 * WIDE_K, NULL);
      ck_assert_int_eq(st, GRAPHD_INVALID_ARGUMENT);
      ck_assert_msg(strstr(graphd_last_error(c), "slot 119"), "%s", graphd_last_error(c));
      for (uint32_t i = 0; i < WIDE_K; i++)
        for (uint32_t j = 0; j < WIDE_N; j++) buf[0][2 * i + 1][j] = -1.0f;
      uint64_t seq = 0;
      ck_assert_int_eq(graphd_replay_async(c, s, pid, bd[0], 2 * WIDE_K, &seq), GRAPHD_OK);
      ck_assert_int_eq(graphd_stream_wait(s, seq, -1), GRAPHD_OK);
      for (uint32_t i = 0; i < WIDE_K; i++)
        for (uint32_t j = 0; j < WIDE_N; j++)
          ck_assert_float_eq(buf[0][2 * i + 1][j], (float)(i + 1) * buf[0][2 * i][j]);
      replays++;
    }
    graphd_async_info info;
    ck_assert_int_eq(graphd_replay_collect(c, &info), GRAPHD_OK);
    /* Through the ring, one completion an entry (its other slots'
     * completions are not counted); or none, the synchronous way. */
    ck_assert_uint_eq(info.completed, small ? 0 : (uint64_t)replays);
    ck_assert_uint_eq(info.failed, 0);
    ck_assert_uint_eq(info.queued, 0);
    graphd_stream_detach(s);
    graphd_close(c);
  }
}
END_TEST

/* Publishes, by hand in k's ring, an entry of `nbindings` bindings at the
 * next seq of k's stream, as libgraphd publishes one on a host device
 * (ready first), with `published` of its slots (the continuation slots
 * zeroed); returns its seq. */
static uint64_t publish_entry(client *k, uint32_t nbindings, uint32_t published,
                              const graphd_ring_binding *b);

static uint64_t publish_by_hand(client *k, uint32_t nbindings, uint32_t published) {
  return publish_entry(k, nbindings, published, NULL);
}

/* publish_by_hand, with the entry's own bindings from b (NULL: none set). */
static uint64_t publish_entry(client *k, uint32_t nbindings, uint32_t published,
                              const graphd_ring_binding *b) {
  gd_ring *r = k->c->ring;
  gd_flag_page *f = k->c->flags;
  ck_assert_ptr_nonnull(r);
  uint32_t slot = k->s->slot;
  uint64_t seq = k->s->seq + 1;
  graphd_ring_sqe e;
  memset(&e, 0, sizeof e);
  e.seq = seq;
  e.program = 0; /* the program of the replay that opened the ring */
  e.stream_slot = slot;
  e.nbindings = nbindings;
  for (uint32_t i = 0; b && i < nbindings && i < GRAPHD_RING_MAX_BINDINGS; i++)
    e.bindings[i] = b[i];
  for (uint32_t i = 1; i < published; i++)
    memset((void *)&r->sq[(r->tail + i) & (r->entries - 1)], 0, sizeof(graphd_ring_cont));
  memcpy((void *)&r->sq[r->tail & (r->entries - 1)], &e, sizeof e);
  __atomic_store_n(gd_flag_word(f, slot, GRAPHD_FLAG_WORD_READY), seq, __ATOMIC_RELEASE);
  atomic_store(&f->issued[slot], seq);
  k->s->seq = seq;
  r->tail += published;
  __atomic_store_n(&r->hdr->sq_tail, r->tail, __ATOMIC_SEQ_CST);
  /* What graphd_stream_wait needs to wait for its completion too. */
  k->s->ring_seq = seq;
  k->s->ring_tail = r->tail;
  k->s->ring_gen = r->gen;
  __atomic_store_n(gd_flag_word(f, slot, GRAPHD_FLAG_WORD_PASSED), seq, __ATOMIC_RELEASE);
  uint64_t one = 1;
  ck_assert_int_eq(write(r->doorbell, &one, sizeof one), (int)sizeof one);
  return seq;
}

/* An entry claiming more bindings than one may carry, its slots all
 * published, is refused: the next call reports it and the stream goes on.
 * One whose slots were not all published stops the worker reading that
 * ring (its session only): the daemon serves everyone else. */
START_TEST(test_async_long_entries_written_by_hand_are_refused) {
  client k;
  client_open(&k, 256, 11);
  ck_assert_int_eq(issue(&k, 0, false, true), GRAPHD_OK);
  check_pair(&k, 0);
  /* 5000 bindings: 239 slots, all published; over 4096. */
  uint64_t seq = publish_by_hand(&k, 5000, GRAPHD_RING_ENTRY_SLOTS(5000));
  ck_assert_int_eq(graphd_stream_wait(k.s, seq, 5000), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(k.c), "at most 4096"), "%s", graphd_last_error(k.c));
  /* The ring reads on: the next replays are exact. */
  for (int i = 0; i < 20; i++) ck_assert_int_eq(issue(&k, i % PAIRS, false, false), GRAPHD_OK);
  for (int i = 0; i < PAIRS; i++) check_pair(&k, i);

  /* 1000 bindings (48 slots), one slot published. */
  publish_by_hand(&k, 1000, 1);
  for (int i = 0; i < 200 && !td_log_contains(&d, "is not read any more"); i++) usleep(10000);
  ck_assert_msg(td_log_contains(&d, "needs 48 slots, but 1 are published"), "no warning");
  /* Another client's replays, sync and async, are exact. */
  client o;
  client_open(&o, 8, 12);
  for (int i = 0; i < 100; i++)
    ck_assert_int_eq(issue(&o, i % PAIRS, i % 3 == 0, i == 0), GRAPHD_OK);
  for (int i = 0; i < PAIRS; i++) check_pair(&o, i);
  client_close(&o);
  client_close(&k);
}
END_TEST

/* A replay's seq must be above the highest the worker took on its flag
 * slot, whichever way each came: a sync Replay behind a ring entry of a
 * higher seq on the same slot is refused before it runs, and the slot's
 * done word does not go back. */
START_TEST(test_async_a_sync_replay_below_a_ring_entrys_seq_is_refused) {
  client k;
  client_open(&k, 8, 13);
  ck_assert_int_eq(issue(&k, 0, false, true), GRAPHD_OK);
  check_pair(&k, 0);
  uint64_t base = k.s->seq;
  k.s->seq = base + 9;
  /* No bindings: refused once its seq is taken, with done = seq written. */
  uint64_t high = publish_by_hand(&k, 0, 1);
  ck_assert_int_eq(graphd_stream_wait(k.s, high, 5000), GRAPHD_INVALID_ARGUMENT);
  volatile uint64_t *done = gd_flag_word(k.c->flags, k.s->slot, GRAPHD_FLAG_WORD_DONE);
  ck_assert_uint_eq(__atomic_load_n(done, __ATOMIC_ACQUIRE), high);
  /* The next sync Replay takes base + 1. */
  k.s->seq = base;
  ck_assert_int_eq(issue(&k, 1, true, false), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(k.c), "must be above the last one"), "%s",
                graphd_last_error(k.c));
  ck_assert_uint_eq(__atomic_load_n(done, __ATOMIC_ACQUIRE), high);
  for (uint32_t j = 0; j < N; j++) /* it did not run */
    ck_assert_uint_eq(((uint32_t *)k.y[1])[j], 0xffffffffu);
  /* Nor does one more than GRAPHD_SEQ_MAX_STEP above it, or 2^63 above
   * (behind it, for the GPU's cyclic compare). */
  k.s->seq = high + GRAPHD_SEQ_MAX_STEP;
  ck_assert_int_eq(issue(&k, 1, true, false), GRAPHD_INVALID_ARGUMENT);
  k.s->seq = high + (1ull << 63) - 1;
  ck_assert_int_eq(issue(&k, 1, true, false), GRAPHD_INVALID_ARGUMENT);
  ck_assert_uint_eq(__atomic_load_n(done, __ATOMIC_ACQUIRE), high);
  /* Past it, both ways are exact. */
  k.s->seq = high;
  for (int i = 0; i < 12; i++) ck_assert_int_eq(issue(&k, i % PAIRS, i % 2 == 0, false), GRAPHD_OK);
  for (int i = 0; i < PAIRS; i++) check_pair(&k, i);
  client_close(&k);
}
END_TEST

/* The worker keeps the last few replays' bindings as resolved, to take
 * them as they are when a later one names the same: a region let go in
 * between is not among them any more. Entries written by hand name the
 * same region ids each time, with another pair's replay between them (so
 * that theirs is not the latest kept): run twice, exact; once the
 * output's region is unregistered, the same entry is refused NOT_FOUND
 * and writes nothing. */
START_TEST(test_async_same_bindings_after_their_region_went_are_refused) {
  client k;
  client_open(&k, 8, 14);
  ck_assert_int_eq(issue(&k, 0, false, true), GRAPHD_OK);
  check_pair(&k, 0);
  graphd_region_ref rx, ry;
  ck_assert_int_eq(graphd_region_register(k.c, (uint64_t)(uintptr_t)k.x[0], N * 4, &rx), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(k.c, (uint64_t)(uintptr_t)k.y[0], N * 4, &ry), GRAPHD_OK);
  graphd_ring_binding b[2] = {
      {.slot = 0, .region_id = rx.region_id, .offset = rx.offset, .bytes = N * 4},
      {.slot = 3, .region_id = ry.region_id, .offset = ry.offset, .bytes = N * 4}};
  for (int round = 0; round < 3; round++) {
    for (uint32_t j = 0; j < N; j++) {
      k.x[0][j] = (float)(round * 7 + (int)j % 13);
      k.want[0][j] = (2.0f * k.x[0][j] + (float)j * 0.5f) * 2.0f + 1.0f;
    }
    memset(k.y[0], 0xff, N * 4);
    if (round == 2) {
      ck_assert_int_eq(graphd_region_unregister(k.c, ry.region_id), GRAPHD_OK);
      /* The reply comes before the worker lets the region go: a list of
       * captures that reached the worker comes after. */
      for (int tries = 0;; tries++) {
        graphd_capture_info *caps;
        size_t ncaps;
        uint32_t busy;
        ck_assert_int_eq(graphd_list_captures(k.c, &caps, &ncaps), GRAPHD_OK);
        free(caps);
        if (!graphd_busy_devices(k.c, &busy, 1)) break;
        ck_assert_int_lt(tries, 100);
      }
    }
    ck_assert_int_eq(issue(&k, 1, false, round == 0), GRAPHD_OK);
    uint64_t seq = publish_entry(&k, 2, 1, b);
    graphd_status st = graphd_stream_wait(k.s, seq, 5000);
    if (round < 2) {
      ck_assert_msg(st == GRAPHD_OK, "round %d: %s", round, graphd_last_error(k.c));
      for (uint32_t j = 0; j < N; j++) ck_assert_float_eq(k.y[0][j], k.want[0][j]);
    } else {
      ck_assert_int_eq(st, GRAPHD_NOT_FOUND);
      ck_assert_msg(strstr(graphd_last_error(k.c), "which this session does not have"), "%s",
                    graphd_last_error(k.c));
      for (uint32_t j = 0; j < N; j++) ck_assert_uint_eq(((uint32_t *)k.y[0])[j], 0xffffffffu);
    }
  }
  /* The pair's memory registers again, and replays are exact. */
  for (int i = 0; i < 8; i++) ck_assert_int_eq(issue(&k, i % PAIRS, i % 2 == 0, false), GRAPHD_OK);
  for (int i = 0; i < PAIRS; i++) check_pair(&k, i);
  client_close(&k);
}
END_TEST

/* Two programs replayed in turn, each over two sets of buffers in turn (a
 * period of four, as a scan step of two calls over a carry of two
 * buffers): the worker takes each replay's bindings from what it keeps of
 * the last few, and each output is that program's of its own inputs. */
#define TURN_K1 3u
#define TURN_K2 5u
START_TEST(test_async_programs_and_buffers_in_turn_are_exact) {
  graphd_client *c = td_data(&d, 0);
  uint8_t mod[32], pid[2][32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  const uint32_t ks[2] = {TURN_K1, TURN_K2};
  for (int p = 0; p < 2; p++)
    ck_assert_int_eq(wide_program_register(c, mod, GRAPHD_MODE_DIRECT, ks[p], WIDE_N, pid[p]),
                     GRAPHD_OK);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  float *buf[2][2][2 * TURN_K2]; /* [program][set][slot] */
  graphd_binding bd[2][2][2 * TURN_K2];
  for (int p = 0; p < 2; p++)
    for (int set = 0; set < 2; set++)
      for (uint32_t j = 0; j < 2 * ks[p]; j++) {
        ck_assert_int_eq(graphd_host_alloc(c, WIDE_N * 4, (void **)&buf[p][set][j]), GRAPHD_OK);
        bd[p][set][j] = (graphd_binding){
            .slot = j, .ptr = (uint64_t)(uintptr_t)buf[p][set][j], .bytes = WIDE_N * 4};
      }
  unsigned rng = 11;
  for (int r = 0; r < 200; r++) {
    int p = r % 2, set = (r / 2) % 2;
    for (uint32_t i = 0; i < ks[p]; i++)
      for (uint32_t j = 0; j < WIDE_N; j++) {
        buf[p][set][2 * i][j] = (float)(rand_r(&rng) % 1000);
        buf[p][set][2 * i + 1][j] = -1.0f;
      }
    uint64_t seq = 0;
    graphd_status st = graphd_replay_async(c, s, pid[p], bd[p][set], 2 * ks[p], &seq);
    ck_assert_msg(st == GRAPHD_OK, "replay %d: %s", r, graphd_last_error(c));
    ck_assert_int_eq(graphd_stream_wait(s, seq, -1), GRAPHD_OK);
    for (uint32_t i = 0; i < ks[p]; i++)
      for (uint32_t j = 0; j < WIDE_N; j++)
        if (buf[p][set][2 * i + 1][j] != (float)(i + 1) * buf[p][set][2 * i][j])
          ck_abort_msg("replay %d (program %d, set %d): y_%u[%u] = %g, want %g", r, p, set, i, j,
                       (double)buf[p][set][2 * i + 1][j],
                       (double)((float)(i + 1) * buf[p][set][2 * i][j]));
  }
  /* A third program of the first one's slots at twice the size: the same
   * bindings, just resolved for the first, are checked for it afresh and
   * refused. */
  uint8_t big[32];
  ck_assert_int_eq(wide_program_register(c, mod, GRAPHD_MODE_DIRECT, TURN_K1, 2 * WIDE_N, big),
                   GRAPHD_OK);
  uint64_t seq = 0;
  ck_assert_int_eq(graphd_replay_async(c, s, pid[0], bd[0][0], 2 * TURN_K1, &seq), GRAPHD_OK);
  ck_assert_int_eq(graphd_stream_wait(s, seq, -1), GRAPHD_OK);
  graphd_status st = graphd_replay_async(c, s, big, bd[0][0], 2 * TURN_K1, &seq);
  if (st == GRAPHD_OK) st = graphd_stream_wait(s, seq, -1);
  ck_assert_int_eq(st, GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c), "but its binding covers"), "%s", graphd_last_error(c));
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

/* CPU time (user + system, in clock ticks) of the daemon's thread named
 * `name`; fails the test when there is none. */
static long thread_cpu_ticks(pid_t pid, const char *name) {
  char path[128], buf[512];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *dir = opendir(path);
  ck_assert_ptr_nonnull(dir);
  long ticks = -1;
  for (struct dirent *e; ticks < 0 && (e = readdir(dir));) {
    int tid = atoi(e->d_name);
    if (tid <= 0) continue;
    snprintf(path, sizeof path, "/proc/%d/task/%d/comm", (int)pid, tid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    bool match = fgets(buf, sizeof buf, f) && strcspn(buf, "\n") == strlen(name) &&
                 strncmp(buf, name, strlen(name)) == 0;
    fclose(f);
    if (!match) continue;
    snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)pid, tid);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(buf, sizeof buf, f));
    fclose(f);
    /* utime and stime are fields 14 and 15, after the ") " that ends comm. */
    char *p = strrchr(buf, ')');
    ck_assert_ptr_nonnull(p);
    unsigned long ut = 0, st = 0;
    ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st),
                     2);
    ticks = (long)(ut + st);
  }
  closedir(dir);
  ck_assert_msg(ticks >= 0, "the daemon has no thread named %s", name);
  return ticks;
}

/* Replays on v, sync and async, all checked: a wedged worker answers
 * neither (the sync call times out, the wait reports it). */
static void victim_is_served(client *v, bool first) {
  for (int i = 0; i < 40; i++)
    ck_assert_int_eq(issue(v, i % PAIRS, i % 4 == 0, first && i == 0), GRAPHD_OK);
  for (int i = 0; i < PAIRS; i++) check_pair(v, i);
}

/* A client's doorbell is its own eventfd, shared with graphd: one that the
 * client registers in two sessions and makes blocking after graphd took
 * it, then rings, does not block the device's worker; a pipe, a socket or
 * a memfd in its place is refused. Another client's sync and async
 * replays stay exact and answered. */
START_TEST(test_async_a_doorbell_the_client_made_blocking_does_not_wedge_the_worker) {
  client v;
  client_open(&v, 8, 21);
  victim_is_served(&v, true);
  uint32_t code;
  char msg[256];
  int pipefd[2], sp[2];
  ck_assert_int_eq(pipe(pipefd), 0);
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
  int memfd = gd_memfd_new_shared("not-a-doorbell", 4096);
  int bad[3] = {pipefd[0], sp[0], memfd};
  for (int i = 0; i < 3; i++) {
    int fd = td_raw_ring_session(&d, 0, bad[i], &code, msg, sizeof msg);
    ck_assert_int_eq(code, GRAPHD_INVALID_ARGUMENT);
    ck_assert_msg(strstr(msg, "doorbell must be an eventfd"), "%s", msg);
    close(fd);
  }
  int s[2];
  int bell = td_raw_wedge_attempt(&d, 0, s);
  usleep(100000);
  victim_is_served(&v, false);
  close(s[0]);
  close(s[1]);
  close(bell);
  close(pipefd[0]);
  close(pipefd[1]);
  close(sp[0]);
  close(sp[1]);
  close(memfd);
  client_close(&v);
}
END_TEST

/* Sends a request carrying fd on the raw data session s (RegisterFlags,
 * RegisterRegion of a host memfd, or RegisterRing with fd as the ring and
 * a fresh eventfd as its doorbell) and returns the reply's code. */
static uint32_t send_with_fd(int s, int what, int fd, char *msg, size_t msglen) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterFlags rf = GRAPHD__WIRE__REGISTER_FLAGS__INIT;
  Graphd__Wire__RegisterRegion rg = GRAPHD__WIRE__REGISTER_REGION__INIT;
  Graphd__Wire__RegisterRing rr = GRAPHD__WIRE__REGISTER_RING__INIT;
  int fds[2] = {fd, eventfd(0, EFD_NONBLOCK)};
  req.request_id = 40;
  req.nfds = what == 2 ? 2 : 1;
  if (what == 0) {
    req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_FLAGS;
    req.register_flags = &rf;
    rf.slots = 64;
  } else if (what == 1) {
    req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_REGION;
    req.register_region = &rg;
    rg.kind = GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD;
    rg.size = 4096;
  } else {
    req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_RING;
    req.register_ring = &rr;
    rr.entries = 8;
  }
  td_raw_send_request(s, &req, fds, (int)req.nfds);
  close(fds[1]);
  Graphd__Wire__Reply *r = td_raw_recv(s, 5000);
  ck_assert_ptr_nonnull(r);
  uint32_t code = r->code;
  snprintf(msg, msglen, "%s", r->message ? r->message : "");
  graphd__wire__reply__free_unpacked(r, NULL);
  return code;
}

/* Every kind of fd a client can send where graphd wants a memfd (the flag
 * page, a host region, the ring) or an eventfd (the doorbell): a pipe, a
 * socket, an eventfd, /dev/null, a FIFO, a regular file, an unsealed
 * memfd. Each is refused with a reason, nothing of it is read, and
 * afterwards another client is served and the device's worker sleeps. */
START_TEST(test_async_every_kind_of_fd_a_client_sends_is_refused_and_never_read) {
  client v;
  client_open(&v, 8, 23);
  victim_is_served(&v, true);
  char dir[] = "/tmp/graphd-fds-XXXXXX", path[64], msg[256];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/fifo", dir);
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  int fifo = open(path, O_RDWR | O_NONBLOCK);
  snprintf(path, sizeof path, "%s/file", dir);
  int file = open(path, O_RDWR | O_CREAT, 0600);
  ck_assert_int_eq(ftruncate(file, 1 << 20), 0);
  int pipefd[2], sp[2];
  ck_assert_int_eq(pipe(pipefd), 0);
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
  int kinds[] = {pipefd[0], sp[0], eventfd(0, EFD_SEMAPHORE),  open("/dev/null", O_RDWR),
                 fifo,      file,  memfd_create("unsealed", 0)};
  const char *names[] = {"pipe", "socket", "eventfd",       "/dev/null",
                         "fifo", "file",   "unsealed memfd"};
  ck_assert_int_ge(kinds[6], 0);
  ck_assert_int_eq(ftruncate(kinds[6], 1 << 20), 0);
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    ck_assert_int_ge(kinds[k], 0);
    uint32_t code;
    /* As the doorbell (an eventfd is a doorbell: accepted). */
    int s = td_raw_ring_session(&d, 0, kinds[k], &code, msg, sizeof msg);
    ck_assert_msg(k == 2 ? code == GRAPHD_OK : code == GRAPHD_INVALID_ARGUMENT, "%s doorbell: %s",
                  names[k], msg);
    close(s);
    /* As the flag page, a host region and the ring, on a session of its own. */
    for (int what = 0; what < 3; what++) {
      graphd_client *ctl = td_control(&d);
      s = td_raw_connect(&d);
      td_raw_data_hello(ctl, s, 0);
      graphd_close(ctl);
      if (what > 0) {
        int flags = gd_memfd_new_shared("flags", 4096);
        td_expect_reply(td_raw_register_flags(s, 2, flags, 64), GRAPHD_OK, NULL);
        close(flags);
      }
      code = send_with_fd(s, what, kinds[k], msg, sizeof msg);
      ck_assert_msg(code == GRAPHD_INVALID_ARGUMENT, "%s as %s: %s (%s)", names[k],
                    what == 0   ? "flags"
                    : what == 1 ? "region"
                                : "ring",
                    graphd_status_name(code), msg);
      ck_assert_msg(msg[0], "%s refused with no reason", names[k]);
      close(s);
    }
  }
  victim_is_served(&v, false);
  long t0 = thread_cpu_ticks(d.pid, "host0");
  usleep(500000);
  long used = thread_cpu_ticks(d.pid, "host0") - t0;
  long hz = sysconf(_SC_CLK_TCK);
  ck_assert_msg(used * 5 < hz / 2, "the idle worker used %ld of %ld ticks in 0.5 s", used, hz / 2);
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) close(kinds[k]);
  close(pipefd[1]);
  close(sp[1]);
  snprintf(path, sizeof path, "%s/fifo", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/file", dir);
  unlink(path);
  rmdir(dir);
  client_close(&v);
}
END_TEST

/* A semaphore-mode eventfd holding 2^40 as a doorbell: the worker is woken
 * once, not once per unit counted, so it sleeps while nothing is queued,
 * and another client is served. */
START_TEST(test_async_a_semaphore_doorbell_does_not_keep_the_worker_busy) {
  client v;
  client_open(&v, 8, 22);
  victim_is_served(&v, true);
  uint32_t code;
  char msg[256];
  int sem = eventfd(0, EFD_NONBLOCK | EFD_SEMAPHORE);
  ck_assert_int_ge(sem, 0);
  int s3 = td_raw_ring_session(&d, 0, sem, &code, msg, sizeof msg);
  ck_assert_msg(code == GRAPHD_OK, "%s", msg);
  uint64_t lots = 1ull << 40;
  ck_assert_int_eq(write(sem, &lots, sizeof lots), (int)sizeof lots);
  usleep(100000);
  long t0 = thread_cpu_ticks(d.pid, "host0");
  usleep(500000);
  long used = thread_cpu_ticks(d.pid, "host0") - t0;
  long hz = sysconf(_SC_CLK_TCK);
  ck_assert_msg(used * 5 < hz / 2, "the idle worker used %ld of %ld ticks in 0.5 s", used, hz / 2);
  victim_is_served(&v, false);
  close(s3);
  close(sem);
  client_close(&v);
}
END_TEST

/* --idle-timeout closes sessions that send nothing, never one whose
 * client keeps its ring busy: a program that replays through the ring
 * for longer than the timeout, sending no request, keeps its session,
 * its regions and its stream, and every replay is exact. */
START_TEST(test_async_a_session_busy_on_its_ring_is_not_idle) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_start_again(&d, "--host-devices", "1", "--idle-timeout", "0.5", NULL);
  client k;
  client_open(&k, 8, 9);
  uint64_t id = graphd_session_id(k.c);
  double t0 = td_now_s();
  int i = 0;
  for (; td_now_s() - t0 < 1.5; i++) {
    graphd_status st = issue(&k, i % PAIRS, false, i == 0);
    ck_assert_msg(st == GRAPHD_OK, "replay %d: %s", i, graphd_last_error(k.c));
  }
  for (int j = 0; j < PAIRS; j++) check_pair(&k, j);
  ck_assert_uint_eq(graphd_session_id(k.c), id);
  ck_assert_msg(!td_log_contains(&d, "(--idle-timeout); closing"),
                "a session replaying through its ring was closed as idle");
  graphd_async_info info;
  ck_assert_int_eq(graphd_replay_collect(k.c, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.failed, 0);
  ck_assert_uint_eq(info.completed, (uint64_t)i);
  /* Once it stops, it is idle like any other, and closed. */
  usleep(2600 * 1000);
  ck_assert(td_log_contains(&d, "(--idle-timeout); closing"));
  client_close(&k);
}
END_TEST

START_TEST(test_async_ring_size_is_checked) {
  graphd_client *c = td_data(&d, 0);
  ck_assert_int_eq(graphd_set_ring_entries(c, 3), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c), "power of two"), "%s", graphd_last_error(c));
  ck_assert_int_eq(graphd_set_ring_entries(c, 8192), GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(graphd_set_ring_entries(c, 2), GRAPHD_OK);
  graphd_close(c);
}
END_TEST

int main(void) {
  Suite *su = suite_create("async");
  TCase *tc = tcase_create("async");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_async_thousands_of_replays_wrap_a_small_ring_exactly);
  tcase_add_test(tc, test_async_a_session_busy_on_its_ring_is_not_idle);
  tcase_add_test(tc, test_async_and_sync_replays_on_one_stream_keep_their_order);
  tcase_add_test(tc, test_async_error_comes_back_on_the_next_call_and_releases_the_stream);
  tcase_add_test(tc, test_async_full_ring_blocks_the_call_until_the_worker_takes_an_entry);
  tcase_add_test(tc, test_async_killed_client_with_entries_queued_leaves_nothing_behind);
  tcase_add_test(tc, test_async_daemon_killed_with_entries_queued_releases_the_stream);
  tcase_add_test(tc, test_async_many_clients_at_once_are_exact);
  tcase_add_test(tc, test_async_handles_of_one_process_run_in_the_order_they_were_queued);
  tcase_add_test(tc, test_async_rings_of_two_processes_are_taken_in_turn);
  tcase_add_test(tc, test_async_entries_of_many_bindings_take_several_slots);
  tcase_add_test(tc, test_async_long_entries_written_by_hand_are_refused);
  tcase_add_test(tc, test_async_a_sync_replay_below_a_ring_entrys_seq_is_refused);
  tcase_add_test(tc, test_async_same_bindings_after_their_region_went_are_refused);
  tcase_add_test(tc, test_async_programs_and_buffers_in_turn_are_exact);
  tcase_add_test(tc, test_async_ring_size_is_checked);
  tcase_add_test(tc, test_async_a_doorbell_the_client_made_blocking_does_not_wedge_the_worker);
  tcase_add_test(tc, test_async_a_semaphore_doorbell_does_not_keep_the_worker_busy);
  tcase_add_test(tc, test_async_every_kind_of_fd_a_client_sends_is_refused_and_never_read);
  suite_add_tcase(su, tc);
  return td_run_suite(su);
}
