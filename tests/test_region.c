/* Regions on the host backend: registration through libgraphd's cache,
 * re-registration after reuse, the LRU cap, unregister, release on session
 * close, bad fds, and the overflow-safe range check. */
#define _GNU_SOURCE
#include <check.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/sessions/region.h"
#include "daemon/replay/execute.h"
#include "daemon/requests/replay.h"
#include "common/memfd.h"
#include "harness.h"
#include "graphd/wire.h"

static gd_test_daemon d;

static void setup(void) { td_start(&d, "--host-devices", "2", NULL); }

static void teardown(void) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* Device `dev`'s region count and bytes, and the count for session sid. */
static void counts(graphd_client *ctl, int dev, uint64_t sid, uint64_t *dev_regions,
                   uint64_t *dev_bytes, uint64_t *sess_regions) {
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(ctl, &s), GRAPHD_OK);
  *dev_regions = s->devices[dev].counters.regions;
  *dev_bytes = s->devices[dev].counters.region_bytes;
  *sess_regions = 0;
  for (uint32_t i = 0; i < s->nsession_info; i++)
    if (s->session_info[i].id == sid) *sess_regions = s->session_info[i].regions;
  graphd_daemon_status_free(s);
}

START_TEST(test_region_register_is_cached_and_counted) {
  graphd_client *ctl = td_control(&d);
  graphd_client *c = td_data(&d, 0);
  void *a;
  ck_assert_int_eq(graphd_host_alloc(c, 1 << 20, &a), GRAPHD_OK);
  graphd_region_ref r1, r2, r3;
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a, 4096, &r1), GRAPHD_OK);
  ck_assert_uint_eq(r1.offset, 0);
  ck_assert_uint_eq(r1.size, 1 << 20);
  /* The same allocation again, and an interior pointer: the cached region. */
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a, 4096, &r2), GRAPHD_OK);
  ck_assert_uint_eq(r2.region_id, r1.region_id);
  ck_assert_uint_eq(r2.import_ns, 0);
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a + 1000, 24, &r3), GRAPHD_OK);
  ck_assert_uint_eq(r3.region_id, r1.region_id);
  ck_assert_uint_eq(r3.offset, 1000);
  ck_assert_uint_eq(graphd_region_count(c), 1);
  uint64_t dr, db, sr;
  counts(ctl, 0, graphd_session_id(c), &dr, &db, &sr);
  ck_assert_uint_eq(dr, 1);
  ck_assert_uint_eq(db, 1 << 20);
  ck_assert_uint_eq(sr, 1);
  counts(ctl, 1, graphd_session_id(c), &dr, &db, &sr);
  ck_assert_uint_eq(dr, 0);
  /* Past the end of the allocation. */
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a + (1 << 20) - 8, 16, &r3),
                   GRAPHD_OUT_OF_RANGE);
  ck_assert_msg(strstr(graphd_last_error(c), "runs past the end"), "%s", graphd_last_error(c));
  /* The daemon writes through its mapping of the same pages. */
  ck_assert_int_eq(graphd_host_free(c, a), GRAPHD_OK);
  counts(ctl, 0, graphd_session_id(c), &dr, &db, &sr);
  ck_assert_uint_eq(dr, 0);
  ck_assert_uint_eq(db, 0);
  graphd_close(c);
  graphd_close(ctl);
}
END_TEST

START_TEST(test_region_new_allocation_at_a_reused_address_is_a_new_region) {
  graphd_client *ctl = td_control(&d);
  graphd_client *c = td_data(&d, 0);
  uint32_t last = 0;
  int reused = 0;
  void *prev = NULL;
  for (int i = 0; i < 20; i++) {
    void *a;
    ck_assert_int_eq(graphd_host_alloc(c, 65536, &a), GRAPHD_OK);
    graphd_region_ref r;
    ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a, 65536, &r), GRAPHD_OK);
    ck_assert_uint_ne(r.region_id, last); /* a new allocation is a new region */
    ck_assert_uint_gt(r.import_ns, 0);
    if (a == prev) reused++;
    prev = a;
    last = r.region_id;
    ck_assert_int_eq(graphd_host_free(c, a), GRAPHD_OK);
  }
  /* mmap hands the same address back after munmap: reuse really happened. */
  ck_assert_int_gt(reused, 0);
  uint64_t dr, db, sr;
  counts(ctl, 0, graphd_session_id(c), &dr, &db, &sr);
  ck_assert_uint_eq(dr, 0);
  graphd_close(c);
  graphd_close(ctl);
}
END_TEST

