/* graphd: startup and shutdown.
 *
 * DESIGN: the main thread parses settings, picks the backend, enumerates
 * devices and binds the socket, then becomes the loop thread (tag [loop]).
 * From then on it never calls CUDA: device work belongs to the workers. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/uuid.h"
#include "daemon/backend/backend.h"
#include "daemon/base/crash.h"
#include "graphd/status.h"
#include "common/log.h"
#include "common/usage.h"
#include "exporter/metrics.h"
#include "daemon/notify.h"
#include "daemon/base/options.h"
#include "daemon/device_table.h"
#include "daemon/sessions/data_session.h"
#include "daemon/server.h"
#include "version.h"

#define DEFAULT_CONFIG "/etc/graphd/graphd.conf"
#define EXIT_USAGE 2

static void usage(FILE *f) {
  fprintf(f,
          "usage: graphd [options]\n"
          "  --socket PATH         listening socket (default: $GRAPHD_SOCKET, else\n"
          "                        /run/graphd/graphd.sock as root, else\n"
          "                        $XDG_RUNTIME_DIR/graphd.sock)\n"
          "  --socket-mode MODE    socket permissions, octal (default 0660)\n"
          "  --socket-group NAME   group owning the socket\n"
          "  --backend B           auto (default), cuda or host\n"
          "  --host-devices N      serve N host devices (implies --backend host)\n"
          "  --host-memory SIZE    memory per host device (default 1G)\n"
          "  --host-busy-ms MS     host devices: each replay keeps its capture busy this\n"
          "                        long after it ran, as a GPU still running it would\n"
          "                        (exercises instances without a GPU; default 0)\n"
          "  --devices LIST        serve only these GPUs: ordinals or UUIDs, comma-separated\n"
          "  --max-frame SIZE      largest request frame accepted (default 4M)\n"
          "  --admin-group NAME    group whose members may evict shared captures\n"
          "                        (default graphd-admin)\n"
          "  --device-budget SIZE  staging bytes captures may hold per device; past it\n"
          "                        the least recently used idle ones are evicted\n"
          "                        (default 0 = no limit)\n"
          "  --ready-timeout SEC   head-of-line timeout for a client's ready flag\n"
          "                        (default 60, 0 = never)\n"
          "  --shutdown-grace SEC  how long shutdown waits for in-flight work (default 10)\n"
          "  --hello-timeout SEC   a connection must send Hello within this (default 10,\n"
          "                        0 = never)\n"
          "  --idle-timeout SEC    close sessions that send no request nor ring entry\n"
          "                        for this long, with no replay running\n"
          "                        (default 0 = never)\n"
          "  --max-connections N   sessions open at once (default 4096)\n"
          "  --max-connections-per-uid N\n"
          "                        sessions open at once per client uid (default 1024)\n"
          "  --max-region-bytes-per-uid SIZE\n"
          "                        bytes of client memory the sessions of one uid may\n"
          "                        have mapped at once (default 0 = no limit)\n"
          "  --max-region-bytes-per-session SIZE\n"
          "                        ... one session (default 0 = no limit)\n"
          "  --max-regions-per-session N\n"
          "                        regions one session holds (default 4096)\n"
          "  --max-regions-per-uid N\n"
          "                        regions the sessions of one uid hold (default 16384,\n"
          "                        0 = no limit)\n"
          "  --max-programs N      programs registered in all (default 65536)\n"
          "  --max-programs-per-uid N\n"
          "                        programs one uid registered (default 8192, 0 = no\n"
          "                        limit); past it its unused ones are freed, least\n"
          "                        recently used first\n"
          "  --max-module-bytes SIZE\n"
          "                        module bytes registered in all (default 8G)\n"
          "  --max-module-bytes-per-uid SIZE\n"
          "                        module bytes one uid registered (default 2G, 0 = no\n"
          "                        limit), freed like programs\n"
          "  --max-program-bytes SIZE\n"
          "                        memory programs take in the registry, in all\n"
          "                        (default 4G)\n"
          "  --max-program-bytes-per-uid SIZE\n"
          "                        ... charged to one uid (default 1G, 0 = no limit),\n"
          "                        freed like programs\n"
          "  --max-inflight-replays N\n"
          "                        replays a session may have queued on its device and\n"
          "                        not finished; more wait (default 1024)\n"
          "  --max-host-maps N     client mappings (regions, flag pages, rings) graphd\n"
          "                        keeps in all (default 0: 3/4 of vm.max_map_count)\n"
          "  --fair-shares yes|no  in the registry and the mappings, refuse a uid past\n"
          "                        its fair share: the bound over one more than the\n"
          "                        uids holding part of it, and no more than stays\n"
          "                        free for the others (default yes)\n"
          "  --gpu-time-sample N   time one replay in N on the GPU, chosen at random,\n"
          "                        for the stats (default 16, 1 = every one, 0 = none)\n"
          "  --ready-hold-rings N  while a device serves more than N submission rings,\n"
          "                        an async replay whose ready write is behind waits\n"
          "                        for it on the worker (200 us at most) rather than\n"
          "                        on the GPU (default 2; 0 = even a ring alone)\n"
          "  --ready-hold-max-us N only for programs the worker queues in N us or less\n"
          "                        (a moving mean); a costlier launch is better queued\n"
          "                        ahead, its wait on the GPU (default 10; 0 = none)\n"
          "  --host-module-allow FILE\n"
          "                        host module ids (64 hex digits a line) that clients\n"
          "                        who are not admins may register\n"
          "  --metrics-listen ADDR:PORT\n"
          "                        serve GET /metrics (Prometheus text) over HTTP there,\n"
          "                        e.g. 127.0.0.1:9464 or [::]:9464 (default: off)\n"
          "  --metrics-header-timeout S\n"
          "                        an HTTP client must send a request's headers within\n"
          "                        S seconds of connecting (or of its last answer),\n"
          "                        however it trickles them (default 5)\n"
          "  --metrics-connections-per-address N\n"
          "                        HTTP connections one client address may hold open\n"
          "                        (default 4, of 64 in all)\n"
          "  --log-level L         error, warn, info (default) or debug\n"
          "  --config PATH         config file (default " DEFAULT_CONFIG
          " if present)\n"
          "  --check-config        validate the settings, print them and exit\n"
          "  --version             print the version and exit\n"
          "  --help                this text\n");
}

enum { OPT_CONFIG = 1000, OPT_CHECK_CONFIG, OPT_VERSION, OPT_HELP, OPT_SETTING = 2000 };

/* The settings (val 0) get a val each, OPT_SETTING + their index, at the
 * start of parse_settings: getopt_long takes a prefix shared by options
 * that all have the same val for the first of them, so `--max-regions`
 * would set --max-regions-per-session rather than be refused. */
