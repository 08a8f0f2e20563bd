/* Running under systemd: sd_notify readiness, status and watchdog, socket
 * activation (LISTEN_FDS), and --check-config on config files. The daemon
 * runs as a child with the host backend; the test plays systemd's part. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "graphd/graphd.h"
#include "harness.h"
#include "daemon/notify.h"
#include "daemon/server.h"
#include "daemon/device/worker.h"

static long long ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void make_dir(char *dir, size_t len) {
  snprintf(dir, len, "/tmp/graphd-sd-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_dir(const char *dir) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

static int unix_socket(int type, const char *path) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  ck_assert_uint_lt(strlen(path), sizeof a.sun_path);
  memcpy(a.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(fd, 0);
  ck_assert_msg(bind(fd, (struct sockaddr *)&a, sizeof a) == 0, "bind %s: %s", path,
                strerror(errno));
  return fd;
}

/* What systemd sets up for a child: environment, and for socket
 * activation the listening socket as fd 3. */
typedef struct child_setup {
  const char *notify_socket; /* NOTIFY_SOCKET, or NULL */
  const char *watchdog_usec; /* WATCHDOG_USEC, or NULL */
  int listen_fd;             /* passed as fd 3 with LISTEN_FDS=1, or -1 */
} child_setup;

/* Forks and execs graphd on the host backend with stderr to log. PIDs in
 * LISTEN_PID and WATCHDOG_PID are the child's own, set after the fork as
 * systemd does. */
static pid_t spawn_graphd(const child_setup *cs, const char *socket_path, const char *log) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid > 0) return pid;
  int lf = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (lf < 0 || dup2(lf, 1) < 0 || dup2(lf, 2) < 0) _exit(126);
  int nul = open("/dev/null", O_RDONLY);
  if (nul < 0 || dup2(nul, 0) < 0) _exit(126);
  char pidbuf[32];
  snprintf(pidbuf, sizeof pidbuf, "%d", (int)getpid());
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDNAMES");
  unsetenv("JOURNAL_STREAM");
  if (cs->notify_socket) setenv("NOTIFY_SOCKET", cs->notify_socket, 1);
  if (cs->watchdog_usec) {
    setenv("WATCHDOG_USEC", cs->watchdog_usec, 1);
    setenv("WATCHDOG_PID", pidbuf, 1);
  }
  if (cs->listen_fd >= 0) {
    if (cs->listen_fd != 3 && dup2(cs->listen_fd, 3) < 0) _exit(126);
    if (fcntl(3, F_SETFD, 0) < 0) _exit(126); /* survives exec */
    setenv("LISTEN_FDS", "1", 1);
    setenv("LISTEN_PID", pidbuf, 1);
  }
  char *argv[] = {GRAPHD_BIN,          "--backend",   "host",  "--socket",
                  (char *)socket_path, "--log-level", "debug", NULL};
  execv(argv[0], argv);
  _exit(127);
}

