/* Listing and evicting captures on the host backend: what list shows,
 * dry runs, re-capture after eviction, the privilege rule, eviction during
 * concurrent replays, and graphctl list/evict; and device isolation: a
 * fault on one device resets that device alone. */
#define _GNU_SOURCE
#include <check.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "program3.h"

#define N 1024u

static gd_test_daemon d;
static uint8_t *plugin;
static size_t plugin_len;

static void setup(void) {
  td_start(&d, "--host-devices", "2", "--socket-mode", "0666", NULL);
  ck_assert_int_eq(chmod(d.dir, 0755), 0); /* for the unprivileged child */
  plugin = td_read_file(HOST_KERNELS_SO, &plugin_len);
}

static bool daemon_exited; /* a test saw the daemon exit, as it should have */

static void teardown(void) {
  free(plugin);
  if (!daemon_exited) ck_assert_int_eq(td_stop(&d), 0);
  daemon_exited = false;
  td_cleanup(&d);
}

typedef struct client {
  graphd_client *c;
  graphd_stream *s;
  uint8_t pid[32];
  float *x, *cc, *y;
} client;

static graphd_status client_open(client *k, int dev) {
  k->c = td_data(&d, dev);
  uint8_t mod[32];
  graphd_status st = graphd_register_module(k->c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod);
  if (st == GRAPHD_OK) st = program3_register(k->c, mod, GRAPHD_MODE_STAGED, N, k->pid);
  if (st == GRAPHD_OK) st = graphd_stream_attach(k->c, NULL, &k->s);
  if (st == GRAPHD_OK) st = graphd_host_alloc(k->c, N * 4, (void **)&k->x);
  if (st == GRAPHD_OK) st = graphd_host_alloc(k->c, N * 4, (void **)&k->cc);
  if (st == GRAPHD_OK) st = graphd_host_alloc(k->c, N * 4, (void **)&k->y);
  return st;
}

static void client_close(client *k) {
  graphd_stream_detach(k->s);
  graphd_close(k->c);
}

/* One replay with c always bound (any replay may be the one that
 * captures again), checked. Returns the status; 99 on a wrong result. */
static int replay_checked(client *k, unsigned seed, int *captured) {
  for (uint32_t i = 0; i < N; i++) {
    k->x[i] = (float)((seed * 31 + i) % 1000);
    k->cc[i] = (float)(i % 7);
  }
  graphd_binding b[3] = {{0, (uint64_t)(uintptr_t)k->x, N * 4},
                         {3, (uint64_t)(uintptr_t)k->y, N * 4},
                         {1, (uint64_t)(uintptr_t)k->cc, N * 4}};
  graphd_replay_info info;
  graphd_status st = graphd_replay(k->c, k->s, k->pid, b, 3, &info);
  if (st != GRAPHD_OK) return st;
  if (captured) *captured = info.captured;
  for (uint32_t i = 0; i < N; i++)
    if (k->y[i] != (2.0f * k->x[i] + k->cc[i]) * 2.0f + 1.0f) return 99;
  return 0;
}

static graphd_device_counters counters(graphd_client *c, int dev) {
  return td_device_info(c, dev).counters;
}