static struct option long_opts[] = {
    {"socket", required_argument, NULL, 0},
    {"socket-mode", required_argument, NULL, 0},
    {"socket-group", required_argument, NULL, 0},
    {"backend", required_argument, NULL, 0},
    {"host-devices", required_argument, NULL, 0},
    {"host-memory", required_argument, NULL, 0},
    {"host-busy-ms", required_argument, NULL, 0},
    {"devices", required_argument, NULL, 0},
    {"max-frame", required_argument, NULL, 0},
    {"admin-group", required_argument, NULL, 0},
    {"device-budget", required_argument, NULL, 0},
    {"ready-timeout", required_argument, NULL, 0},
    {"shutdown-grace", required_argument, NULL, 0},
    {"hello-timeout", required_argument, NULL, 0},
    {"host-module-allow", required_argument, NULL, 0},
    {"metrics-listen", required_argument, NULL, 0},
    {"metrics-header-timeout", required_argument, NULL, 0},
    {"metrics-connections-per-address", required_argument, NULL, 0},
    {"max-region-bytes-per-uid", required_argument, NULL, 0},
    {"max-region-bytes-per-session", required_argument, NULL, 0},
    {"max-regions-per-session", required_argument, NULL, 0},
    {"max-regions-per-uid", required_argument, NULL, 0},
    {"max-programs", required_argument, NULL, 0},
    {"max-programs-per-uid", required_argument, NULL, 0},
    {"max-module-bytes", required_argument, NULL, 0},
    {"max-module-bytes-per-uid", required_argument, NULL, 0},
    {"max-program-bytes", required_argument, NULL, 0},
    {"max-program-bytes-per-uid", required_argument, NULL, 0},
    {"max-inflight-replays", required_argument, NULL, 0},
    {"max-host-maps", required_argument, NULL, 0},
    {"fair-shares", required_argument, NULL, 0},
    {"gpu-time-sample", required_argument, NULL, 0},
    {"ready-hold-rings", required_argument, NULL, 0},
    {"ready-hold-max-us", required_argument, NULL, 0},
    {"idle-timeout", required_argument, NULL, 0},
    {"max-connections", required_argument, NULL, 0},
    {"max-connections-per-uid", required_argument, NULL, 0},
    {"log-level", required_argument, NULL, 0},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"check-config", no_argument, NULL, OPT_CHECK_CONFIG},
    {"version", no_argument, NULL, OPT_VERSION},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

