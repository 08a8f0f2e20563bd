/* End to end on the host backend: start, status, data sessions, the
 * socket's rules, and graceful shutdown. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "graphd/graphd.h"
#include "graphd/frame.h"
#include "harness.h"

static graphd_client *data_session(const gd_test_daemon *d, const uint8_t uuid[16],
                                   graphd_status *st, char *err) {
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = d->socket;
  o.kind = GRAPHD_SESSION_DATA;
  memcpy(o.device_uuid, uuid, 16);
  o.timeout_ms = 5000;
  graphd_client *c = NULL;
  *st = graphd_connect(&o, &c, err, GRAPHD_ERRMAX);
  return c;
}

START_TEST(test_daemon_status_end_to_end_and_graceful_stop) {
  gd_test_daemon d;
  td_start(&d, "--backend", "host", NULL);
  graphd_client *c = td_control(&d);
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  ck_assert_str_eq(s->version, graphd_version());
  ck_assert_uint_eq(s->pid, (uint32_t)d.pid);
  ck_assert_uint_eq(s->ndevices, 1);
  ck_assert_uint_eq(s->sessions, 1);
  graphd_device_info *dev = &s->devices[0];
  ck_assert_str_eq(dev->backend, "host");
  ck_assert_str_eq(dev->state, "ok");
  ck_assert_uint_eq(dev->total_memory, 1ull << 30);
  ck_assert_uint_eq(dev->free_memory, 1ull << 30);
  ck_assert_int_eq(dev->mps_enabled, 0);
  ck_assert_uint_eq(dev->epoch, 0);
  ck_assert_int_eq(strncmp(dev->uuid_str, "HOST-", 5), 0);
  ck_assert_uint_eq(dev->counters.sessions, 0);
  ck_assert_uint_eq(dev->counters.replays, 0);
  graphd_daemon_status_free(s);
  graphd_close(c);
  int st = td_stop(&d);
  ck_assert(WIFEXITED(st));
  ck_assert_int_eq(WEXITSTATUS(st), 0);
  struct stat sb;
  ck_assert_int_eq(stat(d.socket, &sb), -1); /* removed at exit */
  ck_assert(td_log_contains(&d, "shutting down (SIGTERM)"));
  td_cleanup(&d);
}
END_TEST

