/* Mappings of client memory over the whole daemon: every region, flag page
 * and ring is one mapping in graphd's address space, and the kernel allows
 * the process vm.max_map_count of them in all. --max-host-maps bounds them
 * over every session (regions stop at 7/8 of it, so new sessions can still
 * map their flag pages), with RESOURCE_EXHAUSTED naming the limit; each
 * uid has a fair share of the bound, so that uids within their region
 * limits cannot take it all from another; and a session's end lets its
 * mappings go without allocating anything, so that a daemon short of
 * memory (as it is near the map count) still ends it. */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/memfd.h"
#include "harness.h"
#include "program3.h"

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
 * session has gone, the second gets its region. (Both are this uid's, so
 * without fair shares: those are the next test's.) */
START_TEST(test_host_maps_are_bounded_over_all_sessions) {
  td_start(&d, "--host-devices", "1", "--max-host-maps", "40", "--max-regions-per-session", "1000",
           "--max-regions-per-uid", "0", "--fair-shares", "no", NULL);
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

/* Registers regions of mem on the raw session fd until one is refused;
 * returns how many went, and the refusal in *last (freed by the caller). */
static int fill(int fd, int mem, int most, Graphd__Wire__Reply **last) {
  int ok = 0;
  *last = NULL;
  for (int i = 0; i < most; i++) {
    Graphd__Wire__Reply *r = register_region(fd, 100 + (uint64_t)i, mem);
    if (r->code != GRAPHD_OK) {
      *last = r;
      break;
    }
    graphd__wire__reply__free_unpacked(r, NULL);
    ok++;
  }
  return ok;
}

/* A uid alone holds at most half of the regions' part of --max-host-maps:
 * 40 gives regions 35 and it 17 mappings (its flag page and 16 regions);
 * the next is refused naming its share and the flag. */
START_TEST(test_host_maps_fair_share_of_one_uid) {
  td_start(&d, "--host-devices", "1", "--max-host-maps", "40", "--max-regions-per-session", "1000",
           "--max-regions-per-uid", "0", NULL);
  int mem = gd_memfd_new_shared("test-region", 4096);
  ck_assert_int_ge(mem, 0);
  int a = data_session();
  Graphd__Wire__Reply *r;
  ck_assert_int_eq(fill(a, mem, 100, &r), 16);
  ck_assert_ptr_nonnull(r);
  td_expect_reply(r, GRAPHD_RESOURCE_EXHAUSTED,
                  td_fmt("fair share of client mappings reached: uid %u's sessions have 17 "
                         "mappings and this is one more, past its share of 17 (regions may take "
                         "35, 7/8 of --max-host-maps 40, / (1 uid with mappings + 1))",
                         (unsigned)geteuid()));
  close(a);
  close(mem);
}
END_TEST

/* A uid that fills what it may and holds it, until the parent says go. */
typedef struct filler {
  uid_t uid;
  int ready[2], go[2];
  pid_t pid;
} filler;

static int fill_and_hold(const void *arg) {
  const filler *f = arg;
  int mem = gd_memfd_new_shared("test-region", 4096);
  if (mem < 0) return 20;
  int fd = data_session();
  Graphd__Wire__Reply *r;
  int n = fill(fd, mem, 1000, &r);
  bool named = r && r->code == GRAPHD_RESOURCE_EXHAUSTED && strstr(r->message, "fair share");
  if (r) graphd__wire__reply__free_unpacked(r, NULL);
  int msg[2] = {n, named};
  if (write(f->ready[1], msg, sizeof msg) != sizeof msg) return 21;
  char go;
  if (read(f->go[0], &go, 1) != 1) return 22;
  close(fd);
  close(mem);
  return 0;
}

static int child_status(pid_t p) {
  int st;
  ck_assert_int_eq(waitpid(p, &st, 0), p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The host module's bytes, read once by the test's own process: a child
 * that runs as another uid may not reach the build tree (a checkout under
 * root's home, mode 0700), so it uses the copy it inherits. */
static uint8_t *host_module;
static size_t host_module_len;

static const uint8_t *host_module_bytes(size_t *len) {
  if (!host_module) host_module = td_read_file(HOST_KERNELS_SO, &host_module_len);
  *len = host_module_len;
  return host_module;
}

/* One checked replay of the 3-kernel program over n floats, through
 * libgraphd (a flag page and three regions); 0 or what went wrong. */
static int replay_once(uint32_t n) {
  size_t len;
  const uint8_t *plugin = host_module_bytes(&len);
  uint8_t mod[32], pid[32];
  graphd_client *c = td_data(&d, 0);
  graphd_stream *s;
  float *x, *cc, *y;
  int rc = 0;
  if (graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, len, mod) != GRAPHD_OK ||
      program3_register(c, mod, GRAPHD_MODE_STAGED, n, pid) != GRAPHD_OK)
    rc = 30;
  else if (graphd_stream_attach(c, NULL, &s) != GRAPHD_OK)
    rc = 31;
  else if (graphd_host_alloc(c, n * 4, (void **)&x) != GRAPHD_OK ||
           graphd_host_alloc(c, n * 4, (void **)&cc) != GRAPHD_OK ||
           graphd_host_alloc(c, n * 4, (void **)&y) != GRAPHD_OK)
    rc = 32;
  if (rc == 0) {
    for (uint32_t i = 0; i < n; i++) {
      x[i] = (float)(i % 97);
      cc[i] = (float)(i % 5);
    }
    graphd_binding b[3] = {{0, (uint64_t)(uintptr_t)x, n * 4},
                           {3, (uint64_t)(uintptr_t)y, n * 4},
                           {1, (uint64_t)(uintptr_t)cc, n * 4}};
    if (graphd_replay(c, s, pid, b, 3, NULL) != GRAPHD_OK) {
      fprintf(stderr, "replay: %s\n", graphd_last_error(c));
      rc = 33;
    }
    for (uint32_t i = 0; rc == 0 && i < n; i++)
      if (y[i] != (2.0f * x[i] + cc[i]) * 2.0f + 1.0f) rc = 34;
    graphd_stream_detach(s);
  }
  graphd_close(c);
  return rc;
}

static int newcomer(const void *arg) {
  (void)arg;
  return replay_once(1024);
}

/* Four uids, one after another, each map what they may under
 * --max-host-maps 400 (regions 350), within their region limits, and hold
 * it: the first half (175 mappings: its share, 350 / (1 + 1)), each next
 * half of what is left (87, 44, 22), each refused naming the fair share.
 * A fifth uid then connects, registers and replays, and so does root.
 * (Before, the first uid took all 350 and the others, the fifth among
 * them, were refused every region.) */
START_TEST(test_host_maps_fair_shares_keep_room_for_another_uid) {
  if (geteuid() != 0) {
    fprintf(stderr, "not root: the rule between users is not exercised here\n");
    return;
  }
  td_start(&d, "--host-devices", "1", "--max-host-maps", "400", "--socket-mode", "0666", NULL);
  ck_assert_int_eq(chmod(d.dir, 0755), 0);
  size_t len;
  const uint8_t *plugin = host_module_bytes(&len);
  graphd_client *admin = td_control(&d); /* the host module, from an admin */
  ck_assert_int_eq(graphd_register_module(admin, GRAPHD_MODULE_HOST_ELF, plugin, len, NULL),
                   GRAPHD_OK);
  graphd_close(admin);
  filler f[4];
  const int want[4] = {174, 86, 43, 21}; /* regions: the mappings less the flag page */
  for (int i = 0; i < 4; i++) {
    f[i].uid = 65531 + (uid_t)i;
    ck_assert_int_eq(pipe(f[i].ready), 0);
    ck_assert_int_eq(pipe(f[i].go), 0);
    f[i].pid = fork();
    ck_assert_int_ge(f[i].pid, 0);
    if (f[i].pid == 0)
      _exit(setgid(f[i].uid) != 0 || setuid(f[i].uid) != 0 ? 10 : fill_and_hold(&f[i]));
    close(f[i].ready[1]);
    close(f[i].go[0]);
    int msg[2] = {-1, 0};
    ck_assert_int_eq(read(f[i].ready[0], msg, sizeof msg), sizeof msg);
    ck_assert_msg(msg[0] == want[i], "uid %u mapped %d regions, not %d", (unsigned)f[i].uid, msg[0],
                  want[i]);
    ck_assert_msg(msg[1], "uid %u's refusal did not name its fair share", (unsigned)f[i].uid);
  }
  /* While they hold them: another uid, and root. */
  pid_t p = fork();
  ck_assert_int_ge(p, 0);
  if (p == 0) _exit(setgid(65530) != 0 || setuid(65530) != 0 ? 10 : newcomer(NULL));
  ck_assert_int_eq(child_status(p), 0);
  ck_assert_int_eq(replay_once(2048), 0);
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(write(f[i].go[1], "g", 1), 1);
    ck_assert_int_eq(child_status(f[i].pid), 0);
    close(f[i].ready[0]);
    close(f[i].go[1]);
  }
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
  tcase_add_test(tc, test_host_maps_fair_share_of_one_uid);
  tcase_add_test(tc, test_host_maps_fair_shares_keep_room_for_another_uid);
  tcase_add_test(tc, test_host_maps_session_end_needs_no_memory);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