/* Settings come from defaults, then the config file, then flags: the first
 * pass finds --config, the second applies flags over the file. `read` gets
 * the config file's path, or "" when the default one is absent. Usage
 * errors are one line. */
static int parse_settings(int argc, char **argv, gd_options *o, int *check_only, char *read,
                          size_t readlen) {
  const char *config = NULL;
  char err[512];
  int c, idx;
  for (int i = 0; long_opts[i].name; i++)
    if (long_opts[i].val == 0) long_opts[i].val = OPT_SETTING + i;
  opterr = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, "", long_opts, &idx)) != -1) {
    if (c == OPT_CONFIG) config = optarg;
    if (c == OPT_VERSION) {
      printf("graphd %s (protocol %u)\n", GRAPHD_VERSION_STRING, 1u);
      exit(0);
    }
    if (c == OPT_HELP) {
      usage(stdout);
      exit(0);
    }
  }
  options_defaults(o);
  int rc = options_load_file(o, config ? config : DEFAULT_CONFIG, err, sizeof err);
  if (rc < 0 && !(rc == -GRAPHD_NOT_FOUND && !config)) {
    fprintf(stderr, "graphd: %s\n", err);
    return -1;
  }
  snprintf(read, readlen, "%s", rc < 0 ? "" : config ? config : DEFAULT_CONFIG);
  optind = 1;
  while ((c = getopt_long(argc, argv, "", long_opts, &idx)) != -1) {
    if (c >= OPT_SETTING) {
      if (options_set(o, long_opts[c - OPT_SETTING].name, optarg, err, sizeof err) < 0) {
        gd_usage_error(stderr, "graphd", "--%s", err);
        return -1;
      }
    } else if (c == OPT_CHECK_CONFIG) {
      *check_only = 1;
    } else if (c == '?' || c == ':') {
      gd_getopt_error(stderr, "graphd", argv, long_opts);
      return -1;
    }
  }
  if (optind < argc) {
    gd_usage_error(stderr, "graphd", "unexpected argument '%s'", argv[optind]);
    return -1;
  }
  if (o->host_devices && o->backend == GD_BACKEND_CUDA) {
    gd_usage_error(stderr, "graphd", "--host-devices and --backend cuda contradict each other");
    return -1;
  }
  if (o->host_devices && o->backend == GD_BACKEND_AUTO) o->backend = GD_BACKEND_HOST;
  return 0;
}

static int open_backend(const gd_options *o, gd_backend **be) {
  char err[512] = "";
  int rc;
  if (o->backend != GD_BACKEND_HOST) {
    rc = backend_cuda_new(be, err, sizeof err);
    if (rc == 0) return 0;
    if (o->backend == GD_BACKEND_CUDA || rc != -GRAPHD_UNAVAILABLE) {
      GD_LOG(GD_ERROR, "main", "cannot use CUDA: %s", err);
      return rc;
    }
    /* Host devices run clients' native code inside graphd: they are for
     * tests and machines without a GPU, and only when asked for. */
    GD_LOG(GD_ERROR, "main",
           "cannot use CUDA: %s; graphd serves GPUs. For host devices (tests, machines "
           "without a GPU: clients' modules run as native code inside graphd) ask with "
           "--backend host or --host-devices N",
           err);
    return rc;
  }
  rc = backend_host_new(o->host_devices ? o->host_devices : 1, o->host_memory, be, err, sizeof err);
  if (rc == 0 && o->host_busy_ms)
    rc = backend_host_set_busy(*be, (uint64_t)o->host_busy_ms * 1000000u);
  if (rc < 0) GD_LOG(GD_ERROR, "main", "%s", err);
  return rc;
}