START_TEST(test_daemon_uptime_advances) {
  gd_test_daemon d;
  td_start(&d, "--backend", "host", NULL);
  graphd_client *c = td_control(&d);
  graphd_daemon_status *a, *b;
  ck_assert_int_eq(graphd_get_status(c, &a), GRAPHD_OK);
  usleep(120000);
  ck_assert_int_eq(graphd_get_status(c, &b), GRAPHD_OK);
  ck_assert_uint_ge(b->uptime_ms, a->uptime_ms + 100);
  graphd_daemon_status_free(a);
  graphd_daemon_status_free(b);
  graphd_close(c);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

START_TEST(test_daemon_host_devices_and_data_sessions) {
  gd_test_daemon d;
  td_start(&d, "--host-devices", "3", "--host-memory", "256M", NULL);
  graphd_client *c = td_control(&d);
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  ck_assert_uint_eq(s->ndevices, 3);
  for (uint32_t i = 0; i < 3; i++) {
    ck_assert_uint_eq(s->devices[i].ordinal, i);
    ck_assert_uint_eq(s->devices[i].total_memory, 256u << 20);
    for (uint32_t j = 0; j < i; j++)
      ck_assert(memcmp(s->devices[i].uuid, s->devices[j].uuid, 16) != 0);
  }
  graphd_status st;
  char err[GRAPHD_ERRMAX];
  graphd_client *d2 = data_session(&d, s->devices[2].uuid, &st, err);
  ck_assert_msg(st == GRAPHD_OK, "%s", err);
  graphd_device_info info;
  ck_assert_int_eq(graphd_session_device(d2, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.ordinal, 2);
  ck_assert_str_eq(info.uuid_str, s->devices[2].uuid_str);
  ck_assert_int_eq(graphd_session_device(c, &info), GRAPHD_FAILED_PRECONDITION);
  graphd_daemon_status_free(s);

  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  ck_assert_uint_eq(s->devices[2].counters.sessions, 1);
  ck_assert_uint_eq(s->devices[0].counters.sessions, 0);
  ck_assert_uint_eq(s->sessions, 2);
  graphd_daemon_status_free(s);
  /* A data session may ask for status too. */
  ck_assert_int_eq(graphd_ping(d2, NULL, 0), GRAPHD_OK);
  graphd_close(d2);
  for (int i = 0; i < 200; i++) {
    ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
    uint64_t n = s->devices[2].counters.sessions;
    graphd_daemon_status_free(s);
    if (n == 0) break;
    ck_assert_int_lt(i, 199);
    usleep(5000);
  }
  graphd_close(c);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

START_TEST(test_daemon_unknown_uuid_is_not_found) {
  gd_test_daemon d;
  td_start(&d, "--backend", "host", NULL);
  uint8_t uuid[16];
  memset(uuid, 0xab, 16);
  graphd_status st;
  char err[GRAPHD_ERRMAX];
  graphd_client *c = data_session(&d, uuid, &st, err);
  ck_assert_ptr_null(c);
  ck_assert_int_eq(st, GRAPHD_NOT_FOUND);
  ck_assert_msg(strstr(err, "abababab-abab-abab-abab-abababababab"), "%s", err);
  ck_assert_msg(strstr(err, "it serves: HOST-"), "%s", err);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

START_TEST(test_daemon_socket_mode_is_0660) {
  gd_test_daemon d;
  td_start(&d, "--backend", "host", NULL);
  struct stat sb;
  ck_assert_int_eq(stat(d.socket, &sb), 0);
  ck_assert(S_ISSOCK(sb.st_mode));
  ck_assert_uint_eq(sb.st_mode & 0777, 0660);
  td_stop(&d);
  td_cleanup(&d);
  td_start(&d, "--backend", "host", "--socket-mode", "0600", NULL);
  ck_assert_int_eq(stat(d.socket, &sb), 0);
  ck_assert_uint_eq(sb.st_mode & 0777, 0600);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

static int run_graphd_on(const char *socket, char *out, size_t outlen) {
  char *argv[] = {GRAPHD_BIN, "--backend", "host", "--socket", (char *)socket, NULL};
  return td_run(argv, out, outlen, 10000);
}

START_TEST(test_daemon_never_steals_a_live_socket) {
  gd_test_daemon d;
  td_start(&d, "--backend", "host", NULL);
  char out[4096];
  int rc = run_graphd_on(d.socket, out, sizeof out);
  ck_assert_int_ne(rc, 0);
  ck_assert_msg(strstr(out, "in use by a running graphd"), "%s", out);
  /* The first daemon still serves. */
  graphd_client *c = td_control(&d);
  ck_assert_int_eq(graphd_ping(c, "x", 1), GRAPHD_OK);
  graphd_close(c);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

/* A daemon that exits removes its own socket file only: when the path has
 * meanwhile become another daemon's socket, that one stays. */
START_TEST(test_daemon_exit_leaves_a_newer_daemons_socket) {
  gd_test_daemon a, b;
  td_start(&a, "--backend", "host", NULL);
  td_start(&b, "--backend", "host", NULL);
  /* b's socket now lives at a's path (as if a's file had been removed and
   * b started there). */
  ck_assert_int_eq(rename(b.socket, a.socket), 0);
  ck_assert_int_eq(td_stop(&a), 0);
  struct stat st;
  ck_assert_msg(stat(a.socket, &st) == 0 && S_ISSOCK(st.st_mode),
                "the exiting daemon removed the newer daemon's socket");
  snprintf(b.socket, sizeof b.socket, "%s", a.socket);
  graphd_client *c = td_control(&b);
  ck_assert_int_eq(graphd_ping(c, "x", 1), GRAPHD_OK);
  graphd_close(c);
  ck_assert_msg(td_log_contains(&a, "another daemon's socket now"), "a's log says nothing");
  td_stop(&b);
  td_cleanup(&a);
  td_cleanup(&b);
}
END_TEST

static double cpu_ms(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  /* Fields after the command's closing parenthesis: state is 3, utime 14. */
  char *p = strrchr(buf, ')');
  unsigned long ut = 0, stt = 0;
  ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &stt),
                   2);
  return (double)(ut + stt) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

static double wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Out of file descriptors, the daemon rests its listener instead of
 * spinning on the connection it cannot accept, logs it once, and accepts
 * again once sessions close. */
START_TEST(test_daemon_out_of_fds_neither_spins_nor_floods_the_log) {
  gd_test_daemon d;
  setenv("GRAPHD_TEST_WRAPPER", "prlimit --nofile=40:40", 1);
  td_start(&d, "--backend", "host", NULL);
  unsetenv("GRAPHD_TEST_WRAPPER");
  int fds[80];
  for (int i = 0; i < 80; i++) fds[i] = td_raw_connect(&d);
  pid_t pid = td_daemon_pid(&d);
  double c0 = cpu_ms(pid), t0 = wall_ms();
  usleep(1000 * 1000);
  double cpu = cpu_ms(pid) - c0, wall = wall_ms() - t0;
  printf("FIGURE out of fds: the daemon used %.0f ms of CPU in %.0f ms\n", cpu, wall);
  ck_assert_msg(cpu < 0.2 * wall, "the daemon used %.0f ms of CPU in %.0f ms", cpu, wall);
  ck_assert(td_log_contains(&d, "new connections wait until some close"));
  /* Sessions close: the waiting connections are accepted, and a new one is
   * served. */
  for (int i = 0; i < 80; i++) close(fds[i]);
  graphd_client *c = td_control(&d);
  ck_assert_int_eq(graphd_ping(c, "x", 1), GRAPHD_OK);
  graphd_close(c);
  ck_assert(td_log_contains(&d, "accepting connections again"));
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}
END_TEST

static long vm_kib(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  long v = -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, field, strlen(field)) == 0) v = strtol(line + strlen(field) + 1, NULL, 10);
  fclose(f);
  return v;
}

/* A connection must say Hello in time; one that declares a huge frame and
 * then goes quiet costs a read chunk, not the declared size; sessions idle
 * past --idle-timeout are closed. */
START_TEST(test_daemon_slow_and_silent_connections_cost_little_and_go) {
  gd_test_daemon d;
  td_start(&d, "--backend", "host", "--hello-timeout", "1", "--idle-timeout", "1.5", NULL);
  pid_t pid = td_daemon_pid(&d);
  long vm0 = vm_kib(pid, "VmSize:");
  int fds[100];
  for (int i = 0; i < 100; i++) {
    fds[i] = td_raw_connect(&d);
    uint8_t hdr[GD_FRAME_HEADER];
    gd_frame_put_header(hdr, 4u << 20); /* 4 MiB declared, never sent */
    td_raw_send(fds[i], hdr, sizeof hdr, NULL, 0);
  }
  graphd_client *c = td_control(&d); /* served meanwhile */
  ck_assert_int_eq(graphd_ping(c, "x", 1), GRAPHD_OK);
  long grown = vm_kib(pid, "VmSize:") - vm0;
  printf("FIGURE 100 connections declaring 4 MiB frames: the daemon grew by %ld KiB\n", grown);
  /* Declared sizes would be 400 MiB; what may grow besides is a malloc
   * arena or two (64 MiB of address space each, under load). */
  ck_assert_msg(grown < 200 * 1024, "the daemon grew by %ld KiB", grown);
  /* None said Hello: all are closed after the deadline, with a reason. */
  for (int i = 0; i < 100; i++) {
    Graphd__Wire__Reply *r = td_raw_recv(fds[i], 5000);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->code, GRAPHD_DEADLINE_EXCEEDED);
    ck_assert_msg(strstr(r->message, "no Hello within 1 s"), "%s", r->message);
    graphd__wire__reply__free_unpacked(r, NULL);
    ck_assert(td_raw_eof(fds[i], 5000));
    close(fds[i]);
  }
  /* The control session said Hello but then nothing for 1.5 s: closed;
   * its next call reconnects, in a new session. */
  uint64_t first = graphd_session_id(c);
  usleep(2600 * 1000);
  ck_assert_int_eq(graphd_ping(c, "x", 1), GRAPHD_OK);
  ck_assert_uint_ne(graphd_session_id(c), first);
  graphd_close(c);
  ck_assert(td_log_contains(&d, "(--idle-timeout); closing"));
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}
END_TEST

/* Connections past the caps are told which limit they met; the count
 * drops as sessions close. */
START_TEST(test_daemon_caps_connections_in_all_and_per_uid) {
  gd_test_daemon d;
  td_start(&d, "--backend", "host", "--max-connections", "6", "--max-connections-per-uid", "4",
           NULL);
  graphd_client *c[4];
  for (int i = 0; i < 4; i++) c[i] = td_control(&d);
  int fd = td_raw_connect(&d);
  Graphd__Wire__Reply *r = td_raw_recv(fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->code, GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(r->message, "(--max-connections-per-uid 4)"), "%s", r->message);
  graphd__wire__reply__free_unpacked(r, NULL);
  ck_assert(td_raw_eof(fd, 5000));
  close(fd);
  graphd_close(c[3]);
  usleep(200 * 1000);
  c[3] = td_control(&d); /* room again */
  ck_assert_int_eq(graphd_ping(c[3], "x", 1), GRAPHD_OK);
  for (int i = 0; i < 4; i++) graphd_close(c[i]);
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);

  td_start(&d, "--backend", "host", "--max-connections", "3", NULL);
  for (int i = 0; i < 3; i++) c[i] = td_control(&d);
  fd = td_raw_connect(&d);
  r = td_raw_recv(fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->code, GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(r->message, "(--max-connections 3)"), "%s", r->message);
  graphd__wire__reply__free_unpacked(r, NULL);
  close(fd);
  for (int i = 0; i < 3; i++) graphd_close(c[i]);
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}
END_TEST

START_TEST(test_daemon_replaces_a_stale_socket) {
  char dir[] = "/tmp/graphd-stale-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char path[128];
  snprintf(path, sizeof path, "%s/graphd.sock", dir);
  /* A socket file nobody listens on: what a killed daemon leaves. */
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  ck_assert_uint_lt(strlen(path), sizeof a.sun_path);
  memcpy(a.sun_path, path, strlen(path) + 1);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  close(fd);
  pid_t pid = fork();
  if (pid == 0) {
    int nul = open("/dev/null", O_WRONLY);
    dup2(nul, 2);
    execl(GRAPHD_BIN, GRAPHD_BIN, "--backend", "host", "--socket", path, (char *)NULL);
    _exit(127);
  }
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = path;
  graphd_client *c = NULL;
  for (int i = 0; i < 500 && !c; i++) {
    if (graphd_connect(&o, &c, NULL, 0) != GRAPHD_OK) usleep(10000);
  }
  ck_assert_ptr_nonnull(c);
  ck_assert_int_eq(graphd_ping(c, NULL, 0), GRAPHD_OK);
  graphd_close(c);
  kill(pid, SIGTERM);
  int st;
  waitpid(pid, &st, 0);
  ck_assert_int_eq(WEXITSTATUS(st), 0);
  rmdir(dir);
}
END_TEST

START_TEST(test_daemon_refuses_to_replace_a_regular_file) {
  char dir[] = "/tmp/graphd-file-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char path[128];
  snprintf(path, sizeof path, "%s/graphd.sock", dir);
  FILE *f = fopen(path, "w");
  fputs("precious", f);
  fclose(f);
  char out[4096];
  int rc = run_graphd_on(path, out, sizeof out);
  ck_assert_int_ne(rc, 0);
  ck_assert_msg(strstr(out, "exists and is not a socket"), "%s", out);
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert(S_ISREG(sb.st_mode));
  ck_assert_int_eq(sb.st_size, 8);
  unlink(path);
  rmdir(dir);
}
END_TEST

START_TEST(test_daemon_sigint_also_stops_gracefully) {
  gd_test_daemon d;
  td_start(&d, "--backend", "host", NULL);
  int st = td_stop_sig(&d, SIGINT, 10000);
  ck_assert(WIFEXITED(st));
  ck_assert_int_eq(WEXITSTATUS(st), 0);
  ck_assert(td_log_contains(&d, "shutting down (SIGINT)"));
  td_cleanup(&d);
}
END_TEST

/* A crash leaves its stack in the log (the journal under systemd). The
 * signal is sent from outside; the handler cannot tell the difference. */
START_TEST(test_daemon_fatal_signal_writes_its_stack) {
  if (getenv("GRAPHD_TEST_WRAPPER")) return; /* the tool owns the signals */
  struct rlimit no_core = {0, 0};
  ck_assert_int_eq(setrlimit(RLIMIT_CORE, &no_core), 0); /* inherited: no core file */
  gd_test_daemon d;
  td_start(&d, "--backend", "host", NULL);
  int st = td_stop_sig(&d, SIGSEGV, 10000);
  ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "status %#x", st);
  ck_assert(td_log_contains(&d, "graphd: fatal signal 11 (SIGSEGV); stack:"));
  ck_assert(td_log_contains(&d, "graphd(+0x"));
  td_cleanup(&d);
}
END_TEST