/* The cache finds the region holding an address among many, in whatever
 * order they came and went: every address inside each live allocation
 * gives that allocation's region, at its offset, with nothing sent again
 * (the count stays), after frees in the middle and new allocations that
 * may take freed addresses. */
START_TEST(test_region_cache_finds_each_address_among_many) {
  graphd_client *c = td_data(&d, 0);
  enum { NA = 48 };
  void *a[NA] = {0};
  size_t sz[NA];
  uint32_t id[NA];
  unsigned rng = 7;
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < NA; i++) {
      if (a[i]) continue;
      sz[i] = 4096u * (1 + rand_r(&rng) % 8);
      ck_assert_int_eq(graphd_host_alloc(c, sz[i], &a[i]), GRAPHD_OK);
      graphd_region_ref r;
      ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a[i], 64, &r), GRAPHD_OK);
      ck_assert_uint_eq(r.offset, 0);
      id[i] = r.region_id;
    }
    uint32_t live = graphd_region_count(c);
    for (int k = 0; k < 4 * NA; k++) {
      int i = rand_r(&rng) % NA;
      uint64_t off = (uint64_t)(rand_r(&rng) % (sz[i] / 8)) * 8;
      graphd_region_ref r;
      ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a[i] + off, 8, &r),
                       GRAPHD_OK);
      ck_assert_uint_eq(r.region_id, id[i]);
      ck_assert_uint_eq(r.offset, off);
      ck_assert_uint_eq(r.size, sz[i]);
    }
    ck_assert_uint_eq(graphd_region_count(c), live);
    for (int i = round; i < NA; i += 3) {
      ck_assert_int_eq(graphd_host_free(c, a[i]), GRAPHD_OK);
      a[i] = NULL;
    }
  }
  graphd_close(c);
}
END_TEST

START_TEST(test_region_lru_cap_unregisters_the_least_recently_used) {
  graphd_client *ctl = td_control(&d);
  graphd_client *c = td_data(&d, 0);
  ck_assert_int_eq(graphd_set_region_cap(c, 3), GRAPHD_OK);
  void *a[5];
  graphd_region_ref r[5];
  for (int i = 0; i < 5; i++) ck_assert_int_eq(graphd_host_alloc(c, 8192, &a[i]), GRAPHD_OK);
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a[i], 8, &r[i]), GRAPHD_OK);
  /* Touch 0 so 1 is the least recently used. */
  graphd_region_ref t;
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a[0], 8, &t), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a[3], 8, &r[3]), GRAPHD_OK);
  ck_assert_uint_eq(graphd_region_count(c), 3);
  uint64_t dr, db, sr;
  counts(ctl, 0, graphd_session_id(c), &dr, &db, &sr);
  ck_assert_uint_eq(dr, 3);
  ck_assert_uint_eq(sr, 3);
  /* 0 and 2 stay cached (no new import), 1 was evicted (a new region). */
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a[0], 8, &t), GRAPHD_OK);
  ck_assert_uint_eq(t.region_id, r[0].region_id);
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a[2], 8, &t), GRAPHD_OK);
  ck_assert_uint_eq(t.region_id, r[2].region_id);
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a[1], 8, &t), GRAPHD_OK);
  ck_assert_uint_ne(t.region_id, r[1].region_id);
  /* Shrinking the cap unregisters at once. */
  ck_assert_int_eq(graphd_set_region_cap(c, 1), GRAPHD_OK);
  ck_assert_uint_eq(graphd_region_count(c), 1);
  counts(ctl, 0, graphd_session_id(c), &dr, &db, &sr);
  ck_assert_uint_eq(dr, 1);
  ck_assert_int_eq(graphd_set_region_cap(c, 0), GRAPHD_INVALID_ARGUMENT);
  graphd_close(c);
  graphd_close(ctl);
}
END_TEST

