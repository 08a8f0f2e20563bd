/* Captures and replays on a real GPU: a 3-kernel program with scratch and
 * an unstaged input, 1000 exact replays over changing VMM and legacy
 * buffers in both modes, a capture shared by a second process and
 * outliving its session, the kill tests with their release times
 * measured, and eviction: the memory given back, re-capture, and eviction
 * under load from several processes (figures printed as FIGURE lines).
 *
 * Fork mode: the Check parent never calls cuInit; other client processes
 * are exec'd (gpu_replay_client), never forked after CUDA is up. */
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

#include "gpu_common.h"
#include "program3.h"
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

static graphd_client *session(void) {
  ck_assert_int_eq(gpu_up(), 0);
  char err[GRAPHD_ERRMAX];
  graphd_client *c = gpu_session(d.socket, err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  return c;
}

static graphd_device_counters counters(graphd_client *c) { return td_device_info(c, 0).counters; }

/* Starts the helper client; returns its pid and a stream of its stdout. */
static pid_t spawn_client(const char *mode, const char *arg, FILE **out) {
  int pfd[2];
  ck_assert_int_eq(pipe(pfd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pfd[1], 1);
    close(pfd[0]);
    close(pfd[1]);
    execl(GPU_CLIENT_BIN, GPU_CLIENT_BIN, d.socket, TEST_KERNEL_DIR, mode, arg, (char *)NULL);
    _exit(127);
  }
  close(pfd[1]);
  *out = fdopen(pfd[0], "r");
  return pid;
}

static void expect_line(FILE *f, const char *want) {
  char line[512] = "";
  ck_assert_msg(fgets(line, sizeof line, f) != NULL, "the helper printed nothing");
  ck_assert_msg(strstr(line, want), "helper said: %s", line);
}

/* A session with the staged program registered, a stream, VMM buffers,
 * and the capture made by a first checked replay. */
typedef struct fixture {
  graphd_client *c;
  uint8_t pid[32];
  CUstream st;
  graphd_stream *s;
  gbuf x, y, cc;
} fixture;

/* With `shared`, the program without state (t a temp slot), whose one
 * instance sessions share when the budget has room for one only: the
 * tests of a client that holds others up run on it. */
static void fixture_open(fixture *f, unsigned seed, bool shared) {
  f->c = session();
  ck_assert_int_eq(
      (shared ? gpu_program_temp : gpu_program)(f->c, TEST_KERNEL_DIR, GRAPHD_MODE_STAGED, f->pid),
      GRAPHD_OK);
  ck_assert_int_eq(gcu->cuStreamCreate(&f->st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ck_assert_int_eq(graphd_stream_attach(f->c, f->st, &f->s), GRAPHD_OK);
  ck_assert_int_eq(gbuf_alloc(&f->x, GN * 4, 1), 0);
  ck_assert_int_eq(gbuf_alloc(&f->y, GN * 4, 1), 0);
  ck_assert_int_eq(gbuf_alloc(&f->cc, GN * 4, 1), 0);
  ck_assert_int_eq(
      gpu_replay_checked(f->c, f->s, f->st, f->pid, &f->x, &f->y, &f->cc, 1, seed, NULL),
      GRAPHD_OK);
}

static void fixture_up(fixture *f, unsigned seed) { fixture_open(f, seed, false); }
static void fixture_up_shared(fixture *f, unsigned seed) { fixture_open(f, seed, true); }

/* A session, a stream attached to it, and a program built by `make` in
 * each of the three modes (pid[m]). */
typedef graphd_status (*program_fn)(graphd_client *, const char *, graphd_mode, uint8_t[32]);
static graphd_client *three_modes(program_fn make, uint8_t pid[3][32], CUstream *st,
                                  graphd_stream **s) {
  ck_assert_msg(HAVE_CUDA_KERNELS, "the build made no CUDA test kernels (no nvcc)");
  graphd_client *c = session();
  static const graphd_mode modes[3] = {GRAPHD_MODE_STAGED, GRAPHD_MODE_STAGED_EX,
                                       GRAPHD_MODE_DIRECT};
  for (int m = 0; m < 3; m++)
    ck_assert_msg(make(c, TEST_KERNEL_DIR, modes[m], pid[m]) == GRAPHD_OK, "%s",
                  graphd_last_error(c));
  ck_assert_int_eq(gcu->cuStreamCreate(st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ck_assert_int_eq(graphd_stream_attach(c, *st, s), GRAPHD_OK);
  return c;
}

/* Memset and copy steps, aligned and not, bit exact in every mode on VMM
 * and legacy memory; in direct mode they run as graphd's fill and copy
 * kernels on the bound buffers, re-pointed as the buffers change. */
START_TEST(test_gpu_memset_and_copy_steps_are_exact_in_every_mode) {
  uint8_t pid[3][32];
  CUstream st;
  graphd_stream *s;
  graphd_client *c = three_modes(gpu_fill_copy_program, pid, &st, &s);
  gbuf x[2], y[2];
  for (int k = 0; k < 2; k++) {
    ck_assert_int_eq(gbuf_alloc(&x[k], GN * 4, k), 0);
    ck_assert_int_eq(gbuf_alloc(&y[k], GN * 4, 1 - k), 0);
  }
  static float x0[GN], gx[GN], gy[GN], wx[GN], wy[GN];
  for (int r = 0; r < 18; r++) {
    int m = r % 3, k = (r / 3) % 2;
    for (uint32_t i = 0; i < GN; i++) x0[i] = (float)(i * 7 % 1001) * 0.37f - 13.5f + (float)r;
    ck_assert_int_eq(gcu->cuMemcpyHtoDAsync(x[k].ptr, x0, GN * 4, st), CUDA_SUCCESS);
    ck_assert_int_eq(gcu->cuMemsetD32Async(y[k].ptr, 0xeeeeeeeeu, GN, st), CUDA_SUCCESS);
    graphd_binding b[2] = {{0, x[k].ptr, GN * 4}, {1, y[k].ptr, GN * 4}};
    ck_assert_msg(graphd_replay(c, s, pid[m], b, 2, NULL) == GRAPHD_OK, "%s", graphd_last_error(c));
    ck_assert_int_eq(gcu->cuMemcpyDtoHAsync(gx, x[k].ptr, GN * 4, st), CUDA_SUCCESS);
    ck_assert_int_eq(gcu->cuMemcpyDtoHAsync(gy, y[k].ptr, GN * 4, st), CUDA_SUCCESS);
    ck_assert_int_eq(gcu->cuStreamSynchronize(st), CUDA_SUCCESS);
    fill_copy_program_expect(x0, GN, wx, wy);
    ck_assert_msg(memcmp(gx, wx, sizeof wx) == 0, "replay %d, mode %d: x", r, m);
    ck_assert_msg(memcmp(gy, wy, sizeof wy) == 0, "replay %d, mode %d: y", r, m);
  }
  graphd_stream_detach(s);
  for (int k = 0; k < 2; k++) {
    gbuf_free(&x[k]);
    gbuf_free(&y[k]);
  }
  graphd_close(c);
}
END_TEST

/* Loops and branches as CUDA conditional nodes: each count of passes and
 * each side of the branch, bit exact, in every mode, on VMM and legacy
 * memory. */
START_TEST(test_gpu_conditional_loops_and_branches_are_exact) {
  uint8_t pid[3][32];
  CUstream st;
  graphd_stream *s;
  graphd_client *c = three_modes(gpu_cond_program, pid, &st, &s);
  gbuf x[2], ctl[2];
  for (int k = 0; k < 2; k++) {
    ck_assert_int_eq(gbuf_alloc(&x[k], GN * 4, k), 0);
    ck_assert_int_eq(gbuf_alloc(&ctl[k], 8, 1 - k), 0);
  }
  static float hx[GN], got[GN];
  uint32_t cases[][2] = {{3, 1}, {0, 0}, {17, 0}, {1, 1}, {0, 1}, {40, 1}};
  int n = 0;
  double t0 = now_ms();
  for (int m = 0; m < 3; m++)
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++, n++) {
      gbuf *bx = &x[n % 2], *bc = &ctl[(n / 2) % 2];
      for (uint32_t i = 0; i < GN; i++) hx[i] = (float)(i % 1000) * 0.37f - 150.0f;
      uint32_t hc[2] = {cases[k][0], cases[k][1]}, back[2];
      ck_assert_int_eq(gcu->cuMemcpyHtoDAsync(bx->ptr, hx, GN * 4, st), CUDA_SUCCESS);
      ck_assert_int_eq(gcu->cuMemcpyHtoDAsync(bc->ptr, hc, 8, st), CUDA_SUCCESS);
      graphd_binding b[2] = {{0, bx->ptr, GN * 4}, {1, bc->ptr, 8}};
      ck_assert_msg(graphd_replay(c, s, pid[m], b, 2, NULL) == GRAPHD_OK, "%s",
                    graphd_last_error(c));
      ck_assert_int_eq(gcu->cuMemcpyDtoHAsync(got, bx->ptr, GN * 4, st), CUDA_SUCCESS);
      ck_assert_int_eq(gcu->cuMemcpyDtoHAsync(back, bc->ptr, 8, st), CUDA_SUCCESS);
      ck_assert_int_eq(gcu->cuStreamSynchronize(st), CUDA_SUCCESS);
      for (uint32_t i = 0; i < GN; i++) {
        float want = cond_program_expect(hx[i], cases[k][0], cases[k][1]);
        ck_assert_msg(memcmp(&got[i], &want, 4) == 0, "mode %d case %zu: x[%u] = %.9g, want %.9g",
                      m, k, i, (double)got[i], (double)want);
      }
      ck_assert_uint_eq(back[0], 0);
      ck_assert_uint_eq(back[1], cases[k][1]);
    }
  printf(
      "FIGURE conditional steps: %d checked replays (loops of 0 to 40 passes, both branches, "
      "every mode) in %.1f ms\n",
      n, now_ms() - t0);
  graphd_stream_detach(s);
  for (int k = 0; k < 2; k++) {
    gbuf_free(&x[k]);
    gbuf_free(&ctl[k]);
  }
  graphd_close(c);
}
END_TEST

START_TEST(test_gpu_thousand_replays_over_vmm_and_legacy_are_bit_exact_in_every_mode) {
  ck_assert_msg(HAVE_CUDA_KERNELS, "the build made no CUDA test kernels (no nvcc)");
  graphd_client *c = session();
  static const graphd_mode modes[3] = {GRAPHD_MODE_STAGED, GRAPHD_MODE_STAGED_EX,
                                       GRAPHD_MODE_DIRECT};
  static const char *const names[3] = {"staged", "staged_ex", "direct"};
  static const int counts[3] = {1000, 300, 1000};
  uint8_t pid[3][32];
  for (int m = 0; m < 3; m++)
    ck_assert_int_eq(gpu_program(c, TEST_KERNEL_DIR, modes[m], pid[m]), GRAPHD_OK);
  CUstream st;
  ck_assert_int_eq(gcu->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, st, &s), GRAPHD_OK);
  gbuf x[4], y[4], cc;
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(gbuf_alloc(&x[i], GN * 4, i % 2), 0);     /* VMM, legacy, ... */
    ck_assert_int_eq(gbuf_alloc(&y[i], GN * 4, 1 - i % 2), 0); /* the other kind */
  }
  ck_assert_int_eq(gbuf_alloc(&cc, GN * 4, 1), 0);
  graphd_replay_info info;
  for (int m = 0; m < 3; m++) {
    double t0 = now_ms();
    for (int i = 0; i < counts[m]; i++) {
      /* Direct mode also walks through more binding sets than it keeps
       * executable graphs for, so its kernel nodes are re-pointed. */
      int xi = m == 2 ? (i * 3) % 4 : i % 4, yi = m == 2 ? (i / 4 + i) % 4 : (i + 1) % 4;
      graphd_status r =
          gpu_replay_checked(c, s, st, pid[m], &x[xi], &y[yi], &cc, i == 0, (unsigned)i, &info);
      ck_assert_msg(r == GRAPHD_OK, "%s replay %d: %s", names[m], i, graphd_last_error(c));
      if (i == 0) {
        ck_assert_int_eq(info.captured, 1);
        printf("FIGURE first replay (capture) %s: capture %.1f us on the daemon\n", names[m],
               (double)info.capture_ns / 1e3);
      } else {
        ck_assert_int_eq(info.captured, 0);
      }
    }
    printf("FIGURE %d checked replays (%s): %.1f ms, copies and checks included\n", counts[m],
           names[m], now_ms() - t0);
  }
  graphd_device_counters k = counters(c);
  ck_assert_uint_eq(k.captures, 3);
  ck_assert_uint_eq(k.replays, 2300);
  ck_assert_uint_eq(k.errors, 0);
  ck_assert_uint_eq(k.regions, 9);
  graphd_stream_detach(s);
  graphd_close(c);
  for (int i = 0; i < 4; i++) {
    gbuf_free(&x[i]);
    gbuf_free(&y[i]);
  }
  gbuf_free(&cc);
}
END_TEST

START_TEST(test_gpu_a_second_process_shares_the_capture_and_it_outlives_sessions) {
  graphd_client *c = session();
  uint8_t pid[32];
  ck_assert_int_eq(gpu_program(c, TEST_KERNEL_DIR, GRAPHD_MODE_STAGED, pid), GRAPHD_OK);
  CUstream st;
  gcu->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, st, &s), GRAPHD_OK);
  gbuf x, y, cc;
  gbuf_alloc(&x, GN * 4, 1);
  gbuf_alloc(&y, GN * 4, 0);
  gbuf_alloc(&cc, GN * 4, 0);
  ck_assert_int_eq(gpu_replay_checked(c, s, st, pid, &x, &y, &cc, 1, 1, NULL), GRAPHD_OK);
  FILE *out;
  pid_t child = spawn_client("share", "50", &out);
  /* Both processes replay the one capture at the same time. */
  for (int i = 0; i < 50; i++)
    ck_assert_int_eq(gpu_replay_checked(c, s, st, pid, &x, &y, &cc, 0, 100u + (unsigned)i, NULL),
                     GRAPHD_OK);
  expect_line(out, "captured=0 ok");
  fclose(out);
  int wst;
  waitpid(child, &wst, 0);
  ck_assert_int_eq(WEXITSTATUS(wst), 0);
  ck_assert_uint_eq(counters(c).captures_built, 1);
  graphd_stream_detach(s);
  graphd_close(c);
  /* The capture outlives the session that made it: a new process that
   * registers the same program replays at once, with no new capture. */
  child = spawn_client("share", "10", &out);
  expect_line(out, "captured=0 ok");
  fclose(out);
  waitpid(child, &wst, 0);
  ck_assert_int_eq(WEXITSTATUS(wst), 0);
  char err[GRAPHD_ERRMAX];
  graphd_client *c2 = gpu_session(d.socket, err, sizeof err);
  graphd_device_counters k = counters(c2);
  ck_assert_uint_eq(k.captures_built, 1);
  ck_assert_uint_eq(k.captures, 1);
  ck_assert_uint_eq(k.replays, 1 + 50 + 50 + 10);
  graphd_close(c2);
}
END_TEST

