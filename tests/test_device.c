/* The daemon's insides on a host device, without threads: a device is
 * opened on the calling thread and its captures, eviction choices and
 * upkeep are driven directly, the way its worker drives them. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/file.h"
#include "common/memfd.h"
#include "daemon/backend/backend.h"
#include "daemon/device/capture.h"
#include "daemon/device/device.h"
#include "daemon/device/session_stream.h"
#include "daemon/device/evict.h"
#include "daemon/device/modcache.h"
#include "daemon/base/registry.h"
#include "daemon/device/upkeep.h"
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
 * programs. With scratch, a scratch slot of that many bytes too (state
 * the daemon keeps, which the kernel leaves alone). */
static const gd_regprog *scale_program_scratch(fixture *f, float factor, uint64_t scratch) {
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, N * 4, 1);
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, N * 4, 1);
  if (scratch) graphd_program_add_slot(p, GRAPHD_SLOT_SCRATCH, scratch, 0);
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

static const gd_regprog *scale_program(fixture *f, float factor) {
  return scale_program_scratch(f, factor, 0);
}

/* One replay of prog on host buffers x and y on stream st as the worker
 * runs it: prepare, find or build (with the budget) the capture, queue it. */
static int replay_as(fixture *f, const gd_regprog *prog, gd_stream st, float *x, float *y,
                     uint32_t pid, uint32_t uid) {
  char err[512];
  /* One per slot: a scratch slot, if the program has one, is not bound. */
  gd_bound bind[3] = {{true, (uint64_t)(uintptr_t)x, N * 4}, {true, (uint64_t)(uintptr_t)y, N * 4}};
  uint64_t loaded, ns;
  int rc = modcache_prepare(&f->d, prog, &loaded, &ns, err, sizeof err);
  ck_assert_msg(rc == 0, "prepare: %s", err);
  gd_capture *c = capture_find(&f->d, prog);
  bool first = false;
  if (!c) {
    ck_assert_int_eq(capture_build(&f->d, prog, bind, st, &c, err, sizeof err), 0);
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
  rc = capture_enqueue(&f->d, c, st, bind, first, pid, uid, 1, NULL, err, sizeof err);
  ck_assert_msg(rc == 0, "enqueue: %s", err);
  return 0;
}

/* Each test process runs as its own user here: uid = pid. */
static int replay_on(fixture *f, const gd_regprog *prog, gd_stream st, float *x, float *y,
                     uint32_t pid) {
  return replay_as(f, prog, st, x, y, pid, pid);
}

static int replay(fixture *f, const gd_regprog *prog, float *x, float *y, uint32_t pid) {
  return replay_on(f, prog, f->stream, x, y, pid);
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

/* How many of n replays, with one in `every` to be timed, were. */
static uint64_t timed_of(fixture *f, const gd_regprog *p, float *x, float *y, uint32_t every,
                         int n) {
  f->d.gpu_sample_every = every;
  for (int k = 0; k < n; k++) ck_assert_int_eq(replay(f, p, x, y, 10), 0);
  uint64_t ns = 0, m = 0;
  capture_poll_gpu_time(&f->d);
  capture_take_gpu_time(&f->d, &ns, &m);
  return m;
}

/* Replays are timed on the device: every one with --gpu-time-sample 1,
 * one in 16 on average by default (at random gaps), none with 0; each is
 * read once its end has been reached (on the host device at once) when
 * the next sample begins or on a poll, and taken once. */
START_TEST(test_device_samples_the_device_time_of_replays) {
  fixture f;
  fixture_open(&f, 0);
  const gd_regprog *p = scale_program(&f, 2.0f);
  static float x[N], y[N];
  fill(x, 1.0f);
  uint64_t ns = 0, n = 0;
  capture_take_gpu_time(&f.d, &ns, &n); /* nothing replayed yet */
  ck_assert_uint_eq(n, 0);
  f.d.gpu_sample_every = 1;
  for (int k = 0; k < 10; k++) ck_assert_int_eq(replay(&f, p, x, y, 10), 0);
  capture_take_gpu_time(&f.d, &ns, &n);
  ck_assert_uint_eq(n, 9); /* the last one is read by the next sample or a poll */
  ck_assert_uint_gt(ns, 0);
  uint64_t again = 0, m = 0;
  capture_take_gpu_time(&f.d, &again, &m); /* taken once */
  ck_assert_uint_eq(m, 0);
  ck_assert_uint_eq(again, 0);
  capture_poll_gpu_time(&f.d); /* the last one, read without a replay */
  capture_take_gpu_time(&f.d, &again, &m);
  ck_assert_uint_eq(m, 1);
  ck_assert_uint_gt(again, 0);

  /* One in 16 on average: gaps of 1 to 31 replays. */
  m = timed_of(&f, p, x, y, 16, 1600);
  ck_assert_uint_ge(m, 70);
  ck_assert_uint_le(m, 130);
  /* None, but at most the one chosen before the switch. */
  ck_assert_uint_le(timed_of(&f, p, x, y, 0, 100), 1);
  fixture_close(&f);
}
END_TEST

/* Eviction rights go by user: every user that replayed a capture is kept,
 * however many processes did. 20 processes of uid 100, then one of uid
 * 200: uid 100 may not take it (only the first 16 processes are listed,
 * all of uid 100's), nor by one of its processes; uid 200's alone it may. */
START_TEST(test_device_evict_rights_keep_every_user) {
  fixture f;
  fixture_open(&f, 0);
  static float x[N], y[N];
  fill(x, 0.0f);
  const gd_regprog *a = scale_program(&f, 2.0f), *b = scale_program(&f, 4.0f);
  for (uint32_t pid = 1000; pid < 1020; pid++)
    ck_assert_int_eq(replay_as(&f, a, f.stream, x, y, pid, 100), 0);
  ck_assert_int_eq(replay_as(&f, a, f.stream, x, y, 2000, 200), 0);
  ck_assert_int_eq(replay_as(&f, b, f.stream, x, y, 2000, 200), 0);
  gd_capture *c = capture_find(&f.d, a);
  ck_assert_uint_eq(c->npids, GD_CAPTURE_PIDS);
  ck_assert_uint_eq(c->nusers, 2);
  gd_capture_info *ci;
  size_t n;
  uint64_t bytes;
  char err[512] = "";
  gd_evict_sel all = {.requester_uid = 100};
  memcpy(all.prefix, a->id, 4);
  all.prefix_nibbles = 8;
  ck_assert_int_eq(evict_select(&f.d, &all, &ci, &n, &bytes, err, sizeof err),
                   -GRAPHD_PERMISSION_DENIED);
  ck_assert_msg(strstr(err, "shared with another user's process") != NULL, "%s", err);
  gd_evict_sel mine = {.client_pid = 1000, .requester_uid = 100};
  ck_assert_int_eq(evict_select(&f.d, &mine, &ci, &n, &bytes, err, sizeof err), 0);
  ck_assert_uint_eq(n, 0);
  free(ci);
  ck_assert_ptr_nonnull(capture_find(&f.d, a));
  gd_evict_sel theirs = {.requester_uid = 200};
  memcpy(theirs.prefix, b->id, 4);
  theirs.prefix_nibbles = 8;
  ck_assert_int_eq(evict_select(&f.d, &theirs, &ci, &n, &bytes, err, sizeof err), 0);
  ck_assert_uint_eq(n, 1);
  free(ci);
  ck_assert_ptr_null(capture_find(&f.d, b));
  ck_assert_ptr_nonnull(capture_find(&f.d, a));
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
  gd_evict_sel all = {.requester_uid = 100};
  ck_assert_int_eq(evict_select(&f.d, &all, &ci, &n, &bytes, err, sizeof err),
                   -GRAPHD_PERMISSION_DENIED);
  ck_assert_msg(strstr(err, "shared with another user's process") != NULL, "%s", err);
  ck_assert_ptr_nonnull(capture_find(&f.d, a));
  /* Selected by its own process, the shared capture stays and no error
   * comes: what clear() asks for. */
  gd_evict_sel mine = {.client_pid = 100, .requester_uid = 100, .dry_run = true};
  ck_assert_int_eq(evict_select(&f.d, &mine, &ci, &n, &bytes, err, sizeof err), 0);
  ck_assert_uint_eq(n, 1);
  ck_assert_mem_eq(ci[0].program_id, a->id, GD_ID_LEN);
  free(ci);
  /* Naming another user's process is refused. */
  gd_evict_sel theirs = {.client_pid = 200, .requester_uid = 100};
  ck_assert_int_eq(evict_select(&f.d, &theirs, &ci, &n, &bytes, err, sizeof err),
                   -GRAPHD_PERMISSION_DENIED);
  ck_assert_msg(strstr(err, "process 200 runs as another user") != NULL, "%s", err);
  ck_assert_ptr_nonnull(capture_find(&f.d, a));
  ck_assert_ptr_nonnull(capture_find(&f.d, b));
  /* By program prefix, dry run: reported, nothing dropped. */
  gd_evict_sel sel = {.requester_uid = 100, .dry_run = true};
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
  gd_evict_sel by_client = {.client_pid = 200, .admin = true, .requester_uid = 1};
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

/* The host backend runs a replay before it answers; these make its
 * replays look still running, as a GPU's are while the stream works. */
static int never_done(gd_backend *be, gd_backend_dev *dev, gd_event e) {
  (void)be, (void)dev, (void)e;
  return 0;
}

/* A program that keeps no state gets another instance of its capture for
 * each stream that replays it while the others are busy, up to
 * GD_CAPTURE_INSTANCES; a stream keeps going to the instance it used last;
 * an idle instance is taken before a new one is made; one with a scratch
 * slot, or one the budget has no room for, keeps one; eviction frees them
 * all and gives back all their bytes. */
START_TEST(test_device_streams_replaying_at_once_get_instances_of_a_stateless_capture) {
  fixture f;
  fixture_open(&f, 0);
  char err[256];
  gd_backend_ops ops = *f.be->ops;
  const gd_backend_ops *host_ops = f.be->ops;
  ops.event_done = never_done;
  /* The host backend's streams are all one (NULL: the worker runs each
   * replay as it comes) and it never looks at them: distinct handles
   * stand for the sessions' streams. */
  gd_stream st[GD_CAPTURE_INSTANCES + 2];
  for (int i = 0; i < GD_CAPTURE_INSTANCES + 2; i++) st[i] = (gd_stream)(uintptr_t)(0x1000 + i);
  const gd_regprog *p = scale_program(&f, 3.0f), *q = scale_program_scratch(&f, 5.0f, 256);
  static float x[GD_CAPTURE_INSTANCES + 2][N], y[GD_CAPTURE_INSTANCES + 2][N];
  for (int i = 0; i < GD_CAPTURE_INSTANCES + 2; i++) fill(x[i], 100.0f * (float)i);
  f.be->ops = &ops; /* every replay stays busy */
  ck_assert_int_eq(replay_on(&f, p, st[0], x[0], y[0], 1), 0);
  gd_capture *c = capture_find(&f.d, p);
  uint64_t one = c->staging.bytes;
  ck_assert_int_eq(replay_on(&f, p, st[0], x[0], y[0], 1), 0);
  ck_assert_uint_eq(capture_instances(c), 1); /* its own stream: in order already */
  ck_assert_int_eq(replay_on(&f, p, st[1], x[1], y[1], 2), 0);
  ck_assert_uint_eq(capture_instances(c), 2);
  ck_assert_int_eq(replay_on(&f, p, st[0], x[0], y[0], 1), 0);
  ck_assert_int_eq(replay_on(&f, p, st[1], x[1], y[1], 2), 0);
  ck_assert_uint_eq(capture_instances(c), 2); /* each went back to its own */
  ck_assert_ptr_eq(c->last_stream, st[0]);
  ck_assert_ptr_eq(c->more[0]->last_stream, st[1]);
  for (int i = 2; i < GD_CAPTURE_INSTANCES + 2; i++)
    ck_assert_int_eq(replay_on(&f, p, st[i], x[i], y[i], (uint32_t)i + 1), 0);
  ck_assert_uint_eq(capture_instances(c), GD_CAPTURE_INSTANCES);
  ck_assert_uint_eq(capture_staging_bytes(c), GD_CAPTURE_INSTANCES * one);
  ck_assert_uint_eq(c->replays, GD_CAPTURE_INSTANCES + 5);
  /* Every process is a user, as far as the list of users goes. */
  ck_assert_uint_eq(c->npids, GD_CAPTURE_INSTANCES + 2 < GD_CAPTURE_PIDS ? GD_CAPTURE_INSTANCES + 2
                                                                         : GD_CAPTURE_PIDS);
  for (int i = 0; i < GD_CAPTURE_INSTANCES + 2; i++)
    for (uint32_t k = 0; k < N; k++) ck_assert_float_eq(y[i][k], 3.0f * x[i][k]);
  ck_assert(capture_busy(&f.d, c));
  /* The scratch program keeps one instance, whatever the streams. */
  for (int i = 0; i < 4; i++) ck_assert_int_eq(replay_on(&f, q, st[i], x[i], y[i], 1), 0);
  ck_assert_uint_eq(capture_instances(capture_find(&f.d, q)), 1);
  for (uint32_t k = 0; k < N; k++) ck_assert_float_eq(y[3][k], 5.0f * x[3][k]);
  /* Eviction takes every instance and gives back all their bytes. */
  f.be->ops = host_ops;
  uint64_t scratch_bytes = capture_find(&f.d, q)->staging.bytes;
  gd_evict_sel sel = {.admin = true};
  gd_capture_info *ci;
  size_t n = 0;
  uint64_t bytes = 0;
  ck_assert_int_eq(evict_select(&f.d, &sel, &ci, &n, &bytes, err, sizeof err), 0);
  ck_assert_uint_eq(n, 2);
  ck_assert_uint_eq(bytes, GD_CAPTURE_INSTANCES * one + scratch_bytes);
  ck_assert_uint_eq(ci[0].staging_bytes + ci[1].staging_bytes, bytes);
  free(ci);
  ck_assert_ptr_null(capture_find(&f.d, p));
  /* Idle instances are taken before a new one is made. */
  ck_assert_int_eq(replay_on(&f, p, st[0], x[0], y[0], 1), 0);
  for (int i = 1; i < 4; i++) ck_assert_int_eq(replay_on(&f, p, st[i], x[i], y[i], 1), 0);
  ck_assert_uint_eq(capture_instances(capture_find(&f.d, p)), 1);
  /* A budget with no room for another keeps one, and tries no more. */
  f.be->ops = &ops;
  f.d.budget = capture_staging_bytes(capture_find(&f.d, p)) + one / 2;
  for (int i = 0; i < 4; i++) ck_assert_int_eq(replay_on(&f, p, st[i], x[i], y[i], 1), 0);
  ck_assert_uint_eq(capture_instances(capture_find(&f.d, p)), 1);
  ck_assert(capture_find(&f.d, p)->no_more);
  for (int i = 0; i < 4; i++)
    for (uint32_t k = 0; k < N; k++) ck_assert_float_eq(y[i][k], 3.0f * x[i][k]);
  f.be->ops = host_ops;
  fixture_close(&f);
}
END_TEST

/* Replays that alternate between binding sets get an executable graph of
 * their own each (a set counts once it comes back), after which no copy
 * node is re-pointed; sets that never come back re-point one graph. */
START_TEST(test_device_capture_keeps_a_graph_per_binding_set_that_comes_back) {
  fixture f;
  fixture_open(&f, 0);
  const gd_regprog *p = scale_program(&f, 3.0f);
  static float x[3][N], y[3][N];
  for (int k = 0; k < 3; k++) fill(x[k], 10.0f * (float)k);
  for (int i = 0; i < 30; i++) ck_assert_int_eq(replay(&f, p, x[i % 3], y[i % 3], 1), 0);
  gd_capture *c = capture_find(&f.d, p);
  ck_assert_uint_eq(c->nexecs, 3);
  uint64_t settled = c->repoints;
  for (int i = 0; i < 30; i++) {
    fill(y[i % 3], -1.0f);
    ck_assert_int_eq(replay(&f, p, x[i % 3], y[i % 3], 1), 0);
    for (uint32_t k = 0; k < N; k++) ck_assert_float_eq(y[i % 3][k], 3.0f * x[i % 3][k]);
  }
  ck_assert_uint_eq(c->repoints, settled); /* nothing re-pointed once each set has its graph */
  /* Fresh buffers every time: one graph is re-pointed, no more are made. */
  static float fx[12][N], fy[12][N];
  for (int i = 0; i < 12; i++) {
    fill(fx[i], (float)i);
    ck_assert_int_eq(replay(&f, p, fx[i], fy[i], 1), 0);
    for (uint32_t k = 0; k < N; k++) ck_assert_float_eq(fy[i][k], 3.0f * fx[i][k]);
  }
  ck_assert_uint_eq(c->nexecs, 3);
  ck_assert_uint_eq(c->repoints, settled + 12 * 2);
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
  (void)capture_enqueue(&f->d, c, f->stream, bind, true, 1, 1, 1, NULL, err, sizeof err);
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

/* A launch of `name` with pointer parameters at 0 (and 8) on slots a (and
 * b), then the 4-byte scalar words given. */
typedef struct launch_fx {
  gd_param params[4];
  gd_patch patches[2];
  uint8_t data[32];
} launch_fx;

static void set_launch(gd_step *st, launch_fx *lf, const uint8_t mod[GD_ID_LEN], const char *name,
                       int nptr, uint32_t a, uint32_t b, int nwords, const uint32_t *words) {
  memset(st, 0, sizeof *st);
  memset(lf, 0, sizeof *lf);
  st->kind = GD_STEP_LAUNCH;
  gd_launch *l = &st->u.launch;
  memcpy(l->module_id, mod, GD_ID_LEN);
  snprintf(l->name, sizeof l->name, "%s", name);
  l->grid[0] = N / 256, l->grid[1] = 1, l->grid[2] = 1;
  l->block[0] = 256, l->block[1] = 1, l->block[2] = 1;
  uint32_t off = 0, k = 0;
  for (int i = 0; i < nptr; i++, off += 8, k++) {
    lf->params[k] = (gd_param){off, 8};
    lf->patches[i] = (gd_patch){off, i ? b : a, 0};
  }
  for (int i = 0; i < nwords; i++, off += 4, k++) {
    lf->params[k] = (gd_param){off, 4};
    memcpy(lf->data + off, &words[i], 4);
  }
  l->nparams = k;
  l->params = lf->params;
  l->param_bytes = off;
  l->param_data = lf->data;
  l->npatches = (uint32_t)nptr;
  l->patches = lf->patches;
}

/* Encodes p and registers it in f's registry. */
static const gd_regprog *add_program(fixture *f, gd_program *p) {
  uint8_t *enc;
  size_t len;
  char err[1024];
  ck_assert_msg(gd_program_encode(p, &enc, &len, err, sizeof err) == 0, "%s", err);
  bool known;
  ck_assert_msg(registry_add_program(&f->reg, p->id, enc, len, &known, err, sizeof err) == 0, "%s",
                err);
  free(enc);
  return registry_find_program(&f->reg, p->id);
}

/* x (slot 0, N floats, in-out) and ctl (slot 1: the loop count, then the
 * branch flag, in-out):
 *   0 while (ctl[0]) { 1: x = 2 x;  2: ctl[0] -= 1 }
 *   3 if (ctl[1]) { 4: x = 3 x } else { 5: x = 5 x } */
static const gd_regprog *cond_program(fixture *f, uint32_t mode) {
  gd_slot slots[2] = {{GD_ROLE_INOUT, GD_SLOT_STAGED, N * 4}, {GD_ROLE_INOUT, GD_SLOT_STAGED, 8}};
  gd_step steps[6];
  launch_fx lf[4];
  float two = 2.0f, three = 3.0f, five = 5.0f;
  uint32_t n = N, w2[2], w3[2], w5[2];
  memcpy(&w2[0], &two, 4), w2[1] = n;
  memcpy(&w3[0], &three, 4), w3[1] = n;
  memcpy(&w5[0], &five, 4), w5[1] = n;
  steps[0] = (gd_step){.kind = GD_STEP_WHILE, .u.cond = {.slot = 1, .offset = 0, .body = 2}};
  set_launch(&steps[1], &lf[0], f->mod, "scale", 2, 0, 0, 2, w2);
  set_launch(&steps[2], &lf[1], f->mod, "count_down", 1, 1, 0, 0, NULL);
  steps[2].u.launch.grid[0] = 1;
  steps[3] =
      (gd_step){.kind = GD_STEP_IF, .u.cond = {.slot = 1, .offset = 4, .body = 1, .orelse = 1}};
  set_launch(&steps[4], &lf[2], f->mod, "scale", 2, 0, 0, 2, w3);
  set_launch(&steps[5], &lf[3], f->mod, "scale", 2, 0, 0, 2, w5);
  gd_program p = {.mode = mode, .nslots = 2, .slots = slots, .nsteps = 6, .steps = steps};
  return add_program(f, &p);
}

/* One replay of the cond program on x and ctl with the loop count and
 * branch flag given, capturing on the first (*c NULL): x must come out
 * scaled by 2^count and by 3 or 5, the loop counter run down to 0. */
static void replay_cond(fixture *f, const gd_regprog *p, gd_capture **c, float *x, uint32_t *ctl,
                        uint32_t count, uint32_t flag) {
  char err[512];
  fill(x, 1.0f);
  ctl[0] = count;
  ctl[1] = flag;
  gd_bound bind[2] = {{true, (uint64_t)(uintptr_t)x, N * 4}, {true, (uint64_t)(uintptr_t)ctl, 8}};
  bool first = !*c;
  if (first) {
    ck_assert_msg(capture_build(&f->d, p, bind, f->stream, c, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(capture_insert(&f->d, *c), 0);
  }
  ck_assert_msg(
      capture_enqueue(&f->d, *c, f->stream, bind, first, 1, 1, 1, NULL, err, sizeof err) == 0, "%s",
      err);
  float factor = (float)(1u << count) * (flag ? 3.0f : 5.0f);
  for (uint32_t i = 0; i < N; i++) ck_assert_float_eq(x[i], factor * (1.0f + (float)i));
  ck_assert_uint_eq(ctl[0], 0);
  ck_assert_uint_eq(ctl[1], flag);
}

START_TEST(test_device_runs_conditional_loops_and_branches) {
  fixture f;
  fixture_open(&f, 0);
  const gd_regprog *p = cond_program(&f, GD_MODE_STAGED);
  static float x[N];
  char err[512];
  uint64_t loaded, ns;
  ck_assert_msg(modcache_prepare(&f.d, p, &loaded, &ns, err, sizeof err) == 0, "%s", err);
  gd_capture *c = NULL;
  struct {
    uint32_t count, flag;
  } cases[] = {{3, 1}, {0, 0}, {5, 0}, {1, 1}};
  static uint32_t ctl[2];
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    replay_cond(&f, p, &c, x, ctl, cases[k].count, cases[k].flag);
  fixture_close(&f);
}
END_TEST

/* In direct mode, the slot that only launches inside the loop and the
 * branch use is bound straight into their kernel nodes, and the slot of
 * the condition words into the nodes that read them (before the loop, at
 * the end of each pass, before the branch); all are given the new
 * buffers when a replay binds others. Nothing is staged, and each replay
 * works in place on its own buffers: counted by the other buffers' loop
 * counter, the loop would run the wrong number of passes. */
START_TEST(test_device_direct_mode_binds_slots_of_loop_and_branch_bodies) {
  fixture f;
  fixture_open(&f, 0);
  const gd_regprog *p = cond_program(&f, GD_MODE_DIRECT);
  static float xa[N], xb[N];
  static uint32_t ctla[2], ctlb[2];
  char err[512];
  uint64_t loaded, ns;
  ck_assert_msg(modcache_prepare(&f.d, p, &loaded, &ns, err, sizeof err) == 0, "%s", err);
  gd_capture *c = NULL;
  struct {
    float *x;
    uint32_t *ctl, count, flag;
  } cases[] = {{xa, ctla, 3, 1}, {xb, ctlb, 2, 0}, {xa, ctlb, 1, 0},
               {xb, ctla, 4, 1}, {xb, ctlb, 0, 1}, {xa, ctla, 5, 0}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    float *other = cases[k].x == xa ? xb : xa;
    uint32_t *other_ctl = cases[k].ctl == ctla ? ctlb : ctla;
    fill(other, -1.0f);
    other_ctl[0] = 7;
    other_ctl[1] = 9;
    replay_cond(&f, p, &c, cases[k].x, cases[k].ctl, cases[k].count, cases[k].flag);
    for (uint32_t i = 0; i < N; i++) /* the other buffers untouched */
      ck_assert_float_eq(other[i], -1.0f + (float)i);
    ck_assert_uint_eq(other_ctl[0], 7);
    ck_assert_uint_eq(other_ctl[1], 9);
    ck_assert_uint_eq(c->mode, GD_MODE_DIRECT);
    ck_assert(c->direct && c->direct[0] && c->direct[1]);
  }
  ck_assert_uint_gt(c->repoints, 0);
  fixture_close(&f);
}
END_TEST

/* x (slot 0, N floats, in-out) and y (slot 1, N floats, out):
 *   0 y = 1.0f (a memset of 4-byte elements)
 *   1 y[N/2..N) = x[0..N/2) (a copy)
 *   2 x = 2 x */
static const gd_regprog *fill_copy_program(fixture *f, uint32_t mode) {
  gd_slot slots[2] = {{GD_ROLE_INOUT, GD_SLOT_STAGED, N * 4},
                      {GD_ROLE_OUTPUT, GD_SLOT_STAGED, N * 4}};
  gd_step steps[3];
  launch_fx lf;
  float one = 1.0f, two = 2.0f;
  uint32_t bits, w2[2] = {0, N};
  memcpy(&bits, &one, 4);
  memcpy(&w2[0], &two, 4);
  steps[0] = (gd_step){.kind = GD_STEP_MEMSET,
                       .u.memset = {.slot = 1, .element_size = 4, .value = bits, .bytes = N * 4}};
  steps[1] = (gd_step){
      .kind = GD_STEP_COPY,
      .u.copy = {
          .dst_slot = 1, .src_slot = 0, .dst_offset = N * 2, .src_offset = 0, .bytes = N * 2}};
  set_launch(&steps[2], &lf, f->mod, "scale", 2, 0, 0, 2, w2);
  gd_program p = {.mode = mode, .nslots = 2, .slots = slots, .nsteps = 3, .steps = steps};
  return add_program(f, &p);
}

/* In direct mode, the slots of memset and copy steps are bound too: the
 * steps run as graphd's fill and copy kernels, re-pointed when a replay
 * binds other buffers; nothing is staged, and each replay works on its own
 * buffers only. */
START_TEST(test_device_direct_mode_binds_slots_of_memset_and_copy_steps) {
  fixture f;
  fixture_open(&f, 0);
  const gd_regprog *p = fill_copy_program(&f, GD_MODE_DIRECT);
  static float x[2][N], y[2][N];
  char err[512];
  uint64_t loaded, ns;
  ck_assert_msg(modcache_prepare(&f.d, p, &loaded, &ns, err, sizeof err) == 0, "%s", err);
  gd_capture *c = NULL;
  for (int k = 0; k < 6; k++) {
    int a = k % 2, o = 1 - a;
    fill(x[a], (float)k);
    fill(x[o], -7.0f);
    fill(y[a], -3.0f);
    fill(y[o], -5.0f);
    gd_bound bind[2] = {{true, (uint64_t)(uintptr_t)x[a], N * 4},
                        {true, (uint64_t)(uintptr_t)y[a], N * 4}};
    bool first = !c;
    if (first) {
      ck_assert_msg(capture_build(&f.d, p, bind, f.stream, &c, err, sizeof err) == 0, "%s", err);
      ck_assert_int_eq(capture_insert(&f.d, c), 0);
    }
    ck_assert_msg(
        capture_enqueue(&f.d, c, f.stream, bind, first, 1, 1, 1, NULL, err, sizeof err) == 0, "%s",
        err);
    for (uint32_t i = 0; i < N; i++) {
      float in = (float)k + (float)i;
      ck_assert_float_eq(x[a][i], 2.0f * in);
      ck_assert_float_eq(y[a][i], i < N / 2 ? 1.0f : (float)k + (float)(i - N / 2));
      ck_assert_float_eq(x[o][i], -7.0f + (float)i); /* the other buffers untouched */
      ck_assert_float_eq(y[o][i], -5.0f + (float)i);
    }
    ck_assert_uint_eq(c->mode, GD_MODE_DIRECT);
    ck_assert(c->direct && c->direct[0] && c->direct[1]);
  }
  /* A change of buffers re-points all three steps' nodes (until the set
   * that comes back gets an executable graph of its own). */
  ck_assert_uint_ge(c->repoints, 3);
  ck_assert_uint_eq(c->repoints % 3, 0);
  fixture_close(&f);
}
END_TEST

/* Mappings in this process of memfds named `name`. */
static int mapped(const char *name) {
  FILE *f = fopen("/proc/self/maps", "r");
  ck_assert_ptr_nonnull(f);
  char line[512], want[128];
  snprintf(want, sizeof want, "/memfd:%s ", name);
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, want)) n++;
  fclose(f);
  return n;
}

/* A session whose end job is refused because graphd is shutting down
 * never runs session_stream_end: the worker's teardown still unmaps its flag page
 * and releases its region imports. */
START_TEST(test_device_teardown_releases_what_unended_sessions_hold) {
  char err[512];
  gd_backend *be;
  gd_device d;
  ck_assert_int_eq(backend_host_new(1, 64u << 20, &be, err, sizeof err), 0);
  device_init(&d, 0, be, 0, 0);
  ck_assert_int_eq(device_attach(&d), 0);
  int ffd = gd_memfd_new_shared("test-device-flags", 4 * GRAPHD_FLAG_STRIDE);
  int rfd = gd_memfd_new_shared("test-device-region", 8192);
  ck_assert_int_ge(ffd, 0);
  ck_assert_int_ge(rfd, 0);
  gd_session_stream *ds = session_stream_new(1);
  ck_assert_int_eq(session_stream_map_flags(&d, ds, ffd, 4, err, sizeof err), 0);
  gd_region_import in = {.kind = GRAPHD_REGION_HOST_MEMFD, .fd = rfd, .size = 8192};
  gd_region_map map;
  ck_assert_int_eq(device_import(&d, &in, &map, err, sizeof err), 0);
  close(ffd);
  close(rfd);
  ck_assert_int_eq(mapped("test-device-flags"), 1);
  ck_assert_int_eq(mapped("test-device-region"), 1);
  upkeep_close(&d); /* no session_stream_end: its job was refused */
  ck_assert_int_eq(mapped("test-device-flags"), 0);
  ck_assert_int_eq(mapped("test-device-region"), 0);
  session_stream_drop(ds); /* as the refused end job's completion does */
  be->ops->destroy(be);
}
END_TEST

int main(void) {
  Suite *s = suite_create("device");
  TCase *tc = tcase_create("device");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_device_capture_replays_on_new_buffers_and_keeps_its_users);
  tcase_add_test(tc, test_device_evict_selects_by_program_and_client_and_guards_shared_captures);
  tcase_add_test(tc, test_device_evict_rights_keep_every_user);
  tcase_add_test(tc, test_device_budget_drops_the_least_recently_used_capture);
  tcase_add_test(tc, test_device_streams_replaying_at_once_get_instances_of_a_stateless_capture);
  tcase_add_test(tc, test_device_upkeep_resets_a_faulted_device_and_drops_its_captures);
  tcase_add_test(tc, test_device_runs_conditional_loops_and_branches);
  tcase_add_test(tc, test_device_direct_mode_binds_slots_of_loop_and_branch_bodies);
  tcase_add_test(tc, test_device_direct_mode_binds_slots_of_memset_and_copy_steps);
  tcase_add_test(tc, test_device_samples_the_device_time_of_replays);
  tcase_add_test(tc, test_device_capture_keeps_a_graph_per_binding_set_that_comes_back);
  tcase_add_test(tc, test_device_teardown_releases_what_unended_sessions_hold);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