START_TEST(test_region_unregister_and_release_on_close) {
  graphd_client *ctl = td_control(&d);
  graphd_client *c0 = td_data(&d, 0);
  graphd_client *c1 = td_data(&d, 1);
  void *a, *b, *e;
  ck_assert_int_eq(graphd_host_alloc(c0, 4096, &a), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c0, 8192, &b), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c1, 16384, &e), GRAPHD_OK);
  graphd_region_ref ra, rb, re;
  ck_assert_int_eq(graphd_region_register(c0, (uint64_t)(uintptr_t)a, 1, &ra), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c0, (uint64_t)(uintptr_t)b, 1, &rb), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c1, (uint64_t)(uintptr_t)e, 1, &re), GRAPHD_OK);
  uint64_t dr, db, sr;
  counts(ctl, 0, graphd_session_id(c0), &dr, &db, &sr);
  ck_assert_uint_eq(dr, 2);
  ck_assert_uint_eq(db, 4096 + 8192);
  ck_assert_int_eq(graphd_region_forget(c0, (uint64_t)(uintptr_t)a + 10), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_forget(c0, (uint64_t)(uintptr_t)a), GRAPHD_NOT_FOUND);
  ck_assert_int_eq(graphd_region_unregister(c0, 12345), GRAPHD_NOT_FOUND);
  ck_assert_msg(strstr(graphd_last_error(c0), "no region 12345"), "%s", graphd_last_error(c0));
  counts(ctl, 0, graphd_session_id(c0), &dr, &db, &sr);
  ck_assert_uint_eq(dr, 1);
  ck_assert_uint_eq(db, 8192);
  /* Closing a session releases what it still holds; other devices untouched. */
  graphd_close(c0);
  for (int i = 0; i < 200; i++) {
    counts(ctl, 0, 0, &dr, &db, &sr);
    if (dr == 0) break;
    usleep(5000);
  }
  ck_assert_uint_eq(dr, 0);
  ck_assert_uint_eq(db, 0);
  counts(ctl, 1, graphd_session_id(c1), &dr, &db, &sr);
  ck_assert_uint_eq(dr, 1);
  ck_assert_uint_eq(db, 16384);
  graphd_close(c1);
  graphd_close(ctl);
}
END_TEST

START_TEST(test_region_needs_a_data_session_and_its_own_memory) {
  graphd_client *ctl = td_control(&d);
  void *a;
  ck_assert_int_eq(graphd_host_alloc(ctl, 4096, &a), GRAPHD_OK);
  graphd_region_ref r;
  ck_assert_int_eq(graphd_region_register(ctl, (uint64_t)(uintptr_t)a, 1, &r),
                   GRAPHD_FAILED_PRECONDITION);
  ck_assert_msg(strstr(graphd_last_error(ctl), "need a data session"), "%s",
                graphd_last_error(ctl));
  graphd_client *c = td_data(&d, 0);
  /* Memory that is neither graphd_host_alloc'd nor CUDA's. */
  static char plain[64];
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)plain, 1, &r),
                   GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c),
                       "is neither graphd_host_alloc memory of this handle nor CUDA device memory"),
                "%s", graphd_last_error(c));
  ck_assert_int_eq(graphd_host_free(c, a), GRAPHD_NOT_FOUND); /* another handle's */
  graphd_close(c);
  graphd_close(ctl);
}
END_TEST

static Graphd__Wire__Reply *raw_region(int fd, int kind, uint64_t size, const int *fds, int nfds) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterRegion m = GRAPHD__WIRE__REGISTER_REGION__INIT;
  req.request_id = 5;
  req.nfds = (uint32_t)nfds;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_REGION;
  req.register_region = &m;
  m.kind = (Graphd__Wire__RegionKind)kind;
  m.size = size;
  td_raw_send_request(fd, &req, fds, nfds);
  return td_raw_recv(fd, 5000);
}

