/* Asynchronous replays (the submission ring) on a GPU: bit-exact results
 * over a thousand calls whose buffers change between VMM and legacy
 * memory, chains of dependent replays queued without waiting, a refused
 * entry reported by the next call with the stream released, a daemon
 * killed with entries queued behind a held stream, replays of 160
 * bindings whose entries take several slots of the ring, in staged and
 * direct mode, the wait's answer for replays a graceful stop never took,
 * a sync replay's drain of entries --max-inflight-replays holds while
 * another client waits, a doorbell its client made blocking, and every
 * replay timed on the GPU with --gpu-time-sample 1 while the worker runs
 * far ahead, and replays of another process that wait on the worker for
 * their ready writes while a stream waits on the GPU (--ready-hold-rings),
 * never those of one process's order group nor of a program the worker
 * takes longer to queue than --ready-hold-max-us; and a session whose
 * replay waits on the GPU past --idle-timeout is not idle. Exits 77
 * without a GPU. */
#define _GNU_SOURCE
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu_common.h"
#include "harness.h"

static gd_test_daemon d;

static void setup(void) { td_start(&d, "--backend", "cuda", NULL); }

static void teardown(void) {
  if (d.pid > 0) ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

typedef struct fixture {
  graphd_client *c;
  uint8_t pid[32];
  CUstream st;
  graphd_stream *s;
  gbuf x[4], y[4], cc;
} fixture;

static float hx[GN], hc[GN], hy[GN], want[GN];

static void fill(unsigned seed) {
  for (uint32_t i = 0; i < GN; i++) {
    hx[i] = (float)((seed * 2654435761u + i * 40503u) % 20011u) / 7.0f - 1400.0f;
    hc[i] = (float)(i % 977) * 0.25f;
  }
}

/* Set by a test whose sessions are to share one instance: the program
 * without state (t a temp slot), under a budget with room for one. */
static bool shared_program;

static void fixture_up(fixture *f) {
  ck_assert_msg(HAVE_CUDA_KERNELS, "the build made no CUDA test kernels (no nvcc)");
  ck_assert_int_eq(gpu_up(), 0);
  char err[GRAPHD_ERRMAX];
  f->c = gpu_session(d.socket, err, sizeof err);
  ck_assert_msg(f->c != NULL, "%s", err);
  ck_assert_int_eq((shared_program ? gpu_program_temp : gpu_program)(f->c, TEST_KERNEL_DIR,
                                                                     GRAPHD_MODE_STAGED, f->pid),
                   GRAPHD_OK);
  ck_assert_int_eq(gcu->cuStreamCreate(&f->st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ck_assert_int_eq(graphd_stream_attach(f->c, f->st, &f->s), GRAPHD_OK);
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(gbuf_alloc(&f->x[i], GN * 4, i % 2), 0);
    ck_assert_int_eq(gbuf_alloc(&f->y[i], GN * 4, 1 - i % 2), 0);
  }
  ck_assert_int_eq(gbuf_alloc(&f->cc, GN * 4, 1), 0);
  fill(0);
  ck_assert_int_eq(gcu->cuMemcpyHtoD(f->cc.ptr, hc, GN * 4), CUDA_SUCCESS);
}

static void fixture_down(fixture *f) {
  graphd_stream_detach(f->s);
  graphd_close(f->c);
  for (int i = 0; i < 4; i++) {
    gbuf_free(&f->x[i]);
    gbuf_free(&f->y[i]);
  }
  gbuf_free(&f->cc);
}

START_TEST(test_gpu_async_thousand_replays_over_changing_buffers_are_bit_exact) {
  fixture f;
  fixture_up(&f);
  double t0 = now_ms();
  for (int i = 0; i < 1000; i++) {
    gbuf *x = &f.x[(i * 3) % 4], *y = &f.y[(i + 1) % 4];
    fill((unsigned)i);
    ck_assert_int_eq(gcu->cuMemcpyHtoDAsync(x->ptr, hx, GN * 4, f.st), CUDA_SUCCESS);
    ck_assert_int_eq(gcu->cuMemsetD32Async(y->ptr, 0x7fc00000u, GN, f.st), CUDA_SUCCESS);
    graphd_binding b[3] = {{0, x->ptr, GN * 4}, {3, y->ptr, GN * 4}, {1, f.cc.ptr, GN * 4}};
    ck_assert_msg(graphd_replay_async(f.c, f.s, f.pid, b, i == 0 ? 3 : 2, NULL) == GRAPHD_OK,
                  "replay %d: %s", i, graphd_last_error(f.c));
    /* Ordered by the stream: the copy waits for the replay's done. */
    ck_assert_int_eq(gcu->cuMemcpyDtoHAsync(hy, y->ptr, GN * 4, f.st), CUDA_SUCCESS);
    ck_assert_int_eq(gcu->cuStreamSynchronize(f.st), CUDA_SUCCESS);
    gpu_reference(hx, hc, want);
    ck_assert_msg(memcmp(hy, want, sizeof hy) == 0, "replay %d: wrong output", i);
  }
  printf("FIGURE 1000 checked async replays: %.1f ms, copies and checks included\n", now_ms() - t0);
  graphd_async_info info;
  ck_assert_int_eq(graphd_replay_collect(f.c, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.completed, 1000);
  ck_assert_uint_eq(info.failed, 0);
  fixture_down(&f);
}
END_TEST

/* 80 launches, 160 bindings: each entry takes 8 slots of the ring. */
#define WIDE_K 80
START_TEST(test_gpu_async_replays_of_many_bindings_are_exact) {
  fixture f;
  fixture_up(&f);
  static gbuf b[2][2 * WIDE_K];
  static float in[WIDE_K][GN], out[GN];
  for (int set = 0; set < 2; set++)
    for (int j = 0; j < 2 * WIDE_K; j++) ck_assert_int_eq(gbuf_alloc(&b[set][j], GN * 4, set), 0);
  for (int m = 0; m < 2; m++) {
    uint8_t pid[32];
    ck_assert_int_eq(gpu_wide_program(f.c, TEST_KERNEL_DIR,
                                      m ? GRAPHD_MODE_DIRECT : GRAPHD_MODE_STAGED, WIDE_K, pid),
                     GRAPHD_OK);
    double t0 = now_ms();
    for (int r = 0; r < 200; r++) {
      int set = r % 2;
      /* Every tenth replay (and the last) gets fresh inputs, each slot
       * other ones, and its outputs are checked; the others replay
       * whatever their buffers hold. */
      bool check = r % 10 == 0 || r == 199;
      graphd_binding bd[2 * WIDE_K];
      fill((unsigned)r);
      for (int i = 0; i < WIDE_K; i++) {
        bd[2 * i] = (graphd_binding){(uint32_t)(2 * i), b[set][2 * i].ptr, GN * 4};
        bd[2 * i + 1] = (graphd_binding){(uint32_t)(2 * i + 1), b[set][2 * i + 1].ptr, GN * 4};
        if (!check) continue;
        for (uint32_t j = 0; j < GN; j++) in[i][j] = hx[j] + (float)i;
        ck_assert_int_eq(gcu->cuMemcpyHtoDAsync(b[set][2 * i].ptr, in[i], GN * 4, f.st),
                         CUDA_SUCCESS);
        ck_assert_int_eq(gcu->cuMemsetD32Async(b[set][2 * i + 1].ptr, 0x7fc00000u, GN, f.st),
                         CUDA_SUCCESS);
      }
      ck_assert_msg(graphd_replay_async(f.c, f.s, pid, bd, 2 * WIDE_K, NULL) == GRAPHD_OK,
                    "replay %d: %s", r, graphd_last_error(f.c));
      if (!check) continue;
      ck_assert_int_eq(gcu->cuStreamSynchronize(f.st), CUDA_SUCCESS);
      for (int i = 0; i < WIDE_K; i++) {
        ck_assert_int_eq(gcu->cuMemcpyDtoH(out, b[set][2 * i + 1].ptr, GN * 4), CUDA_SUCCESS);
        for (uint32_t j = 0; j < GN; j++)
          if (out[j] != (float)(i + 1) * in[i][j])
            ck_abort_msg("%s replay %d: y_%d[%u] = %g, want %g", m ? "direct" : "staged", r, i, j,
                         (double)out[j], (double)((float)(i + 1) * in[i][j]));
      }
    }
    printf(
        "FIGURE 200 async replays of %d bindings (%s, 8 ring slots each): %.1f ms, copies and "
        "checks included\n",
        2 * WIDE_K, m ? "direct" : "staged", now_ms() - t0);
  }
  graphd_async_info info;
  ck_assert_int_eq(graphd_replay_collect(f.c, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.completed, 400);
  ck_assert_uint_eq(info.failed, 0);
  for (int set = 0; set < 2; set++)
    for (int j = 0; j < 2 * WIDE_K; j++) gbuf_free(&b[set][j]);
  fixture_down(&f);
}
END_TEST

START_TEST(test_gpu_async_chains_of_dependent_replays_are_exact) {
  fixture f;
  fixture_up(&f);
  static float ref[GN];
  for (int round = 0; round < 30; round++) {
    fill((unsigned)round + 7);
    for (uint32_t i = 0; i < GN; i++) hx[i] *= 1e-6f;
    memcpy(ref, hx, sizeof ref);
    ck_assert_int_eq(gcu->cuMemcpyHtoDAsync(f.x[0].ptr, hx, GN * 4, f.st), CUDA_SUCCESS);
    /* 20 replays, each reading what the one before wrote, none waited for. */
    for (int k = 0; k < 20; k++) {
      CUdeviceptr in = k % 2 ? f.y[1].ptr : f.x[0].ptr, out = k % 2 ? f.x[0].ptr : f.y[1].ptr;
      graphd_binding b[3] = {{0, in, GN * 4}, {3, out, GN * 4}, {1, f.cc.ptr, GN * 4}};
      ck_assert_msg(
          graphd_replay_async(f.c, f.s, f.pid, b, round + k == 0 ? 3 : 2, NULL) == GRAPHD_OK, "%s",
          graphd_last_error(f.c));
      gpu_reference(ref, hc, want);
      memcpy(ref, want, sizeof ref);
    }
    ck_assert_int_eq(gcu->cuMemcpyDtoHAsync(hy, f.x[0].ptr, GN * 4, f.st), CUDA_SUCCESS);
    ck_assert_int_eq(gcu->cuStreamSynchronize(f.st), CUDA_SUCCESS);
    ck_assert_msg(memcmp(hy, ref, sizeof hy) == 0, "chain %d: wrong output", round);
  }
  fixture_down(&f);
}
END_TEST

START_TEST(test_gpu_async_refused_entry_is_reported_and_releases_the_stream) {
  fixture f;
  fixture_up(&f);
  graphd_binding bad[2] = {{0, f.x[0].ptr, GN * 4}, {3, f.y[0].ptr, GN * 4 - 4}};
  uint64_t seq;
  ck_assert_int_eq(graphd_replay_async(f.c, f.s, f.pid, bad, 2, &seq), GRAPHD_OK);
  ck_assert_int_eq(gcu->cuStreamSynchronize(f.st), CUDA_SUCCESS); /* not stuck */
  ck_assert_int_eq(graphd_stream_wait(f.s, seq, -1), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(f.c), "binding covers"), "%s", graphd_last_error(f.c));
  ck_assert_int_eq(gpu_replay_checked(f.c, f.s, f.st, f.pid, &f.x[0], &f.y[0], &f.cc, 1, 5, NULL),
                   GRAPHD_OK);
  fixture_down(&f);
}
END_TEST

START_TEST(test_gpu_async_dead_daemon_with_entries_queued_releases_the_stream) {
  fixture f;
  fixture_up(&f);
  graphd_set_reconnect_wait(f.c, 0);
  ck_assert_int_eq(gpu_replay_checked(f.c, f.s, f.st, f.pid, &f.x[0], &f.y[0], &f.cc, 1, 5, NULL),
                   GRAPHD_OK);
  volatile uint64_t *flag = gpu_hold_stream(f.st);
  ck_assert_ptr_nonnull((void *)flag);
  for (int i = 0; i < 5; i++) {
    graphd_binding b[2] = {{0, f.x[i % 4].ptr, GN * 4}, {3, f.y[i % 4].ptr, GN * 4}};
    ck_assert_int_eq(graphd_replay_async(f.c, f.s, f.pid, b, 2, NULL), GRAPHD_OK);
  }
  double t0 = now_ms();
  kill(td_daemon_pid(&d), SIGKILL);
  __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
  ck_assert_int_eq(gcu->cuStreamSynchronize(f.st), CUDA_SUCCESS);
  double released = now_ms() - t0;
  printf("FIGURE dead daemon, async entries queued: stream released %.1f ms after SIGKILL\n",
         released);
  ck_assert_double_lt(released, 1000.0);
  graphd_binding b[2] = {{0, f.x[0].ptr, GN * 4}, {3, f.y[0].ptr, GN * 4}};
  ck_assert_int_eq(graphd_replay_async(f.c, f.s, f.pid, b, 2, NULL), GRAPHD_UNAVAILABLE);
  fixture_down(&f);
  gpu_hold_free(flag);
  waitpid(d.pid, NULL, 0);
  d.pid = 0;
}
END_TEST

/* With --max-inflight-replays 1 and the client's stream held, the worker
 * takes the first of 8 async replays and holds the other 7 in the ring.
 * A graceful stop (the stream let go after SIGTERM, so the first runs)
 * never takes the 7: the wait answers OK for the first and UNAVAILABLE for
 * each of the others, whose outputs nothing wrote. */
START_TEST(test_gpu_async_wait_reports_the_replays_a_graceful_stop_dropped) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_start_again(&d, "--backend", "cuda", "--max-inflight-replays", "1", NULL);
  fixture f;
  fixture_up(&f);
  graphd_set_reconnect_wait(f.c, 0);
  ck_assert_int_eq(gpu_replay_checked(f.c, f.s, f.st, f.pid, &f.x[0], &f.y[0], &f.cc, 1, 5, NULL),
                   GRAPHD_OK);
  uint32_t nan_bits = 0x7fc00000u;
  for (uint32_t j = 0; j < GN; j++) memcpy(&hy[j], &nan_bits, 4);
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(gcu->cuMemcpyHtoD(f.y[i].ptr, hy, GN * 4), CUDA_SUCCESS);
  volatile uint64_t *flag = gpu_hold_stream(f.st);
  ck_assert_ptr_nonnull((void *)flag);
  uint64_t seq[8];
  for (int i = 0; i < 8; i++) {
    graphd_binding b[2] = {{0, f.x[i % 4].ptr, GN * 4}, {3, f.y[i % 4].ptr, GN * 4}};
    ck_assert_int_eq(graphd_replay_async(f.c, f.s, f.pid, b, 2, &seq[i]), GRAPHD_OK);
  }
  usleep(200000); /* the worker has taken the first and holds the rest */
  kill(td_daemon_pid(&d), SIGTERM);
  usleep(100000);
  __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
  int st = td_stop_sig(&d, SIGTERM, 20000);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
  ck_assert_int_eq(gcu->cuStreamSynchronize(f.st), CUDA_SUCCESS);
  ck_assert_msg(graphd_stream_wait(f.s, seq[0], 5000) == GRAPHD_OK, "%s", graphd_last_error(f.c));
  for (int i = 1; i < 8; i++) {
    ck_assert_int_eq(graphd_stream_wait(f.s, seq[i], 5000), GRAPHD_UNAVAILABLE);
    ck_assert_msg(strstr(graphd_last_error(f.c), "before it finished replay seq"), "%s",
                  graphd_last_error(f.c));
  }
  /* Pairs 1-3 were only in the dropped replays: never written. */
  for (int i = 1; i < 4; i++) {
    ck_assert_int_eq(gcu->cuMemcpyDtoH(hy, f.y[i].ptr, GN * 4), CUDA_SUCCESS);
    uint32_t bits;
    memcpy(&bits, &hy[GN / 2], 4);
    ck_assert_uint_eq(bits, 0x7fc00000u);
  }
  printf(
      "FIGURE graceful stop with 8 async replays queued: 1 ran and waited OK, 7 reported "
      "UNAVAILABLE\n");
  fixture_down(&f);
  gpu_hold_free(flag);
}
END_TEST

typedef struct held_call {
  fixture *f;
  graphd_status st;
} held_call;

static void *sync_replay_of_held(void *arg) {
  held_call *h = arg;
  graphd_binding b[2] = {{0, h->f->x[0].ptr, GN * 4}, {3, h->f->y[0].ptr, GN * 4}};
  h->st = graphd_replay(h->f->c, h->f->s, h->f->pid, b, 2, NULL);
  return NULL;
}

/* --max-inflight-replays 2 and a client whose stream is held: two of its
 * six ring entries are queued on the GPU behind its ready flag, the rest
 * stay on its ring, and its sync replay waits on the loop (held back as a
 * launch into a full queue waits), not in the device's worker. Another
 * client replaying the same capture (one instance: the program keeps
 * scratch) queues behind the two on the GPU: the held session now blocks
 * it, so once the ready timeout (1 s) has passed the held session is cut
 * off and the other client is answered, exact. The waiting sync replay
 * fails with a clear error rather than waiting for ever; let go, the held
 * stream finishes. */
START_TEST(test_gpu_async_held_ring_and_sync_replay_let_another_client_through) {
  ck_assert_int_eq(td_stop(&d), 0);
  /* The budget has room for one instance: v's replays share a's. */
  td_start_again(&d, "--backend", "cuda", "--max-inflight-replays", "2", "--ready-timeout", "1",
                 "--device-budget", "2M", NULL);
  fixture a, v;
  shared_program = true;
  fixture_up(&a);
  fixture_up(&v);
  shared_program = false;
  graphd_set_reconnect_wait(a.c, 0);
  ck_assert_int_eq(gpu_replay_checked(a.c, a.s, a.st, a.pid, &a.x[0], &a.y[0], &a.cc, 1, 1, NULL),
                   GRAPHD_OK);
  ck_assert_int_eq(gpu_replay_checked(v.c, v.s, v.st, v.pid, &v.x[0], &v.y[0], &v.cc, 1, 2, NULL),
                   GRAPHD_OK);
  volatile uint64_t *flag = gpu_hold_stream(a.st);
  ck_assert_ptr_nonnull((void *)flag);
  for (int i = 0; i < 6; i++) {
    graphd_binding b[2] = {{0, a.x[i % 4].ptr, GN * 4}, {3, a.y[i % 4].ptr, GN * 4}};
    ck_assert_int_eq(graphd_replay_async(a.c, a.s, a.pid, b, 2, NULL), GRAPHD_OK);
  }
  held_call h = {.f = &a};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, sync_replay_of_held, &h), 0);
  usleep(300000); /* its replay reached the daemon and waits */
  double t0 = now_ms();
  for (int i = 0; i < 5; i++)
    ck_assert_int_eq(gpu_replay_checked(v.c, v.s, v.st, v.pid, &v.x[i % 4], &v.y[i % 4], &v.cc, 0,
                                        (unsigned)(10 + i), NULL),
                     GRAPHD_OK);
  double took = now_ms() - t0;
  printf(
      "FIGURE another client's 5 replays behind a held ring and a waiting sync replay: %.1f ms "
      "(ready timeout 1 s)\n",
      took);
  fflush(stdout);
  ck_assert_msg(took < 3000, "the other client waited %.0f ms", took);
  ck_assert_msg(td_log_contains(&d, "is hung"), "the held session was not cut off");
  pthread_join(t, NULL);
  ck_assert_msg(h.st == GRAPHD_RESOURCE_EXHAUSTED || h.st == GRAPHD_UNAVAILABLE,
                "the waiting replay: %d", h.st);
  __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
  ck_assert_int_eq(gcu->cuStreamSynchronize(a.st), CUDA_SUCCESS);
  fixture_down(&a);
  fixture_down(&v);
  gpu_hold_free(flag);
}
END_TEST

