/* Captures on the host backend, through the daemon: a program with a loop
 * or a branch (a graph with a conditional node, which CUDA instantiates
 * once at a time, and the host backend likewise) keeps one executable
 * graph and re-points it for every binding set, exactly, and logs that
 * expected path once at debug, never as a warning or an error. Memset and
 * copy steps, aligned and not, give the same bytes in every mode. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "program3.h"

#define N 256u /* floats per slot */

/* A daemon with one host device, a data session on it and the host test
 * kernels registered there (mod). */
static graphd_client *host_daemon(gd_test_daemon *d, uint8_t mod[32]) {
  td_start(d, "--backend", "host", NULL);
  size_t len;
  void *plugin = td_read_file(HOST_KERNELS_SO, &len);
  graphd_client *c = td_data(d, 0);
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, len, mod), GRAPHD_OK);
  free(plugin);
  return c;
}

START_TEST(test_capture_conditional_graph_is_repointed_without_a_warning) {
  gd_test_daemon d;
  uint8_t mod[32], pid[32];
  graphd_client *c = host_daemon(&d, mod);
  ck_assert_int_eq(cond_program_register(c, mod, GRAPHD_MODE_STAGED, N, pid), GRAPHD_OK);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  /* Three binding sets that keep coming back: a capture would keep an
   * executable graph for each, were it not for the conditional node. */
  float *x[3];
  uint32_t *ctl;
  for (int k = 0; k < 3; k++)
    ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&x[k]), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, 8, (void **)&ctl), GRAPHD_OK);
  for (int r = 0; r < 12; r++) {
    float *xs = x[r % 3];
    uint32_t count = (uint32_t)(r % 4), flag = (uint32_t)(r % 2);
    for (uint32_t i = 0; i < N; i++) xs[i] = (float)i - 50.0f;
    ctl[0] = count;
    ctl[1] = flag;
    graphd_binding b[2] = {{.slot = 0, .ptr = (uint64_t)(uintptr_t)xs, .bytes = N * 4},
                           {.slot = 1, .ptr = (uint64_t)(uintptr_t)ctl, .bytes = 8}};
    ck_assert_msg(graphd_replay(c, s, pid, b, 2, NULL) == GRAPHD_OK, "%s", graphd_last_error(c));
    for (uint32_t i = 0; i < N; i++)
      ck_assert_float_eq(xs[i], cond_program_expect((float)i - 50.0f, count, flag));
  }
  graphd_stream_detach(s);
  graphd_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  /* The expected path said once, at debug; nothing an operator pages on. */
  td_log_print(&d, "capture");
  ck_assert(!td_log_contains(&d, "another instance of a graph"));
  ck_assert(!td_log_contains(&d, "ERROR"));
  ck_assert(!td_log_contains(&d, "cannot have another executable instance"));
  ck_assert(td_log_contains(&d, "has a loop or a branch: one executable graph"));
  td_cleanup(&d);
}
END_TEST

START_TEST(test_capture_memset_and_copy_steps_are_exact_in_every_mode) {
  gd_test_daemon d;
  uint8_t mod[32], pid[3][32];
  graphd_client *c = host_daemon(&d, mod);
  static const graphd_mode modes[3] = {GRAPHD_MODE_STAGED, GRAPHD_MODE_STAGED_EX,
                                       GRAPHD_MODE_DIRECT};
  for (int m = 0; m < 3; m++)
    ck_assert_int_eq(fill_copy_program_register(c, mod, modes[m], N, pid[m]), GRAPHD_OK);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  float *x[2], *y[2];
  for (int k = 0; k < 2; k++) {
    ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&x[k]), GRAPHD_OK);
    ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&y[k]), GRAPHD_OK);
  }
  static float x0[N], wx[N], wy[N];
  for (int r = 0; r < 12; r++) {
    int m = r % 3, k = (r / 3) % 2;
    for (uint32_t i = 0; i < N; i++) x0[i] = (float)(i * 7 % 101) - 13.5f + (float)r;
    memcpy(x[k], x0, sizeof x0);
    memset(y[k], 0xee, N * 4);
    graphd_binding b[2] = {{.slot = 0, .ptr = (uint64_t)(uintptr_t)x[k], .bytes = N * 4},
                           {.slot = 1, .ptr = (uint64_t)(uintptr_t)y[k], .bytes = N * 4}};
    ck_assert_msg(graphd_replay(c, s, pid[m], b, 2, NULL) == GRAPHD_OK, "%s", graphd_last_error(c));
    fill_copy_program_expect(x0, N, wx, wy);
    ck_assert_msg(memcmp(x[k], wx, sizeof wx) == 0, "mode %d: x", m);
    ck_assert_msg(memcmp(y[k], wy, sizeof wy) == 0, "mode %d: y", m);
  }
  graphd_stream_detach(s);
  graphd_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("capture");
  TCase *tc = tcase_create("capture");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_capture_conditional_graph_is_repointed_without_a_warning);
  tcase_add_test(tc, test_capture_memset_and_copy_steps_are_exact_in_every_mode);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