START_TEST(test_gpu_killed_client_stalls_nobody) {
  fixture f;
  fixture_up_shared(&f, 7);
  graphd_client *c = f.c;
  const uint8_t *pid = f.pid;
  CUstream st = f.st;
  graphd_stream *s = f.s;
  gbuf x = f.x, y = f.y, cc = f.cc;
  graphd_device_counters base = counters(c);
  FILE *out;
  pid_t child = spawn_client("hang", "shared", &out);
  expect_line(out, "hung");
  /* Our replay of the same instance (the budget has room for one) now
   * waits behind the hung one. */
  graphd_binding b[2] = {{0, x.ptr, GN * 4}, {3, y.ptr, GN * 4}};
  ck_assert_int_eq(graphd_replay(c, s, pid, b, 2, NULL), GRAPHD_OK);
  usleep(200000);
  ck_assert_int_eq(gcu->cuStreamQuery(st), CUDA_ERROR_NOT_READY);
  double t0 = now_ms();
  kill(child, SIGKILL);
  ck_assert_int_eq(gcu->cuStreamSynchronize(st), CUDA_SUCCESS);
  double released = now_ms() - t0;
  printf("FIGURE killed client: the other session's stream was released %.1f ms after SIGKILL\n",
         released);
  ck_assert_double_lt(released, 1000.0);
  waitpid(child, NULL, 0);
  fclose(out);
  /* The daemon is back at its baseline, and replays go on. */
  graphd_device_counters k;
  for (int i = 0;; i++) {
    k = counters(c);
    if ((k.sessions == base.sessions && k.regions == base.regions) || i > 200) break;
    usleep(10000);
  }
  ck_assert_uint_eq(k.sessions, base.sessions);
  ck_assert_uint_eq(k.regions, base.regions);
  ck_assert_uint_eq(k.inflight, 0);
  ck_assert_int_eq(gpu_replay_checked(c, s, st, pid, &x, &y, &cc, 0, 8, NULL), GRAPHD_OK);
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

START_TEST(test_gpu_dead_daemon_releases_the_client_stream) {
  fixture f;
  fixture_up(&f, 3);
  graphd_client *c = f.c;
  graphd_set_reconnect_wait(c, 0); /* the daemon stays dead: no waiting for another */
  const uint8_t *pid = f.pid;
  CUstream st = f.st;
  graphd_stream *s = f.s;
  gbuf x = f.x, y = f.y;
  /* Hold our stream so the next replay's ready write waits, then let the
   * replay be queued: our stream now waits on a done the daemon will
   * never write. */
  volatile uint64_t *flag = gpu_hold_stream(st);
  ck_assert_ptr_nonnull((void *)flag);
  graphd_binding b[2] = {{0, x.ptr, GN * 4}, {3, y.ptr, GN * 4}};
  ck_assert_int_eq(graphd_replay(c, s, pid, b, 2, NULL), GRAPHD_OK);
  double t0 = now_ms();
  kill(td_daemon_pid(&d), SIGKILL);
  __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
  ck_assert_int_eq(gcu->cuStreamSynchronize(st), CUDA_SUCCESS);
  double released = now_ms() - t0;
  printf("FIGURE dead daemon: the client's stream was released %.1f ms after SIGKILL\n", released);
  ck_assert_double_lt(released, 1000.0);
  ck_assert_int_eq(graphd_ping(c, NULL, 0), GRAPHD_UNAVAILABLE);
  ck_assert_msg(strstr(graphd_last_error(c), "undefined"), "%s", graphd_last_error(c));
  graphd_stream_detach(s);
  graphd_close(c);
  waitpid(d.pid, NULL, 0);
  d.pid = 0;
}
END_TEST

static void *set_flag_later(void *arg) {
  usleep(200000);
  __atomic_store_n((volatile uint64_t *)arg, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* The daemon dies while our stream is still behind the replay's ready
 * write and done wait. graphd_close must not unregister the flag page
 * under those queued operations (that would be an illegal address in this
 * process's context): it waits for the stream to get past them. */
START_TEST(test_gpu_close_after_daemon_death_waits_for_the_stream) {
  fixture f;
  fixture_up(&f, 4);
  graphd_set_reconnect_wait(f.c, 0); /* the daemon stays dead: no waiting for another */
  volatile uint64_t *flag = gpu_hold_stream(f.st);
  ck_assert_ptr_nonnull((void *)flag);
  graphd_binding b[2] = {{0, f.x.ptr, GN * 4}, {3, f.y.ptr, GN * 4}};
  ck_assert_int_eq(graphd_replay(f.c, f.s, f.pid, b, 2, NULL), GRAPHD_OK);
  kill(td_daemon_pid(&d), SIGKILL);
  waitpid(d.pid, NULL, 0);
  d.pid = 0;
  /* The next replay fails, with its own ready write already queued. */
  ck_assert_int_eq(graphd_replay(f.c, f.s, f.pid, b, 2, NULL), GRAPHD_UNAVAILABLE);
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, set_flag_later, (void *)flag), 0);
  double t0 = now_ms();
  graphd_stream_detach(f.s);
  graphd_close(f.c);
  double took = now_ms() - t0;
  pthread_join(th, NULL);
  printf("FIGURE close after the daemon died, stream held 200 ms: close took %.1f ms\n", took);
  ck_assert_double_gt(took, 150.0);
  ck_assert_double_lt(took, 2000.0);
  ck_assert_int_eq(gcu->cuStreamSynchronize(f.st), CUDA_SUCCESS);
  /* Our context is healthy: new work on the stream runs. */
  ck_assert_int_eq(gcu->cuMemsetD32Async(f.y.ptr, 7, GN, f.st), CUDA_SUCCESS);
  ck_assert_int_eq(gcu->cuStreamSynchronize(f.st), CUDA_SUCCESS);
  ck_assert_int_eq(gcu->cuStreamQuery(NULL), CUDA_SUCCESS);
  gpu_hold_free(flag);
}
END_TEST

/* Sticky GPU errors on the GPU: a replay whose kernel faults (illegal address)
 * fails that device's work, and the client's stream is released from the
 * host; this process's own context never notices. Then one of two things:
 * - the driver gives the daemon a fresh context: the device's epoch goes
 *   up, its sessions are closed, and a new session replays bit exact on a
 *   fresh capture;
 * - the driver refuses any new context in the daemon's process (CUDA 13 on
 *   the H200 does, as measured): graphd stops cleanly with exit status 3,
 *   for its service manager to restart it, and a new daemon serves at once.
 * Not under MPS: an MPS server spreads a fatal fault to every client on the
 * GPU, this process included, and takes no new client until they have all
 * exited. */
START_TEST(test_gpu_fault_is_contained_and_the_device_comes_back) {
  fixture f;
  fixture_up(&f, 30);
  graphd_client *ctl = td_control(&d);
  graphd_device_info before = td_device_info(ctl, 0);
  const char *wrap = getenv("GRAPHD_TEST_WRAPPER");
  if (before.mps_enabled || (wrap && strstr(wrap, "compute-sanitizer"))) {
    /* memcheck reports the fault on purpose as an error, failing its run. */
    printf(
        "NOTE the fault test runs neither under MPS (a fault reaches every MPS client) nor "
        "under compute-sanitizer\n");
    graphd_stream_detach(f.s);
    graphd_close(f.c);
    graphd_close(ctl);
    return;
  }
  uint8_t fp[32];
  ck_assert_int_eq(gpu_fault_program(f.c, TEST_KERNEL_DIR, fp), GRAPHD_OK);
  double t0 = now_ms();
  graphd_status st = graphd_replay(f.c, f.s, fp, NULL, 0, NULL);
  ck_assert_msg(st == GRAPHD_OK || st == GRAPHD_UNAVAILABLE, "%s: %s", graphd_status_name(st),
                graphd_last_error(f.c));
  /* Our stream waited on the faulted replay's done: it must be released. */
  ck_assert_int_eq(gcu->cuStreamSynchronize(f.st), CUDA_SUCCESS);
  double released = now_ms() - t0;
  /* Reset in place (the epoch goes up), or exit for a restart. */
  int wst = 0;
  pid_t gone = 0;
  graphd_device_info after = before;
  for (int i = 0; i < 1000 && !gone && after.epoch == before.epoch; i++) {
    usleep(10000);
    gone = waitpid(d.pid, &wst, WNOHANG);
    if (!gone && graphd_ping(ctl, NULL, 0) == GRAPHD_OK) after = td_device_info(ctl, 0);
  }
  double settled = now_ms() - t0;
  ck_assert(td_log_contains(&d, "CUDA_ERROR_ILLEGAL_ADDRESS"));
  ck_assert_int_eq(gcu->cuStreamQuery(NULL), CUDA_SUCCESS); /* our context is fine */
  graphd_stream_detach(f.s);
  graphd_close(f.c);
  graphd_close(ctl);
  if (gone == d.pid) {
    d.pid = 0;
    printf(
        "FIGURE GPU fault: client stream released after %.1f ms; the driver refused a new "
        "context, graphd exited with status %d after %.1f ms\n",
        released, WIFEXITED(wst) ? WEXITSTATUS(wst) : -1, settled);
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 3) td_log_print(&d, "");
    ck_assert(WIFEXITED(wst));
    ck_assert_int_eq(WEXITSTATUS(wst), 3);
    ck_assert(td_log_contains(&d, "exiting with status 3"));
    /* What the service manager does: start graphd again. */
    td_cleanup(&d);
    setup();
  } else {
    printf(
        "FIGURE GPU fault: client stream released after %.1f ms, device reset in place "
        "(epoch %llu) after %.1f ms\n",
        released, (unsigned long long)after.epoch, settled);
    if (after.epoch != before.epoch + 1 || strcmp(after.state, "ok") != 0) td_log_print(&d, "");
    ck_assert_uint_eq(after.epoch, before.epoch + 1);
    ck_assert_str_eq(after.state, "ok");
    ck_assert_uint_eq(after.counters.captures, 0);
  }
  /* A new session captures afresh and is exact. */
  fixture g;
  fixture_up(&g, 31);
  graphd_replay_info info;
  ck_assert_int_eq(gpu_replay_checked(g.c, g.s, g.st, g.pid, &g.x, &g.y, &g.cc, 1, 32, &info),
                   GRAPHD_OK);
  ck_assert_int_eq(info.captured, 0);
  ck_assert_uint_eq(counters(g.c).captures, 1);
  graphd_stream_detach(g.s);
  graphd_close(g.c);
}
END_TEST

static uint64_t free_now(graphd_client *c) { return td_device_info(c, 0).free_memory; }

/* Eviction gives the device memory back. The daemon's own
 * accounting is exact (staging is one VMM allocation per capture), and the
 * device's free memory moves by that much within 2 MiB plus what the graph
 * exec and the module hold (allowed 8 MiB here; the figure is printed).
 * The next replay captures again and is bit exact. Needs a quiet GPU. */
START_TEST(test_gpu_eviction_gives_the_memory_back_and_recaptures) {
  fixture f;
  fixture_up(&f, 11);
  graphd_device_counters k = counters(f.c);
  ck_assert_uint_eq(k.captures, 1);
  uint64_t held = k.staging_bytes;
  ck_assert_uint_ge(held, 4ull * GN * 4); /* four slots of GN floats */
  graphd_capture_info *ci;
  size_t n;
  ck_assert_int_eq(graphd_list_captures(f.c, &ci, &n), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(ci[0].staging_bytes, held);
  ck_assert_int_eq(ci[0].busy, 0); /* the checked replay synchronised */
  free(ci);
  uint64_t before = free_now(f.c);
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.client_pid = (uint32_t)getpid();
  uint64_t bytes;
  ck_assert_int_eq(graphd_evict(f.c, &o, NULL, &n, &bytes), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(bytes, held);
  uint64_t after = free_now(f.c);
  int64_t delta = (int64_t)(after - before);
  printf("FIGURE eviction: %llu staging bytes reported freed, cuMemGetInfo free +%lld bytes\n",
         (unsigned long long)bytes, (long long)delta);
  ck_assert_msg(delta >= (int64_t)bytes - (2 << 20) && delta <= (int64_t)bytes + (10 << 20),
                "free memory moved by %lld for %llu bytes evicted", (long long)delta,
                (unsigned long long)bytes);
  k = counters(f.c);
  ck_assert_uint_eq(k.captures, 0);
  ck_assert_uint_eq(k.staging_bytes, 0);
  ck_assert_uint_eq(k.evictions, 1);
  graphd_replay_info info;
  for (unsigned i = 0; i < 50; i++) {
    ck_assert_int_eq(
        gpu_replay_checked(f.c, f.s, f.st, f.pid, &f.x, &f.y, &f.cc, 1, 200 + i, &info), GRAPHD_OK);
    ck_assert_int_eq(info.captured, i == 0);
  }
  k = counters(f.c);
  ck_assert_uint_eq(k.recaptures, 1);
  ck_assert_uint_eq(k.staging_bytes, held);
  ck_assert_uint_eq(k.errors, 0);
  graphd_stream_detach(f.s);
  graphd_close(f.c);
}
END_TEST

/* Eviction under load. Three client processes replay the one
 * shared capture (checking every output) while this process, an admin
 * (the daemon's uid), evicts everything again and again. */
START_TEST(test_gpu_eviction_under_load_from_several_processes) {
  graphd_client *c = session();
  FILE *out[3];
  pid_t kid[3];
  for (int i = 0; i < 3; i++) kid[i] = spawn_client("share", "2000", &out[i]);
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.all = 1;
  /* Evict again and again for as long as any client still runs: their
   * start-up with CUDA takes longer than a fixed number of rounds would. */
  uint64_t evicted = 0;
  int wst[3] = {0, 0, 0}, done[3] = {0, 0, 0}, running = 3;
  double t0 = now_ms();
  while (running > 0) {
    ck_assert_msg(now_ms() - t0 < 60000.0, "the clients did not finish within 60 s");
    size_t n;
    uint64_t bytes;
    ck_assert_int_eq(graphd_evict(c, &o, NULL, &n, &bytes), GRAPHD_OK);
    evicted += n;
    usleep(2000);
    for (int i = 0; i < 3; i++) {
      int st;
      if (!done[i] && waitpid(kid[i], &st, WNOHANG) == kid[i]) {
        done[i] = 1;
        wst[i] = st;
        running--;
      }
    }
  }
  for (int i = 0; i < 3; i++) {
    expect_line(out[i], " ok");
    fclose(out[i]);
    ck_assert(WIFEXITED(wst[i]));
    ck_assert_int_eq(WEXITSTATUS(wst[i]), 0);
  }
  graphd_device_counters k = counters(c);
  printf("FIGURE eviction under load: %llu evictions, %llu captures built, %llu replays\n",
         (unsigned long long)k.evictions, (unsigned long long)k.captures_built,
         (unsigned long long)k.replays);
  ck_assert_uint_eq(k.evictions, evicted);
  ck_assert_uint_ge(evicted, 1);
  ck_assert_uint_eq(k.replays, 3 * 2000);
  ck_assert_uint_eq(k.errors, 0);
  ck_assert_uint_eq(k.captures_built, k.evictions + k.captures);
  graphd_close(c);
}
END_TEST

/* A 1 s ready timeout, and a budget with room for one instance of the
 * tests' programs (2 MiB of staging each), so that sessions replaying the
 * program without state share it. */
static void setup_timeout(void) {
  td_start(&d, "--backend", "cuda", "--ready-timeout", "1", "--device-budget", "2M", NULL);
}
static void setup_shared(void) { td_start(&d, "--backend", "cuda", "--device-budget", "2M", NULL); }

static uint64_t sessions_now(graphd_client *c) {
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  uint64_t n = s->sessions;
  graphd_daemon_status_free(s);
  return n;
}

START_TEST(test_gpu_hung_client_is_cut_off_only_when_it_blocks_someone) {
  fixture f;
  fixture_up_shared(&f, 21);
  graphd_client *c = f.c;
  const uint8_t *pid = f.pid;
  CUstream st = f.st;
  graphd_stream *s = f.s;
  gbuf x = f.x, y = f.y, cc = f.cc;
  FILE *out;
  pid_t child = spawn_client("hang", "shared", &out);
  expect_line(out, "hung");
  /* Past the 1 s ready timeout, but blocking nobody: left alone. */
  usleep(1500000);
  ck_assert_uint_eq(sessions_now(c), 2);
  ck_assert(!td_log_contains(&d, "is hung"));
  /* Now a replay of the same capture waits behind it: it is cut off. */
  graphd_binding b[2] = {{0, x.ptr, GN * 4}, {3, y.ptr, GN * 4}};
  double t0 = now_ms();
  ck_assert_int_eq(graphd_replay(c, s, pid, b, 2, NULL), GRAPHD_OK);
  ck_assert_int_eq(gcu->cuStreamSynchronize(st), CUDA_SUCCESS);
  double released = now_ms() - t0;
  printf(
      "FIGURE hung client (alive, 1 s ready timeout already passed): the session behind it "
      "was released %.1f ms after its replay was queued\n",
      released);
  ck_assert_double_lt(released, 1000.0);
  for (int i = 0; i < 100 && sessions_now(c) != 1; i++) usleep(10000);
  ck_assert_uint_eq(sessions_now(c), 1);
  ck_assert(td_log_contains(&d, "is hung"));
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  fclose(out);
  /* Replays go on. */
  ck_assert_int_eq(gpu_replay_checked(c, s, st, pid, &x, &y, &cc, 0, 22, NULL), GRAPHD_OK);
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

/* A client whose ready word stands 2^63 ahead of its replay's seq: the
 * GPU's wait compares cyclically and keeps waiting, and so must the
 * daemon's watch, which cuts it off once a replay of the same capture
 * waits behind it; the release it writes lets both run. */
START_TEST(test_gpu_a_ready_word_two_to_the_63_ahead_is_cut_off_as_hung) {
  fixture f;
  fixture_up_shared(&f, 41);
  FILE *out;
  pid_t child = spawn_client("hostile", "shared", &out);
  expect_line(out, "hostile");
  double t0 = now_ms();
  ck_assert_int_eq(gpu_replay_checked(f.c, f.s, f.st, f.pid, &f.x, &f.y, &f.cc, 0, 42, NULL),
                   GRAPHD_OK);
  double released = now_ms() - t0;
  printf(
      "FIGURE ready word 2^63 ahead (1 s ready timeout): the replay behind it ran %.1f ms "
      "later\n",
      released);
  ck_assert_double_lt(released, 5000.0);
  for (int i = 0; i < 100 && sessions_now(f.c) != 1; i++) usleep(10000);
  ck_assert_uint_eq(sessions_now(f.c), 1);
  ck_assert(td_log_contains(&d, "released from the host and cut off"));
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  fclose(out);
  ck_assert_int_eq(gpu_replay_checked(f.c, f.s, f.st, f.pid, &f.x, &f.y, &f.cc, 0, 43, NULL),
                   GRAPHD_OK);
  graphd_stream_detach(f.s);
  graphd_close(f.c);
}
END_TEST

/* The same client killed before anyone waits behind it: the release at
 * its session's end must free its stream's wait, though the word it left
 * is behind "the word plus a margin" too; the worker drains that stream
 * and serves the next replay at once, with no device reset. */
START_TEST(test_gpu_a_killed_client_with_a_hostile_ready_word_is_released_at_its_end) {
  fixture f;
  fixture_up_shared(&f, 51);
  FILE *out;
  pid_t child = spawn_client("hostile", "shared", &out);
  expect_line(out, "hostile");
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  fclose(out);
  for (int i = 0; i < 200 && sessions_now(f.c) != 1; i++) usleep(10000);
  ck_assert_uint_eq(sessions_now(f.c), 1);
  double t0 = now_ms();
  ck_assert_int_eq(gpu_replay_checked(f.c, f.s, f.st, f.pid, &f.x, &f.y, &f.cc, 0, 52, NULL),
                   GRAPHD_OK);
  double took = now_ms() - t0;
  printf("FIGURE killed client with its ready word 2^63 ahead: the next replay took %.1f ms\n",
         took);
  ck_assert_double_lt(took, 1000.0);
  ck_assert(!td_log_contains(&d, "resetting the device"));
  graphd_device_info info = td_device_info(f.c, 0);
  ck_assert_uint_eq(info.epoch, 0);
  graphd_stream_detach(f.s);
  graphd_close(f.c);
}
END_TEST

/* A replay waiting for a ready write that never comes, then the same
 * client unregisters the region it uses: the release job waits for the
 * client's stream on the worker. Past the ready timeout the hung session is
 * cut off, so the worker (and every other session of the device) goes on.
 * (Before, the worker waited for that stream for good.) */
START_TEST(test_gpu_unregister_behind_a_hung_replay_does_not_hold_the_worker) {
  fixture f;
  fixture_up_shared(&f, 61);
  FILE *out;
  pid_t child = spawn_client("hang-forget", "shared", &out);
  expect_line(out, "hung");
  usleep(200000); /* its forget is with the worker */
  double t0 = now_ms();
  ck_assert_int_eq(gpu_replay_checked(f.c, f.s, f.st, f.pid, &f.x, &f.y, &f.cc, 0, 62, NULL),
                   GRAPHD_OK);
  double took = now_ms() - t0;
  printf(
      "FIGURE unregister behind a hung replay (1 s ready timeout): another session's replay "
      "ran %.1f ms later\n",
      took);
  ck_assert_double_lt(took, 5000.0);
  expect_line(out, "forget");
  for (int i = 0; i < 100 && sessions_now(f.c) != 1; i++) usleep(10000);
  ck_assert_uint_eq(sessions_now(f.c), 1);
  ck_assert(td_log_contains(&d, "while the device's worker waited behind it"));
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  fclose(out);
  graphd_stream_detach(f.s);
  graphd_close(f.c);
}
END_TEST

/* An admin evicts the capture a hung client's replay still waits to run:
 * the eviction waits for that replay on the worker; past the ready timeout
 * the client is cut off and the eviction and the replays behind it go on. */
START_TEST(test_gpu_evicting_a_hung_replays_capture_does_not_hold_the_worker) {
  fixture f;
  fixture_up_shared(&f, 71);
  FILE *out;
  pid_t child = spawn_client("hang", "shared", &out);
  expect_line(out, "hung");
  graphd_client *ctl = td_control(&d);
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.client_pid = (uint32_t)child;
  size_t n;
  uint64_t bytes;
  ck_assert_int_eq(graphd_evict(ctl, &o, NULL, &n, &bytes), GRAPHD_OK);
  graphd_close(ctl); /* sessions_now counts the sessions left: ours and the hung one's */
  double t0 = now_ms();
  /* The capture went: the replay that captures again binds c. */
  ck_assert_int_eq(gpu_replay_checked(f.c, f.s, f.st, f.pid, &f.x, &f.y, &f.cc, 1, 72, NULL),
                   GRAPHD_OK);
  double took = now_ms() - t0;
  printf(
      "FIGURE eviction of a hung replay's capture (1 s ready timeout): the next replay ran "
      "%.1f ms later\n",
      took);
  ck_assert_double_lt(took, 5000.0);
  fflush(stdout);
  for (int i = 0; i < 300 && sessions_now(f.c) != 1; i++) usleep(10000);
  if (sessions_now(f.c) != 1) {
    td_log_print(&d, "");
    fflush(stdout);
  }
  ck_assert_uint_eq(sessions_now(f.c), 1);
  ck_assert_uint_ge(counters(f.c).evictions, 1);
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  fclose(out);
  graphd_stream_detach(f.s);
  graphd_close(f.c);
}
END_TEST

static void setup_budget(void) {
  td_start(&d, "--backend", "cuda", "--ready-timeout", "1", "--device-budget", "3M", NULL);
}

/* The budget fits one capture of these programs. A hung client's capture
 * holds it, busy with a replay whose ready write never comes: another
 * program's first replay is refused for want of room, but past the ready
 * timeout the hung client is cut off, its capture goes idle, and a retry
 * finds room. (Before, the busy capture held the budget for good.) */
START_TEST(test_gpu_a_hung_replay_does_not_hold_the_budget_for_good) {
  FILE *out;
  pid_t child = spawn_client("hang", "", &out);
  expect_line(out, "hung");
  graphd_client *c = session();
  uint8_t pid[32];
  ck_assert_int_eq(gpu_program(c, TEST_KERNEL_DIR, GRAPHD_MODE_STAGED_EX, pid), GRAPHD_OK);
  CUstream st;
  graphd_stream *s;
  ck_assert_int_eq(gcu->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ck_assert_int_eq(graphd_stream_attach(c, st, &s), GRAPHD_OK);
  gbuf x, y, cc;
  ck_assert_int_eq(gbuf_alloc(&x, GN * 4, 1), 0);
  ck_assert_int_eq(gbuf_alloc(&y, GN * 4, 1), 0);
  ck_assert_int_eq(gbuf_alloc(&cc, GN * 4, 1), 0);
  /* Each try binds and fills c, which the replay that captures copies. */
  double t0 = now_ms();
  graphd_status r = gpu_replay_checked(c, s, st, pid, &x, &y, &cc, 1, 81, NULL);
  ck_assert_msg(r == GRAPHD_RESOURCE_EXHAUSTED, "%s", graphd_last_error(c));
  int refused = 1;
  while (r == GRAPHD_RESOURCE_EXHAUSTED && now_ms() - t0 < 10000) {
    usleep(100000);
    r = gpu_replay_checked(c, s, st, pid, &x, &y, &cc, 1, 82, NULL);
    refused += r == GRAPHD_RESOURCE_EXHAUSTED;
  }
  double took = now_ms() - t0;
  printf(
      "FIGURE budget held by a hung replay (1 s ready timeout): room after %.1f ms, %d "
      "refusals\n",
      took, refused);
  fflush(stdout);
  ck_assert_msg(r == GRAPHD_OK, "%s", graphd_last_error(c));
  ck_assert_double_lt(took, 5000.0);
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  fclose(out);
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

/* Two sessions replay one program with state (its scratch slot) on the
 * GPU: each has an instance of its own, so one held back by its ready
 * write does not hold the other, whose replay runs and is exact while the
 * first still waits. (With one instance, the second waited behind it.) */
START_TEST(test_gpu_sessions_of_a_program_with_state_run_at_once) {
  fixture a, b;
  fixture_up(&a, 91);
  fixture_up(&b, 92);
  volatile uint64_t *flag = gpu_hold_stream(a.st);
  ck_assert_ptr_nonnull((void *)flag);
  graphd_binding ba[2] = {{0, a.x.ptr, GN * 4}, {3, a.y.ptr, GN * 4}};
  ck_assert_int_eq(graphd_replay(a.c, a.s, a.pid, ba, 2, NULL), GRAPHD_OK);
  double t0 = now_ms();
  ck_assert_int_eq(gpu_replay_checked(b.c, b.s, b.st, b.pid, &b.x, &b.y, &b.cc, 0, 93, NULL),
                   GRAPHD_OK);
  double took = now_ms() - t0;
  printf(
      "FIGURE a session's replay while another session's instance waits for its ready "
      "write: %.1f ms\n",
      took);
  ck_assert_double_lt(took, 2000.0);
  ck_assert_int_eq(gcu->cuStreamQuery(a.st), CUDA_ERROR_NOT_READY); /* a still waits */
  __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
  ck_assert_int_eq(gcu->cuStreamSynchronize(a.st), CUDA_SUCCESS);
  ck_assert_int_eq(gpu_replay_checked(a.c, a.s, a.st, a.pid, &a.x, &a.y, &a.cc, 0, 94, NULL),
                   GRAPHD_OK);
  ck_assert_uint_eq(counters(a.c).captures_built, 1);
  graphd_stream_detach(a.s);
  graphd_stream_detach(b.s);
  graphd_close(a.c);
  graphd_close(b.c);
}
END_TEST

typedef struct late_replay {
  fixture *f;
  graphd_status st;
  double returned_ms;
} late_replay;

static void *replay_in_thread(void *arg) {
  late_replay *l = arg;
  graphd_binding b[2] = {{0, l->f->x.ptr, GN * 4}, {3, l->f->y.ptr, GN * 4}};
  l->st = graphd_replay(l->f->c, l->f->s, l->f->pid, b, 2, NULL);
  l->returned_ms = now_ms();
  return NULL;
}

/* --max-inflight-replays 4 on the GPU: a client whose stream is held runs
 * four replays ahead; the fifth call waits in the daemon (the loop and
 * the worker stay free for others) until the stream moves, then everything completes in
 * order and exactly. */
START_TEST(test_gpu_replays_past_the_inflight_limit_wait_for_the_stream) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
  td_start(&d, "--backend", "cuda", "--max-inflight-replays", "4", NULL);
  fixture f;
  fixture_up(&f, 6);
  volatile uint64_t *flag = gpu_hold_stream(f.st);
  ck_assert_ptr_nonnull((void *)flag);
  graphd_binding b[2] = {{0, f.x.ptr, GN * 4}, {3, f.y.ptr, GN * 4}};
  for (int i = 0; i < 4; i++)
    ck_assert_msg(graphd_replay(f.c, f.s, f.pid, b, 2, NULL) == GRAPHD_OK, "%s",
                  graphd_last_error(f.c));
  late_replay l = {.f = &f};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, replay_in_thread, &l), 0);
  usleep(300000);
  ck_assert_double_eq(l.returned_ms, 0); /* still held */
  /* The daemon serves others meanwhile. */
  graphd_client *ctl = td_control(&d);
  ck_assert_uint_eq(td_device_info(ctl, 0).counters.inflight, 1); /* the held one */
  graphd_close(ctl);
  double t0 = now_ms();
  __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
  pthread_join(th, NULL);
  ck_assert_msg(l.st == GRAPHD_OK, "%s", graphd_last_error(f.c));
  printf("FIGURE held replay (4 in flight): answered %.1f ms after the stream moved\n",
         l.returned_ms - t0);
  ck_assert_int_eq(gcu->cuStreamSynchronize(f.st), CUDA_SUCCESS);
  ck_assert_int_eq(gpu_replay_checked(f.c, f.s, f.st, f.pid, &f.x, &f.y, &f.cc, 1, 8, NULL),
                   GRAPHD_OK);
  gpu_hold_free(flag);
}
END_TEST

/* --- a graceful restart -------------------------------------------------------- */

typedef struct looper {
  graphd_client *c;
  graphd_stream *s;
  CUstream st;
  uint8_t pid[32];
  gbuf x, y, cc;
  int total;
  atomic_int done, fails;
  graphd_status first_fail;
  char first_err[GRAPHD_ERRMAX];
} looper;

static void *replay_loop(void *arg) {
  looper *l = arg;
  (void)gpu_up(); /* this thread's context */
  for (int i = 0; i < l->total; i++) {
    graphd_status r = gpu_replay_checked(l->c, l->s, l->st, l->pid, &l->x, &l->y, &l->cc, 1,
                                         500u + (unsigned)i, NULL);
    if (r != GRAPHD_OK && atomic_fetch_add(&l->fails, 1) == 0) {
      l->first_fail = r;
      snprintf(l->first_err, sizeof l->first_err, "replay %d: %s", i, graphd_last_error(l->c));
    }
    atomic_fetch_add(&l->done, 1);
  }
  return NULL;
}

/* graphd is stopped with SIGTERM while a client replays in a loop on its
 * GPU, and a new graphd is started on the same socket: the client goes on
 * without a failed, lost or wrong replay. The old daemon finishes what it
 * took (its streams drain before anything is freed), what it had not
 * started is sent again, and the new daemon takes the flag page with the
 * words where the old one left them. */
START_TEST(test_gpu_replays_go_on_across_a_restart) {
  static looper l;
  memset(&l, 0, sizeof l);
  l.total = 600;
  l.c = session();
  ck_assert_int_eq(gpu_program_in_registry(l.c, TEST_KERNEL_DIR, GRAPHD_MODE_STAGED, l.pid),
                   GRAPHD_OK);
  ck_assert_int_eq(gcu->cuStreamCreate(&l.st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ck_assert_int_eq(graphd_stream_attach(l.c, l.st, &l.s), GRAPHD_OK);
  ck_assert_int_eq(gbuf_alloc(&l.x, GN * 4, 1), 0); /* VMM */
  ck_assert_int_eq(gbuf_alloc(&l.y, GN * 4, 0), 0); /* legacy */
  ck_assert_int_eq(gbuf_alloc(&l.cc, GN * 4, 1), 0);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, replay_loop, &l), 0);
  while (atomic_load(&l.done) < 200 && !atomic_load(&l.fails)) usleep(1000);
  double t0 = now_ms();
  int st = td_stop(&d);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "graphd stopped with status %d", st);
  double stop_ms = now_ms() - t0;
  int at_stop = atomic_load(&l.done);
  /* The stop waited for the device's streams (a driver entry point called
   * at the wrong ABI made this fail with CONTEXT_IS_DESTROYED). */
  ck_assert_msg(!td_log_contains(&d, "finishing its streams at stop failed"),
                "graphd could not finish its streams at stop");
  usleep(200000); /* the client waits for the socket meanwhile */
  td_start_again(&d, "--backend", "cuda", NULL);
  pthread_join(t, NULL);
  ck_assert_msg(!atomic_load(&l.fails), "%d replays failed; the first (%d): %s",
                atomic_load(&l.fails), (int)l.first_fail, l.first_err);
  graphd_device_counters k = counters(l.c);
  ck_assert_uint_gt(k.replays, 0);
  ck_assert_uint_le(k.replays, (uint64_t)(l.total - at_stop) + 1);
  ck_assert_uint_eq(k.captures_built, 1);
  ck_assert_uint_eq(k.errors, 0);
  printf(
      "FIGURE restart on the GPU: SIGTERM to exit %.1f ms; %d checked replays before it, %llu "
      "on the new daemon, none failed\n",
      stop_ms, at_stop, (unsigned long long)k.replays);
  graphd_stream_detach(l.s);
  graphd_close(l.c);
  gbuf_free(&l.x);
  gbuf_free(&l.y);
  gbuf_free(&l.cc);
}
END_TEST

int main(void) {
  td_gpu_or_skip();
  td_gpu_kernels_or_skip();
  Suite *su = suite_create("gpu_replay");
  TCase *tc = tcase_create("gpu_replay");
  tcase_set_timeout(tc, 240);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_gpu_thousand_replays_over_vmm_and_legacy_are_bit_exact_in_every_mode);
  tcase_add_test(tc, test_gpu_conditional_loops_and_branches_are_exact);
  tcase_add_test(tc, test_gpu_memset_and_copy_steps_are_exact_in_every_mode);
  tcase_add_test(tc, test_gpu_a_second_process_shares_the_capture_and_it_outlives_sessions);
  tcase_add_test(tc, test_gpu_sessions_of_a_program_with_state_run_at_once);
  tcase_add_test(tc, test_gpu_dead_daemon_releases_the_client_stream);
  tcase_add_test(tc, test_gpu_close_after_daemon_death_waits_for_the_stream);
  tcase_add_test(tc, test_gpu_eviction_gives_the_memory_back_and_recaptures);
  tcase_add_test(tc, test_gpu_eviction_under_load_from_several_processes);
  tcase_add_test(tc, test_gpu_replays_past_the_inflight_limit_wait_for_the_stream);
  tcase_add_test(tc, test_gpu_replays_go_on_across_a_restart);
  tcase_add_test(tc, test_gpu_fault_is_contained_and_the_device_comes_back);
  suite_add_tcase(su, tc);
  TCase *th = tcase_create("gpu_replay_hung");
  tcase_set_timeout(th, 120);
  tcase_add_checked_fixture(th, setup_timeout, teardown);
  tcase_add_test(th, test_gpu_hung_client_is_cut_off_only_when_it_blocks_someone);
  tcase_add_test(th, test_gpu_a_ready_word_two_to_the_63_ahead_is_cut_off_as_hung);
  tcase_add_test(th, test_gpu_a_killed_client_with_a_hostile_ready_word_is_released_at_its_end);
  tcase_add_test(th, test_gpu_unregister_behind_a_hung_replay_does_not_hold_the_worker);
  tcase_add_test(th, test_gpu_evicting_a_hung_replays_capture_does_not_hold_the_worker);
  suite_add_tcase(su, th);
  TCase *tk = tcase_create("gpu_replay_shared");
  tcase_set_timeout(tk, 120);
  tcase_add_checked_fixture(tk, setup_shared, teardown);
  tcase_add_test(tk, test_gpu_killed_client_stalls_nobody);
  suite_add_tcase(su, tk);
  TCase *tb = tcase_create("gpu_replay_budget");
  tcase_set_timeout(tb, 120);
  tcase_add_checked_fixture(tb, setup_budget, teardown);
  tcase_add_test(tb, test_gpu_a_hung_replay_does_not_hold_the_budget_for_good);
  suite_add_tcase(su, tb);
  return td_run_suite(su);
}