/* --gpu-time-sample 1: with the client's stream held, the worker queues
 * 200 replays ahead of the GPU (more than the sampler's first pairs), and
 * every one is timed once the stream goes. */
START_TEST(test_gpu_async_every_replay_timed_while_the_worker_runs_ahead) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_start_again(&d, "--backend", "cuda", "--gpu-time-sample", "1", NULL);
  fixture f;
  fixture_up(&f);
  ck_assert_int_eq(gpu_replay_checked(f.c, f.s, f.st, f.pid, &f.x[0], &f.y[0], &f.cc, 1, 1, NULL),
                   GRAPHD_OK);
  volatile uint64_t *flag = gpu_hold_stream(f.st);
  ck_assert_ptr_nonnull((void *)flag);
  for (int i = 0; i < 200; i++) {
    graphd_binding b[2] = {{0, f.x[i % 4].ptr, GN * 4}, {3, f.y[i % 4].ptr, GN * 4}};
    ck_assert_int_eq(graphd_replay_async(f.c, f.s, f.pid, b, 2, NULL), GRAPHD_OK);
  }
  usleep(300000); /* the worker has queued them behind the held stream */
  __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
  ck_assert_int_eq(gcu->cuStreamSynchronize(f.st), CUDA_SUCCESS);
  graphd_async_info info;
  ck_assert_int_eq(graphd_replay_collect(f.c, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.failed, 0);
  graphd_client *ctl = td_control(&d);
  uint64_t replays = 0, timed = 0, ns = 0, worker = 0, launch = 0;
  for (int tries = 0; tries < 50; tries++) { /* the rings' replays are folded in within ms */
    graphd_daemon_status *s;
    ck_assert_int_eq(graphd_get_status(ctl, &s), GRAPHD_OK);
    replays = s->work[0].replays;
    timed = s->work[0].gpu_replays;
    ns = s->work[0].gpu_ns;
    worker = s->work[0].replay_ns;
    launch = s->launch_ns[0];
    graphd_daemon_status_free(s);
    if (replays == 201 && timed == 201) break;
    usleep(20000);
  }
  printf(
      "FIGURE %llu replays, %llu timed on the GPU, %.1f us each; the worker %.1f us a replay, "
      "%.1f us of it in graph launches\n",
      (unsigned long long)replays, (unsigned long long)timed,
      timed ? (double)ns / (double)timed / 1e3 : 0.0,
      replays ? (double)worker / (double)replays / 1e3 : 0.0,
      replays ? (double)launch / (double)replays / 1e3 : 0.0);
  ck_assert_uint_eq(replays, 201);
  ck_assert_uint_eq(timed, 201);
  ck_assert_uint_gt(ns, 0);
  /* Every one ran, so each was launched: some time there, within the
   * worker's. */
  ck_assert_uint_gt(launch, 0);
  ck_assert_uint_le(launch, worker);
  graphd_close(ctl);
  fixture_down(&f);
  gpu_hold_free(flag);
}
END_TEST

