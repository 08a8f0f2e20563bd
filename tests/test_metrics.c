/* --metrics-listen: GET /metrics in the Prometheus text format on the host
 * backend. The figures follow what clients do (sessions, replays,
 * captures), the metric families are exactly graphctl stats
 * --prometheus's, other paths and methods are refused, a daemon that closed
 * the scraper's session is asked again, and a bad or taken address stops
 * graphd with a message. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "program3.h"

#define N 1024u

static gd_test_daemon d;
static unsigned port;
static char listen_arg[32];

/* A TCP port free on 127.0.0.1 now (bound to 0, read back, closed). */
static unsigned free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &al), 0);
  close(fd);
  return ntohs(a.sin_port);
}

static void setup(void) {
  port = free_port();
  snprintf(listen_arg, sizeof listen_arg, "127.0.0.1:%u", port);
  ck_assert_int_eq(td_start(&d, "--host-devices", "2", "--metrics-listen", listen_arg,
                            "--device-budget", "64M", NULL),
                   0);
}

/* The same with --metrics-header-timeout s. */
static void setup_header_timeout(const char *s) {
  port = free_port();
  snprintf(listen_arg, sizeof listen_arg, "127.0.0.1:%u", port);
  ck_assert_int_eq(td_start(&d, "--host-devices", "1", "--metrics-listen", listen_arg,
                            "--metrics-header-timeout", s, NULL),
                   0);
}
static void setup_short_deadline(void) { setup_header_timeout("1"); }
static void setup_long_deadline(void) { setup_header_timeout("60"); }

static void teardown(void) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* Sends one HTTP/1.0 request and returns the whole answer (malloc'd,
 * NUL-terminated): status line, headers and body. */
static char *http(const char *method, const char *path) {
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  /* graphd starts serving /metrics just after its socket: wait for it. */
  int fd = -1, rc = -1;
  for (int i = 0; i < 500 && rc != 0; i++) {
    if (fd >= 0) {
      close(fd);
      usleep(10000);
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    rc = connect(fd, (struct sockaddr *)&a, sizeof a);
  }
  ck_assert_msg(rc == 0, "connect to %s failed: %s", listen_arg, strerror(errno));
  char req[256];
  int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", method, path);
  ck_assert_int_eq(write(fd, req, (size_t)n), n);
  size_t cap = 1 << 16, len = 0;
  char *out = malloc(cap);
  ck_assert_ptr_nonnull(out);
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ck_assert_msg(poll(&p, 1, 10000) == 1, "no answer from /metrics in 10 s");
    if (len + 1 == cap) {
      cap *= 2;
      out = realloc(out, cap);
      ck_assert_ptr_nonnull(out);
    }
    ssize_t r = read(fd, out + len, cap - 1 - len);
    ck_assert_int_ge(r, 0);
    if (r == 0) break;
    len += (size_t)r;
  }
  out[len] = '\0';
  close(fd);
  return out;
}

static const char *body_of(const char *answer) {
  const char *b = strstr(answer, "\r\n\r\n");
  ck_assert_ptr_nonnull(b);
  return b + 4;
}

/* The value of the sample line that starts with `series` (name and
 * labels up to the closing brace), or -1 when there is none. */
static double sample(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (strncmp(l, series, n) == 0 && l[n] == ' ') return strtod(l + n + 1, NULL);
  return -1;
}

/* The "# TYPE" lines of a text, joined, for comparing families. */
static char *types_of(const char *text) {
  char *out = calloc(1, strlen(text) + 1);
  size_t len = 0;
  ck_assert_ptr_nonnull(out);
  for (const char *l = text; *l;) {
    const char *e = strchr(l, '\n');
    size_t n = e ? (size_t)(e - l) + 1 : strlen(l);
    if (strncmp(l, "# TYPE ", 7) == 0) {
      memcpy(out + len, l, n);
      len += n;
    }
    l += n;
  }
  return out;
}