START_TEST(test_daemon_shutdown_closes_open_sessions_cleanly) {
  gd_test_daemon d;
  td_start(&d, "--host-devices", "2", NULL);
  graphd_client *c = td_control(&d);
  graphd_set_reconnect_wait(c, 0); /* no daemon comes back here */
  ck_assert_int_eq(graphd_ping(c, NULL, 0), GRAPHD_OK);
  int st = td_stop(&d);
  ck_assert_int_eq(WEXITSTATUS(st), 0);
  ck_assert(td_log_contains(&d, "1 sessions open"));
  /* The client learns the daemon is gone, with a clear status. */
  ck_assert_int_eq(graphd_ping(c, NULL, 0), GRAPHD_UNAVAILABLE);
  ck_assert_ptr_nonnull(strstr(graphd_last_error(c), "closed the connection"));
  ck_assert_int_eq(graphd_ping(c, NULL, 0), GRAPHD_UNAVAILABLE);
  graphd_close(c);
  td_cleanup(&d);
}
END_TEST

START_TEST(test_daemon_devices_flag_selects_and_orders) {
  gd_test_daemon d;
  td_start(&d, "--host-devices", "3", "--devices", "2,0", NULL);
  graphd_client *c = td_control(&d);
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  ck_assert_uint_eq(s->ndevices, 2);
  ck_assert_str_eq(s->devices[0].name, "graphd host device 2");
  ck_assert_str_eq(s->devices[1].name, "graphd host device 0");
  char uuid[48];
  snprintf(uuid, sizeof uuid, "%s", s->devices[0].uuid_str);
  graphd_daemon_status_free(s);
  graphd_close(c);
  td_stop(&d);
  td_cleanup(&d);

  /* By UUID too. */
  td_start(&d, "--host-devices", "3", "--devices", uuid, NULL);
  c = td_control(&d);
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  ck_assert_uint_eq(s->ndevices, 1);
  ck_assert_str_eq(s->devices[0].uuid_str, uuid);
  graphd_daemon_status_free(s);
  graphd_close(c);
  td_stop(&d);
  td_cleanup(&d);

  char out[4096];
  char *argv[] = {GRAPHD_BIN, "--host-devices",         "2", "--devices", "5",
                  "--socket", "/tmp/graphd-never.sock", NULL};
  ck_assert_int_ne(td_run(argv, out, sizeof out, 10000), 0);
  ck_assert_msg(strstr(out, "no host device '5'"), "%s", out);
}
END_TEST