/* On the CUDA backend too, a doorbell registered in two sessions and made
 * blocking by its owner, then rung, leaves the worker serving others. */
START_TEST(test_gpu_async_a_doorbell_the_client_made_blocking_does_not_wedge_the_worker) {
  fixture f;
  fixture_up(&f);
  int s[2];
  int bell = td_raw_wedge_attempt(&d, 0, s);
  usleep(100000);
  for (int i = 0; i < 20; i++)
    ck_assert_int_eq(gpu_replay_checked(f.c, f.s, f.st, f.pid, &f.x[i % 4], &f.y[i % 4], &f.cc,
                                        i == 0, (unsigned)i, NULL),
                     GRAPHD_OK);
  close(s[0]);
  close(s[1]);
  close(bell);
  fixture_down(&f);
}
END_TEST

enum { THREADS = 12, ROUNDS = 30, BURST = 32 };

typedef struct worker_arg {
  int id;
  const char *socket;
  CUcontext ctx;
  int ok;
  char err[GRAPHD_ERRMAX + 64];
} worker_arg;

/* One handle of many in this process: its own session, stream and
 * buffers; ROUNDS bursts of BURST async replays, a synchronize after each,
 * then the output checked. */
static void *many_handles_worker(void *p) {
  worker_arg *a = p;
  graphd_client *c = NULL;
  graphd_stream *s = NULL;
  CUstream st = NULL;
  gbuf x[2] = {{0}}, y = {0}, cc = {0};
  float *in = malloc(GN * 4), *c_host = malloc(GN * 4), *out = malloc(GN * 4),
        *ref = malloc(GN * 4);
  uint8_t pid[32];
  if (!in || !c_host || !out || !ref) goto done;
  gcu->cuCtxSetCurrent(a->ctx);
  c = gpu_session(a->socket, a->err, sizeof a->err);
  if (!c || gpu_program(c, TEST_KERNEL_DIR, GRAPHD_MODE_STAGED, pid) != GRAPHD_OK ||
      gcu->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      graphd_stream_attach(c, st, &s) != GRAPHD_OK) {
    if (c) snprintf(a->err, sizeof a->err, "set-up: %s", graphd_last_error(c));
    goto done;
  }
  for (uint32_t i = 0; i < GN; i++) {
    in[i] = (float)((i * 31u + (uint32_t)a->id * 7u) % 1013u) * 0.5f;
    /* Slot 1 is copied once, when the shared capture is built: the same
     * for every handle. */
    c_host[i] = (float)(i % 7u) * 0.25f;
  }
  if (gbuf_alloc(&x[0], GN * 4, a->id % 2) || gbuf_alloc(&x[1], GN * 4, 1 - a->id % 2) ||
      gbuf_alloc(&y, GN * 4, 1) || gbuf_alloc(&cc, GN * 4, 0) ||
      gcu->cuMemcpyHtoD(x[0].ptr, in, GN * 4) || gcu->cuMemcpyHtoD(x[1].ptr, in, GN * 4) ||
      gcu->cuMemcpyHtoD(cc.ptr, c_host, GN * 4)) {
    snprintf(a->err, sizeof a->err, "buffers: a CUDA call failed");
    goto done;
  }
  for (int r = 0; r < ROUNDS; r++) {
    for (int k = 0; k < BURST; k++) {
      graphd_binding b[3] = {{0, x[k % 2].ptr, GN * 4}, {3, y.ptr, GN * 4}, {1, cc.ptr, GN * 4}};
      if (graphd_replay_async(c, s, pid, b, 3, NULL) != GRAPHD_OK) {
        snprintf(a->err, sizeof a->err, "round %d replay %d: %s", r, k, graphd_last_error(c));
        goto done;
      }
    }
    if (gcu->cuStreamSynchronize(st) != CUDA_SUCCESS) {
      snprintf(a->err, sizeof a->err, "round %d: cuStreamSynchronize failed", r);
      goto done;
    }
  }
  if (graphd_replay_collect(c, NULL) != GRAPHD_OK) {
    snprintf(a->err, sizeof a->err, "collect: %s", graphd_last_error(c));
    goto done;
  }
  gcu->cuMemcpyDtoH(out, y.ptr, GN * 4);
  gpu_reference(in, c_host, ref);
  a->ok = memcmp(out, ref, GN * 4) == 0;
  if (!a->ok) snprintf(a->err, sizeof a->err, "wrong output");
done:
  if (s) graphd_stream_detach(s);
  graphd_close(c);
  if (st) gcu->cuStreamDestroy(st);
  gbuf_free(&x[0]);
  gbuf_free(&x[1]);
  gbuf_free(&y);
  gbuf_free(&cc);
  free(in);
  free(c_host);
  free(out);
  free(ref);
  return NULL;
}