static const char *series(const char *name, int dev) {
  graphd_client *ctl = td_control(&d);
  graphd_device_info info = td_device_info(ctl, dev);
  graphd_close(ctl);
  return td_fmt("%s{device=\"%d\",uuid=\"%s\"}", name, dev, info.uuid_str);
}

START_TEST(test_metrics_follow_sessions_and_replays) {
  char *a = http("GET", "/metrics");
  ck_assert_msg(strncmp(a, "HTTP/1.0 200", 12) == 0 || strncmp(a, "HTTP/1.1 200", 12) == 0, "%s",
                a);
  ck_assert_ptr_nonnull(strstr(a, "Content-Type: text/plain; version=0.0.4"));
  const char *b = body_of(a);
  ck_assert_double_eq(sample(b, series("graphd_replays_total", 0)), 0);
  ck_assert_double_eq(sample(b, series("graphd_sessions", 1)), 0);
  ck_assert_ptr_null(strstr(b, "name=\"metrics-test\""));
  free(a);

  /* A data session on device 1 that registers a host module and replays
   * the three-kernel program five times, each checked. */
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = d.socket;
  o.kind = GRAPHD_SESSION_DATA;
  graphd_client *ctl = td_control(&d);
  graphd_device_info dev1 = td_device_info(ctl, 1);
  graphd_close(ctl);
  memcpy(o.device_uuid, dev1.uuid, 16);
  o.client_name = "metrics-test";
  graphd_client *c;
  char err[GRAPHD_ERRMAX];
  ck_assert_int_eq(graphd_connect(&o, &c, err, sizeof err), GRAPHD_OK);
  size_t plen;
  uint8_t *plugin = td_read_file(HOST_KERNELS_SO, &plen);
  uint8_t mod[32], pid[32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plen, mod), GRAPHD_OK);
  free(plugin);
  ck_assert_int_eq(program3_register(c, mod, GRAPHD_MODE_STAGED, N, pid), GRAPHD_OK);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  float *x, *cc, *y;
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&x), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&cc), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&y), GRAPHD_OK);
  for (int r = 0; r < 5; r++) {
    for (uint32_t i = 0; i < N; i++) {
      x[i] = (float)((r * 31 + (int)i) % 1000);
      cc[i] = (float)(i % 7);
    }
    graphd_binding bd[3] = {{0, (uint64_t)(uintptr_t)x, N * 4},
                            {3, (uint64_t)(uintptr_t)y, N * 4},
                            {1, (uint64_t)(uintptr_t)cc, N * 4}};
    ck_assert_int_eq(graphd_replay(c, s, pid, bd, 3, NULL), GRAPHD_OK);
    for (uint32_t i = 0; i < N; i++) ck_assert_float_eq(y[i], (2.0f * x[i] + cc[i]) * 2.0f + 1.0f);
  }
  usleep(300000); /* the client's idle time, below */

  a = http("GET", "/metrics");
  b = body_of(a);
  ck_assert_double_eq(sample(b, series("graphd_replays_total", 1)), 5);
  ck_assert_double_eq(sample(b, series("graphd_replays_total", 0)), 0);
  ck_assert_double_eq(sample(b, series("graphd_captures", 1)), 1);
  ck_assert_double_eq(sample(b, series("graphd_captures_built_total", 1)), 1);
  ck_assert_double_eq(sample(b, series("graphd_sessions", 1)), 1);
  ck_assert_double_eq(sample(b, "graphd_programs"), 1);
  ck_assert_double_eq(sample(b, "graphd_modules"), 1);
  const char *q =
      td_fmt("graphd_replay_latency_quantile_seconds{device=\"1\",uuid=\"%s\",quantile=\"0.5\"}",
             dev1.uuid_str);
  ck_assert_double_gt(sample(b, q), 0);
  /* The latency as a histogram: five replays in +Inf and in _count, the
   * buckets cumulative, the sum between the smallest bound's and the
   * largest p50 could give. */
  char l1[128]; /* device 1's labels (td_fmt's buffers go round) */
  snprintf(l1, sizeof l1, "device=\"1\",uuid=\"%s\"", dev1.uuid_str);
  ck_assert_double_eq(sample(b, td_fmt("graphd_replay_latency_seconds_bucket{%s,le=\"+Inf\"}", l1)),
                      5);
  ck_assert_double_eq(sample(b, td_fmt("graphd_replay_latency_seconds_count{%s}", l1)), 5);
  double lsum = sample(b, td_fmt("graphd_replay_latency_seconds_sum{%s}", l1));
  ck_assert_double_gt(lsum, 0);
  ck_assert_double_le(lsum, 5 * 10.0);
  static const char *const les[] = {"1e-06", "1e-05", "0.0001", "0.001", "0.01", "0.1", "1", "10"};
  double last = 0;
  for (size_t k = 0; k < sizeof les / sizeof les[0]; k++) {
    double v = sample(b, td_fmt("graphd_replay_latency_seconds_bucket{%s,le=\"%s\"}", l1, les[k]));
    ck_assert_msg(v >= last && v <= 5, "le %s: %g after %g", les[k], v, last);
    last = v;
  }
  ck_assert_double_eq(last, 5); /* nothing took 10 s */
  /* Device 0 replayed nothing: its histogram is empty, not missing. */
  ck_assert_double_eq(sample(b, series("graphd_replay_latency_seconds_count", 0)), 0);
  /* The devices' health for alerts: up, the state as a series per state,
   * MPS (off on a host device), memory and the budget (--device-budget). */
  ck_assert_double_eq(sample(b, td_fmt("graphd_device_up{%s}", l1)), 1);
  ck_assert_double_eq(sample(b, td_fmt("graphd_device_state{%s,state=\"ok\"}", l1)), 1);
  ck_assert_double_eq(sample(b, td_fmt("graphd_device_state{%s,state=\"failed\"}", l1)), 0);
  ck_assert_double_eq(sample(b, td_fmt("graphd_device_state{%s,state=\"busy\"}", l1)), 0);
  ck_assert_double_eq(sample(b, td_fmt("graphd_device_state{%s,state=\"starting\"}", l1)), 0);
  ck_assert_double_eq(sample(b, td_fmt("graphd_device_mps_enabled{%s,backend=\"host\"}", l1)), 0);
  ck_assert_double_eq(
      sample(b, td_fmt("graphd_device_info{%s,name=\"%s\",backend=\"host\"}", l1, dev1.name)), 1);
  ck_assert_double_eq(sample(b, td_fmt("graphd_device_memory_total_bytes{%s}", l1)), 1 << 30);
  double fr = sample(b, td_fmt("graphd_device_memory_free_bytes{%s}", l1));
  ck_assert_double_gt(fr, 0);
  ck_assert_double_le(fr, 1 << 30);
  ck_assert_double_eq(sample(b, td_fmt("graphd_staging_budget_bytes{%s}", l1)), 64 << 20);
  ck_assert_double_eq(sample(b, td_fmt("graphd_build_info{version=\"%s\"}", graphd_version())), 1);
  q = td_fmt("graphd_replay_worker_seconds_count{device=\"1\",uuid=\"%s\"}", dev1.uuid_str);
  ck_assert_double_eq(sample(b, q), 5);
  q = td_fmt("graphd_replay_worker_seconds_sum{device=\"1\",uuid=\"%s\"}", dev1.uuid_str);
  double worker = sample(b, q);
  ck_assert_double_gt(worker, 0);
  /* Of it, the launches (a host device runs the replay there). */
  q = td_fmt("graphd_replay_worker_launch_seconds_total{device=\"1\",uuid=\"%s\"}", dev1.uuid_str);
  ck_assert_double_gt(sample(b, q), 0);
  ck_assert_double_le(sample(b, q), worker);
  /* The worker's busy time holds its time in the replay path and more (the
   * Status and upkeep jobs); it is never more than the daemon has run. */
  double busy = sample(b, td_fmt("graphd_worker_busy_seconds_total{%s}", l1));
  ck_assert_double_ge(busy, worker);
  ck_assert_double_le(busy, sample(b, "graphd_uptime_seconds") + 0.001);
  /* The first replay was timed on the device; it is read when a later
   * sample begins, a millisecond on at least, so it may not be in yet. */
  q = td_fmt("graphd_replay_gpu_seconds_count{device=\"1\",uuid=\"%s\"}", dev1.uuid_str);
  ck_assert_double_le(sample(b, q), 5);
  /* The request counters: the five Replays, answered OK, and some loop
   * time in their handler; a row for every kind, Evict's too. */
  ck_assert_double_eq(sample(b, "graphd_requests_total{request=\"Replay\"}"), 5);
  ck_assert_double_eq(sample(b, "graphd_request_errors_total{request=\"Replay\"}"), 0);
  ck_assert_double_gt(sample(b, "graphd_request_seconds_total{request=\"Replay\"}"), 0);
  ck_assert_double_eq(sample(b, "graphd_requests_total{request=\"Evict\"}"), 0);
  ck_assert_double_ge(sample(b, "graphd_requests_total{request=\"Status\"}"), 2);
  /* The scraper's own session is not a client of the figures. */
  ck_assert_ptr_null(strstr(b, "graphd-metrics"));

  /* The same families, in the same order, as graphctl's, and this
   * process's client row with the same figures. */
  char out[1 << 16];
  char *argv[] = {GRAPHCTL_BIN, "--socket", d.socket, "stats", "--prometheus", NULL};
  ck_assert_int_eq(td_run(argv, out, sizeof out, 10000), 0);
  char mine[160];
  snprintf(mine, sizeof mine, "graphd_client_sessions{pid=\"%d\",uid=\"%d\",name=\"metrics-test\"}",
           (int)getpid(), (int)getuid());
  ck_assert_double_eq(sample(b, mine), 1);
  ck_assert_double_eq(sample(out, mine), 1);
  ck_assert_double_eq(
      sample(b, td_fmt("graphd_client_regions{pid=\"%d\",uid=\"%d\",name=\"metrics-test\"}",
                       (int)getpid(), (int)getuid())),
      3);
  /* Its idle time (since the last replay, 300 ms ago) and age, the
   * same in graphctl's. */
  char who[128];
  snprintf(who, sizeof who, "{pid=\"%d\",uid=\"%d\",name=\"metrics-test\"}", (int)getpid(),
           (int)getuid());
  double idle = sample(b, td_fmt("graphd_client_idle_seconds%s", who));
  double age = sample(b, td_fmt("graphd_client_age_seconds%s", who));
  ck_assert_double_ge(idle, 0.29);
  ck_assert_double_le(idle, 60);
  ck_assert_double_ge(age, idle);
  ck_assert_double_ge(sample(out, td_fmt("graphd_client_idle_seconds%s", who)), idle);
  ck_assert_double_ge(sample(out, td_fmt("graphd_client_age_seconds%s", who)), age);
  /* graphctl leaves out the daemon's scraper as well. */
  ck_assert_ptr_null(strstr(out, "graphd-metrics"));
  char *t1 = types_of(b), *t2 = types_of(out);
  ck_assert_str_eq(t1, t2);
  ck_assert_ptr_nonnull(strstr(t1, "# TYPE graphd_replays_total counter\n"));
  ck_assert_ptr_nonnull(strstr(t1, "# TYPE graphd_replay_latency_seconds histogram\n"));
  ck_assert_ptr_nonnull(strstr(t1, "# TYPE graphd_replay_latency_quantile_seconds summary\n"));
  ck_assert_ptr_nonnull(strstr(t1, "# TYPE graphd_worker_busy_seconds_total counter\n"));
  ck_assert_ptr_nonnull(strstr(t1, "# TYPE graphd_ring_replays_total counter\n"));
  ck_assert_ptr_nonnull(strstr(t1, "# TYPE graphd_requests_total counter\n"));
  ck_assert_ptr_nonnull(strstr(t1, "# TYPE graphd_request_errors_total counter\n"));
  ck_assert_ptr_nonnull(strstr(t1, "# TYPE graphd_request_seconds_total counter\n"));
  free(t1);
  free(t2);
  free(a);
  graphd_stream_detach(s);
  graphd_close(c);

  /* The daemon ends the session when it reads the hang-up, a moment after
   * graphd_close returns. */
  for (int i = 0;; i++) {
    a = http("GET", "/metrics");
    if (sample(body_of(a), series("graphd_sessions", 1)) == 0 || i == 500) break;
    free(a);
    usleep(10000);
  }
  ck_assert_double_eq(sample(body_of(a), series("graphd_sessions", 1)), 0);
  ck_assert_double_eq(sample(body_of(a), series("graphd_replays_total", 1)), 5);
  free(a);
}
END_TEST

