/* A second client process for the GPU replay tests.
 *   gpu_replay_client SOCKET KERNEL_DIR share N  -- replays N times, prints
 *       "captured=<0|1> ok" and exits 0
 *   gpu_replay_client SOCKET KERNEL_DIR hang     -- replays once, then
 *       blocks its stream on a flag nobody writes, issues another replay,
 *       prints "hung" and waits to be killed
 *   gpu_replay_client SOCKET KERNEL_DIR hostile  -- as hang, then writes
 *       its ready word 2^63 ahead of that replay's seq (behind it, for the
 *       GPU's cyclic compare), prints "hostile" and waits to be killed
 *   gpu_replay_client SOCKET KERNEL_DIR hang-forget -- as hang, then
 *       prints "hung", unregisters its output's region (graphd_region_forget,
 *       whose job waits for its stream), prints "forget <status>" and waits
 *   gpu_replay_client SOCKET KERNEL_DIR loop     -- replays until killed,
 *       printing "running" after the first 20
 *   gpu_replay_client SOCKET KERNEL_DIR async N  -- N asynchronous replays
 *       of a copy (y = x, new x each), the last output checked bit for bit;
 *       prints "async ok", then keeps its session (and its ring) until its
 *       standard input closes */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../client/lib/internal.h"
#include "gpu_common.h"

static int fail(const char *what, graphd_client *c) {
  printf("FAIL %s: %s\n", what, c ? graphd_last_error(c) : "");
  fflush(stdout);
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (gpu_up() < 0) return fail("cuda", NULL);
  char err[GRAPHD_ERRMAX];
  graphd_client *c = gpu_session(argv[1], err, sizeof err);
  if (!c) {
    printf("FAIL connect: %s\n", err);
    return 1;
  }
  uint8_t pid[32];
  /* "shared" as the argument: the program without state, whose instance
   * the test's own session shares when the budget has room for one. */
  int shared = argc > 4 && strcmp(argv[4], "shared") == 0;
  if ((shared ? gpu_program_temp : gpu_program)(c, argv[2], GRAPHD_MODE_STAGED, pid) != GRAPHD_OK)
    return fail("program", c);
  CUstream st;
  gcu->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING);
  graphd_stream *s;
  if (graphd_stream_attach(c, st, &s) != GRAPHD_OK) return fail("attach", c);
  gbuf x, y, cc;
  /* A hung client dies with its replay still queued in the daemon: its
   * memory must be VMM, which the daemon's import keeps alive. */
  int legacy_y = strncmp(argv[3], "hang", 4) != 0 && strcmp(argv[3], "hostile") != 0;
  if (gbuf_alloc(&x, GN * 4, 1) || gbuf_alloc(&y, GN * 4, !legacy_y) || gbuf_alloc(&cc, GN * 4, 1))
    return fail("alloc", NULL);
  graphd_replay_info info;
  const char *mode = argv[3];
  if (strcmp(mode, "share") == 0) {
    int n = argc > 4 ? atoi(argv[4]) : 10;
    int captured = 0;
    for (int i = 0; i < n; i++) {
      if (gpu_replay_checked(c, s, st, pid, &x, &y, &cc, 1, 1000u + (unsigned)i, &info) !=
          GRAPHD_OK)
        return fail("replay", c);
      captured |= info.captured;
    }
    printf("captured=%d ok\n", captured);
  } else if (strncmp(mode, "hang", 4) == 0 || strcmp(mode, "hostile") == 0) {
    if (gpu_replay_checked(c, s, st, pid, &x, &y, &cc, 1, 1, &info) != GRAPHD_OK)
      return fail("replay", c);
    /* Block the stream: the ready write of the next replay sits behind it,
     * so the daemon's stream waits for a ready value that never comes. */
    if (!gpu_hold_stream(st)) return fail("hold the stream", NULL);
    graphd_binding b[2] = {{0, x.ptr, GN * 4}, {3, y.ptr, GN * 4}};
    if (graphd_replay(c, s, pid, b, 2, NULL) != GRAPHD_OK) return fail("hung replay", c);
    if (strcmp(mode, "hostile") == 0) {
      volatile uint64_t *ready = gd_flag_word(c->flags, s->slot, GRAPHD_FLAG_WORD_READY);
      __atomic_store_n(ready, s->seq + (1ull << 63), __ATOMIC_RELEASE);
      printf("hostile\n");
    } else {
      printf("hung\n");
    }
    if (strcmp(mode, "hang-forget") == 0)
      printf("forget %s\n", graphd_status_name(graphd_region_forget(c, y.ptr)));
    for (;;) pause();
  } else if (strcmp(mode, "async") == 0) {
    int n = argc > 4 ? atoi(argv[4]) : 10;
    uint8_t cp[32];
    if (gpu_wide_program(c, argv[2], GRAPHD_MODE_STAGED, 1, cp) != GRAPHD_OK)
      return fail("copy program", c);
    if (gpu_async_copies_checked(c, s, st, cp, &x, &y, 1, n, 7) != GRAPHD_OK)
      return fail("async copies", c);
    graphd_async_info ai;
    if (graphd_replay_collect(c, &ai) != GRAPHD_OK || ai.failed) return fail("collect", c);
    printf("async ok\n");
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
  } else if (strcmp(mode, "loop") == 0) {
    for (unsigned i = 0;; i++) {
      if (gpu_replay_checked(c, s, st, pid, &x, &y, &cc, 1, i, NULL) != GRAPHD_OK)
        return fail("replay", c);
      if (i == 20) printf("running\n");
    }
  }
  graphd_stream_detach(s);
  graphd_close(c);
  return 0;
}