/* More streams in one process than its context has work queues, each
 * waiting on the daemon while the daemon's session streams wait on them.
 * Every handle must finish, bit-exact. */
START_TEST(test_gpu_async_many_handles_in_one_process_all_finish) {
  ck_assert_msg(HAVE_CUDA_KERNELS, "the build made no CUDA test kernels (no nvcc)");
  ck_assert_int_eq(gpu_up(), 0);
  CUcontext ctx;
  ck_assert_int_eq(gcu->cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  pthread_t t[THREADS];
  static worker_arg args[THREADS];
  for (int i = 0; i < THREADS; i++) {
    args[i] = (worker_arg){.id = i, .socket = d.socket, .ctx = ctx};
    ck_assert_int_eq(pthread_create(&t[i], NULL, many_handles_worker, &args[i]), 0);
  }
  double t0 = now_ms();
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 90;
  for (int i = 0; i < THREADS; i++) {
    ck_assert_msg(pthread_timedjoin_np(t[i], NULL, &deadline) == 0,
                  "handle %d did not finish within 90 s: the streams are stuck", i);
    ck_assert_msg(args[i].ok, "handle %d: %s", i, args[i].err);
  }
  printf("FIGURE %d handles x %d async replays in one process: %.1f ms\n", THREADS, ROUNDS * BURST,
         now_ms() - t0);
}
END_TEST

/* f's program becomes the stateless y = x (the wide program of one
 * launch): sessions replaying it at once get an instance each. */
static void copy_program(fixture *f) {
  ck_assert_int_eq(gpu_wide_program(f->c, TEST_KERNEL_DIR, GRAPHD_MODE_STAGED, 1, f->pid),
                   GRAPHD_OK);
}

/* n async replays of y = x on f, checked (gpu_async_copies_checked). */
static void copies_checked(fixture *f, int n, unsigned seed) {
  graphd_status r = gpu_async_copies_checked(f->c, f->s, f->st, f->pid, f->x, f->y, 4, n, seed);
  ck_assert_msg(r == GRAPHD_OK, "%d async copies (seed %u): status %d: %s", n, seed, (int)r,
                graphd_last_error(f->c));
}

/* f's stream held (gpu_hold_stream) and one async copy of x[0], filled
 * from seed first (a copy from pageable memory would wait for the held
 * stream), into y[0] queued behind the hold: its ready write does not
 * come until release_checked. */
static volatile uint64_t *held_copy(fixture *f, unsigned seed) {
  fill(seed);
  ck_assert_int_eq(gcu->cuMemcpyHtoD(f->x[0].ptr, hx, GN * 4), CUDA_SUCCESS);
  volatile uint64_t *flag = gpu_hold_stream(f->st);
  ck_assert_ptr_nonnull((void *)flag);
  graphd_binding b[2] = {{0, f->x[0].ptr, GN * 4}, {1, f->y[0].ptr, GN * 4}};
  ck_assert_int_eq(graphd_replay_async(f->c, f->s, f->pid, b, 2, NULL), GRAPHD_OK);
  return flag;
}

/* Lets held_copy's stream go; its copy must then hold seed's fill. */
static void release_checked(fixture *f, volatile uint64_t *flag, unsigned seed) {
  ck_assert_int_eq(gcu->cuStreamQuery(f->st), CUDA_ERROR_NOT_READY);
  __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
  ck_assert_int_eq(gcu->cuStreamSynchronize(f->st), CUDA_SUCCESS);
  ck_assert_int_eq(gcu->cuMemcpyDtoH(hy, f->y[0].ptr, GN * 4), CUDA_SUCCESS);
  fill(seed);
  ck_assert_msg(memcmp(hy, hx, GN * 4) == 0, "the held stream's replay: wrong output");
  gpu_hold_free(flag);
}

/* Another client process (gpu_replay_client async n): n async replays of
 * a copy, checked, on a session whose ring is not in this process's order
 * group. It keeps the session until *in, its standard input, is closed
 * (other_process_end). */
static pid_t other_process_async(int n, int *in) {
  int o[2], i[2];
  ck_assert_int_eq(pipe(o), 0);
  ck_assert_int_eq(pipe(i), 0);
  char ns[16];
  snprintf(ns, sizeof ns, "%d", n);
  pid_t p = fork();
  ck_assert_int_ge(p, 0);
  if (p == 0) {
    dup2(i[0], 0);
    dup2(o[1], 1);
    close(i[0]);
    close(i[1]);
    close(o[0]);
    close(o[1]);
    execl(GPU_CLIENT_BIN, GPU_CLIENT_BIN, d.socket, TEST_KERNEL_DIR, "async", ns, (char *)NULL);
    _exit(127);
  }
  close(i[0]);
  close(o[1]);
  FILE *f = fdopen(o[0], "r");
  ck_assert_ptr_nonnull(f);
  char line[512] = "(nothing)";
  if (!fgets(line, sizeof line, f)) strcpy(line, "(nothing)");
  fclose(f);
  ck_assert_msg(strstr(line, "async ok"), "the other client process: %s", line);
  *in = i[1];
  return p;
}

static void other_process_end(pid_t p, int in) {
  close(in);
  int st;
  ck_assert_int_eq(waitpid(p, &st, 0), p);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the other client process ended badly");
}

/* Device 0's hold counters: entries held on the worker for their ready
 * writes, the time they waited, and those held to the bound, once the
 * rings' tallies are folded in (they are within ms: read until two
 * answers agree). */
typedef struct holds {
  uint64_t n, ns, expired;
} holds;

static holds read_holds(void) {
  graphd_client *ctl = td_control(&d);
  holds h = {0}, last = {UINT64_MAX, 0, 0};
  for (int tries = 0; tries < 50; tries++) {
    graphd_daemon_status *s;
    ck_assert_int_eq(graphd_get_status(ctl, &s), GRAPHD_OK);
    graphd_device_record r;
    ck_assert_int_eq(graphd_daemon_status_device(s, 0, &r, sizeof r), GRAPHD_OK);
    graphd_daemon_status_free(s);
    h = (holds){r.ready_holds, r.ready_hold_ns, r.ready_holds_expired};
    if (h.n == last.n && h.ns == last.ns && h.expired == last.expired) break;
    last = h;
    usleep(20000);
  }
  graphd_close(ctl);
  printf("FIGURE ready holds: %llu, %.1f us each on the mean, %llu to the bound\n",
         (unsigned long long)h.n, h.n ? (double)h.ns / (double)h.n / 1e3 : 0.0,
         (unsigned long long)h.expired);
  return h;
}

/* A fresh daemon whose worker holds ring entries for their ready writes
 * as soon as a device serves more than one ring (--ready-hold-rings 1),
 * of programs it queues within max_us on the mean (--ready-hold-max-us:
 * the tests of how holds run allow any program; the copy program takes a
 * few us on an H100). */
static void restart_holding_past_one_ring_within(const char *max_us) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_start_again(&d, "--backend", "cuda", "--ready-hold-rings", "1", "--ready-hold-max-us", max_us,
                 NULL);
}