/* The SigBlk mask of thread tid of process pid, from /proc; false when
 * the thread is gone. */
static bool thread_blocked(pid_t pid, const char *tid, unsigned long long *mask) {
  char path[320], line[256];
  snprintf(path, sizeof path, "/proc/%d/task/%s/status", (int)pid, tid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  bool found = false;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "SigBlk: %llx", mask) == 1) found = true;
  fclose(f);
  return found;
}

START_TEST(test_metrics_stop_signals_reach_the_loop_thread_alone) {
  /* SIGTERM and SIGINT are blocked in every thread of the daemon but the
   * loop's (the main thread), so the kernel hands them to the thread that
   * handles them: workers, libuv's pool and the exporter (with the
   * libgraphd it asks, after a scrape) never hold one. The teardown's stop
   * then checks that SIGTERM stops the daemon. */
  char *a = http("GET", "/metrics");
  ck_assert_msg(strstr(a, " 200 ") != NULL, "%s", a);
  free(a);
  pid_t pid = td_daemon_pid(&d);
  char dir[64];
  snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
  DIR *tasks = opendir(dir);
  ck_assert_ptr_nonnull(tasks);
  const unsigned long long stop = (1ull << (SIGTERM - 1)) | (1ull << (SIGINT - 1));
  int others = 0, loop = 0;
  for (struct dirent *e; (e = readdir(tasks));) {
    if (e->d_name[0] == '.') continue;
    unsigned long long mask;
    if (!thread_blocked(pid, e->d_name, &mask)) continue;
    if (atoi(e->d_name) == pid) {
      loop++;
      ck_assert_msg((mask & stop) == 0, "the loop thread blocks the stop signals (SigBlk %llx)",
                    mask);
    } else {
      others++;
      ck_assert_msg((mask & stop) == stop, "thread %s takes the stop signals (SigBlk %llx)",
                    e->d_name, mask);
    }
  }
  closedir(tasks);
  ck_assert_int_eq(loop, 1);
  ck_assert_int_ge(others, 8); /* two workers, the exporter's, libuv's pool of 4 */
}
END_TEST