START_TEST(test_evict_list_dry_run_evict_and_recapture) {
  client k;
  ck_assert_int_eq(client_open(&k, 0), GRAPHD_OK);
  int cap = 0;
  for (unsigned i = 0; i < 5; i++) ck_assert_int_eq(replay_checked(&k, i, &cap), 0);
  graphd_capture_info *ci;
  size_t n;
  ck_assert_int_eq(graphd_list_captures(k.c, &ci, &n), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_mem_eq(ci[0].program_id, k.pid, 32);
  ck_assert_uint_eq(ci[0].device, 0);
  ck_assert_uint_eq(ci[0].mode, GRAPHD_MODE_STAGED);
  ck_assert_uint_eq(ci[0].nodes, 5); /* copy-in x, 3 kernels, copy-out y */
  ck_assert_uint_eq(ci[0].replays, 5);
  ck_assert_uint_eq(ci[0].npids, 1);
  ck_assert_uint_eq(ci[0].pids[0], (uint32_t)getpid());
  ck_assert_uint_eq(ci[0].generation, 1);
  ck_assert_uint_eq(ci[0].graphs, 1);   /* one binding set so far */
  ck_assert_uint_eq(ci[0].repoints, 0); /* ... so nothing re-pointed */
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  uint64_t now_ms = (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
  ck_assert_uint_le(ci[0].created_unix_ms, now_ms);
  ck_assert_uint_gt(ci[0].created_unix_ms, now_ms - 60000u);
  uint64_t created = ci[0].created_unix_ms;
  uint64_t staging = ci[0].staging_bytes;
  ck_assert_uint_gt(staging, 0);
  ck_assert_uint_eq(staging, counters(k.c, 0).staging_bytes);
  free(ci);

  char hex[65];
  graphd_id_hex(k.pid, hex);
  hex[12] = 0;
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.program = hex;
  o.dry_run = 1;
  uint64_t bytes;
  ck_assert_int_eq(graphd_evict(k.c, &o, &ci, &n, &bytes), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(bytes, staging);
  free(ci);
  graphd_device_counters c0 = counters(k.c, 0);
  ck_assert_uint_eq(c0.captures, 1); /* the dry run changed nothing */
  ck_assert_uint_eq(c0.evictions, 0);

  o.dry_run = 0;
  ck_assert_int_eq(graphd_evict(k.c, &o, NULL, &n, &bytes), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(bytes, staging);
  c0 = counters(k.c, 0);
  ck_assert_uint_eq(c0.captures, 0);
  ck_assert_uint_eq(c0.staging_bytes, 0);
  ck_assert_uint_eq(c0.evictions, 1);
  ck_assert_int_eq(graphd_list_captures(k.c, &ci, &n), GRAPHD_OK);
  ck_assert_uint_eq(n, 0);
  /* The next replay captures again, transparently, with right results. */
  ck_assert_int_eq(replay_checked(&k, 9, &cap), 0);
  ck_assert_int_eq(cap, 1);
  c0 = counters(k.c, 0);
  ck_assert_uint_eq(c0.captures, 1);
  ck_assert_uint_eq(c0.recaptures, 1);
  ck_assert_uint_eq(c0.captures_built, 2);
  /* The new capture says it is the second, and when it was made. */
  ck_assert_int_eq(graphd_list_captures(k.c, &ci, &n), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(ci[0].generation, 2);
  ck_assert_uint_ge(ci[0].created_unix_ms, created);
  free(ci);
  /* Another output buffer: the copy-out node is re-pointed, and the list
   * says so. */
  float *y0 = k.y;
  ck_assert_int_eq(graphd_host_alloc(k.c, N * 4, (void **)&k.y), GRAPHD_OK);
  ck_assert_int_eq(replay_checked(&k, 10, &cap), 0);
  k.y = y0;
  ck_assert_int_eq(graphd_list_captures(k.c, &ci, &n), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_ge(ci[0].repoints, 1);
  ck_assert_uint_ge(ci[0].graphs, 1);
  free(ci);
  /* Nothing matches: nothing goes. */
  o.program = "ffffffffffff";
  ck_assert_int_eq(graphd_evict(k.c, &o, NULL, &n, &bytes), GRAPHD_OK);
  ck_assert_uint_eq(n, 0);
  client_close(&k);
}
END_TEST

START_TEST(test_evict_selectors_are_checked) {
  graphd_client *c = td_control(&d);
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  ck_assert_int_eq(graphd_evict(c, &o, NULL, NULL, NULL), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c), "say what to evict"), "%s", graphd_last_error(c));
  o.program = "abc";
  ck_assert_int_eq(graphd_evict(c, &o, NULL, NULL, NULL), GRAPHD_INVALID_ARGUMENT);
  o.program = "zzzzzzzz";
  ck_assert_int_eq(graphd_evict(c, &o, NULL, NULL, NULL), GRAPHD_INVALID_ARGUMENT);
  graphd_evict_options_init(&o);
  o.device = 7;
  ck_assert_int_eq(graphd_evict(c, &o, NULL, NULL, NULL), GRAPHD_NOT_FOUND);
  graphd_evict_options_init(&o);
  o.session = 999;
  ck_assert_int_eq(graphd_evict(c, &o, NULL, NULL, NULL), GRAPHD_INVALID_ARGUMENT);
  graphd_close(c);
}
END_TEST

START_TEST(test_evict_by_device_leaves_the_other_device_alone) {
  client a, b;
  ck_assert_int_eq(client_open(&a, 0), GRAPHD_OK);
  ck_assert_int_eq(client_open(&b, 1), GRAPHD_OK);
  ck_assert_int_eq(replay_checked(&a, 1, NULL), 0);
  ck_assert_int_eq(replay_checked(&b, 2, NULL), 0);
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.device = 1;
  size_t n;
  ck_assert_int_eq(graphd_evict(a.c, &o, NULL, &n, NULL), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(counters(a.c, 0).captures, 1);
  ck_assert_uint_eq(counters(a.c, 1).captures, 0);
  int cap = 0;
  ck_assert_int_eq(replay_checked(&a, 3, &cap), 0);
  ck_assert_int_eq(cap, 0); /* device 0's capture was untouched */
  client_close(&a);
  client_close(&b);
}
END_TEST

/* A program whose one launch faults the host device (host_kernels.c:
 * fault): kind 1 is cleared by the reset, kind 2 is not. */
static graphd_status fault_program(graphd_client *c, uint32_t kind, uint8_t pid[32]) {
  uint8_t mod[32];
  graphd_status st = graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod);
  if (st != GRAPHD_OK) return st;
  return fault_program_register(c, mod, GRAPHD_SLOT_INPUT, 16, 1, kind, pid);
}

/* Runs a faulting program (kind as in fault_program) on k's device. */
static void fault_device(client *k, uint32_t kind) {
  uint8_t fp[32];
  ck_assert_int_eq(fault_program(k->c, kind, fp), GRAPHD_OK);
  graphd_binding fb = {0, (uint64_t)(uintptr_t)k->x, 16};
  graphd_status st = graphd_replay(k->c, k->s, fp, &fb, 1, NULL);
  /* The host runs the graph inside the call: the fault shows after it. */
  ck_assert_msg(st == GRAPHD_OK || st == GRAPHD_UNAVAILABLE, "%s", graphd_status_name(st));
}

START_TEST(test_fault_on_one_device_resets_it_alone) {
  client a, b, c;
  ck_assert_int_eq(client_open(&a, 0), GRAPHD_OK);
  ck_assert_int_eq(client_open(&b, 1), GRAPHD_OK);
  ck_assert_int_eq(replay_checked(&a, 1, NULL), 0);
  ck_assert_int_eq(replay_checked(&b, 2, NULL), 0);
  fault_device(&b, 1);
  graphd_device_info d1 = td_device_info(a.c, 1);
  for (int i = 0; i < 500 && d1.epoch == 0; i++) {
    usleep(10000);
    d1 = td_device_info(a.c, 1);
  }
  ck_assert_uint_eq(d1.epoch, 1);
  ck_assert_str_eq(d1.state, "ok");
  ck_assert_uint_eq(d1.counters.captures, 0); /* dropped with the old context */
  ck_assert_uint_eq(d1.counters.staging_bytes, 0);
  ck_assert_uint_ge(d1.counters.errors, 1);
  /* The faulted device's session was closed: the client must reconnect. */
  ck_assert_int_eq(replay_checked(&b, 3, NULL), GRAPHD_UNAVAILABLE);
  /* Device 0 never noticed: same epoch, same capture, no re-capture. */
  graphd_device_info d0 = td_device_info(a.c, 0);
  ck_assert_uint_eq(d0.epoch, 0);
  ck_assert_uint_eq(d0.counters.captures, 1);
  ck_assert_uint_eq(d0.counters.errors, 0);
  for (unsigned i = 0; i < 20; i++) {
    int cap = 1;
    ck_assert_int_eq(replay_checked(&a, 10 + i, &cap), 0);
    ck_assert_int_eq(cap, 0);
  }
  /* A new session on the reset device works, on a fresh capture. */
  ck_assert_int_eq(client_open(&c, 1), GRAPHD_OK);
  int cap = 0;
  ck_assert_int_eq(replay_checked(&c, 40, &cap), 0);
  ck_assert_int_eq(cap, 1);
  ck_assert_int_eq(replay_checked(&c, 41, &cap), 0);
  ck_assert_int_eq(cap, 0);
  client_close(&a);
  client_close(&b);
  client_close(&c);
}
END_TEST

/* A fault the reset cannot clear (as a CUDA 13 driver treats an illegal
 * address: no new context in the process) makes graphd stop cleanly and
 * exit with status 3, for its service manager to restart it. Clients of
 * the other device see the daemon go, with UNAVAILABLE. */
START_TEST(test_unrecoverable_fault_makes_graphd_exit_for_a_restart) {
  client a, b;
  ck_assert_int_eq(client_open(&a, 0), GRAPHD_OK);
  ck_assert_int_eq(client_open(&b, 1), GRAPHD_OK);
  ck_assert_int_eq(replay_checked(&a, 1, NULL), 0);
  fault_device(&b, 2);
  int wst = 0;
  pid_t got = 0;
  for (int i = 0; i < 1000 && got == 0; i++) {
    got = waitpid(d.pid, &wst, WNOHANG);
    if (got == 0) usleep(10000);
  }
  ck_assert_int_eq(got, d.pid);
  d.pid = 0;
  daemon_exited = true;
  ck_assert(WIFEXITED(wst));
  ck_assert_int_eq(WEXITSTATUS(wst), 3);
  ck_assert(td_log_contains(&d, "no reset clears"));
  ck_assert(td_log_contains(&d, "exiting with status 3"));
  ck_assert(td_log_contains(&d, "stopped"));
  /* Device 0's client learns on its next call (no daemon comes back). */
  graphd_set_reconnect_wait(a.c, 0);
  ck_assert_int_eq(replay_checked(&a, 2, NULL), GRAPHD_UNAVAILABLE);
  client_close(&a);
  client_close(&b);
}
END_TEST

/* A client process running as nobody: not an admin. */
static int unprivileged_child(const void *arg) {
  const char *what = arg;
  client k;
  if (client_open(&k, 0) != GRAPHD_OK) return 11;
  if (replay_checked(&k, 5, NULL) != 0) return 12;
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  size_t n = 0;
  if (strcmp(what, "all") == 0) {
    o.all = 1;
    graphd_status st = graphd_evict(k.c, &o, NULL, &n, NULL);
    return st == GRAPHD_PERMISSION_DENIED && strstr(graphd_last_error(k.c), "admin") ? 0 : 13;
  }
  if (strcmp(what, "shared") == 0) {
    o.device = 0; /* the capture the parent shares with us */
    graphd_status st = graphd_evict(k.c, &o, NULL, &n, NULL);
    return st == GRAPHD_PERMISSION_DENIED && strstr(graphd_last_error(k.c), "shared") ? 0 : 14;
  }
  if (strcmp(what, "clear") == 0) {
    /* What clear() asks: this process's captures; the shared one stays,
     * and that is no error. */
    o.client_pid = (uint32_t)getpid();
    graphd_status st = graphd_evict(k.c, &o, NULL, &n, NULL);
    return st == GRAPHD_OK && n == 0 ? 0 : 16;
  }
  /* "own": a capture only this process used goes. */
  o.client_pid = (uint32_t)getpid();
  graphd_status st = graphd_evict(k.c, &o, NULL, &n, NULL);
  return st == GRAPHD_OK && n == 1 ? 0 : 15;
}

static int run_child(const char *what) { return td_as_nobody(unprivileged_child, what); }

START_TEST(test_evict_privilege_rule) {
  if (geteuid() != 0) {
    /* Needs root to run a child as another user; CI runs as root. */
    fprintf(stderr, "not root: the privilege rule is not exercised here\n");
    return;
  }
  /* Host modules are native code: an admin brings them in, then anyone
   * may name them. */
  graphd_client *admin = td_control(&d);
  ck_assert_int_eq(graphd_register_module(admin, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, NULL),
                   GRAPHD_OK);
  graphd_close(admin);
  ck_assert_int_eq(run_child("all"), 0);
  /* That child's replay left a capture its (now gone) process used: as
   * root, clear it, so the next child's capture is its own alone. */
  graphd_client *root = td_control(&d);
  graphd_evict_options all;
  graphd_evict_options_init(&all);
  all.all = 1;
  ck_assert_int_eq(graphd_evict(root, &all, NULL, NULL, NULL), GRAPHD_OK);
  graphd_close(root);
  ck_assert_int_eq(run_child("own"), 0);
  /* Shared with this (root) process: refused for the child. */
  client k;
  ck_assert_int_eq(client_open(&k, 0), GRAPHD_OK);
  ck_assert_int_eq(replay_checked(&k, 1, NULL), 0);
  ck_assert_int_eq(run_child("shared"), 0);
  ck_assert_int_eq(run_child("clear"), 0);
  ck_assert_uint_eq(counters(k.c, 0).captures, 1);
  /* An admin (root) may. */
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.all = 1;
  size_t n;
  ck_assert_int_eq(graphd_evict(k.c, &o, NULL, &n, NULL), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  client_close(&k);
}
END_TEST

/* nobody replays the program of client_open once, then leaves. */
static int nobody_replays_once(const void *arg) {
  (void)arg;
  client k;
  if (client_open(&k, 0) != GRAPHD_OK) return 11;
  int rc = replay_checked(&k, 7, NULL);
  client_close(&k);
  return rc == 0 ? 0 : 12;
}

/* nobody asks to evict every capture on device 0 (a control session):
 * 0 when refused as shared with another user, 13 when it went. */
static int nobody_evicts_device0(const void *arg) {
  (void)arg;
  graphd_client *c = td_control(&d);
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.device = 0;
  size_t n = 0;
  graphd_status st = graphd_evict(c, &o, NULL, &n, NULL);
  int out = st == GRAPHD_PERMISSION_DENIED && strstr(graphd_last_error(c), "shared") ? 0
            : st == GRAPHD_OK && n > 0                                               ? 13
                                                                                     : 14;
  graphd_close(c);
  return out;
}

/* Another user's process meanwhile: connects, registers the program and
 * replays it on the capture as it is (no re-capture). */
static int other_user_replays(const void *arg) {
  (void)arg;
  client k;
  if (client_open(&k, 0) != GRAPHD_OK) return 21;
  int cap = -1, rc = replay_checked(&k, 9, &cap);
  client_close(&k);
  return rc != 0 ? 22 : cap != 0 ? 23 : 0;
}

/* Eviction rights go by user, however many processes replayed a capture:
 * after 20 processes of nobody, a process of root replays it too; nobody
 * may then not evict it (before, only the first 16 processes were kept,
 * all nobody's, and nobody's eviction took root's capture), and a process
 * of a third user, then root's next replay, find it as it was. */
START_TEST(test_evict_rights_are_by_user_however_many_processes) {
  if (geteuid() != 0) {
    fprintf(stderr, "not root: the privilege rule is not exercised here\n");
    return;
  }
  graphd_client *admin = td_control(&d);
  ck_assert_int_eq(graphd_register_module(admin, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, NULL),
                   GRAPHD_OK);
  graphd_close(admin);
  for (int i = 0; i < 20; i++) ck_assert_int_eq(td_as_nobody(nobody_replays_once, NULL), 0);
  client k;
  ck_assert_int_eq(client_open(&k, 0), GRAPHD_OK);
  int cap = -1;
  ck_assert_int_eq(replay_checked(&k, 1, &cap), 0);
  ck_assert_int_eq(cap, 0); /* nobody's capture, shared now */
  graphd_capture_info *ci;
  size_t n;
  ck_assert_int_eq(graphd_list_captures(k.c, &ci, &n), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(ci[0].npids, 16); /* the first 16 processes are shown */
  ck_assert_uint_eq(ci[0].replays, 21);
  free(ci);
  ck_assert_int_eq(td_as_nobody(nobody_evicts_device0, NULL), 0);
  pid_t p = fork();
  ck_assert_int_ge(p, 0);
  if (p == 0) _exit(setgid(65533) != 0 || setuid(65533) != 0 ? 10 : other_user_replays(NULL));
  int ws;
  ck_assert_int_eq(waitpid(p, &ws, 0), p);
  ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  /* Root's client goes on: same capture, no re-capture, exact results. */
  ck_assert_int_eq(replay_checked(&k, 2, &cap), 0);
  ck_assert_int_eq(cap, 0);
  graphd_device_counters c0 = counters(k.c, 0);
  ck_assert_uint_eq(c0.captures, 1);
  ck_assert_uint_eq(c0.evictions, 0);
  ck_assert_uint_eq(c0.recaptures, 0);
  client_close(&k);
}
END_TEST

typedef struct loop_arg {
  int bad;
  _Atomic int done;
} loop_arg;

static void *replayer(void *p) {
  loop_arg *a = p;
  client k;
  if (client_open(&k, 0) != GRAPHD_OK) {
    a->bad = 1000;
    return NULL;
  }
  for (unsigned i = 0; i < 400; i++)
    if (replay_checked(&k, i, NULL) != 0) a->bad++;
  client_close(&k);
  atomic_store(&a->done, 1);
  return NULL;
}

START_TEST(test_evict_during_concurrent_replays_loses_nothing) {
  loop_arg la[2];
  memset(la, 0, sizeof la);
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, replayer, &la[i]);
  graphd_client *c = td_control(&d);
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.all = 1;
  uint64_t evicted = 0;
  while (!atomic_load(&la[0].done) || !atomic_load(&la[1].done)) {
    size_t n = 0;
    ck_assert_int_eq(graphd_evict(c, &o, NULL, &n, NULL), GRAPHD_OK);
    evicted += n;
    usleep(2000);
  }
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    ck_assert_int_eq(la[i].bad, 0);
  }
  ck_assert_uint_gt(evicted, 0);
  graphd_device_counters k = counters(c, 0);
  ck_assert_uint_eq(k.replays, 800);
  ck_assert_uint_eq(k.errors, 0);
  ck_assert_uint_eq(k.evictions, evicted);
  ck_assert_uint_eq(k.recaptures + 1, k.captures_built);
  graphd_close(c);
}
END_TEST

START_TEST(test_graphctl_list_and_evict) {
  client k;
  ck_assert_int_eq(client_open(&k, 0), GRAPHD_OK);
  ck_assert_int_eq(replay_checked(&k, 1, NULL), 0);
  char hex[65], cap[32], out[8192];
  graphd_id_hex(k.pid, hex);
  snprintf(cap, sizeof cap, "%.12s@0", hex);
  char *l[] = {GRAPHCTL_BIN, "--socket", d.socket, "list", NULL};
  ck_assert_int_eq(td_run(l, out, sizeof out, 10000), 0);
  ck_assert_msg(strstr(out, cap) && strstr(out, "1 capture(s)"), "%s", out);
  char *dry[] = {GRAPHCTL_BIN, "--socket", d.socket, "evict", "--capture", cap, "--dry-run", NULL};
  ck_assert_int_eq(td_run(dry, out, sizeof out, 10000), 0);
  ck_assert_msg(strstr(out, "would evict 1 capture(s)"), "%s", out);
  char *ev[] = {GRAPHCTL_BIN, "--socket", d.socket, "evict", "--capture", cap, "--json", NULL};
  ck_assert_int_eq(td_run(ev, out, sizeof out, 10000), 0);
  ck_assert_msg(strstr(out, "\"evicted\"") && strstr(out, cap), "%s", out);
  char *bad[] = {GRAPHCTL_BIN, "--socket", d.socket, "evict", "--capture", "nonsense", NULL};
  ck_assert_int_eq(td_run(bad, out, sizeof out, 10000), 2);
  char *none[] = {GRAPHCTL_BIN, "--socket", d.socket, "evict", NULL};
  ck_assert_int_eq(td_run(none, out, sizeof out, 10000), 2); /* a usage error, as documented */
  ck_assert_msg(strstr(out, "say what to evict"), "%s", out);
  client_close(&k);
}
END_TEST

static uint64_t jget(json_object *o, const char *path) {
  /* "a.b": nested keys */
  char buf[128];
  snprintf(buf, sizeof buf, "%s", path);
  json_object *v = o;
  for (char *save, *k = strtok_r(buf, ".", &save); k; k = strtok_r(NULL, ".", &save))
    ck_assert_msg(json_object_object_get_ex(v, k, &v), "no %s", path);
  return json_object_get_uint64(v);
}

/* graphctl stats agrees with what was done: replays, a capture, a re-capture
 * after an eviction, an error; latency percentiles ordered; the client
 * process's regions; the Prometheus form carries the same numbers. */
START_TEST(test_graphctl_stats_agree_with_the_actions) {
  client k;
  ck_assert_int_eq(client_open(&k, 1), GRAPHD_OK);
  for (unsigned i = 0; i < 20; i++) ck_assert_int_eq(replay_checked(&k, i, NULL), 0);
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.client_pid = (uint32_t)getpid();
  size_t n;
  uint64_t bytes;
  ck_assert_int_eq(graphd_evict(k.c, &o, NULL, &n, &bytes), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_int_eq(replay_checked(&k, 21, NULL), 0); /* captures again */
  uint8_t unknown[32] = {1};
  graphd_binding b[1] = {{0, (uint64_t)(uintptr_t)k.x, N * 4}};
  ck_assert_int_eq(graphd_replay(k.c, k.s, unknown, b, 1, NULL), GRAPHD_NOT_FOUND);

  static char out[65536];
  char *js[] = {GRAPHCTL_BIN, "--socket", d.socket, "stats", "--json", NULL};
  ck_assert_int_eq(td_run(js, out, sizeof out, 10000), 0);
  json_object *root = json_tokener_parse(out);
  ck_assert_msg(root, "not JSON: %s", out);
  json_object *devs, *cls;
  ck_assert(json_object_object_get_ex(root, "devices", &devs));
  ck_assert_uint_eq(json_object_array_length(devs), 2);
  json_object *d1 = json_object_array_get_idx(devs, 1), *d0 = json_object_array_get_idx(devs, 0);
  ck_assert_uint_eq(jget(d1, "device"), 1);
  ck_assert_uint_eq(jget(d1, "replays"), 21);
  ck_assert_uint_eq(jget(d1, "captures"), 1);
  ck_assert_uint_eq(jget(d1, "graphs"), 1);
  ck_assert_uint_eq(jget(d1, "captures_built"), 2);
  ck_assert_uint_eq(jget(d1, "recaptures"), 1);
  ck_assert_uint_eq(jget(d1, "evictions"), 1);
  ck_assert_uint_eq(jget(d1, "staging_bytes"), bytes);
  ck_assert_uint_ge(jget(d1, "errors"), 1);
  uint64_t p50 = jget(d1, "replay_latency_ns.p50"), p90 = jget(d1, "replay_latency_ns.p90");
  uint64_t p99 = jget(d1, "replay_latency_ns.p99"), mx = jget(d1, "replay_latency_ns.max");
  ck_assert_uint_gt(p50, 0);
  ck_assert(p50 <= p90 && p90 <= p99 && p99 <= mx);
  /* The worker's time: every replay it took (the unknown program was
   * refused on the loop), and some time for them. */
  ck_assert_uint_eq(jget(d1, "worker_replays"), 21);
  ck_assert_uint_gt(jget(d1, "worker_replay_ns"), 0);
  ck_assert_uint_eq(jget(d0, "worker_replays"), 0);
  /* Of it, the time in the graph launches of the 20 that ran (a host
   * device runs a replay in its launch). */
  ck_assert_uint_gt(jget(d1, "worker_launch_ns"), 0);
  ck_assert_uint_le(jget(d1, "worker_launch_ns"), jget(d1, "worker_replay_ns"));
  ck_assert_uint_eq(jget(d0, "worker_launch_ns"), 0);
  /* Some of them timed on the device (one in 16 on average, at random). */
  uint64_t sampled = jget(d1, "gpu_replays");
  ck_assert_uint_le(sampled, 21);
  ck_assert(sampled == 0 || jget(d1, "gpu_replay_ns") > 0);
  ck_assert_uint_eq(jget(d0, "gpu_replays"), 0);
  ck_assert_uint_eq(jget(d0, "replays"), 0);
  ck_assert_uint_eq(jget(d0, "replay_latency_ns.p50"), 0);
  ck_assert(json_object_object_get_ex(root, "clients", &cls));
  bool me = false;
  for (size_t i = 0; i < json_object_array_length(cls); i++) {
    json_object *c = json_object_array_get_idx(cls, i);
    if (jget(c, "pid") != (uint64_t)getpid()) continue;
    me = true;
    ck_assert_uint_ge(jget(c, "sessions"), 1);
    ck_assert_uint_eq(jget(c, "regions"), 3); /* x, c, y */
    ck_assert_uint_ge(jget(c, "region_bytes"), 3 * N * 4);
  }
  ck_assert_msg(me, "this process is not among the clients: %s", out);
  json_object_put(root);

  char *pr[] = {GRAPHCTL_BIN, "--socket", d.socket, "stats", "--prometheus", NULL};
  ck_assert_int_eq(td_run(pr, out, sizeof out, 10000), 0);
  ck_assert_msg(strstr(out, "# TYPE graphd_replays_total counter\n"), "%s", out);
  ck_assert_msg(strstr(out, "graphd_replays_total{device=\"1\",uuid=\""), "%s", out);
  char line[128];
  snprintf(line, sizeof line, "graphd_evictions_total{device=\"1\"");
  const char *at = strstr(out, line);
  ck_assert_msg(at && strstr(at, "} 1\n") == strchr(at, '}'), "%s", out);
  ck_assert_msg(strstr(out, ",quantile=\"0.99\"} "), "%s", out);
  ck_assert_msg(strstr(out, "# TYPE graphd_replay_worker_seconds summary\n"), "%s", out);
  snprintf(line, sizeof line, "graphd_replay_worker_seconds_count{device=\"1\"");
  at = strstr(out, line);
  ck_assert_msg(at && strstr(at, "} 21\n") == strchr(at, '}'), "%s", out);
  snprintf(line, sizeof line, "graphd_client_regions{pid=\"%d\"", (int)getpid());
  ck_assert_msg(strstr(out, line), "%s", out);
  /* Every sample line is NAME{labels} VALUE or NAME VALUE. */
  for (char *save, *ln = strtok_r(out, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save)) {
    if (ln[0] == '#') continue;
    ck_assert_msg(strncmp(ln, "graphd_", 7) == 0, "%s", ln);
    char *sp = strrchr(ln, ' ');
    ck_assert_msg(sp && sp[1], "%s", ln);
    char *end;
    strtod(sp + 1, &end);
    ck_assert_msg(*end == 0, "value of: %s", ln);
  }
  char *both[] = {GRAPHCTL_BIN, "--socket", d.socket, "stats", "--json", "--prometheus", NULL};
  ck_assert_int_eq(td_run(both, out, sizeof out, 10000), 2);
  client_close(&k);
}
END_TEST

/* The device budget: 128 KiB holds two captures of program3 at these sizes
 * (64 KiB of host staging each). */
#define BIG (16u * 1024u) /* 256 KiB of staging: over the budget on its own */
static void setup_budget(void) {
  td_start(&d, "--host-devices", "1", "--device-budget", "128K", NULL);
  plugin = td_read_file(HOST_KERNELS_SO, &plugin_len);
}

static graphd_status replay_n(client *k, const uint8_t pid[32], uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    k->x[i] = (float)(i % 1000);
    k->cc[i] = 1.0f;
  }
  graphd_binding b[3] = {{0, (uint64_t)(uintptr_t)k->x, n * 4},
                         {3, (uint64_t)(uintptr_t)k->y, n * 4},
                         {1, (uint64_t)(uintptr_t)k->cc, n * 4}};
  graphd_status st = graphd_replay(k->c, k->s, pid, b, 3, NULL);
  if (st != GRAPHD_OK) return st;
  for (uint32_t i = 0; i < n; i++)
    if (k->y[i] != (2.0f * k->x[i] + 1.0f) * 2.0f + 1.0f) return (graphd_status)99;
  return GRAPHD_OK;
}

static bool listed(graphd_client *c, const uint8_t pid[32]) {
  graphd_capture_info *ci;
  size_t n;
  ck_assert_int_eq(graphd_list_captures(c, &ci, &n), GRAPHD_OK);
  bool found = false;
  for (size_t i = 0; i < n; i++) found |= memcmp(ci[i].program_id, pid, 32) == 0;
  free(ci);
  return found;
}

START_TEST(test_budget_evicts_the_least_recently_used) {
  client k = {0};
  k.c = td_data(&d, 0);
  uint8_t mod[32], a[32], b[32], c3[32], big[32];
  ck_assert_int_eq(graphd_register_module(k.c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  ck_assert_int_eq(program3_register(k.c, mod, GRAPHD_MODE_STAGED, 1024, a), GRAPHD_OK);
  ck_assert_int_eq(program3_register(k.c, mod, GRAPHD_MODE_STAGED, 1280, b), GRAPHD_OK);
  ck_assert_int_eq(program3_register(k.c, mod, GRAPHD_MODE_STAGED, 1536, c3), GRAPHD_OK);
  ck_assert_int_eq(program3_register(k.c, mod, GRAPHD_MODE_STAGED, BIG, big), GRAPHD_OK);
  ck_assert_int_eq(graphd_stream_attach(k.c, NULL, &k.s), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(k.c, BIG * 4, (void **)&k.x), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(k.c, BIG * 4, (void **)&k.cc), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(k.c, BIG * 4, (void **)&k.y), GRAPHD_OK);

  ck_assert_int_eq(replay_n(&k, a, 1024), GRAPHD_OK);
  ck_assert_int_eq(replay_n(&k, b, 1280), GRAPHD_OK);
  ck_assert_uint_eq(counters(k.c, 0).staging_bytes, 128u << 10); /* exactly full */
  ck_assert_int_eq(replay_n(&k, a, 1024), GRAPHD_OK);            /* a is now the more recent */
  ck_assert_int_eq(replay_n(&k, c3, 1536), GRAPHD_OK);           /* b must make room */
  ck_assert(listed(k.c, a));
  ck_assert(!listed(k.c, b));
  ck_assert(listed(k.c, c3));
  graphd_device_counters c0 = counters(k.c, 0);
  ck_assert_uint_eq(c0.captures, 2);
  ck_assert_uint_eq(c0.staging_bytes, 128u << 10);
  ck_assert_uint_eq(c0.evictions, 1);
  ck_assert_uint_eq(c0.captures_built, 3);

  /* b comes back transparently (a, now the least recent, goes) and counts
   * as a re-capture. */
  ck_assert_int_eq(replay_n(&k, b, 1280), GRAPHD_OK);
  ck_assert(!listed(k.c, a));
  c0 = counters(k.c, 0);
  ck_assert_uint_eq(c0.evictions, 2);
  ck_assert_uint_eq(c0.recaptures, 1);

  /* A capture that cannot fit on its own is refused and evicts nothing. */
  ck_assert_int_eq(replay_n(&k, big, BIG), GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(graphd_last_error(k.c), "budget"), "%s", graphd_last_error(k.c));
  c0 = counters(k.c, 0);
  ck_assert_uint_eq(c0.captures, 2);
  ck_assert_uint_eq(c0.evictions, 2);
  ck_assert(listed(k.c, b) && listed(k.c, c3));
  /* The stream is still usable. */
  ck_assert_int_eq(replay_n(&k, c3, 1536), GRAPHD_OK);
  client_close(&k);
}
END_TEST

int main(void) {
  Suite *s = suite_create("evict");
  TCase *tc = tcase_create("evict");
  tcase_set_timeout(tc, 60);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_evict_list_dry_run_evict_and_recapture);
  tcase_add_test(tc, test_evict_selectors_are_checked);
  tcase_add_test(tc, test_evict_by_device_leaves_the_other_device_alone);
  tcase_add_test(tc, test_fault_on_one_device_resets_it_alone);
  tcase_add_test(tc, test_unrecoverable_fault_makes_graphd_exit_for_a_restart);
  tcase_add_test(tc, test_evict_privilege_rule);
  tcase_add_test(tc, test_evict_rights_are_by_user_however_many_processes);
  tcase_add_test(tc, test_evict_during_concurrent_replays_loses_nothing);
  tcase_add_test(tc, test_graphctl_list_and_evict);
  tcase_add_test(tc, test_graphctl_stats_agree_with_the_actions);
  suite_add_tcase(s, tc);
  TCase *tb = tcase_create("budget");
  tcase_set_timeout(tb, 60);
  tcase_add_checked_fixture(tb, setup_budget, teardown);
  tcase_add_test(tb, test_budget_evicts_the_least_recently_used);
  suite_add_tcase(s, tb);
  return td_run_suite(s);
}