static void restart_holding_past_one_ring(void) { restart_holding_past_one_ring_within("1000000"); }

/* --ready-hold-rings 1. A stream held (its ready write not coming) has
 * its replay's ready wait on the GPU: its session's ring is then the
 * device's only one. Another process's replays, whose ready writes land
 * a moment after their entries, wait on the worker for them (two rings
 * now) instead of joining it there, and all run, exact, while the first
 * stream is still held; then the held one runs too. (Copies from
 * pageable memory wait for their stream: x is filled before the hold.) */
START_TEST(test_gpu_async_replays_wait_on_the_worker_while_another_stream_waits_on_the_gpu) {
  restart_holding_past_one_ring();
  fixture a;
  fixture_up(&a);
  copy_program(&a);
  copies_checked(&a, 1, 1);
  volatile uint64_t *flag = held_copy(&a, 77);
  usleep(100000); /* its ready wait is on the GPU */
  double t0 = now_ms();
  int in;
  pid_t other = other_process_async(200, &in);
  printf(
      "FIGURE another process's 200 async replays while a stream waits on the GPU: %.1f ms "
      "with its start\n",
      now_ms() - t0);
  ck_assert_msg(td_log_contains(&d, "wait on the worker for their ready writes"),
                "the other session's replays were not held for their ready writes");
  release_checked(&a, flag, 77);
  other_process_end(other, in);
  /* Counted: some held, none longer than the time they waited. */
  holds h = read_holds();
  ck_assert_uint_ge(h.n, 1);
  ck_assert_uint_le(h.expired, h.n);
  fixture_down(&a);
}
END_TEST