/* Applies --devices: ordinals or UUIDs, in the order given. */
static int select_devices(const gd_options *o, const gd_backend *be, int *idx, int *n) {
  if (!o->devices[0]) {
    for (int i = 0; i < be->ndevices; i++) idx[i] = i;
    *n = be->ndevices;
    return 0;
  }
  char list[sizeof o->devices];
  snprintf(list, sizeof list, "%s", o->devices);
  int k = 0;
  char *save = NULL;
  for (char *tok = strtok_r(list, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    int found = -1;
    uint8_t uuid[16];
    char *end;
    long ord = strtol(tok, &end, 10);
    if (*tok && !*end) {
      if (ord >= 0 && ord < be->ndevices) found = (int)ord;
    } else if (gd_uuid_parse(tok, uuid) == 0) {
      for (int i = 0; i < be->ndevices; i++)
        if (memcmp(be->devices[i].uuid, uuid, 16) == 0) found = i;
    }
    if (found < 0) {
      GD_LOG(GD_ERROR, "main", "--devices: no %s device '%s' (this node has %d)", be->name, tok,
             be->ndevices);
      return -GRAPHD_NOT_FOUND;
    }
    for (int j = 0; j < k; j++)
      if (idx[j] == found) {
        GD_LOG(GD_ERROR, "main", "--devices: '%s' is listed twice", tok);
        return -GRAPHD_INVALID_ARGUMENT;
      }
    if (k >= be->ndevices) return -GRAPHD_INVALID_ARGUMENT;
    idx[k++] = found;
  }
  if (k == 0) {
    GD_LOG(GD_ERROR, "main", "--devices: the list is empty");
    return -GRAPHD_INVALID_ARGUMENT;
  }
  *n = k;
  return 0;
}

static void close_signals(gd_daemon *srv) {
  uv_close((uv_handle_t *)&srv->sig_term, NULL);
  uv_close((uv_handle_t *)&srv->sig_int, NULL);
}

/* SIGTERM and SIGINT go to the loop thread alone. They are blocked from
 * before the first thread starts (the driver's, the workers', the
 * exporter's, libgraphd's watcher in it) until every thread the daemon
 * starts is running, so each inherits them blocked; then the loop thread
 * takes them (a signal sent meanwhile waits for it). A signal the kernel
 * handed to any other thread would still reach libuv's handler, but a
 * thread that stays in a long call may hold it there: under
 * ThreadSanitizer, which runs handlers at its own safe points, a SIGTERM
 * was once still undelivered 10 s after it was sent. */
static void loop_signals(int how) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(how, &set, NULL);
}

static void no_work(uv_work_t *w) { (void)w; }

/* libuv starts its thread pool at the first work queued on it (a large
 * registration): started here, while the signals are blocked. */
static void start_thread_pool(uv_loop_t *loop) {
  static uv_work_t w;
  if (uv_queue_work(loop, &w, no_work, NULL) != 0)
    GD_LOG(GD_WARN, "main", "libuv's thread pool did not start; it starts at its first use");
}

