/* graphctl: exit codes, one-line errors, text and JSON status; and the
 * command lines of graphd, graphctl and graphd-demo alike: --version, a
 * usage error in one line with exit 2, --help in full with exit 0. */
#include <check.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "graphd/graphd.h"
#include "harness.h"

/* Runs argv (NULL-terminated, at most 15 words) and returns its exit
 * status, its stdout and stderr together in out. */
static int run(char *out, size_t n, const char *prog, ...) {
  char *argv[16];
  int k = 0;
  argv[k++] = (char *)prog;
  va_list ap;
  va_start(ap, prog);
  for (const char *a; k < 15 && (a = va_arg(ap, const char *));) argv[k++] = (char *)a;
  va_end(ap);
  argv[k] = NULL;
  return td_run(argv, out, n, 10000);
}

static int lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

/* A usage error: exit 2, one line naming the program, ending in the
 * pointer to --help. */
static void one_line_usage_error(const char *what, int rc, const char *out, const char *prog) {
  ck_assert_msg(rc == 2, "%s: exit %d: %s", what, rc, out);
  ck_assert_msg(lines(out) == 1, "%s: %d lines, not 1: %s", what, lines(out), out);
  char want[64];
  snprintf(want, sizeof want, "%s: ", prog);
  ck_assert_msg(strncmp(out, want, strlen(want)) == 0, "%s: %s", what, out);
  snprintf(want, sizeof want, "; try '%s --help'\n", prog);
  ck_assert_msg(strstr(out, want) && strstr(out, want)[strlen(want)] == '\0', "%s: %s", what, out);
}

static int ctl(char *out, size_t n, const char *sock, const char *a, const char *b) {
  char *argv[8];
  int k = 0;
  argv[k++] = GRAPHCTL_BIN;
  if (sock) {
    argv[k++] = "--socket";
    argv[k++] = (char *)sock;
  }
  if (a) argv[k++] = (char *)a;
  if (b) argv[k++] = (char *)b;
  argv[k] = NULL;
  return td_run(argv, out, n, 10000);
}

START_TEST(test_graphctl_cannot_connect_exits_3_with_one_line) {
  char out[2048];
  ck_assert_int_eq(ctl(out, sizeof out, "/tmp/graphd-nobody-here.sock", "status", NULL), 3);
  ck_assert_msg(strstr(out, "graphctl: cannot connect to graphd at /tmp/graphd-nobody-here.sock"),
                "%s", out);
  ck_assert_msg(strstr(out, "is the daemon running?"), "%s", out);
  /* Exactly one line. */
  ck_assert_ptr_eq(strchr(out, '\n'), out + strlen(out) - 1);
}
END_TEST

START_TEST(test_graphctl_usage_errors_exit_2) {
  char out[2048];
  ck_assert_int_eq(ctl(out, sizeof out, NULL, NULL, NULL), 2);
  ck_assert_int_eq(ctl(out, sizeof out, NULL, "frobnicate", NULL), 2);
  ck_assert_msg(strstr(out, "unknown command 'frobnicate'"), "%s", out);
  ck_assert_int_eq(ctl(out, sizeof out, NULL, "--bogus", NULL), 2);
  char *argv[] = {GRAPHCTL_BIN, "--timeout", "0", "status", NULL};
  ck_assert_int_eq(td_run(argv, out, sizeof out, 5000), 2);
}
END_TEST