START_TEST(test_region_bad_fds_are_refused_cleanly) {
  graphd_client *ctl = td_control(&d);
  int fd = td_raw_connect(&d);
  td_raw_data_hello(ctl, fd, 0);
  int base = td_count_fds(d.pid);

  const int host = GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD;
  /* No fd where one is needed. */
  td_expect_reply(raw_region(fd, host, 4096, NULL, 0), GRAPHD_INVALID_ARGUMENT,
                  "carries exactly one fd");
  /* A regular file is not a memfd. On tmpfs (a /tmp of systemd's, a
   * container's) a file takes seals like a memfd, but none can be added:
   * there it is refused as unsealed. */
  char path[] = "/tmp/graphd-region-XXXXXX";
  int file = mkstemp(path);
  ck_assert_int_eq(ftruncate(file, 4096), 0);
  unlink(path);
  td_expect_reply(raw_region(fd, host, 4096, &file, 1), GRAPHD_INVALID_ARGUMENT,
                  fcntl(file, F_GET_SEALS) < 0
                      ? "not a memfd"
                      : "the region memfd must be sealed against shrink and grow");
  /* A memfd that could shrink under the daemon's mapping (a SIGBUS there):
   * refused; one sealed the way graphd_host_alloc seals it cannot shrink. */
  int loose = memfd_create("loose", MFD_CLOEXEC);
  ck_assert_int_eq(ftruncate(loose, 4096), 0);
  td_expect_reply(raw_region(fd, host, 4096, &loose, 1), GRAPHD_INVALID_ARGUMENT,
                  "the region memfd must be sealed against shrink and grow");
  close(loose);
  int sealed = gd_memfd_new_shared("sealed", 4096);
  ck_assert_int_ge(sealed, 0);
  ck_assert_int_lt(ftruncate(sealed, 0), 0);
  close(sealed);
  /* A memfd smaller than declared. */
  int small = gd_memfd_new_shared("small", 100);
  ck_assert_int_ge(small, 0);
  td_expect_reply(raw_region(fd, host, 4096, &small, 1), GRAPHD_INVALID_ARGUMENT,
                  "the region memfd holds 100 bytes, fewer than the 4096 it must");
  /* CUDA kinds on a host device. */
  td_expect_reply(raw_region(fd, GRAPHD__WIRE__REGION_KIND__REGION_KIND_VMM_FD, 100, &small, 1),
                  GRAPHD_FAILED_PRECONDITION, "graphd_host_alloc only");
  /* Zero size and an unknown kind. */
  td_expect_reply(raw_region(fd, host, 0, &small, 1), GRAPHD_INVALID_ARGUMENT, "size is 0");
  td_expect_reply(raw_region(fd, 42, 100, NULL, 0), GRAPHD_INVALID_ARGUMENT, "kind must be");
  close(file);
  close(small);
  /* Every fd the daemon received was closed. */
  for (int i = 0; i < 100 && td_count_fds(d.pid) != base; i++) usleep(10000);
  ck_assert_int_eq(td_count_fds(d.pid), base);
  close(fd);
  graphd_close(ctl);
}
END_TEST

START_TEST(test_region_range_check_does_not_overflow) {
  gd_region r;
  memset(&r, 0, sizeof r);
  r.id = 7;
  r.map.size = 4096;
  char err[256];
  ck_assert_int_eq(region_check_range(&r, 0, 4096, err, sizeof err), 0);
  ck_assert_int_eq(region_check_range(&r, 4095, 1, err, sizeof err), 0);
  ck_assert_int_eq(region_check_range(&r, 4096, 0, err, sizeof err), 0);
  ck_assert_int_eq(region_check_range(&r, 4096, 1, err, sizeof err), -GRAPHD_OUT_OF_RANGE);
  ck_assert_int_eq(region_check_range(&r, 1, UINT64_MAX, err, sizeof err), -GRAPHD_OUT_OF_RANGE);
  ck_assert_int_eq(region_check_range(&r, UINT64_MAX, 2, err, sizeof err), -GRAPHD_OUT_OF_RANGE);
  ck_assert_int_eq(region_check_range(&r, UINT64_MAX - 10, 20, err, sizeof err),
                   -GRAPHD_OUT_OF_RANGE);
  ck_assert_msg(strstr(err, "region 7"), "%s", err);
}
END_TEST

