/* server.c in-process: how the listener takes its socket path. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "daemon/base/options.h"
#include "daemon/server.h"

static char dir[48], path[90];

static void make_stale_socket(const char *p) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", p);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  close(fd); /* the file stays; nothing listens: a daemon that died */
}

/* Connects to p and says whether listen_fd is what answered. */
static bool reaches(const char *p, int listen_fd) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", p);
  bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  if (!ok) return false;
  int got = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK);
  if (got < 0) return false;
  close(got);
  return true;
}

static gd_daemon a, b;
static gd_options oa, ob;
static int rc_a = 1;
static char err_a[512];

/* Daemon A starts while B is held between its probe of the stale file and
 * its unlink: the moment when, without a lock, B removes A's live socket. */
static void start_a_cb(const char *p) {
  server_probed_hook = NULL;
  ck_assert_str_eq(p, path);
  rc_a = server_listen(&a, &oa, err_a, sizeof err_a);
}

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/graphd-server-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/graphd.sock", dir);
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  options_defaults(&oa);
  snprintf(oa.socket_path, sizeof oa.socket_path, "%s", path);
  ob = oa;
  rc_a = 1;
  err_a[0] = 0;
}

static void teardown(void) {
  server_probed_hook = NULL;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

START_TEST(test_server_two_daemons_over_a_stale_socket_never_both_run) {
  make_stale_socket(path);
  server_probed_hook = start_a_cb;
  char err_b[512] = "";
  int rc_b = server_listen(&b, &ob, err_b, sizeof err_b);
  ck_assert_int_ne(rc_a, 1); /* the hook ran */
  ck_assert_msg(rc_b == 0, "%s", err_b);
  /* A was refused, plainly, rather than started on a socket B then
   * replaced (which left A running and unreachable). */
  ck_assert_msg(rc_a < 0, "both daemons started; A %s reachable",
                reaches(path, a.listen_fd) ? "is" : "is not");
  ck_assert_msg(strstr(err_a, "another graphd holds"), "%s", err_a);
  ck_assert_msg(strstr(err_a, path), "%s", err_a);
  ck_assert(reaches(path, b.listen_fd));
  /* Once B serves, its lock is gone: a third daemon finds the socket live
   * and says so. */
  gd_daemon c;
  memset(&c, 0, sizeof c);
  char err_c[512] = "";
  ck_assert_int_lt(server_listen(&c, &ob, err_c, sizeof err_c), 0);
  ck_assert_msg(strstr(err_c, "in use by a running graphd"), "%s", err_c);
  ck_assert(reaches(path, b.listen_fd));
  close(b.listen_fd);
}
END_TEST

/* A daemon that replaces a stale socket on its own still starts, and the
 * lock file it leaves does not stop the next one. */
START_TEST(test_server_stale_socket_is_replaced_and_the_lock_file_stays) {
  make_stale_socket(path);
  char err[512] = "";
  ck_assert_msg(server_listen(&b, &ob, err, sizeof err) == 0, "%s", err);
  ck_assert(reaches(path, b.listen_fd));
  char lock[160];
  snprintf(lock, sizeof lock, "%s.lock", path);
  struct stat st;
  ck_assert_int_eq(stat(lock, &st), 0);
  ck_assert_uint_eq(st.st_mode & 0777, 0600);
  close(b.listen_fd);
  ck_assert_int_eq(unlink(path), 0);
  make_stale_socket(path);
  ck_assert_msg(server_listen(&a, &oa, err, sizeof err) == 0, "%s", err);
  ck_assert(reaches(path, a.listen_fd));
  close(a.listen_fd);
}
END_TEST

static Suite *server_suite(void) {
  Suite *s = suite_create("server");
  TCase *tc = tcase_create("listen");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_server_two_daemons_over_a_stale_socket_never_both_run);
  tcase_add_test(tc, test_server_stale_socket_is_replaced_and_the_lock_file_stays);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return td_run_suite(server_suite()); }