/* Waits up to 10 s for graphd to exit; returns its wait status. */
static int wait_exit(pid_t pid) {
  long long deadline = ms_now() + 10000;
  int st;
  while (ms_now() < deadline) {
    if (waitpid(pid, &st, WNOHANG) == pid) return st;
    usleep(5000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  ck_abort_msg("graphd did not stop within 10 s of SIGTERM");
  return -1;
}

/* One SIGTERM, as systemd sends. */
static int stop_graphd(pid_t pid) {
  kill(pid, SIGTERM);
  return wait_exit(pid);
}

static void dump_log(const char *log) {
  char cmd[160];
  snprintf(cmd, sizeof cmd, "cat '%s' >&2", log);
  if (system(cmd) != 0) fprintf(stderr, "(no log at %s)\n", log);
}

/* Receives one datagram within timeout_ms into buf; returns its length or
 * -1 on timeout. */
static ssize_t recv_msg(int fd, char *buf, size_t len, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (poll(&p, 1, timeout_ms) <= 0) return -1;
  ssize_t n = recv(fd, buf, len - 1, 0);
  ck_assert_int_gt(n, 0);
  buf[n] = '\0';
  return n;
}

static bool has_line(const char *msg, const char *line) {
  size_t n = strlen(line);
  for (const char *p = msg; (p = strstr(p, line)) != NULL; p += n)
    if ((p == msg || p[-1] == '\n') && (p[n] == '\n' || p[n] == '\0')) return true;
  return false;
}

static bool can_connect(const char *path) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  ck_assert_uint_lt(strlen(path), sizeof a.sun_path);
  memcpy(a.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

static graphd_client *control_at(const char *path) {
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = path;
  o.timeout_ms = 10000;
  o.client_name = "test_systemd";
  graphd_client *c = NULL;
  char err[GRAPHD_ERRMAX];
  graphd_status st = graphd_connect(&o, &c, err, sizeof err);
  ck_assert_msg(st == GRAPHD_OK, "connect %s: %s", path, err);
  return c;
}

/* --- sd_notify ------------------------------------------------------------ */

START_TEST(test_notify_ready_status_watchdog_then_stopping) {
  char dir[64], nsock[128], gsock[128], log[128], msg[1024];
  make_dir(dir, sizeof dir);
  snprintf(nsock, sizeof nsock, "%s/notify", dir);
  snprintf(gsock, sizeof gsock, "%s/graphd.sock", dir);
  snprintf(log, sizeof log, "%s/graphd.log", dir);
  int nfd = unix_socket(SOCK_DGRAM, nsock);
  child_setup cs = {.notify_socket = nsock, .watchdog_usec = "600000", .listen_fd = -1};
  pid_t pid = spawn_graphd(&cs, gsock, log);

  /* READY=1 comes with a STATUS= line, and only once clients can connect. */
  ssize_t n = recv_msg(nfd, msg, sizeof msg, 20000);
  if (n < 0) dump_log(log);
  ck_assert_msg(n > 0, "no sd_notify message within 20 s");
  ck_assert_msg(has_line(msg, "READY=1"), "first message is not READY=1: %s", msg);
  ck_assert_msg(strstr(msg, "STATUS=1 of 1 device(s) up (host), 0 session(s)") != NULL,
                "READY without the expected STATUS: %s", msg);
  ck_assert_msg(can_connect(gsock), "READY=1 sent before the socket accepts connections");

  /* Pings keep coming, well within the 600 ms interval. */
  int pings = 0;
  long long start = ms_now(), last = start;
  while (pings < 3 && ms_now() - start < 3000) {
    if (recv_msg(nfd, msg, sizeof msg, 1000) < 0) break;
    if (has_line(msg, "WATCHDOG=1")) {
      ck_assert_msg(ms_now() - last < 600, "watchdog gap of %lld ms", ms_now() - last);
      last = ms_now();
      pings++;
    }
  }
  ck_assert_int_ge(pings, 2);

  /* STATUS= follows the session count. */
  graphd_client *c = control_at(gsock);
  bool seen = false;
  start = ms_now();
  while (!seen && ms_now() - start < 3000 && recv_msg(nfd, msg, sizeof msg, 1000) > 0)
    seen = strstr(msg, "STATUS=1 of 1 device(s) up (host), 1 session(s)") != NULL;
  ck_assert_msg(seen, "STATUS did not report the open session");
  graphd_close(c);

  /* STOPPING=1 after SIGTERM, then a clean exit. */
  kill(pid, SIGTERM);
  bool stopping = false;
  start = ms_now();
  while (!stopping && ms_now() - start < 5000 && recv_msg(nfd, msg, sizeof msg, 1000) > 0)
    stopping = has_line(msg, "STOPPING=1");
  ck_assert_msg(stopping, "no STOPPING=1 after SIGTERM");
  int st = wait_exit(pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
  close(nfd);
  remove_dir(dir);
}
END_TEST

START_TEST(test_notify_sends_no_pings_without_a_watchdog) {
  char dir[64], nsock[128], gsock[128], log[128], msg[1024];
  make_dir(dir, sizeof dir);
  snprintf(nsock, sizeof nsock, "%s/notify", dir);
  snprintf(gsock, sizeof gsock, "%s/graphd.sock", dir);
  snprintf(log, sizeof log, "%s/graphd.log", dir);
  int nfd = unix_socket(SOCK_DGRAM, nsock);
  child_setup cs = {.notify_socket = nsock, .watchdog_usec = NULL, .listen_fd = -1};
  pid_t pid = spawn_graphd(&cs, gsock, log);
  ck_assert_int_gt(recv_msg(nfd, msg, sizeof msg, 20000), 0);
  ck_assert_msg(has_line(msg, "READY=1") && !strstr(msg, "WATCHDOG"), "got %s", msg);
  /* Nothing changes, so nothing more is sent for a while. */
  ck_assert_int_lt(recv_msg(nfd, msg, sizeof msg, 1200), 0);
  ck_assert_int_eq(stop_graphd(pid), 0);
  close(nfd);
  remove_dir(dir);
}
END_TEST

/* In-process: a worker that has been busy in one job for longer than the
 * watchdog interval stops the pings; when it finishes, they resume. */
typedef struct phase {
  int nfd;
  int pings, statuses;
  char last_status[256];
} phase;

static void collect(phase *ph) {
  char msg[1024];
  ssize_t n;
  while ((n = recv(ph->nfd, msg, sizeof msg - 1, MSG_DONTWAIT)) > 0) {
    msg[n] = '\0';
    if (has_line(msg, "WATCHDOG=1")) ph->pings++;
    char *s = strstr(msg, "STATUS=");
    if (s) {
      ph->statuses++;
      snprintf(ph->last_status, sizeof ph->last_status, "%.*s", (int)strcspn(s + 7, "\n"), s + 7);
    }
  }
}

static void stop_loop_cb(uv_timer_t *t) { uv_stop(t->loop); }

/* Runs the loop for ms, then collects what was sent during it. */
static void run_for(uv_loop_t *loop, int ms, phase *ph) {
  uv_timer_t t;
  uv_timer_init(loop, &t);
  uv_timer_start(&t, stop_loop_cb, (uint64_t)ms, 0);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  ph->pings = ph->statuses = 0;
  ph->last_status[0] = '\0';
  collect(ph);
}

START_TEST(test_watchdog_pings_stop_while_a_worker_is_stuck) {
  char dir[64], nsock[128], pidbuf[32];
  make_dir(dir, sizeof dir);
  snprintf(nsock, sizeof nsock, "%s/notify", dir);
  phase ph = {.nfd = unix_socket(SOCK_DGRAM, nsock)};
  snprintf(pidbuf, sizeof pidbuf, "%d", (int)getpid());
  setenv("NOTIFY_SOCKET", nsock, 1);
  setenv("WATCHDOG_USEC", "200000", 1); /* pings every 100 ms; stuck after 200 ms */
  setenv("WATCHDOG_PID", pidbuf, 1);

  uv_loop_t loop;
  ck_assert_int_eq(uv_loop_init(&loop), 0);
  gd_worker w;
  memset(&w, 0, sizeof w);
  atomic_store(&w.heartbeat_ns, gd_now_ns());
  gd_device dev;
  memset(&dev, 0, sizeof dev);
  atomic_store(&dev.state, GD_DEVICE_OK);
  gd_daemon s;
  memset(&s, 0, sizeof s);
  s.loop = &loop;
  s.ndevices = 1;
  s.devices = &dev;
  s.pool.workers = &w;
  s.pool.n = 1;
  gd_notify n;
  ck_assert_int_eq(notify_start(&n, &s), 0);
  ck_assert_uint_eq(n.watchdog_usec, 200000);

  run_for(&loop, 500, &ph); /* READY=1 and its ping count too */
  ck_assert_int_ge(ph.pings, 3);

  /* Busy in one job, last heard of a second ago: stuck. */
  atomic_store(&w.busy, true);
  atomic_store(&w.heartbeat_ns, gd_now_ns() - 1000000000ull);
  run_for(&loop, 600, &ph);
  ck_assert_int_eq(ph.pings, 0);
  ck_assert_msg(strstr(ph.last_status, "stuck") != NULL, "status: %s", ph.last_status);

  /* The job finished: pings resume and STATUS= says so. */
  atomic_store(&w.busy, false);
  atomic_store(&w.heartbeat_ns, gd_now_ns());
  run_for(&loop, 500, &ph);
  ck_assert_int_ge(ph.pings, 2);
  ck_assert_msg(strstr(ph.last_status, "1 of 1 device(s) up") != NULL, "status: %s",
                ph.last_status);

  /* STOPPING=1, and the timer is closed so the loop can be closed. */
  notify_stop(&n);
  notify_stop(&n); /* idempotent */
  uv_run(&loop, UV_RUN_DEFAULT);
  char msg[256];
  ssize_t k = recv(ph.nfd, msg, sizeof msg - 1, MSG_DONTWAIT);
  ck_assert_int_gt(k, 0);
  msg[k] = '\0';
  ck_assert_msg(has_line(msg, "STOPPING=1"), "got %s", msg);
  ck_assert_int_lt(recv(ph.nfd, msg, sizeof msg, MSG_DONTWAIT), 0);
  ck_assert_int_eq(uv_loop_close(&loop), 0);
  close(ph.nfd);
  remove_dir(dir);
}
END_TEST

START_TEST(test_notify_is_a_no_op_outside_systemd) {
  unsetenv("NOTIFY_SOCKET");
  uv_loop_t loop;
  ck_assert_int_eq(uv_loop_init(&loop), 0);
  gd_daemon s;
  memset(&s, 0, sizeof s);
  s.loop = &loop;
  gd_notify n;
  ck_assert_int_eq(notify_start(&n, &s), 0);
  ck_assert(!n.enabled && !n.timer_open);
  notify_stop(&n);
  ck_assert_int_eq(uv_run(&loop, UV_RUN_NOWAIT), 0);
  ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

/* --- Socket activation ---------------------------------------------------- */

START_TEST(test_socket_activation_serves_and_never_unlinks) {
  char dir[64], path[128], unused[128], log[128];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/activated.sock", dir);
  snprintf(unused, sizeof unused, "%s/own.sock", dir);
  snprintf(log, sizeof log, "%s/graphd.log", dir);
  /* systemd's side: bind and listen once; the socket outlives each daemon. */
  int lfd = unix_socket(SOCK_STREAM, path);
  ck_assert_int_eq(listen(lfd, 16), 0);
  child_setup cs = {.notify_socket = NULL, .watchdog_usec = NULL, .listen_fd = lfd};

  for (int round = 0; round < 2; round++) {
    pid_t pid = spawn_graphd(&cs, unused, log);
    /* A client may connect before graphd is up: it waits in the backlog. */
    graphd_client *c = control_at(path);
    graphd_daemon_status *st = NULL;
    graphd_status rc = graphd_get_status(c, &st);
    if (rc != GRAPHD_OK) dump_log(log);
    ck_assert_msg(rc == GRAPHD_OK, "status: %s", graphd_last_error(c));
    ck_assert_uint_eq(st->pid, (uint32_t)pid);
    ck_assert_uint_eq(st->ndevices, 1);
    ck_assert_str_eq(st->devices[0].backend, "host");
    graphd_daemon_status_free(st);
    graphd_close(c);
    int es = stop_graphd(pid);
    ck_assert_msg(WIFEXITED(es) && WEXITSTATUS(es) == 0, "exit status %d", es);

    struct stat sb;
    ck_assert_msg(stat(path, &sb) == 0 && S_ISSOCK(sb.st_mode),
                  "round %d: graphd removed the socket it inherited", round);
    ck_assert_msg(access(unused, F_OK) != 0, "graphd bound --socket despite LISTEN_FDS");
    FILE *f = fopen(log, "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    bool adopted = false;
    while (!adopted && fgets(line, sizeof line, f)) adopted = strstr(line, "(socket from systemd)");
    fclose(f);
    ck_assert_msg(adopted, "the log does not say the socket came from systemd");
  }
  close(lfd);
  remove_dir(dir);
}
END_TEST

/* --- --check-config ------------------------------------------------------- */

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fputs(text, f) >= 0, 1);
  fclose(f);
}

START_TEST(test_check_config_accepts_a_valid_file_and_flags_override_it) {
  char dir[64], conf[128], out[8192];
  make_dir(dir, sizeof dir);
  snprintf(conf, sizeof conf, "%s/graphd.conf", dir);
  write_file(conf,
             "; comment\n"
             "[graphd]\n"
             "socket = /run/graphd/graphd.sock\n"
             "max-frame = 8M\n"
             "log-level = warn\n"
             "ready-timeout = 0\n");
  char *argv[] = {GRAPHD_BIN, "--config", conf, "--log-level", "debug", "--check-config", NULL};
  int rc = td_run(argv, out, sizeof out, 10000);
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  ck_assert_msg(strstr(out, "configuration is valid"), "%s", out);
  /* It names the file it read. */
  char read_line[256];
  snprintf(read_line, sizeof read_line,
           "graphd: configuration is valid (read %s, then the flags)\n", conf);
  ck_assert_msg(strncmp(out, read_line, strlen(read_line)) == 0, "no '%s' first in: %s", read_line,
                out);
  ck_assert_msg(strstr(out, "max-frame = 8388608\n"), "%s", out);
  ck_assert_msg(strstr(out, "ready-timeout = 0\n"), "%s", out);
  ck_assert_msg(strstr(out, "log-level = debug\n"), "the flag did not override: %s", out);
  remove_dir(dir);
}
END_TEST

START_TEST(test_check_config_rejects_a_bad_file_with_path_and_line) {
  char dir[64], conf[128], out[8192], want[160];
  make_dir(dir, sizeof dir);
  snprintf(conf, sizeof conf, "%s/graphd.conf", dir);
  write_file(conf, "[graphd]\nsocket-mode = 0660\nmax-frame = lots\n");
  char *argv[] = {GRAPHD_BIN, "--config", conf, "--check-config", NULL};
  int rc = td_run(argv, out, sizeof out, 10000);
  ck_assert_msg(rc != 0, "a bad config passed: %s", out);
  snprintf(want, sizeof want, "%s:3: max-frame", conf);
  ck_assert_msg(strstr(out, want), "no '%s' in: %s", want, out);

  /* inih reports a section at its first setting. */
  write_file(conf, "[graphd]\nbackend = host\n[gpu]\nbackend = cuda\n");
  rc = td_run(argv, out, sizeof out, 10000);
  ck_assert_msg(rc != 0, "an unknown section passed: %s", out);
  snprintf(want, sizeof want, "%s:4: unknown section [gpu]", conf);
  ck_assert_msg(strstr(out, want), "no '%s' in: %s", want, out);

  /* The host module allow-list is read at start: a bad id names its line. */
  char allow[128], body[256];
  snprintf(allow, sizeof allow, "%s/host-modules.allow", dir);
  write_file(allow,
             "# ids\n0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\nxyz\n");
  snprintf(body, sizeof body, "[graphd]\nhost-module-allow = %s\n", allow);
  write_file(conf, body);
  rc = td_run(argv, out, sizeof out, 10000);
  ck_assert_msg(rc != 0, "a bad allow-list passed: %s", out);
  snprintf(body, sizeof body, "%s:3: not a module id", allow);
  ck_assert_msg(strstr(out, body), "no '%s' in: %s", body, out);

  /* A config named explicitly must exist. */
  char missing[160];
  snprintf(missing, sizeof missing, "%s/absent.conf", dir);
  char *argv2[] = {GRAPHD_BIN, "--config", missing, "--check-config", NULL};
  rc = td_run(argv2, out, sizeof out, 10000);
  ck_assert_msg(rc != 0 && strstr(out, missing), "exit %d: %s", rc, out);
  remove_dir(dir);
}
END_TEST

/* The example config is valid as shipped (all commented out) and with
 * every documented setting switched on. */
START_TEST(test_check_config_accepts_the_shipped_example) {
  char dir[64], conf[128], out[8192], line[1024];
  char *argv[] = {GRAPHD_BIN, "--config", GRAPHD_EXAMPLE_CONF, "--check-config", NULL};
  int rc = td_run(argv, out, sizeof out, 10000);
  ck_assert_msg(rc == 0, "%s: exit %d: %s", GRAPHD_EXAMPLE_CONF, rc, out);

  make_dir(dir, sizeof dir);
  snprintf(conf, sizeof conf, "%s/all.conf", dir);
  FILE *in = fopen(GRAPHD_EXAMPLE_CONF, "r");
  FILE *all = fopen(conf, "w");
  ck_assert(in && all);
  int settings = 0;
  while (fgets(line, sizeof line, in)) {
    size_t k = strspn(line + 1, "abcdefghijklmnopqrstuvwxyz-");
    bool setting = line[0] == '#' && k > 0 && strncmp(line + 1 + k, " = ", 3) == 0;
    settings += setting;
    fputs(setting ? line + 1 : line, all);
  }
  fclose(in);
  fclose(all);
  ck_assert_int_ge(settings, 12);
  argv[2] = conf;
  rc = td_run(argv, out, sizeof out, 10000);
  ck_assert_msg(rc == 0, "every example setting on: exit %d: %s", rc, out);
  ck_assert_msg(strstr(out, "socket-group = graphd\n"), "%s", out);
  remove_dir(dir);
}
END_TEST

static Suite *systemd_suite(void) {
  Suite *s = suite_create("systemd");
  TCase *tc = tcase_create("notify");
  tcase_set_timeout(tc, 40);
  tcase_add_test(tc, test_notify_ready_status_watchdog_then_stopping);
  tcase_add_test(tc, test_notify_sends_no_pings_without_a_watchdog);
  tcase_add_test(tc, test_watchdog_pings_stop_while_a_worker_is_stuck);
  tcase_add_test(tc, test_notify_is_a_no_op_outside_systemd);
  suite_add_tcase(s, tc);
  tc = tcase_create("activation");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_socket_activation_serves_and_never_unlinks);
  suite_add_tcase(s, tc);
  tc = tcase_create("config");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_check_config_accepts_a_valid_file_and_flags_override_it);
  tcase_add_test(tc, test_check_config_rejects_a_bad_file_with_path_and_line);
  tcase_add_test(tc, test_check_config_accepts_the_shipped_example);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return td_run_suite(systemd_suite()); }