/* --ready-hold-rings 1, and another process's ring on the device:
 * replays whose ready write is behind wait on the worker, up to a bound.
 * A stream held far longer still gets its replays queued (their waits
 * then on the GPU), and they run, exact, once it goes. */
START_TEST(test_gpu_async_a_ready_write_held_past_the_bound_still_runs) {
  restart_holding_past_one_ring();
  int in;
  pid_t other = other_process_async(3, &in); /* f's ring is not the device's only one */
  fixture f;
  fixture_up(&f);
  copy_program(&f);
  copies_checked(&f, 20, 5);
  volatile uint64_t *flag = held_copy(&f, 9);
  graphd_binding b[2] = {{0, f.x[0].ptr, GN * 4}, {1, f.y[0].ptr, GN * 4}};
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(graphd_replay_async(f.c, f.s, f.pid, b, 2, NULL), GRAPHD_OK);
  usleep(50000); /* far past the bound: all five are queued on the GPU */
  graphd_async_info info;
  ck_assert_int_eq(graphd_replay_collect(f.c, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.queued, 0);
  ck_assert_msg(td_log_contains(&d, "--ready-hold-rings 1"), "no replay waited on the worker");
  release_checked(&f, flag, 9);
  copies_checked(&f, 20, 50);
  other_process_end(other, in);
  /* The held stream's next entry waited to the bound (200 us) and went on
   * the GPU all the same: counted as expired, with its time. */
  holds h = read_holds();
  ck_assert_uint_ge(h.expired, 1);
  ck_assert_uint_ge(h.n, h.expired);
  ck_assert_uint_ge(h.ns, 200000u * h.expired);
  fixture_down(&f);
}
END_TEST

/* --ready-hold-rings 1, and two sessions of this process on the device:
 * their rings share the process's order group, taken in its order, so
 * none of their entries waits on the worker, where a held head would
 * hold the group's other stream back too. One stream held (its ready
 * write not coming) has its replay queued with its wait on the GPU, and
 * the other session's replays behind it in the order run, exact, while
 * it is still held; then it runs too. */
START_TEST(test_gpu_async_rings_of_one_order_group_are_never_held) {
  restart_holding_past_one_ring();
  fixture a, b;
  fixture_up(&a);
  fixture_up(&b);
  copy_program(&a);
  copy_program(&b);
  copies_checked(&a, 20, 100);
  copies_checked(&b, 20, 200);
  volatile uint64_t *flag = held_copy(&a, 31);
  usleep(20000); /* a's entry is taken: past the hold's bound, were it held */
  copies_checked(&b, 100, 300);
  ck_assert_msg(!td_log_contains(&d, "wait on the worker for their ready writes"),
                "a ring of an order group with another ring waited on the worker");
  release_checked(&a, flag, 31);
  ck_assert_uint_eq(read_holds().n, 0);
  fixture_down(&a);
  fixture_down(&b);
}
END_TEST

/* --ready-hold-rings 1 with --ready-hold-max-us 0: every program costs
 * the worker more than 0 us to queue, so with two processes' rings on the
 * device no entry waits on the worker: another process's replays queue
 * their ready waits on the GPU ahead of their writes, all exact, while
 * this process's stream is held, and the log says why, once. */
START_TEST(test_gpu_async_a_program_costlier_than_the_bound_is_never_held) {
  restart_holding_past_one_ring_within("0");
  fixture a;
  fixture_up(&a);
  copy_program(&a);
  copies_checked(&a, 20, 3);
  volatile uint64_t *flag = held_copy(&a, 41);
  usleep(100000);
  int in;
  pid_t other = other_process_async(200, &in);
  ck_assert_msg(!td_log_contains(&d, "wait on the worker for their ready writes"),
                "a replay of a program over --ready-hold-max-us waited on the worker");
  ck_assert_msg(td_log_contains(&d, "us to queue a replay"),
                "the log does not say why the replays were not held");
  release_checked(&a, flag, 41);
  other_process_end(other, in);
  ck_assert_uint_eq(read_holds().n, 0);
  fixture_down(&a);
}
END_TEST

/* --idle-timeout 0.5: a session whose only replay waits on the GPU (its
 * stream held) for four times that sends nothing meanwhile, yet is not
 * idle: it keeps its session, and the replay runs, exact, once the stream
 * goes. */
START_TEST(test_gpu_async_a_session_with_a_replay_running_is_not_idle) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_start_again(&d, "--backend", "cuda", "--idle-timeout", "0.5", NULL);
  fixture a;
  fixture_up(&a);
  copy_program(&a);
  copies_checked(&a, 5, 8);
  uint64_t id = graphd_session_id(a.c);
  volatile uint64_t *flag = held_copy(&a, 61);
  usleep(2000000);
  ck_assert_msg(!td_log_contains(&d, "(--idle-timeout); closing"),
                "a session with a replay queued on the GPU was closed as idle");
  release_checked(&a, flag, 61);
  ck_assert_uint_eq(graphd_session_id(a.c), id);
  fixture_down(&a);
}
END_TEST