/* --max-region-bytes-per-uid bounds what one user's sessions map, across
 * sessions and devices; the refusal names the limit and clears once a
 * region goes. */
START_TEST(test_region_bytes_per_uid_are_capped) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
  td_start(&d, "--host-devices", "2", "--max-region-bytes-per-uid", "3M", NULL);
  graphd_client *c0 = td_data(&d, 0);
  graphd_client *c1 = td_data(&d, 1);
  void *a, *b, *e;
  graphd_region_ref r;
  ck_assert_int_eq(graphd_host_alloc(c0, 2 << 20, &a), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c0, (uint64_t)(uintptr_t)a, 8, &r), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c1, 1 << 20, &b), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c1, (uint64_t)(uintptr_t)b, 8, &r), GRAPHD_OK);
  /* 3 MiB mapped: one byte more is over, from either session. */
  ck_assert_int_eq(graphd_host_alloc(c1, 4096, &e), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c1, (uint64_t)(uintptr_t)e, 8, &r),
                   GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(graphd_last_error(c1), "--max-region-bytes-per-uid 3145728"), "%s",
                graphd_last_error(c1));
  /* The first session's region goes: room again. */
  ck_assert_int_eq(graphd_host_free(c0, a), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c1, (uint64_t)(uintptr_t)e, 8, &r), GRAPHD_OK);
  graphd_close(c0);
  graphd_close(c1);
}
END_TEST

/* The daemon's memory mappings (lines of /proc/PID/maps). */
/* The mappings of clients' memfds (host regions, flag pages, rings) in
 * pid: the daemon's own heap, whose mappings its allocator (ASan's most of
 * all) splits and keeps as it likes, is left out. */
static int client_map_count(pid_t pid) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  int n = 0;
  while (fgets(line, sizeof line, f)) n += strstr(line, "/memfd:graphd-") != NULL;
  fclose(f);
  return n;
}

/* The region limits per session (count and bytes) and per uid (count):
 * each refusal names its limit, and clears once regions go. */
START_TEST(test_region_counts_and_session_bytes_are_capped) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
  td_start(&d, "--host-devices", "2", "--max-regions-per-session", "3", "--max-regions-per-uid",
           "4", "--max-region-bytes-per-session", "64K", NULL);
  graphd_client *c0 = td_data(&d, 0);
  graphd_client *c1 = td_data(&d, 1);
  void *p[5], *big;
  graphd_region_ref r;
  for (int i = 0; i < 5; i++) ck_assert_int_eq(graphd_host_alloc(c0, 4096, &p[i]), GRAPHD_OK);
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(graphd_region_register(c0, (uint64_t)(uintptr_t)p[i], 8, &r), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c0, (uint64_t)(uintptr_t)p[3], 8, &r),
                   GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(graphd_last_error(c0), "--max-regions-per-session 3"), "%s",
                graphd_last_error(c0));
  /* The other session of the same user: one more makes 4, the uid's most. */
  void *q[2];
  for (int i = 0; i < 2; i++) ck_assert_int_eq(graphd_host_alloc(c1, 4096, &q[i]), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c1, (uint64_t)(uintptr_t)q[0], 8, &r), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c1, (uint64_t)(uintptr_t)q[1], 8, &r),
                   GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(graphd_last_error(c1), "--max-regions-per-uid 4"), "%s",
                graphd_last_error(c1));
  /* One of the first session's regions goes: room for both again. */
  ck_assert_int_eq(graphd_host_free(c0, p[0]), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c1, (uint64_t)(uintptr_t)q[1], 8, &r), GRAPHD_OK);
  /* Bytes per session: 64 KiB. */
  ck_assert_int_eq(graphd_host_free(c1, q[0]), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c1, 128 << 10, &big), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c1, (uint64_t)(uintptr_t)big, 8, &r),
                   GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(graphd_last_error(c1), "--max-region-bytes-per-session 65536"), "%s",
                graphd_last_error(c1));
  graphd_close(c0);
  graphd_close(c1);
}
END_TEST

