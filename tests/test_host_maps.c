/* Mappings of client memory over the whole daemon: every region, flag page
 * and ring is one mapping in graphd's address space, and the kernel allows
 * the process vm.max_map_count of them in all. --max-host-maps bounds them
 * over every session (regions stop at 7/8 of it, so new sessions can still
 * map their flag pages), with RESOURCE_EXHAUSTED naming the limit; and a
 * session's end lets its mappings go without allocating anything, so that
 * a daemon short of memory (as it is near the map count) still ends it. */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/memfd.h"
#include "harness.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif

static gd_test_daemon d;

static void teardown(void) {
  if (d.pid > 0) ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* A raw data session on host device 0 with a flag page. */
static int data_session(void) {
  graphd_client *ctl = td_control(&d);
  int fd = td_raw_connect(&d);
  td_raw_data_hello(ctl, fd, 0);
  graphd_close(ctl);
  int flags = gd_memfd_new_shared("test-flags", 4096);
  ck_assert_int_ge(flags, 0);
  td_expect_reply(td_raw_register_flags(fd, 2, flags, 4), GRAPHD_OK, NULL);
  close(flags);
  return fd;
}

/* Registers memfd mem (4 KiB) as a region of the raw session fd and
 * returns the reply. */
static Graphd__Wire__Reply *register_region(int fd, uint64_t id, int mem) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterRegion m = GRAPHD__WIRE__REGISTER_REGION__INIT;
  req.request_id = id;
  req.nfds = 1;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_REGION;
  req.register_region = &m;
  m.kind = GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD;
  m.size = 4096;
  td_raw_send_request(fd, &req, &mem, 1);
  Graphd__Wire__Reply *r = td_raw_recv(fd, 10000);
  ck_assert_ptr_nonnull(r);
  return r;
}

/* The daemon's mappings of memfds named test-region. */
static int daemon_region_maps(void) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%d/maps", (int)td_daemon_pid(&d));
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "memfd:test-region")) n++;
  fclose(f);
  return n;
}

/* --max-host-maps 40: the regions of two sessions together stop at 35 (7/8
 * of it); the second session's flag page still fits; once the first
 * session has gone, the second gets its region. */
START_TEST(test_host_maps_are_bounded_over_all_sessions) {
  td_start(&d, "--host-devices", "1", "--max-host-maps", "40", "--max-regions-per-session", "1000",
           "--max-regions-per-uid", "0", NULL);
  int mem = gd_memfd_new_shared("test-region", 4096);
  ck_assert_int_ge(mem, 0);
  int a = data_session();
  int ok = 0;
  Graphd__Wire__Reply *r = NULL;
  for (int i = 0; i < 100; i++) {
    r = register_region(a, 10 + (uint64_t)i, mem);
    if (r->code != GRAPHD_OK) break;
    graphd__wire__reply__free_unpacked(r, NULL);
    r = NULL;
    ok++;
  }
  ck_assert_msg(r, "100 regions of one session were all mapped under --max-host-maps 40");
  /* Its flag page and 34 regions: 35 mappings. */
  ck_assert_int_eq(ok, 34);
  td_expect_reply(r, GRAPHD_RESOURCE_EXHAUSTED, "--max-host-maps 40");
  int b = data_session();
  td_expect_reply(register_region(b, 10, mem), GRAPHD_RESOURCE_EXHAUSTED, "vm.max_map_count");
  close(a);
  /* The first session's end lets its mappings go, then b maps again. */
  uint32_t code = GRAPHD_RESOURCE_EXHAUSTED;
  for (int i = 0; i < 1000 && code == GRAPHD_RESOURCE_EXHAUSTED; i++) {
    r = register_region(b, 20 + (uint64_t)i, mem);
    code = r->code;
    graphd__wire__reply__free_unpacked(r, NULL);
    if (code == GRAPHD_RESOURCE_EXHAUSTED) usleep(10000);
  }
  ck_assert_uint_eq(code, GRAPHD_OK);
  close(b);
  close(mem);
}
END_TEST

/* Out of address space (the daemon's RLIMIT_AS set to what it has, as a
 * daemon near the kernel's map count is), a session of 8192 regions still
 * ends: its end allocates nothing, and every one of its mappings goes. */
static void session_end_needs_no_memory(void) {
  enum { REGIONS = 8192 };
  td_start(&d, "--host-devices", "1", "--max-regions-per-session", "10000", "--max-regions-per-uid",
           "0", "--log-level", "info", NULL);
  int mem = gd_memfd_new_shared("test-region", 4096);
  ck_assert_int_ge(mem, 0);
  int a = data_session();
  for (int i = 0; i < REGIONS; i++)
    td_expect_reply(register_region(a, 10 + (uint64_t)i, mem), GRAPHD_OK, NULL);
  ck_assert_int_eq(daemon_region_maps(), REGIONS);
  pid_t pid = td_daemon_pid(&d);
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  unsigned long long vm_kib = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmSize: %llu kB", &vm_kib) == 1) break;
  fclose(f);
  ck_assert_uint_gt(vm_kib, 0);
  struct rlimit cap = {.rlim_cur = vm_kib << 10, .rlim_max = RLIM_INFINITY}, old;
  ck_assert_int_eq(prlimit(pid, RLIMIT_AS, &cap, &old), 0);
  close(a);
  int left = REGIONS;
  for (int i = 0; i < 1000 && (left = daemon_region_maps()) > 0; i++) usleep(10000);
  ck_assert_int_eq(prlimit(pid, RLIMIT_AS, &old, NULL), 0);
  ck_assert_msg(left == 0, "%d of the session's %d mappings stayed after its end", left, REGIONS);
  ck_assert(!td_log_contains(&d, "out of memory"));
  close(mem);
}

START_TEST(test_host_maps_session_end_needs_no_memory) {
#ifndef SANITIZED
  session_end_needs_no_memory();
#else
  /* The sanitizers' runtimes map memory as they go: a cap on the address
   * space would stop them, not graphd. */
  (void)session_end_needs_no_memory;
#endif
}
END_TEST

int main(void) {
  Suite *s = suite_create("host_maps");
  TCase *tc = tcase_create("host_maps");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, NULL, teardown);
  tcase_add_test(tc, test_host_maps_are_bounded_over_all_sessions);
  tcase_add_test(tc, test_host_maps_session_end_needs_no_memory);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