int main(void) {
  td_gpu_or_skip();
  td_gpu_kernels_or_skip();
  Suite *su = suite_create("gpu_async");
  TCase *tc = tcase_create("gpu_async");
  tcase_set_timeout(tc, 240);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_gpu_async_thousand_replays_over_changing_buffers_are_bit_exact);
  tcase_add_test(tc, test_gpu_async_chains_of_dependent_replays_are_exact);
  tcase_add_test(tc, test_gpu_async_replays_of_many_bindings_are_exact);
  tcase_add_test(tc, test_gpu_async_refused_entry_is_reported_and_releases_the_stream);
  tcase_add_test(tc, test_gpu_async_dead_daemon_with_entries_queued_releases_the_stream);
  tcase_add_test(tc, test_gpu_async_many_handles_in_one_process_all_finish);
  tcase_add_test(tc, test_gpu_async_wait_reports_the_replays_a_graceful_stop_dropped);
  tcase_add_test(tc, test_gpu_async_held_ring_and_sync_replay_let_another_client_through);
  tcase_add_test(tc, test_gpu_async_a_doorbell_the_client_made_blocking_does_not_wedge_the_worker);
  tcase_add_test(tc, test_gpu_async_every_replay_timed_while_the_worker_runs_ahead);
  tcase_add_test(tc,
                 test_gpu_async_replays_wait_on_the_worker_while_another_stream_waits_on_the_gpu);
  tcase_add_test(tc, test_gpu_async_a_ready_write_held_past_the_bound_still_runs);
  tcase_add_test(tc, test_gpu_async_rings_of_one_order_group_are_never_held);
  tcase_add_test(tc, test_gpu_async_a_program_costlier_than_the_bound_is_never_held);
  tcase_add_test(tc, test_gpu_async_a_session_with_a_replay_running_is_not_idle);
  suite_add_tcase(su, tc);
  return td_run_suite(su);
}