START_TEST(test_daemon_usage_errors_exit_2) {
  char out[4096];
  char *a1[] = {GRAPHD_BIN, "--max-frame", "huge", NULL};
  ck_assert_int_eq(td_run(a1, out, sizeof out, 5000), 2);
  ck_assert_msg(strstr(out, "max-frame"), "%s", out);
  char *a2[] = {GRAPHD_BIN, "--no-such-flag", NULL};
  ck_assert_int_eq(td_run(a2, out, sizeof out, 5000), 2);
  char *a3[] = {GRAPHD_BIN, "--backend", "cuda", "--host-devices", "2", NULL};
  ck_assert_int_eq(td_run(a3, out, sizeof out, 5000), 2);
  ck_assert_msg(strstr(out, "contradict"), "%s", out);
  char *a4[] = {GRAPHD_BIN, "--version", NULL};
  ck_assert_int_eq(td_run(a4, out, sizeof out, 5000), 0);
  ck_assert_msg(strstr(out, graphd_version()), "%s", out);
}
END_TEST

START_TEST(test_daemon_many_concurrent_sessions) {
  gd_test_daemon d;
  td_start(&d, "--host-devices", "2", NULL);
  enum { N = 64 };
  graphd_client *c[N];
  for (int i = 0; i < N; i++) c[i] = td_control(&d);
  for (int round = 0; round < 5; round++)
    for (int i = 0; i < N; i++) ck_assert_int_eq(graphd_ping(c[i], &i, sizeof i), GRAPHD_OK);
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c[0], &s), GRAPHD_OK);
  ck_assert_uint_eq(s->sessions, N);
  graphd_daemon_status_free(s);
  for (int i = 0; i < N; i++) graphd_close(c[i]);
  ck_assert_int_eq(WEXITSTATUS(td_stop(&d)), 0);
  td_cleanup(&d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("daemon");
  TCase *tc = tcase_create("daemon");
  tcase_set_timeout(tc, 40);
  tcase_add_test(tc, test_daemon_status_end_to_end_and_graceful_stop);
  tcase_add_test(tc, test_daemon_uptime_advances);
  tcase_add_test(tc, test_daemon_host_devices_and_data_sessions);
  tcase_add_test(tc, test_daemon_unknown_uuid_is_not_found);
  tcase_add_test(tc, test_daemon_socket_mode_is_0660);
  tcase_add_test(tc, test_daemon_never_steals_a_live_socket);
  tcase_add_test(tc, test_daemon_replaces_a_stale_socket);
  tcase_add_test(tc, test_daemon_exit_leaves_a_newer_daemons_socket);
  tcase_add_test(tc, test_daemon_out_of_fds_neither_spins_nor_floods_the_log);
  tcase_add_test(tc, test_daemon_slow_and_silent_connections_cost_little_and_go);
  tcase_add_test(tc, test_daemon_caps_connections_in_all_and_per_uid);
  tcase_add_test(tc, test_daemon_refuses_to_replace_a_regular_file);
  tcase_add_test(tc, test_daemon_sigint_also_stops_gracefully);
  tcase_add_test(tc, test_daemon_shutdown_closes_open_sessions_cleanly);
  tcase_add_test(tc, test_daemon_devices_flag_selects_and_orders);
  tcase_add_test(tc, test_daemon_usage_errors_exit_2);
  tcase_add_test(tc, test_daemon_fatal_signal_writes_its_stack);
  tcase_add_test(tc, test_daemon_many_concurrent_sessions);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