START_TEST(test_metrics_refuses_other_paths_and_methods) {
  char *a = http("GET", "/");
  ck_assert_msg(strstr(a, " 404 ") != NULL, "%s", a);
  free(a);
  a = http("GET", "/metrics/x");
  ck_assert_msg(strstr(a, " 404 ") != NULL, "%s", a);
  free(a);
  a = http("POST", "/metrics");
  ck_assert_msg(strstr(a, " 405 ") != NULL, "%s", a);
  ck_assert_ptr_nonnull(strstr(a, "Allow: GET, HEAD"));
  free(a);
  a = http("HEAD", "/metrics");
  ck_assert_msg(strstr(a, " 200 ") != NULL, "%s", a);
  ck_assert_str_eq(body_of(a), "");
  free(a);
}
END_TEST

START_TEST(test_metrics_ask_again_after_the_daemon_closed_the_session) {
  /* Restart with an idle timeout shorter than the gap between scrapes:
   * the kept session is closed by graphd in between, and the next scrape
   * must connect again rather than fail. */
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
  ck_assert_int_eq(td_start(&d, "--host-devices", "1", "--metrics-listen", listen_arg,
                            "--idle-timeout", "0.2", NULL),
                   0);
  char *a = http("GET", "/metrics");
  ck_assert_msg(strstr(a, " 200 ") != NULL, "%s", a);
  free(a);
  usleep(600 * 1000);
  a = http("GET", "/metrics");
  ck_assert_msg(strstr(a, " 200 ") != NULL, "%s", a);
  ck_assert_double_ge(sample(body_of(a), "graphd_uptime_seconds"), 0.6);
  free(a);
}
END_TEST

