/* On a real GPU: one allocation's identity across sessions, frees, reuse
 * and re-registration. The daemon opens a legacy IPC allocation once per
 * device and shares the mapping among the regions that name it (a second
 * cuIpcOpenMemHandle of it would answer CUDA_ERROR_ALREADY_MAPPED); the
 * client drops a cached region whose memory was freed and reused.
 *
 * Fork mode: the Check parent never calls cuInit; each test body sets up
 * CUDA. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"
#include "harness.h"

static gd_test_daemon d;

static void setup(void) { td_start(&d, "--backend", "cuda", NULL); }

static void teardown(void) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

typedef struct sess {
  graphd_client *c;
  uint8_t pid[32];
  CUstream st;
  graphd_stream *s;
} sess;

static void sess_up(sess *x) {
  char err[GRAPHD_ERRMAX];
  x->c = gpu_session(d.socket, err, sizeof err);
  ck_assert_msg(x->c != NULL, "%s", err);
  ck_assert_msg(gpu_program(x->c, TEST_KERNEL_DIR, GRAPHD_MODE_STAGED, x->pid) == GRAPHD_OK, "%s",
                graphd_last_error(x->c));
  ck_assert_int_eq(gcu->cuStreamCreate(&x->st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ck_assert_int_eq(graphd_stream_attach(x->c, x->st, &x->s), GRAPHD_OK);
}

static void sess_down(sess *x) {
  graphd_stream_detach(x->s);
  graphd_close(x->c);
  ck_assert_int_eq(gcu->cuStreamDestroy(x->st), CUDA_SUCCESS);
}

static void replay_ok(sess *x, gbuf *in, gbuf *out, gbuf *cc, unsigned seed) {
  graphd_status st = gpu_replay_checked(x->c, x->s, x->st, x->pid, in, out, cc, 1, seed, NULL);
  ck_assert_msg(st == GRAPHD_OK, "%s: %s", graphd_status_name(st), graphd_last_error(x->c));
}

/* The same cuMemAlloc buffers bound by two sessions of one process (the
 * XLA handler's and the Python package's, under JAX): both import them,
 * and the mapping outlives the first session's release. */
START_TEST(test_gpu_legacy_allocation_is_shared_by_two_sessions) {
  ck_assert_msg(HAVE_CUDA_KERNELS, "the build made no CUDA test kernels (no nvcc)");
  ck_assert_int_eq(gpu_up(), 0);
  sess a, b;
  sess_up(&a);
  sess_up(&b);
  gbuf x, y, cc;
  ck_assert_int_eq(gbuf_alloc(&x, GN * 4, 0), 0);
  ck_assert_int_eq(gbuf_alloc(&y, GN * 4, 0), 0);
  ck_assert_int_eq(gbuf_alloc(&cc, GN * 4, 0), 0);
  replay_ok(&a, &x, &y, &cc, 1);
  replay_ok(&b, &x, &y, &cc, 2); /* was: CUDA_ERROR_ALREADY_MAPPED */
  /* Also two regions of one allocation in one session: the cache answers
   * with the same region. */
  graphd_region_ref r1, r2;
  ck_assert_int_eq(graphd_region_register(b.c, x.ptr, 64, &r1), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(b.c, x.ptr + 1024, 64, &r2), GRAPHD_OK);
  ck_assert_uint_eq(r1.region_id, r2.region_id);
  /* The first session goes (its regions released); the second's mapping
   * of the same allocations still works, and a third session shares it. */
  sess_down(&a);
  replay_ok(&b, &x, &y, &cc, 3);
  sess c;
  sess_up(&c);
  replay_ok(&c, &x, &y, &cc, 4);
  replay_ok(&b, &x, &y, &cc, 5);
  /* Forgotten and registered again while the other session holds it. */
  ck_assert_int_eq(graphd_region_forget(b.c, x.ptr), GRAPHD_OK);
  replay_ok(&b, &x, &y, &cc, 6);
  replay_ok(&c, &x, &y, &cc, 7);
  sess_down(&b);
  sess_down(&c);
  gbuf_free(&x);
  gbuf_free(&y);
  gbuf_free(&cc);
}
END_TEST

/* Freed without telling graphd, and allocated again (at the same address
 * when the driver gives it back, as it usually does): the client sees a
 * new allocation, drops the stale region and registers the new one. */
START_TEST(test_gpu_legacy_buffer_freed_and_reallocated_registers_again) {
  ck_assert_msg(HAVE_CUDA_KERNELS, "the build made no CUDA test kernels (no nvcc)");
  ck_assert_int_eq(gpu_up(), 0);
  sess a;
  sess_up(&a);
  gbuf x, y, cc;
  ck_assert_int_eq(gbuf_alloc(&y, GN * 4, 0), 0);
  ck_assert_int_eq(gbuf_alloc(&cc, GN * 4, 0), 0);
  int same = 0;
  CUdeviceptr last = 0;
  uint32_t count = 0;
  for (unsigned round = 0; round < 8; round++) {
    ck_assert_int_eq(gbuf_alloc(&x, GN * 4, 0), 0);
    replay_ok(&a, &x, &y, &cc, 10 + round);
    graphd_region_ref r;
    ck_assert_int_eq(graphd_region_register(a.c, x.ptr, 64, &r), GRAPHD_OK);
    if (round > 0 && x.ptr == last) {
      /* The stale region was dropped, not kept beside the new one. */
      same++;
      ck_assert_uint_eq(graphd_region_count(a.c), count);
    }
    last = x.ptr;
    count = graphd_region_count(a.c);
    ck_assert_int_eq(gcu->cuStreamSynchronize(a.st), CUDA_SUCCESS);
    gbuf_free(&x);
  }
  printf("legacy buffer reallocated at the same address in %d of 7 rounds\n", same);
  ck_assert_msg(same > 0, "the driver never gave the address back; the reuse was not exercised");
  /* A larger allocation, likely over the freed ones' addresses. */
  ck_assert_int_eq(gbuf_alloc(&x, 4 * GN * 4, 0), 0);
  replay_ok(&a, &x, &y, &cc, 30);
  sess_down(&a);
  gbuf_free(&x);
  gbuf_free(&y);
  gbuf_free(&cc);
}
END_TEST

int main(void) {
  td_gpu_or_skip();
  td_gpu_kernels_or_skip();
  Suite *s = suite_create("gpu_region");
  TCase *tc = tcase_create("gpu_region");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_gpu_legacy_allocation_is_shared_by_two_sessions);
  tcase_add_test(tc, test_gpu_legacy_buffer_freed_and_reallocated_registers_again);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