/* A host device holds at most --host-memory of client regions, as a GPU
 * holds at most its memory: a sparse memfd of any size cannot fill the
 * daemon's address space. */
START_TEST(test_region_host_regions_fit_the_host_memory) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
  td_start(&d, "--host-devices", "1", "--host-memory", "4M", NULL);
  graphd_client *c = td_data(&d, 0);
  void *big, *a, *b;
  graphd_region_ref r;
  ck_assert_int_eq(graphd_host_alloc(c, 8 << 20, &big), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)big, 8, &r),
                   GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(graphd_last_error(c), "--host-memory"), "%s", graphd_last_error(c));
  ck_assert_int_eq(graphd_host_alloc(c, 3 << 20, &a), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, 3 << 20, &b), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)a, 8, &r), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)b, 8, &r),
                   GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_int_eq(graphd_host_free(c, a), GRAPHD_OK);
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)b, 8, &r), GRAPHD_OK);
  graphd_close(c);
}
END_TEST

/* A client that leaves (closes, or is killed) takes its host regions with
 * it: the daemon's mappings come back to where they were, so sessions
 * coming and going never exhaust the kernel's mapping limit. */
START_TEST(test_region_host_mappings_go_with_the_client) {
  graphd_client *ctl = td_control(&d);
  (void)td_device_info(ctl, 0); /* the daemon is up and settled */
  int before = client_map_count(d.pid);
  for (int round = 0; round < 2; round++) {
    int up[2], go[2]; /* the child says it is ready; the parent lets it go on */
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(go), 0);
    pid_t kid = fork();
    ck_assert_int_ge(kid, 0);
    if (kid == 0) {
      graphd_client *c = td_data(&d, 0);
      for (int i = 0; i < 200; i++) {
        void *p;
        graphd_region_ref r;
        if (graphd_host_alloc(c, 4096, &p) != GRAPHD_OK ||
            graphd_region_register(c, (uint64_t)(uintptr_t)p, 8, &r) != GRAPHD_OK)
          _exit(1);
      }
      char b = 0;
      if (write(up[1], &b, 1) != 1 || read(go[0], &b, 1) != 1) _exit(2);
      if (round == 0) graphd_close(c);
      _exit(0); /* round 1: killed by exit, without a close */
    }
    /* While the client is there, its regions (and flag page) are mapped. */
    char b;
    ck_assert_int_eq(read(up[0], &b, 1), 1);
    int during = client_map_count(d.pid);
    ck_assert_msg(during >= before + 200,
                  "%d mappings of clients' memfds with 200 regions, %d before", during, before);
    ck_assert_int_eq(write(go[1], &b, 1), 1);
    close(up[0]);
    close(up[1]);
    close(go[0]);
    close(go[1]);
    int st;
    ck_assert_int_eq(waitpid(kid, &st, 0), kid);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  /* The session ends on the loop shortly after the socket closes. */
  int after = -1;
  for (int i = 0; i < 200 && (after = client_map_count(d.pid)) != before; i++) usleep(10000);
  ck_assert_msg(after == before,
                "the daemon had %d mappings of clients' memfds before and %d after", before, after);
  graphd_close(ctl);
}
END_TEST

/* exec_bind, the binding checks of a replay, on a table of two made-up
 * regions: an in-range binding resolves to the region's address plus the
 * offset; each broken rule is refused with its status, an offset whose sum
 * with the bytes wraps past 2^64 included. */