START_TEST(test_metrics_bad_or_taken_addresses_stop_graphd) {
  static const char *const bad[] = {"9464",     "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000",
                                    "::1:9464", ":9464",     "[::1:9464"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char out[4096];
    char *argv[] = {GRAPHD_BIN,     "--host-devices", "1", "--metrics-listen",
                    (char *)bad[i], "--check-config", NULL};
    int rc = td_run(argv, out, sizeof out, 10000);
    ck_assert_msg(rc == 2, "--metrics-listen %s: exit %d: %s", bad[i], rc, out);
    ck_assert_msg(strstr(out, "metrics-listen") != NULL, "%s: %s", bad[i], out);
  }
  /* The address this test's daemon already serves: taken. */
  free(http("GET", "/metrics")); /* it serves by now */
  gd_test_daemon d2;
  int status = 0;
  char *args[] = {"--host-devices", "1", "--metrics-listen", listen_arg, NULL};
  /* Its socket may come up before the metrics address is tried (the
   * harness then says it started): either way it must exit 1. */
  if (td_start_env(&d2, args, NULL, &status) == 0) {
    pid_t w = 0;
    for (int i = 0; i < 1000 && (w = waitpid(d2.pid, &status, WNOHANG)) == 0; i++) usleep(10000);
    ck_assert_msg(w == d2.pid, "a second graphd on a taken metrics address did not exit");
  }
  ck_assert(WIFEXITED(status));
  ck_assert_int_eq(WEXITSTATUS(status), 1);
  ck_assert(td_log_contains(&d2, "Address already in use"));
  td_cleanup(&d2);
  /* And the first one goes on serving. */
  char *a = http("GET", "/metrics");
  ck_assert_msg(strstr(a, " 200 ") != NULL, "%s", a);
  free(a);
}
END_TEST

