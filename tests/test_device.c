/* The daemon's insides on a host device, without threads: a device is
 * opened on the calling thread and its captures, eviction choices and
 * upkeep are driven directly, the way its worker drives them. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/file.h"
#include "../daemon/backend.h"
#include "../daemon/capture.h"
#include "../daemon/device.h"
#include "../daemon/evict.h"
#include "../daemon/modcache.h"
#include "../daemon/registry.h"
#include "../daemon/upkeep.h"
#include "graphd/program.h"

#define N 1024u /* floats per slot */

typedef struct fixture {
  gd_backend *be;
  gd_device d;
  gd_registry reg;
  uint8_t mod[GD_ID_LEN];
  gd_stream stream;
} fixture;

static void fixture_open(fixture *f, uint64_t budget) {
  char err[512];
  memset(f, 0, sizeof *f);
  ck_assert_int_eq(backend_host_new(1, 256u << 20, &f->be, err, sizeof err), 0);
  device_init(&f->d, 0, f->be, 0, budget);
  ck_assert_int_eq(device_attach(&f->d), 0);
  ck_assert(device_ok(&f->d));
  size_t len;
  void *so = gd_read_file(HOST_KERNELS_SO, &len);
  ck_assert_ptr_nonnull(so);
  ck_assert_int_eq(gd_module_id(GD_MODULE_HOST_ELF, so, len, f->mod), 0);
  bool known;
  ck_assert_int_eq(registry_add_module(&f->reg, f->mod, GD_MODULE_HOST_ELF, so, len, -1, &known,
                                       err, sizeof err),
                   0);
  free(so);
  ck_assert_int_eq(f->be->ops->stream_create(f->be, f->d.dev, &f->stream, err, sizeof err), 0);
}

static void fixture_close(fixture *f) {
  f->be->ops->stream_destroy(f->be, f->d.dev, f->stream);
  upkeep_close(&f->d);
  registry_close(&f->reg);
  f->be->ops->destroy(f->be);
}

/* y = factor * x over N floats, staged; distinct factors make distinct
 * programs. */
static const gd_regprog *scale_program(fixture *f, float factor) {
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, N * 4, 1);
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, N * 4, 1);
  uint32_t grid[3] = {N / 256, 1, 1}, block[3] = {256, 1, 1}, n = N;
  int s = graphd_program_add_launch(p, f->mod, "scale", grid, block, 0);
  graphd_program_param_slot(p, (uint32_t)s, 0, 0, 0);
  graphd_program_param_slot(p, (uint32_t)s, 8, 1, 0);
  graphd_program_param(p, (uint32_t)s, 16, &factor, 4);
  graphd_program_param(p, (uint32_t)s, 20, &n, 4);
  uint8_t id[GD_ID_LEN];
  ck_assert_int_eq(graphd_program_finish(p, id), GRAPHD_OK);
  const uint8_t *enc;
  size_t len;
  ck_assert_int_eq(graphd_program_encoding(p, &enc, &len), GRAPHD_OK);
  char err[1024];
  bool known;
  ck_assert_int_eq(registry_add_program(&f->reg, id, enc, len, &known, err, sizeof err), 0);
  graphd_program_free(p);
  return registry_find_program(&f->reg, id);
}

/* One replay of prog on host buffers x and y as the worker runs it:
 * prepare, find or build (with the budget) the capture, queue it. */
static int replay(fixture *f, const gd_regprog *prog, float *x, float *y, uint32_t pid) {
  char err[512];
  gd_bound bind[2] = {{true, (uint64_t)(uintptr_t)x, N * 4}, {true, (uint64_t)(uintptr_t)y, N * 4}};
  uint64_t loaded, ns;
  int rc = modcache_prepare(&f->d, prog, &loaded, &ns, err, sizeof err);
  ck_assert_msg(rc == 0, "prepare: %s", err);
  gd_capture *c = capture_find(&f->d, prog);
  bool first = false;
  if (!c) {
    ck_assert_int_eq(capture_build(&f->d, prog, bind, f->stream, &c, err, sizeof err), 0);
    ck_assert_int_eq(capture_insert(&f->d, c), 0);
    uint32_t n;
    uint64_t bytes;
    if (f->d.budget && (rc = evict_make_room(&f->d, c, &n, &bytes, err, sizeof err)) < 0) {
      capture_remove(&f->d, c);
      capture_free(&f->d, c);
      return rc;
    }
    (void)capture_mark_built(&f->d, c);
    first = true;
  }
  rc = capture_enqueue(&f->d, c, f->stream, bind, first, pid, err, sizeof err);
  ck_assert_msg(rc == 0, "enqueue: %s", err);
  return 0;
}

static void fill(float *x, float base) {
  for (uint32_t i = 0; i < N; i++) x[i] = base + (float)i;
}

