/* What one session's submission ring may cost the others, on the host
 * backend: a client that keeps its ring full while it sends
 * UnregisterRegion or a sync Replay (whose jobs first take what the ring
 * held) does not hold the device's worker; the entries such a job takes
 * are held back by --max-inflight-replays as the worker's poll holds them;
 * and a ring entry whose ready flag never rises is given up after the
 * ready timeout when other sessions' entries wait, its done written, and
 * its session cut off. Each victim asserts that it is answered, never how
 * fast: a wedged worker leaves it without an answer until its handle's
 * timeout. */
#define _GNU_SOURCE
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../client/lib/internal.h"
#include "harness.h"
#include "program3.h"

#define PAIRS 4
/* What the victim's calls may take before they count as not answered. */
#define VICTIM_TIMEOUT_MS 20000

static gd_test_daemon d;
static uint8_t *plugin;
static size_t plugin_len;

static void teardown(void) {
  free(plugin);
  plugin = NULL;
  if (d.pid > 0) ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* A client with the staged 3-kernel program over n floats, a stream and
 * PAIRS pairs of buffers. */
typedef struct client {
  graphd_client *c;
  graphd_stream *s;
  uint8_t pid[32];
  uint32_t n;
  float *x[PAIRS], *y[PAIRS], *cst;
} client;

static void client_open(client *k, uint32_t ring_entries, uint32_t n) {
  memset(k, 0, sizeof *k);
  k->c = td_data_timeout(&d, 0, VICTIM_TIMEOUT_MS);
  k->n = n;
  if (ring_entries) ck_assert_int_eq(graphd_set_ring_entries(k->c, ring_entries), GRAPHD_OK);
  uint8_t mod[32];
  ck_assert_int_eq(graphd_register_module(k->c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  ck_assert_int_eq(program3_register(k->c, mod, GRAPHD_MODE_STAGED, n, k->pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_stream_attach(k->c, NULL, &k->s), GRAPHD_OK);
  for (int i = 0; i < PAIRS; i++) {
    ck_assert_int_eq(graphd_host_alloc(k->c, n * 4, (void **)&k->x[i]), GRAPHD_OK);
    ck_assert_int_eq(graphd_host_alloc(k->c, n * 4, (void **)&k->y[i]), GRAPHD_OK);
    for (uint32_t j = 0; j < n; j++) k->x[i][j] = (float)(i + 1);
  }
  ck_assert_int_eq(graphd_host_alloc(k->c, n * 4, (void **)&k->cst), GRAPHD_OK);
  for (uint32_t j = 0; j < n; j++) k->cst[j] = 1.0f;
}

static void client_close(client *k) {
  graphd_stream_detach(k->s);
  graphd_close(k->c);
}

/* Replays pair i on stream s of k, sync or async (*seq: its seq). */
static graphd_status replay(client *k, graphd_stream *s, int i, bool sync, uint64_t *seq) {
  graphd_binding bd[3] = {
      {.slot = 0, .ptr = (uint64_t)(uintptr_t)k->x[i], .bytes = k->n * 4},
      {.slot = 3, .ptr = (uint64_t)(uintptr_t)k->y[i], .bytes = k->n * 4},
      {.slot = 1, .ptr = (uint64_t)(uintptr_t)k->cst, .bytes = k->n * 4},
  };
  if (sync) return graphd_replay(k->c, s, k->pid, bd, 3, NULL);
  return graphd_replay_async(k->c, s, k->pid, bd, 3, seq);
}

/* y of pair i is what the program makes of x = i + 1, c = 1. */
static void check_pair(client *k, int i) {
  float want = (2.0f * (float)(i + 1) + 1.0f) * 2.0f + 1.0f;
  for (uint32_t j = 0; j < k->n; j++)
    if (k->y[i][j] != want) ck_abort_msg("pair %d: y[%u] = %g, want %g", i, j, k->y[i][j], want);
}

/* Every pair once, async (the first opens the ring), waited for and
 * checked: from here on k's replays of these pairs need no request. */
static void warm_up(client *k) {
  uint64_t seq = 0;
  for (int i = 0; i < PAIRS; i++) {
    memset(k->y[i], 0, k->n * 4);
    ck_assert_int_eq(replay(k, k->s, i, false, &seq), GRAPHD_OK);
    ck_assert_int_eq(graphd_stream_wait(k->s, seq, VICTIM_TIMEOUT_MS), GRAPHD_OK);
    check_pair(k, i);
  }
}

/* The victim's async replays of every pair, through its ring only (no
 * job), each answered. */
static void victim_async_served(client *v) {
  uint64_t seq = 0;
  for (int i = 0; i < PAIRS; i++) {
    memset(v->y[i], 0, v->n * 4);
    ck_assert_int_eq(replay(v, v->s, i, false, &seq), GRAPHD_OK);
  }
  graphd_status st = graphd_stream_wait(v->s, seq, VICTIM_TIMEOUT_MS);
  ck_assert_msg(st == GRAPHD_OK, "victim's async replays: %s", graphd_last_error(v->c));
  for (int i = 0; i < PAIRS; i++) check_pair(v, i);
}

/* The victim: sync and async replays of every pair, each answered. */
static void victim_is_served(client *v) {
  for (int i = 0; i < PAIRS; i++) {
    memset(v->y[i], 0, v->n * 4);
    graphd_status st = replay(v, v->s, i, true, NULL);
    ck_assert_msg(st == GRAPHD_OK, "victim's sync replay: %s", graphd_last_error(v->c));
    check_pair(v, i);
  }
  victim_async_served(v);
}

/* A hand on k's ring, as a client that writes it itself: the ring and the
 * flag page as libgraphd mapped them, with a tail of its own from where
 * libgraphd left it, and the stream's seq. Only its thread writes through
 * it, and libgraphd publishes nothing on k meanwhile. */
typedef struct hand {
  volatile graphd_ring_header *hdr;
  volatile graphd_ring_sqe *sq;
  volatile graphd_ring_cqe *cq;
  uint32_t entries;
  int doorbell;
  volatile uint64_t *ready;
  graphd_ring_sqe entry; /* the last entry libgraphd published: the model */
  uint64_t tail, seq;
  atomic_bool stop;
  atomic_ulong published;
} hand;

static void hand_init(hand *h, client *k) {
  memset(h, 0, sizeof *h);
  gd_ring *r = k->c->ring;
  ck_assert_ptr_nonnull(r);
  h->hdr = r->hdr;
  h->sq = r->sq;
  h->cq = r->cq;
  h->entries = r->entries;
  h->doorbell = r->doorbell;
  h->ready = gd_flag_word(k->c->flags, k->s->slot, GRAPHD_FLAG_WORD_READY);
  h->tail = r->tail;
  h->seq = k->s->seq;
  ck_assert_uint_gt(h->tail, 0);
  memcpy(&h->entry, (const void *)&r->sq[(h->tail - 1) & (r->entries - 1)], sizeof h->entry);
  ck_assert_uint_eq(h->entry.nbindings, 3);
}

/* Publishes the model entry at the next seq; the ready word rises first
 * unless raise_ready is false (a stream that never gets there). */
static void hand_publish(hand *h, bool raise_ready) {
  graphd_ring_sqe e = h->entry;
  e.seq = ++h->seq;
  memcpy((void *)&h->sq[h->tail & (h->entries - 1)], &e, sizeof e);
  if (raise_ready) __atomic_store_n(h->ready, e.seq, __ATOMIC_RELEASE);
  __atomic_store_n(&h->hdr->sq_tail, ++h->tail, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&h->hdr->flags, __ATOMIC_SEQ_CST) & GRAPHD_RING_NEED_WAKEUP) {
    uint64_t one = 1;
    if (write(h->doorbell, &one, sizeof one) < 0) { /* only a signal */
    }
  }
  atomic_fetch_add(&h->published, 1);
}

/* What the worker has taken from the ring. */
static uint64_t hand_taken(const hand *h) {
  return __atomic_load_n(&h->hdr->sq_head, __ATOMIC_ACQUIRE);
}

/* Keeps the ring full until told to stop: refills each slot the worker
 * frees. */
static void *keep_full(void *arg) {
  hand *h = arg;
  while (!atomic_load(&h->stop)) {
    if (h->tail - hand_taken(h) < h->entries) {
      hand_publish(h, true);
      continue;
    }
    struct timespec nap = {0, 50000};
    nanosleep(&nap, NULL);
  }
  return NULL;
}

/* The worker has taken at least n more entries than it had at `from`
 * (bounded: fails the test when it does not within 60 s, a bound for a
 * loaded machine: a full ring is under a second's work). */
static void wait_taken(const hand *h, uint64_t from, uint64_t n) {
  double end = td_now_s() + 60;
  while (hand_taken(h) - from < n && td_now_s() < end) usleep(1000);
  ck_assert_msg(hand_taken(h) - from >= n, "the worker took %llu entries, not %llu",
                (unsigned long long)(hand_taken(h) - from), (unsigned long long)n);
}

/* 4096 entries of 16 Ki floats: a full ring is a good part of a second of
 * the worker's time, so the filler keeps it full whatever the scheduler
 * does to it meanwhile. */
#define FILL_ENTRIES 4096
#define FILL_FLOATS (16u << 10)

/* The hostile client runs in a process of its own: the rings of one
 * process are one queue by design (their order group), so only another
 * process is someone else. It and the test talk through this page. */
enum hostile_mode { FILL_UNREGISTER, FILL_SYNC_REPLAY, HELD_UNREGISTER, NEVER_READY };

typedef struct shared {
  atomic_int step;    /* 1: the hostile is set up; 2: the test's victim is; 3: it acted */
  atomic_bool stop;   /* the test is done with it */
  uint64_t before;    /* entries its worker had taken when it acted */
  uint64_t hung_seq;  /* NEVER_READY: the entry's seq */
  uint64_t taken;     /* at the stop: entries taken */
  uint32_t cq_status; /* ... the completion of the entry at `before` */
  uint64_t cq_seq;
  uint64_t done; /* NEVER_READY: its stream's done word once the entry completed */
  char err[256];
} shared;

static shared *sh;

static void wait_step(int step) {
  for (int i = 0; i < 60000 && atomic_load(&sh->step) < step; i++) usleep(1000);
  ck_assert_msg(atomic_load(&sh->step) >= step, "the hostile process did not reach step %d: %s",
                step, sh->err);
}

/* The hostile process: set up, wait for the test's victim, then act. */
static int hostile(enum hostile_mode mode) {
  client h;
  bool fill = mode == FILL_UNREGISTER || mode == FILL_SYNC_REPLAY;
  client_open(&h, fill ? FILL_ENTRIES : 64, fill ? FILL_FLOATS : 256);
  warm_up(&h);
  void *p;
  ck_assert_int_eq(graphd_host_alloc(h.c, 4096, &p), GRAPHD_OK);
  graphd_region_ref ref; /* a region none of its entries names, to let go of */
  ck_assert_int_eq(graphd_region_register(h.c, (uint64_t)(uintptr_t)p, 4096, &ref), GRAPHD_OK);
  graphd_stream *s2;
  ck_assert_int_eq(graphd_stream_attach(h.c, NULL, &s2), GRAPHD_OK);
  hand hd;
  hand_init(&hd, &h);
  atomic_store(&sh->step, 1);
  while (atomic_load(&sh->step) < 2) usleep(1000);
  pthread_t t;
  sh->before = hand_taken(&hd);
  if (fill) {
    ck_assert_int_eq(pthread_create(&t, NULL, keep_full, &hd), 0);
    wait_taken(&hd, sh->before, 2 * FILL_ENTRIES);
    if (mode == FILL_UNREGISTER) {
      ck_assert_int_eq(graphd_region_unregister(h.c, ref.region_id), GRAPHD_OK);
    } else {
      memset(h.y[1], 0, h.n * 4);
      graphd_status st = replay(&h, s2, 1, true, NULL);
      if (st != GRAPHD_OK)
        snprintf(sh->err, sizeof sh->err, "the filler's sync replay: %s", graphd_last_error(h.c));
      ck_assert_int_eq(st, GRAPHD_OK);
      check_pair(&h, 1);
    }
  } else if (mode == HELD_UNREGISTER) {
    /* Its replays taken on the slot read as unfinished to the daemon: the
     * next entries are held back by --max-inflight-replays. */
    __atomic_store_n(gd_flag_word(h.c->flags, h.s->slot, GRAPHD_FLAG_WORD_DONE), 0,
                     __ATOMIC_RELEASE);
    for (int i = 0; i < 4; i++) hand_publish(&hd, true);
    ck_assert_int_eq(graphd_region_unregister(h.c, ref.region_id), GRAPHD_OK);
  } else {
    hand_publish(&hd, false);
    sh->hung_seq = hd.seq;
    atomic_store(&sh->step, 3);
    /* Its done word as the daemon leaves it when it gives the entry up,
     * read as soon as the completion is there: once the session is cut
     * off, libgraphd's own release writes what it issued. */
    time_t until = time(NULL) + 30;
    while (hand_taken(&hd) == sh->before && time(NULL) < until) sched_yield();
    sh->done = __atomic_load_n(gd_flag_word(h.c->flags, h.s->slot, GRAPHD_FLAG_WORD_DONE),
                               __ATOMIC_ACQUIRE);
  }
  atomic_store(&sh->step, 3);
  while (!atomic_load(&sh->stop)) usleep(1000);
  if (fill) {
    atomic_store(&hd.stop, true);
    pthread_join(t, NULL);
  }
  sh->taken = hand_taken(&hd);
  const volatile graphd_ring_cqe *c = &hd.cq[sh->before & (hd.entries - 1)];
  sh->cq_status = c->status;
  sh->cq_seq = c->seq;
  graphd_stream_detach(s2);
  client_close(&h);
  return 0;
}

/* Starts the daemon with args (NULL-terminated, after --host-devices 1)
 * and the hostile process; returns its pid. */
static pid_t start(enum hostile_mode mode, const char *a1, const char *a2, const char *a3,
                   const char *a4) {
  td_start(&d, "--host-devices", "1", "--host-memory", "2G", a1, a2, a3, a4, NULL);
  plugin = td_read_file(HOST_KERNELS_SO, &plugin_len);
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(sh, MAP_FAILED);
  /* Before the test makes any thread of its own. */
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) _exit(hostile(mode));
  return pid;
}

/* Stops the hostile process; fails the test when it failed. */
static void finish(pid_t pid) {
  atomic_store(&sh->stop, true);
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the hostile process failed: %s",
                sh->err);
}

/* A filler's UnregisterRegion or sync Replay is a job that first takes
 * what its ring holds: only what was published when the job began, so the
 * victim's replays behind it are answered while the ring stays full. */
static void full_ring_does_not_hold_the_worker(enum hostile_mode mode) {
  pid_t pid = start(mode, NULL, NULL, NULL, NULL);
  wait_step(1);
  client v;
  client_open(&v, 8, 256);
  warm_up(&v);
  atomic_store(&sh->step, 2);
  wait_step(3);
  victim_is_served(&v);
  victim_is_served(&v);
  finish(pid);
  client_close(&v);
}

START_TEST(test_ring_hold_full_ring_and_unregister_do_not_hold_the_worker) {
  full_ring_does_not_hold_the_worker(FILL_UNREGISTER);
}
END_TEST

START_TEST(test_ring_hold_full_ring_and_sync_replay_do_not_hold_the_worker) {
  full_ring_does_not_hold_the_worker(FILL_SYNC_REPLAY);
}
END_TEST

/* Entries held back by --max-inflight-replays (the client wrote its done
 * word back, so its replays read as unfinished) stay held when a job of
 * the session takes what its ring holds, as the poll holds them: they do
 * not run. Once they have held the victim's replay up for the ready
 * timeout the session is cut off, and the victim is answered. */
START_TEST(test_ring_hold_drain_keeps_entries_held_by_max_inflight) {
  pid_t pid = start(HELD_UNREGISTER, "--max-inflight-replays", "2", "--ready-timeout", "1");
  wait_step(1);
  client v;
  client_open(&v, 8, 256);
  warm_up(&v);
  atomic_store(&sh->step, 2);
  wait_step(3);
  victim_is_served(&v);
  for (int i = 0; i < 5000 && !td_log_contains(&d, "is hung"); i++) usleep(1000);
  finish(pid);
  ck_assert_uint_eq(sh->taken, sh->before);
  ck_assert_msg(td_log_contains(&d, "held back by --max-inflight-replays"), "no cut-off logged");
  ck_assert_msg(td_log_contains(&d, "is hung"), "the session was not cut off");
  client_close(&v);
}
END_TEST

/* A ring entry whose ready flag never rises: with no job queued, other
 * sessions' ring entries waiting behind it make it hang for the ready
 * timeout only. It fails (DEADLINE_EXCEEDED in its completion, its done
 * written), its session is cut off, and the others' entries run. */
START_TEST(test_ring_hold_ready_flag_that_never_rises_is_cut_off) {
  pid_t pid = start(NEVER_READY, "--ready-timeout", "1", NULL, NULL);
  wait_step(1);
  client v;
  client_open(&v, 8, 256);
  warm_up(&v);
  atomic_store(&sh->step, 2);
  wait_step(3);
  /* The victim's entries only (its ring and regions are made): no job.
   * A worker slow to wake may run a batch before it takes the hostile's
   * entry, which then waits with nobody behind it (no cut-off): the next
   * batch waits behind it, and is answered once the ready timeout cut
   * the hostile off. */
  for (int round = 0; round < 3 && !td_log_contains(&d, "is hung"); round++) {
    victim_async_served(&v);
    for (int i = 0; i < 3000 && !td_log_contains(&d, "is hung"); i++) usleep(1000);
  }
  ck_assert_msg(td_log_contains(&d, "is hung"), "the hung session was not cut off");
  victim_is_served(&v);
  finish(pid);
  /* The hung entry's completion, and its done, came from the daemon. */
  ck_assert_uint_eq(sh->taken, sh->before + 1);
  ck_assert_uint_eq(sh->cq_seq, sh->hung_seq);
  ck_assert_uint_eq(sh->cq_status, GRAPHD_DEADLINE_EXCEEDED);
  ck_assert_uint_ge(sh->done, sh->hung_seq);
  client_close(&v);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ring_hold");
  TCase *tc = tcase_create("ring_hold");
  tcase_set_timeout(tc, 100);
  tcase_add_checked_fixture(tc, NULL, teardown);
  tcase_add_test(tc, test_ring_hold_full_ring_and_unregister_do_not_hold_the_worker);
  tcase_add_test(tc, test_ring_hold_full_ring_and_sync_replay_do_not_hold_the_worker);
  tcase_add_test(tc, test_ring_hold_drain_keeps_entries_held_by_max_inflight);
  tcase_add_test(tc, test_ring_hold_ready_flag_that_never_rises_is_cut_off);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