START_TEST(test_graphctl_usage_errors_are_one_line) {
  char out[8192];
  const char *nobody = "/tmp/graphd-nobody-here.sock";
  /* Checked before connecting: usage errors whether a daemon runs or not. */
  static const char *const bad[][4] = {
      {"--bogus", "status"},
      {"-x", "status"},
      {"--socket"},
      {"--help=1"},
      {"frobnicate"},
      {"status", "--yaml"},
      {"list", "--all"},
      {"stats", "--json", "--prometheus"},
      {"stats", "--requests", "--json"},
      {"ping", "extra"},
      {"evict"}, /* no selector: was exit 1 from the daemon */
      {"evict", "--json"},
      {"evict", "--idle", "0"},
      {"evict", "--idle", "soon"},
      {"evict", "--capture", "nodevice"},
      {"evict", "--device"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = run(out, sizeof out, GRAPHCTL_BIN, "--socket", nobody, bad[i][0], bad[i][1], bad[i][2],
                 bad[i][3], NULL);
    char what[128];
    snprintf(what, sizeof what, "graphctl %s %s %s", bad[i][0], bad[i][1] ? bad[i][1] : "",
             bad[i][2] ? bad[i][2] : "");
    one_line_usage_error(what, rc, out, "graphctl");
  }
  ck_assert_int_eq(run(out, sizeof out, GRAPHCTL_BIN, NULL), 2);
  one_line_usage_error("graphctl", 2, out, "graphctl");
  ck_assert_int_eq(run(out, sizeof out, GRAPHCTL_BIN, "--socket", nobody, "evict", NULL), 2);
  ck_assert_msg(strstr(out, "say what to evict"), "%s", out);
  ck_assert_int_eq(run(out, sizeof out, GRAPHCTL_BIN, "--socket", nobody, "--bogus", NULL), 2);
  ck_assert_msg(strstr(out, "unknown option '--bogus'"), "%s", out);
  ck_assert_int_eq(run(out, sizeof out, GRAPHCTL_BIN, "--socket", NULL), 2);
  ck_assert_msg(strstr(out, "--socket needs a value"), "%s", out);

  /* --help is the whole usage on stdout, exit 0, also after a command. */
  ck_assert_int_eq(run(out, sizeof out, GRAPHCTL_BIN, "--help", NULL), 0);
  ck_assert_msg(lines(out) > 15 && strstr(out, "commands:") && strstr(out, "evict SELECTORS"), "%s",
                out);
  ck_assert_int_eq(run(out, sizeof out, GRAPHCTL_BIN, "--socket", nobody, "evict", "--help", NULL),
                   0);
  ck_assert_msg(strstr(out, "commands:"), "%s", out);
}
END_TEST

START_TEST(test_graphd_usage_errors_are_one_line) {
  char out[16384];
  static const char *const bad[][3] = {
      {"--bogus"},
      {"--socket"},                  /* lacks its value */
      {"--check-config=yes"},        /* takes none */
      {"--max-regions", "5"},        /* a prefix of two options: was taken as the first */
      {"--s", "/tmp/x.sock"},        /* the same */
      {"extra"},                     /* no operands */
      {"--host-devices", "2", "-x"}, /* a short option: graphd has none */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = run(out, sizeof out, GRAPHD_BIN, bad[i][0], bad[i][1], bad[i][2], NULL);
    one_line_usage_error(bad[i][0], rc, out, "graphd");
  }
  run(out, sizeof out, GRAPHD_BIN, "--max-regions", "5", NULL);
  ck_assert_msg(strstr(out, "ambiguous option '--max-regions'"), "%s", out);
  run(out, sizeof out, GRAPHD_BIN, "--socket", NULL);
  ck_assert_msg(strstr(out, "option --socket needs a value"), "%s", out);
  /* A bad value, or settings that contradict, alike (naming the setting). */
  int rc = run(out, sizeof out, GRAPHD_BIN, "--host-devices", "x", NULL);
  one_line_usage_error("--host-devices x", rc, out, "graphd");
  ck_assert_msg(strstr(out, "graphd: --host-devices: "), "%s", out);
  rc = run(out, sizeof out, GRAPHD_BIN, "--host-devices", "2", "--backend", "cuda", NULL);
  one_line_usage_error("--host-devices 2 --backend cuda", rc, out, "graphd");
  /* --help is the whole usage on stdout, exit 0. */
  ck_assert_int_eq(run(out, sizeof out, GRAPHD_BIN, "--help", NULL), 0);
  ck_assert_msg(lines(out) > 40 && strstr(out, "--check-config"), "%s", out);

  /* graphd-demo alike. */
  ck_assert_int_eq(run(out, sizeof out, GRAPHD_DEMO_BIN, "--bogus", "dir", NULL), 2);
  one_line_usage_error("graphd-demo --bogus", 2, out, "graphd-demo");
  ck_assert_int_eq(run(out, sizeof out, GRAPHD_DEMO_BIN, NULL), 2);
  one_line_usage_error("graphd-demo", 2, out, "graphd-demo");
  ck_assert_int_eq(run(out, sizeof out, GRAPHD_DEMO_BIN, "--help", NULL), 0);
  ck_assert_msg(strstr(out, "usage: graphd-demo"), "%s", out);
}
END_TEST

/* Every binary answers --version with one line, its name and the
 * version, without a daemon (after other options too). */
START_TEST(test_every_binary_has_version) {
  char out[4096], want[128];
  static const struct {
    const char *bin, *name, *arg;
  } bins[] = {
      {GRAPHD_BIN, "graphd", "--version"},
      {GRAPHCTL_BIN, "graphctl", "--version"},
      {GRAPHCTL_BIN, "graphctl", "version"},
      {GRAPHD_DEMO_BIN, "graphd-demo", "--version"},
  };
  for (size_t i = 0; i < sizeof bins / sizeof bins[0]; i++) {
    int rc = run(out, sizeof out, bins[i].bin, "--socket", "/tmp/graphd-nobody-here.sock",
                 bins[i].arg, NULL);
    ck_assert_msg(rc == 0, "%s %s: exit %d: %s", bins[i].name, bins[i].arg, rc, out);
    snprintf(want, sizeof want, "%s %s", bins[i].name, graphd_version());
    ck_assert_msg(strncmp(out, want, strlen(want)) == 0 && lines(out) == 1, "%s %s: %s",
                  bins[i].name, bins[i].arg, out);
  }
}
END_TEST

START_TEST(test_graphctl_status_text_json_and_ping) {
  gd_test_daemon d;
  td_start(&d, "--host-devices", "2", NULL);
  char out[16384];
  ck_assert_int_eq(ctl(out, sizeof out, d.socket, "status", NULL), 0);
  ck_assert_msg(strstr(out, "device 0: graphd host device 0 HOST-"), "%s", out);
  ck_assert_msg(strstr(out, "device 1: graphd host device 1 HOST-"), "%s", out);
  ck_assert_msg(strstr(out, "backend host, state ok"), "%s", out);
  ck_assert_msg(strstr(out, "memory 1.0 GiB total"), "%s", out);
  ck_assert_msg(!strstr(out, "\nsession "), "control sessions are not listed: %s", out);

  /* A data session with a stream, idle while graphctl asks: its line. */
  graphd_client *c = td_data(&d, 1);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  usleep(300 * 1000);
  ck_assert_int_eq(ctl(out, sizeof out, d.socket, "status", NULL), 0);
  char want[256];
  snprintf(want, sizeof want, "\nsession %llu: pid %d uid %u gid %u (admin), test-data, device 1, ",
           (unsigned long long)graphd_session_id(c), (int)getpid(), (unsigned)getuid(),
           (unsigned)getgid());
  const char *line = strstr(out, want);
  ck_assert_msg(line, "no '%s' in: %s", want + 1, out);
  double up = -1, idle = -1;
  const char *figs = strstr(line, ", flag slots 128, ring no, up ");
  ck_assert_msg(
      figs && sscanf(figs, ", flag slots 128, ring no, up %lf s, idle %lf s", &up, &idle) == 2,
      "%s", line);
  ck_assert_msg(idle >= 0.3 && up >= idle, "up %g s, idle %g s", up, idle);
  /* The daemon's line, 4 per device, the registry's, and the session's
   * alone: graphctl's own control session is not listed. */
  ck_assert_msg(lines(out) == 11, "%s", out);

  ck_assert_int_eq(ctl(out, sizeof out, d.socket, "status", "--json"), 0);
  json_object *o = json_tokener_parse(out);
  ck_assert_msg(o != NULL, "not JSON: %s", out);
  json_object *devs, *dev0, *v;
  ck_assert(json_object_object_get_ex(o, "devices", &devs));
  ck_assert_int_eq((int)json_object_array_length(devs), 2);
  dev0 = json_object_array_get_idx(devs, 0);
  ck_assert(json_object_object_get_ex(dev0, "total_memory", &v));
  ck_assert_uint_eq(json_object_get_uint64(v), 1ull << 30);
  ck_assert(json_object_object_get_ex(dev0, "backend", &v));
  ck_assert_str_eq(json_object_get_string(v), "host");
  ck_assert(json_object_object_get_ex(dev0, "counters", &v));
  ck_assert(json_object_object_get_ex(o, "pid", &v));
  ck_assert_int_eq(json_object_get_int(v), d.pid);
  /* The data session and graphctl's own (busy asking; an earlier
   * graphctl's may linger until graphd sees it hang up), with every figure
   * of theirs. */
  json_object *sess;
  ck_assert(json_object_object_get_ex(o, "session_list", &sess));
  int ndata = 0, nbusy = 0;
  for (size_t i = 0; i < json_object_array_length(sess); i++) {
    json_object *x = json_object_array_get_idx(sess, i), *kind, *f;
    ck_assert(json_object_object_get_ex(x, "kind", &kind));
    bool data = strcmp(json_object_get_string(kind), "data") == 0;
    ndata += data;
    ck_assert(json_object_object_get_ex(x, "gid", &f));
    ck_assert_uint_eq(json_object_get_uint64(f), getgid());
    ck_assert(json_object_object_get_ex(x, "admin", &f));
    ck_assert(json_object_get_boolean(f));
    ck_assert(json_object_object_get_ex(x, "busy", &f));
    nbusy += json_object_get_boolean(f);
    ck_assert(!data || !json_object_get_boolean(f));
    ck_assert(json_object_object_get_ex(x, "flag_slots", &f));
    ck_assert_uint_eq(json_object_get_uint64(f), data ? 128 : 0);
    ck_assert(json_object_object_get_ex(x, "has_ring", &f));
    ck_assert(!json_object_get_boolean(f));
    ck_assert(json_object_object_get_ex(x, "idle_ms", &f));
    uint64_t idle_ms = json_object_get_uint64(f);
    ck_assert(json_object_object_get_ex(x, "age_ms", &f));
    ck_assert_uint_ge(json_object_get_uint64(f), idle_ms);
    if (data) ck_assert_uint_ge(idle_ms, 300);
  }
  ck_assert_int_eq(ndata, 1);
  ck_assert_int_eq(nbusy, 1);
  json_object_put(o);
  graphd_stream_detach(s);
  graphd_close(c);

  ck_assert_int_eq(ctl(out, sizeof out, d.socket, "status", "--yaml"), 2);
  ck_assert_int_eq(ctl(out, sizeof out, d.socket, "ping", NULL), 0);
  ck_assert_msg(strstr(out, "pong"), "%s", out);

  /* stats --requests: a row per kind of request; the ping above, and
   * status --yaml's none (refused before it connected). */
  ck_assert_int_eq(ctl(out, sizeof out, d.socket, "stats", "--requests"), 0);
  ck_assert_msg(strncmp(out, "REQUEST ", 8) == 0 && strstr(out, " HANDLER ms "), "%s", out);
  unsigned long long calls = 0, errors = 9;
  const char *ping = strstr(out, "\nPing ");
  ck_assert_msg(ping && sscanf(ping, "\nPing %llu %llu", &calls, &errors) == 2, "%s", out);
  ck_assert_uint_eq(calls, 1);
  ck_assert_uint_eq(errors, 0);
  ck_assert_msg(strstr(out, "\nReplay "), "%s", out);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

START_TEST(test_graphctl_uses_graphd_socket_env) {
  gd_test_daemon d;
  td_start(&d, "--backend", "host", NULL);
  setenv("GRAPHD_SOCKET", d.socket, 1);
  char out[4096];
  ck_assert_int_eq(ctl(out, sizeof out, NULL, "ping", NULL), 0);
  unsetenv("GRAPHD_SOCKET");
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

/* A data session on device 1 replaying a 50 ms host kernel without pause. */
typedef struct sleeper {
  graphd_client *c;
  graphd_stream *s;
  uint8_t pid[32];
  void *out;
  atomic_bool stop;
  int replays;
} sleeper;

static void *sleep_replays(void *arg) {
  sleeper *k = arg;
  graphd_binding b = {.slot = 0, .ptr = (uint64_t)(uintptr_t)k->out, .bytes = 256};
  while (!atomic_load(&k->stop)) {
    ck_assert_int_eq(graphd_replay(k->c, k->s, k->pid, &b, 1, NULL), GRAPHD_OK);
    k->replays++;
  }
  return NULL;
}

/* The value in column col (0-based, split at spaces) of device dev's row
 * in the refresh that starts at frame. */
static double top_column(const char *frame, int dev, int col) {
  char want[16];
  snprintf(want, sizeof want, "\n%-6d ", dev);
  const char *row = strstr(frame, want);
  ck_assert_msg(row != NULL, "no device %d in %s", dev, frame);
  row++;
  for (int k = 0; k < col; k++) {
    row = strchr(row, ' ');
    while (*row == ' ') row++;
  }
  return strtod(row, NULL);
}

/* graphctl top's busy share is the worker's busy time over the wall time:
 * near all of it on a device whose worker runs 50 ms replays back to
 * back, nothing on the idle one; replays a second follow. stats gives the
 * share since the worker began serving, and the figures in its JSON. */
START_TEST(test_graphctl_top_busy_share_and_rate) {
  gd_test_daemon d;
  td_start(&d, "--host-devices", "2", NULL);
  sleeper k = {.c = td_data(&d, 1)};
  size_t len;
  void *so = td_read_file(HOST_KERNELS_SO, &len);
  uint8_t mod[32];
  ck_assert_int_eq(graphd_register_module(k.c, GRAPHD_MODULE_HOST_ELF, so, len, mod), GRAPHD_OK);
  free(so);
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, 256, 1);
  uint32_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1}, ms = 50;
  int s0 = graphd_program_add_launch(p, mod, "sleep_ms", grid, block, 0);
  graphd_program_param(p, (uint32_t)s0, 0, &ms, 4);
  ck_assert_int_eq(graphd_program_finish(p, k.pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_register_program(k.c, p), GRAPHD_OK);
  graphd_program_free(p);
  ck_assert_int_eq(graphd_stream_attach(k.c, NULL, &k.s), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(k.c, 256, &k.out), GRAPHD_OK);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, sleep_replays, &k), 0);

  char out[16384], stats[16384], json[65536];
  int rc = run(out, sizeof out, GRAPHCTL_BIN, "--socket", d.socket, "top", "--count", "2",
               "--interval", "1", NULL);
  int rc_stats = run(stats, sizeof stats, GRAPHCTL_BIN, "--socket", d.socket, "stats", NULL);
  int rc_json = run(json, sizeof json, GRAPHCTL_BIN, "--socket", d.socket, "stats", "--json", NULL);
  atomic_store(&k.stop, true);
  pthread_join(t, NULL);
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  ck_assert_msg(rc_stats == 0, "exit %d: %s", rc_stats, stats);
  ck_assert_msg(rc_json == 0, "exit %d: %s", rc_json, json);
  /* Two refreshes, a blank line between; the second is checked. */
  const char *second = strstr(out, "\n\ngraphd ");
  ck_assert_msg(second && !strstr(second + 2, "\n\n"), "not two refreshes: %s", out);
  second += 1;
  ck_assert_msg(strstr(second, "DEVICE STATE     REPLAYS/s   BUSY     MEMORY FREE / TOTAL"), "%s",
                second);
  double rate1 = top_column(second, 1, 2), busy1 = top_column(second, 1, 3);
  double rate0 = top_column(second, 0, 2), busy0 = top_column(second, 0, 3);
  ck_assert_msg(busy1 >= 60 && busy1 <= 100, "device 1 busy %.1f%%: %s", busy1, out);
  ck_assert_msg(rate1 >= 5 && rate1 <= 21, "device 1 at %.1f replays/s: %s", rate1, out);
  ck_assert_msg(busy0 == 0 && rate0 == 0, "device 0 is idle: %s", out);
  ck_assert_int_ge(k.replays, 10);

  /* stats gives the share since the worker began serving (BUSY, column
   * 11: the staging size takes two), and its JSON the figures behind it. */
  ck_assert_msg(strstr(stats, " GPU us   BUSY "), "%s", stats);
  double since1 = top_column(stats, 1, 11), since0 = top_column(stats, 0, 11);
  ck_assert_msg(since1 > 20 && since1 <= 100, "device 1 busy %.1f%% since start: %s", since1,
                stats);
  ck_assert_msg(since0 < 5, "device 0 busy %.1f%% since start: %s", since0, stats);
  json_object *o = json_tokener_parse(json), *devs, *dev1, *v;
  ck_assert_ptr_nonnull(o);
  ck_assert(json_object_object_get_ex(o, "devices", &devs));
  dev1 = json_object_array_get_idx(devs, 1);
  ck_assert(json_object_object_get_ex(dev1, "worker_busy_ns", &v));
  uint64_t busy_ns = json_object_get_uint64(v);
  ck_assert(json_object_object_get_ex(dev1, "worker_clock_ns", &v));
  uint64_t clock_ns = json_object_get_uint64(v);
  ck_assert_uint_gt(busy_ns, 0);
  ck_assert_uint_le(busy_ns, clock_ns);
  json_object_put(o);

  graphd_stream_detach(k.s);
  graphd_close(k.c);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("graphctl");
  TCase *tc = tcase_create("graphctl");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_graphctl_cannot_connect_exits_3_with_one_line);
  tcase_add_test(tc, test_graphctl_usage_errors_exit_2);
  tcase_add_test(tc, test_graphctl_usage_errors_are_one_line);
  tcase_add_test(tc, test_graphd_usage_errors_are_one_line);
  tcase_add_test(tc, test_every_binary_has_version);
  tcase_add_test(tc, test_graphctl_top_busy_share_and_rate);
  tcase_add_test(tc, test_graphctl_status_text_json_and_ping);
  tcase_add_test(tc, test_graphctl_uses_graphd_socket_env);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