START_TEST(test_device_capture_replays_on_new_buffers_and_keeps_its_users) {
  fixture f;
  fixture_open(&f, 0);
  const gd_regprog *p = scale_program(&f, 3.0f);
  static float x1[N], y1[N], x2[N], y2[N];
  fill(x1, 1.0f);
  fill(x2, 100.0f);
  ck_assert_int_eq(replay(&f, p, x1, y1, 10), 0);
  ck_assert_int_eq(replay(&f, p, x2, y2, 11), 0); /* the copy nodes move to the new buffers */
  ck_assert_int_eq(replay(&f, p, x1, y1, 10), 0); /* and back */
  for (uint32_t i = 0; i < N; i++) {
    ck_assert_float_eq(y1[i], 3.0f * x1[i]);
    ck_assert_float_eq(y2[i], 3.0f * x2[i]);
  }
  gd_capture *c = capture_find(&f.d, p);
  ck_assert_ptr_nonnull(c);
  ck_assert_uint_eq(c->replays, 3);
  ck_assert_uint_eq(c->npids, 2);
  ck_assert_uint_eq(c->pids[0], 10);
  ck_assert_uint_eq(c->pids[1], 11);
  ck_assert(!capture_any_busy(&f.d));
  fixture_close(&f);
}
END_TEST

START_TEST(test_device_evict_selects_by_program_and_client_and_guards_shared_captures) {
  fixture f;
  fixture_open(&f, 0);
  static float x[N], y[N];
  fill(x, 0.0f);
  const gd_regprog *a = scale_program(&f, 2.0f), *b = scale_program(&f, 5.0f);
  ck_assert_int_eq(replay(&f, a, x, y, 100), 0);
  ck_assert_int_eq(replay(&f, b, x, y, 100), 0);
  ck_assert_int_eq(replay(&f, b, x, y, 200), 0); /* b is shared by two processes */
  gd_capture_info *ci;
  size_t n;
  uint64_t bytes;
  char err[512] = "";
  /* A non-admin may not take a capture another process also used. */
  gd_evict_sel all = {.requester_pid = 100};
  ck_assert_int_eq(evict_select(&f.d, &all, &ci, &n, &bytes, err, sizeof err),
                   -GRAPHD_PERMISSION_DENIED);
  ck_assert_msg(strstr(err, "shared with other processes") != NULL, "%s", err);
  ck_assert_ptr_nonnull(capture_find(&f.d, a));
  ck_assert_ptr_nonnull(capture_find(&f.d, b));
  /* By program prefix, dry run: reported, nothing dropped. */
  gd_evict_sel sel = {.requester_pid = 100, .dry_run = true};
  memcpy(sel.prefix, a->id, 3);
  sel.prefix_nibbles = 6;
  ck_assert_int_eq(evict_select(&f.d, &sel, &ci, &n, &bytes, err, sizeof err), 0);
  ck_assert_uint_eq(n, 1);
  ck_assert_mem_eq(ci[0].program_id, a->id, GD_ID_LEN);
  ck_assert_uint_gt(bytes, 0);
  free(ci);
  ck_assert_ptr_nonnull(capture_find(&f.d, a));
  /* For real: only a goes, with its bytes. */
  sel.dry_run = false;
  ck_assert_int_eq(evict_select(&f.d, &sel, &ci, &n, &bytes, err, sizeof err), 0);
  ck_assert_uint_eq(n, 1);
  free(ci);
  ck_assert_ptr_null(capture_find(&f.d, a));
  ck_assert_ptr_nonnull(capture_find(&f.d, b));
  /* An admin may take the shared one by client. */
  gd_evict_sel by_client = {.client_pid = 200, .admin = true, .requester_pid = 1};
  ck_assert_int_eq(evict_select(&f.d, &by_client, &ci, &n, &bytes, err, sizeof err), 0);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(ci[0].npids, 2);
  free(ci);
  ck_assert_ptr_null(capture_find(&f.d, b));
  /* The next replay captures afresh and is exact. */
  ck_assert_int_eq(replay(&f, a, x, y, 100), 0);
  for (uint32_t i = 0; i < N; i++) ck_assert_float_eq(y[i], 2.0f * x[i]);
  fixture_close(&f);
}
END_TEST