/* A TCP connection to /metrics from the local address `from`. */
static int connect_from(const char *from) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_in src = {.sin_family = AF_INET};
  ck_assert_int_eq(inet_pton(AF_INET, from, &src.sin_addr), 1);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&src, sizeof src), 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

/* Whether the server has closed fd (end of file or reset), waiting up to
 * ms for it. */
static bool closed_by_server(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (poll(&p, 1, ms) != 1) return false;
  char buf[256];
  ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno != EAGAIN);
}

/* A client that sends its request's headers a line at a time, every
 * 200 ms, is cut off at the header deadline (1 s here), although the
 * bytes keep coming: the deadline does not restart with them. (Before,
 * the idle timer restarted on each byte and the client held its
 * connection for as long as it trickled.) */
START_TEST(test_metrics_trickled_headers_are_cut_at_the_deadline) {
  free(http("GET", "/metrics")); /* serving */
  int fd = connect_from("127.0.0.1");
  const char *first = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  ck_assert_int_eq(send(fd, first, strlen(first), MSG_NOSIGNAL), (ssize_t)strlen(first));
  bool cut = false;
  int lines = 0;
  for (; lines < 75 && !cut; lines++) { /* 15 s: past libmicrohttpd's 10 s idle timer */
    if (send(fd, "X-Slow: 1\r\n", 11, MSG_NOSIGNAL) != 11) {
      cut = true;
      break;
    }
    cut = closed_by_server(fd, 200);
  }
  close(fd);
  printf("FIGURE trickled headers: cut after %d lines (every 200 ms)\n", lines);
  ck_assert_msg(cut, "a client trickling header lines kept its connection for 15 s");
  /* Scrapers are served as before. */
  char *a = http("GET", "/metrics");
  ck_assert_msg(strstr(a, " 200 ") != NULL, "%s", a);
  free(a);
}
END_TEST