START_TEST(test_exec_bind_checks_each_rule) {
  gd_region_table t;
  memset(&t, 0, sizeof t);
  gd_region_map m;
  memset(&m, 0, sizeof m);
  m.ptr = 0x10000;
  m.size = 4096;
  m.epoch = 1;
  uint32_t r1 = region_add(&t, &m, 0)->id;
  m.ptr = 0x40000;
  m.epoch = 0; /* from before a reset */
  uint32_t r2 = region_add(&t, &m, 0)->id;
  gd_slot slots[3] = {{GD_ROLE_INPUT, GD_SLOT_STAGED, 1024},
                      {GD_ROLE_OUTPUT, GD_SLOT_STAGED, 1024},
                      {GD_ROLE_SCRATCH, 0, 64}};
  gd_program p = {.nslots = 3, .slots = slots};
  gd_bind_req b[3];
  memset(b, 0, sizeof b);
  gd_bound bind[3];
  char err[512];
#define BIND(n, want)                                                                              \
  do {                                                                                             \
    memset(bind, 0, sizeof bind);                                                                  \
    ck_assert_int_eq(exec_bind(&p, region_lookup, &t, 1, 0, b, (n), bind, err, sizeof err),        \
                     (want));                                                                      \
  } while (0)
  b[0] = (gd_bind_req){.slot = 0, .region_id = r1, .offset = 0, .bytes = 1024};
  b[1] = (gd_bind_req){.slot = 1, .region_id = r1, .offset = 3072, .bytes = 1024};
  BIND(2, 0);
  ck_assert(bind[0].bound && bind[1].bound && !bind[2].bound);
  ck_assert_uint_eq(bind[1].addr, 0x10000 + 3072);
  ck_assert_uint_eq(bind[1].bytes, 1024);
  BIND(1, -GRAPHD_INVALID_ARGUMENT); /* slot 1 is staged and unbound */
  ck_assert_msg(strstr(err, "slot 1"), "%s", err);
  b[1].offset = 3073; /* one byte past the end */
  BIND(2, -GRAPHD_OUT_OF_RANGE);
  b[1].offset = UINT64_MAX - 1000; /* offset + bytes wraps */
  BIND(2, -GRAPHD_OUT_OF_RANGE);
  b[1].offset = 0;
  b[1].bytes = 1023; /* not the slot's size */
  BIND(2, -GRAPHD_INVALID_ARGUMENT);
  b[1].bytes = 1024;
  b[1].region_id = r2; /* imported before the reset */
  BIND(2, -GRAPHD_UNAVAILABLE);
  b[1].region_id = r2 + 1; /* no such region */
  BIND(2, -GRAPHD_NOT_FOUND);
  b[1].region_id = r1;
  b[1].slot = 0; /* slot 0 twice */
  BIND(2, -GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err, "twice"), "%s", err);
  b[1].slot = 1;
  b[2] = (gd_bind_req){.slot = 2, .region_id = r1, .offset = 0, .bytes = 64};
  BIND(3, -GRAPHD_INVALID_ARGUMENT); /* scratch is the daemon's */
  ck_assert_msg(strstr(err, "scratch"), "%s", err);
  b[2].slot = 3;
  BIND(3, -GRAPHD_INVALID_ARGUMENT); /* no slot 3 */
#undef BIND
  gd_region_map *maps;
  size_t n;
  ck_assert_int_eq(region_take_all(&t, &maps, &n), 0);
  ck_assert_uint_eq(n, 2);
  free(maps);
}
END_TEST

int main(void) {
  Suite *s = suite_create("region");
  TCase *tc = tcase_create("region");
  tcase_set_timeout(tc, 30);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_region_register_is_cached_and_counted);
  tcase_add_test(tc, test_region_new_allocation_at_a_reused_address_is_a_new_region);
  tcase_add_test(tc, test_region_cache_finds_each_address_among_many);
  tcase_add_test(tc, test_region_lru_cap_unregisters_the_least_recently_used);
  tcase_add_test(tc, test_region_unregister_and_release_on_close);
  tcase_add_test(tc, test_region_needs_a_data_session_and_its_own_memory);
  tcase_add_test(tc, test_region_bad_fds_are_refused_cleanly);
  tcase_add_test(tc, test_region_bytes_per_uid_are_capped);
  tcase_add_test(tc, test_region_counts_and_session_bytes_are_capped);
  tcase_add_test(tc, test_region_host_mappings_go_with_the_client);
  tcase_add_test(tc, test_region_host_regions_fit_the_host_memory);
  suite_add_tcase(s, tc);
  TCase *pure = tcase_create("range");
  tcase_add_test(pure, test_region_range_check_does_not_overflow);
  tcase_add_test(pure, test_exec_bind_checks_each_rule);
  suite_add_tcase(s, pure);
  return td_run_suite(s);
}