int main(int argc, char **argv) {
  gd_options opt;
  int check_only = 0;
  int exit_code = 1;
  gd_backend *be = NULL;
  gd_daemon srv;
  gd_notify notify;
  gd_metrics *metrics = NULL;
  uv_loop_t loop;
  int *idx = NULL;
  int n = 0;
  char err[512];

  signal(SIGPIPE, SIG_IGN);
  gd_crash_install();
  gd_log_init();
  char config_read[4096];
  if (parse_settings(argc, argv, &opt, &check_only, config_read, sizeof config_read) < 0)
    return EXIT_USAGE;
  gd_log_level = opt.log_level;
  memset(&srv, 0, sizeof srv);
  gd_reg_limits limits = {
      .max_programs = opt.max_programs,
      .max_module_bytes = opt.max_module_bytes,
      .max_programs_per_uid = opt.max_programs_per_uid,
      .max_module_bytes_per_uid = opt.max_module_bytes_per_uid,
      .max_program_bytes = opt.max_program_bytes,
      .max_program_bytes_per_uid = opt.max_program_bytes_per_uid,
      .no_fair_shares = !opt.fair_shares,
  };
  registry_set_limits(&srv.reg, &limits);
  if (opt.host_module_allow[0] &&
      allowlist_load(&srv.host_allow, opt.host_module_allow, err, sizeof err) < 0) {
    fprintf(stderr, "graphd: %s\n", err);
    return EXIT_USAGE;
  }
  if (check_only) {
    allowlist_free(&srv.host_allow);
    if (config_read[0])
      printf("graphd: configuration is valid (read %s, then the flags)\n", config_read);
    else
      printf(
          "graphd: configuration is valid (no config file: %s is absent; defaults, then the "
          "flags)\n",
          DEFAULT_CONFIG);
    fflush(stdout);
    options_print(&opt, STDOUT_FILENO);
    return 0;
  }
  if (srv.host_allow.n)
    GD_LOG(GD_INFO, "main", "%zu host module(s) allowed for every client, from %s",
           srv.host_allow.n, opt.host_module_allow);
  loop_signals(SIG_BLOCK);
  if (open_backend(&opt, &be) < 0) {
    allowlist_free(&srv.host_allow);
    return 1;
  }
  idx = calloc((size_t)be->ndevices, sizeof *idx);
  if (!idx || select_devices(&opt, be, idx, &n) < 0) goto exit;
  srv.be = be;
  srv.ndevices = n;
  srv.facts = calloc((size_t)n, sizeof *srv.facts);
  srv.counters = calloc((size_t)n, sizeof *srv.counters);
  if (!srv.facts || !srv.counters) goto exit;
  for (int i = 0; i < n; i++) {
    const gd_device_facts *f = &be->devices[idx[i]];
    srv.facts[i] = f;
    GD_LOG(GD_INFO, "main", "device %d: %s, %s, %llu MiB, backend %s, MPS %s", i, f->name,
           f->uuid_str, (unsigned long long)(f->total_memory >> 20), be->name,
           f->mps_enabled ? "on" : "off");
    if (be->runs_under_mps && !f->mps_enabled)
      GD_LOG(GD_WARN, "main",
             "MPS is off on device %d (%s): every cross-process hand-off will cost about "
             "300 us of GPU time-slicing; start nvidia-cuda-mps-control -d -M for speed",
             i, f->uuid_str);
  }
  uv_loop_init(&loop);
  if (server_signals_start(&srv, &loop) < 0) goto exit_loop;
  if (server_listen(&srv, &opt, err, sizeof err) < 0) {
    GD_LOG(GD_ERROR, "main", "%s", err);
    close_signals(&srv);
    uv_run(&loop, UV_RUN_DEFAULT);
    goto exit_loop;
  }
  gd_log_set_thread_tag("loop");
  data_session_maps_init(&srv);
  if (device_table_start(&srv, &loop, idx, n, opt.device_budget) < 0) {
    GD_LOG(GD_ERROR, "main", "no device could be opened; exiting");
    worker_pool_stop(&srv.pool, 0);
    worker_pool_close(&srv.pool);
    close_signals(&srv);
    uv_run(&loop, UV_RUN_DEFAULT);
    server_cleanup(&srv);
    goto exit_loop;
  }
  bool started = server_start(&srv, &loop) == 0;
  if (started && opt.metrics_listen[0] &&
      !(metrics = metrics_start(opt.metrics_listen, srv.socket_path, opt.metrics_header_timeout_s,
                                opt.metrics_per_address, err, sizeof err))) {
    GD_LOG(GD_ERROR, "main", "%s", err);
    started = false;
  }
  if (!started) {
    server_shutdown(&srv, "startup failed");
    uv_run(&loop, UV_RUN_DEFAULT);
    server_cleanup(&srv);
    goto exit_loop;
  }
  GD_LOG(GD_INFO, "main", "graphd %s ready: %d device(s), pid %d", GRAPHD_VERSION_STRING, n,
         (int)getpid());
  srv.owner = &notify; /* READY=1, STATUS=, watchdog; STOPPING=1 at shutdown */
  srv.on_shutdown = notify_shutdown_cb;
  (void)notify_start(&notify, &srv);
  start_thread_pool(&loop);
  loop_signals(SIG_UNBLOCK);
  uv_run(&loop, UV_RUN_DEFAULT);
  metrics_stop(metrics); /* the sessions are closed: no scrape waits for the loop */
  server_cleanup(&srv);
  GD_LOG(GD_INFO, "main", "stopped");
  exit_code = srv.exit_code;
exit_loop:
  if (uv_loop_close(&loop) != 0) GD_LOG(GD_WARN, "main", "loop closed with handles open");
exit:
  worker_pool_free(&srv.pool);
  device_table_free(&srv);
  registry_close(&srv.reg);
  data_session_maps_free(&srv);
  allowlist_free(&srv.host_allow);
  free(srv.facts);
  free(srv.counters);
  free(idx);
  if (be) be->ops->destroy(be);
  return exit_code;
}