/* One address holds --metrics-connections-per-address (4) connections:
 * of 20 idle connections from 127.0.0.1 the server closes 16 at once, and
 * a scraper from another address is served while the other 4 stay open.
 * (Before, 16 idle connections filled the server and every scraper waited
 * for them to time out.) */
START_TEST(test_metrics_one_address_cannot_crowd_out_scrapers) {
  free(http("GET", "/metrics")); /* serving */
  enum { K = 20 };
  int fd[K];
  bool gone[K] = {false};
  for (int i = 0; i < K; i++) fd[i] = connect_from("127.0.0.1");
  int ngone = 0;
  for (int round = 0; round < 50 && ngone < K - 4; round++) /* 5 s, within the idle timer */
    for (int i = 0; i < K; i++)
      if (!gone[i] && closed_by_server(fd[i], i == 0 ? 100 : 0)) {
        gone[i] = true;
        ngone++;
      }
  printf("FIGURE 20 idle connections from one address: %d closed by the server\n", ngone);
  ck_assert_int_eq(ngone, K - 4);
  int s = connect_from("127.0.0.2");
  const char *req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  ck_assert_int_eq(send(s, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
  char buf[64] = "";
  struct pollfd p = {.fd = s, .events = POLLIN};
  ck_assert_msg(poll(&p, 1, 20000) == 1, "the scraper got no answer");
  ck_assert_int_gt(recv(s, buf, sizeof buf - 1, 0), 0);
  ck_assert_msg(strstr(buf, " 200 ") != NULL, "%s", buf);
  close(s);
  /* The four from 127.0.0.1 were still open meanwhile. */
  for (int i = 0; i < K; i++) {
    if (!gone[i]) ck_assert(!closed_by_server(fd[i], 0));
    close(fd[i]);
  }
}
END_TEST

/* A replay that keeps device 0's worker busy for a few seconds (the host
 * kernel sleep_ms runs on the worker). */
typedef struct busy_call {
  graphd_client *c;
  graphd_stream *s;
  uint8_t pid[32];
  void *out;
  graphd_status st;
} busy_call;

static void *busy_replay(void *arg) {
  busy_call *k = arg;
  graphd_binding b = {.slot = 0, .ptr = (uint64_t)(uintptr_t)k->out, .bytes = 256};
  k->st = graphd_replay(k->c, k->s, k->pid, &b, 1, NULL);
  return NULL;
}

static void busy_start(busy_call *k, pthread_t *t, uint32_t ms) {
  size_t len;
  void *so = td_read_file(HOST_KERNELS_SO, &len);
  k->c = td_data(&d, 0);
  uint8_t mod[32];
  ck_assert_int_eq(graphd_register_module(k->c, GRAPHD_MODULE_HOST_ELF, so, len, mod), GRAPHD_OK);
  free(so);
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, 256, 1);
  uint32_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  int s0 = graphd_program_add_launch(p, mod, "sleep_ms", grid, block, 0);
  graphd_program_param(p, (uint32_t)s0, 0, &ms, 4);
  ck_assert_int_eq(graphd_program_finish(p, k->pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_register_program(k->c, p), GRAPHD_OK);
  graphd_program_free(p);
  ck_assert_int_eq(graphd_stream_attach(k->c, NULL, &k->s), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(k->c, 256, &k->out), GRAPHD_OK);
  ck_assert_int_eq(pthread_create(t, NULL, busy_replay, k), 0);
}

static _Atomic bool scrapers_stop;
static _Atomic int scrapes_done;

/* Scrapes /metrics from its own address over and over. */
static void *scraper(void *arg) {
  const char *from = arg;
  const char *req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  while (!atomic_load(&scrapers_stop)) {
    int fd = connect_from(from);
    if (send(fd, req, strlen(req), MSG_NOSIGNAL) == (ssize_t)strlen(req)) {
      char buf[4096];
      struct pollfd p = {.fd = fd, .events = POLLIN};
      while (poll(&p, 1, 15000) == 1 && recv(fd, buf, sizeof buf, 0) > 0) {
      }
      atomic_fetch_add(&scrapes_done, 1);
    }
    close(fd);
  }
  return NULL;
}

/* While device 0's worker is in a long job, and 16 scrapers from other
 * addresses scrape without pause, a scrape is answered at once from the
 * last figures, device 0's marked old. (Before, each scrape waited 500 ms
 * for the busy worker on the exporter's one thread, and a scrape waited
 * behind all the others'.) */
START_TEST(test_metrics_answer_at_once_while_a_worker_is_busy) {
  free(http("GET", "/metrics")); /* serving, with every device's figures */
  busy_call k = {0};
  pthread_t t;
  busy_start(&k, &t, 4000);
  usleep(300000); /* the worker is in the replay */
  enum { K = 16 };
  pthread_t sc[K];
  char from[K][16];
  atomic_store(&scrapers_stop, false);
  for (int i = 0; i < K; i++) {
    snprintf(from[i], sizeof from[i], "127.0.0.%d", 10 + i);
    ck_assert_int_eq(pthread_create(&sc[i], NULL, scraper, from[i]), 0);
  }
  usleep(500000);
  double worst = 0;
  char *text = NULL;
  for (int i = 0; i < 5; i++) {
    free(text);
    double t0 = td_now_s();
    text = http("GET", "/metrics");
    double took = td_now_s() - t0;
    worst = took > worst ? took : worst;
  }
  atomic_store(&scrapers_stop, true);
  for (int i = 0; i < K; i++) pthread_join(sc[i], NULL);
  printf(
      "FIGURE scrape with a worker busy and %d scrapers beside it: worst of 5 %.1f ms (%d "
      "scrapes by the others)\n",
      K, worst * 1e3, atomic_load(&scrapes_done));
  ck_assert_double_lt(worst, 0.3);
  const char *body = body_of(text);
  ck_assert_msg(strstr(text, " 200 ") != NULL, "%s", text);
  double age0 = sample(body, series("graphd_device_figures_age_seconds", 0));
  ck_assert_double_gt(age0, 0.2);
  ck_assert_double_ge(sample(body, series("graphd_device_figures_age_seconds", 1)), 0);
  free(text);
  pthread_join(t, NULL);
  ck_assert_int_eq(k.st, GRAPHD_OK);
  graphd_stream_detach(k.s);
  graphd_close(k.c);
}
END_TEST

int main(void) {
  Suite *s = suite_create("metrics");
  TCase *tc = tcase_create("http");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_metrics_follow_sessions_and_replays);
  tcase_add_test(tc, test_metrics_refuses_other_paths_and_methods);
  tcase_add_test(tc, test_metrics_stop_signals_reach_the_loop_thread_alone);
  tcase_add_test(tc, test_metrics_ask_again_after_the_daemon_closed_the_session);
  tcase_add_test(tc, test_metrics_bad_or_taken_addresses_stop_graphd);
  tcase_add_test(tc, test_metrics_answer_at_once_while_a_worker_is_busy);
  suite_add_tcase(s, tc);
  TCase *ts = tcase_create("short_deadline");
  tcase_add_checked_fixture(ts, setup_short_deadline, teardown);
  tcase_set_timeout(ts, 60);
  tcase_add_test(ts, test_metrics_trickled_headers_are_cut_at_the_deadline);
  suite_add_tcase(s, ts);
  TCase *tl = tcase_create("long_deadline");
  tcase_add_checked_fixture(tl, setup_long_deadline, teardown);
  tcase_set_timeout(tl, 60);
  tcase_add_test(tl, test_metrics_one_address_cannot_crowd_out_scrapers);
  suite_add_tcase(s, tl);
  return td_run_suite(s);
}
