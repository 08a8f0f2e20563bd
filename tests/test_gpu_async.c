/* Asynchronous replays (the submission ring) on a GPU: bit-exact results
 * over a thousand calls whose buffers change between VMM and legacy
 * memory, chains of dependent replays queued without waiting, a refused
 * entry reported by the next call with the stream released, and a daemon
 * killed with entries queued behind a held stream. Exits 77 without a
 * GPU. */
#define _GNU_SOURCE
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static void fixture_up(fixture *f) {
  ck_assert_msg(HAVE_CUDA_KERNELS, "the build made no CUDA test kernels (no nvcc)");
  ck_assert_int_eq(gpu_up(), 0);
  char err[GRAPHD_ERRMAX];
  f->c = gpu_session(d.socket, err, sizeof err);
  ck_assert_msg(f->c != NULL, "%s", err);
  ck_assert_int_eq(gpu_program(f->c, TEST_KERNEL_DIR, GRAPHD_MODE_STAGED, f->pid), GRAPHD_OK);
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

int main(void) {
  td_gpu_or_skip();
  Suite *su = suite_create("gpu_async");
  TCase *tc = tcase_create("gpu_async");
  tcase_set_timeout(tc, 240);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_gpu_async_thousand_replays_over_changing_buffers_are_bit_exact);
  tcase_add_test(tc, test_gpu_async_chains_of_dependent_replays_are_exact);
  tcase_add_test(tc, test_gpu_async_refused_entry_is_reported_and_releases_the_stream);
  tcase_add_test(tc, test_gpu_async_dead_daemon_with_entries_queued_releases_the_stream);
  suite_add_tcase(su, tc);
  return td_run_suite(su);
}