START_TEST(test_device_budget_drops_the_least_recently_used_capture) {
  fixture f;
  fixture_open(&f, 0);
  static float x[N], y[N];
  fill(x, 0.0f);
  const gd_regprog *a = scale_program(&f, 2.0f), *b = scale_program(&f, 3.0f),
                   *c = scale_program(&f, 4.0f);
  ck_assert_int_eq(replay(&f, a, x, y, 1), 0);
  uint64_t one = capture_find(&f.d, a)->staging.bytes;
  f.d.budget = 2 * one; /* room for two captures */
  ck_assert_int_eq(replay(&f, b, x, y, 1), 0);
  ck_assert_int_eq(replay(&f, a, x, y, 1), 0); /* a is now the more recent */
  ck_assert_int_eq(replay(&f, c, x, y, 1), 0); /* c pushes out b */
  ck_assert_ptr_nonnull(capture_find(&f.d, a));
  ck_assert_ptr_null(capture_find(&f.d, b));
  ck_assert_ptr_nonnull(capture_find(&f.d, c));
  for (uint32_t i = 0; i < N; i++) ck_assert_float_eq(y[i], 4.0f * x[i]);
  /* One capture alone over the budget is refused, and nothing goes. */
  f.d.budget = one - 1;
  char err[512];
  uint32_t n;
  uint64_t bytes;
  ck_assert_int_eq(evict_make_room(&f.d, capture_find(&f.d, a), &n, &bytes, err, sizeof err),
                   -GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(err, "--device-budget") != NULL, "%s", err);
  ck_assert_ptr_nonnull(capture_find(&f.d, c));
  fixture_close(&f);
}
END_TEST

/* One launch of fault(kind) on a host device. */
static const gd_regprog *fault_program(fixture *f, uint32_t kind) {
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_SCRATCH, 256, 0);
  uint32_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  int s = graphd_program_add_launch(p, f->mod, "fault", grid, block, 0);
  graphd_program_param(p, (uint32_t)s, 0, &kind, 4);
  uint8_t id[GD_ID_LEN];
  ck_assert_int_eq(graphd_program_finish(p, id), GRAPHD_OK);
  const uint8_t *enc;
  size_t len;
  ck_assert_int_eq(graphd_program_encoding(p, &enc, &len), GRAPHD_OK);
  char err[1024];
  bool known;
  ck_assert_int_eq(registry_add_program(&f->reg, id, enc, len, &known, err, sizeof err), 0);
  graphd_program_free(p);
  return registry_find_program(&f->reg, id);
}

static void run_fault(fixture *f, uint32_t kind) {
  char err[512];
  const gd_regprog *p = fault_program(f, kind);
  uint64_t loaded, ns;
  gd_bound bind[1] = {{false, 0, 0}};
  gd_capture *c;
  ck_assert_int_eq(modcache_prepare(&f->d, p, &loaded, &ns, err, sizeof err), 0);
  ck_assert_int_eq(capture_build(&f->d, p, bind, f->stream, &c, err, sizeof err), 0);
  ck_assert_int_eq(capture_insert(&f->d, c), 0);
  (void)capture_enqueue(&f->d, c, f->stream, bind, true, 1, err, sizeof err);
}

START_TEST(test_device_upkeep_resets_a_faulted_device_and_drops_its_captures) {
  fixture f;
  fixture_open(&f, 0);
  static float x[N], y[N];
  fill(x, 0.0f);
  const gd_regprog *a = scale_program(&f, 2.0f);
  ck_assert_int_eq(replay(&f, a, x, y, 1), 0);
  gd_upkeep_news news;
  upkeep_after(&f.d, true, true, 0, &news); /* healthy: nothing to report */
  ck_assert(!news.reset);
  ck_assert_uint_eq(atomic_load(&f.d.epoch), 0);
  run_fault(&f, 1);
  upkeep_after(&f.d, true, true, 0, &news); /* host devices are asked after every job */
  ck_assert(news.reset);
  ck_assert_uint_eq(atomic_load(&f.d.epoch), 1);
  ck_assert(device_ok(&f.d));
  ck_assert_ptr_null(capture_find(&f.d, a));
  /* The stream went with the old context; a new one replays exactly. */
  char err[256];
  ck_assert_int_eq(f.be->ops->stream_create(f.be, f.d.dev, &f.stream, err, sizeof err), 0);
  fill(y, -1.0f);
  ck_assert_int_eq(replay(&f, a, x, y, 1), 0);
  for (uint32_t i = 0; i < N; i++) ck_assert_float_eq(y[i], 2.0f * x[i]);
  /* A fault no reset clears leaves the device failed, with the reason. */
  run_fault(&f, 2);
  upkeep_after(&f.d, true, true, 0, &news);
  ck_assert(news.reset);
  ck_assert(!device_ok(&f.d));
  ck_assert_msg(strstr(f.d.fail_msg, "could not be reset") != NULL, "%s", f.d.fail_msg);
  /* A failed device reports nothing more. */
  upkeep_after(&f.d, false, false, 0, &news);
  ck_assert(!news.reset);
  fixture_close(&f);
}
END_TEST

int main(void) {
  Suite *s = suite_create("device");
  TCase *tc = tcase_create("device");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_device_capture_replays_on_new_buffers_and_keeps_its_users);
  tcase_add_test(tc, test_device_evict_selects_by_program_and_client_and_guards_shared_captures);
  tcase_add_test(tc, test_device_budget_drops_the_least_recently_used_capture);
  tcase_add_test(tc, test_device_upkeep_resets_a_faulted_device_and_drops_its_captures);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
