/* graphctl: the admin CLI. Exit codes: 0 ok, 1 the daemon reported an
 * error, 2 usage error, 3 cannot connect. Errors are one line on stderr. */
#define _GNU_SOURCE
#include <getopt.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/usage.h"
#include "graphd/graphd.h"
#include "stats.h"
#include "top.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: graphctl [--socket PATH] [--timeout MS] COMMAND [ARGS]\n"
          "       graphctl --version | --help\n"
          "options:\n"
          "  -s, --socket PATH  the daemon's socket (default: $GRAPHD_SOCKET, else the\n"
          "                     caller's or the system's default)\n"
          "  -t, --timeout MS   connect and command timeout (default 30000)\n"
          "commands:\n"
          "  status [--json]   daemon version, uptime, devices, counters and data\n"
          "                    sessions (their age, idle time, flag slots, ring)\n"
          "  list [--json]     one line per capture: mode, staging, instances,\n"
          "                    replays, idle time, processes and more\n"
          "  evict SELECTORS [--dry-run] [--json]\n"
          "                    free captures: --capture ID (as list shows it),\n"
          "                    --program HASH, --device N, --client PID,\n"
          "                    --session ID, --idle SECONDS, or --all\n"
          "  stats [--json | --prometheus | --requests]\n"
          "                    per device: captures, staging, replays, latency\n"
          "                    percentiles, the worker's busy share since it began\n"
          "                    serving, captures built, evictions, errors;\n"
          "                    per client: sessions, regions and bytes;\n"
          "                    --requests: per kind of request, calls, errors and\n"
          "                    the daemon's time in its handler\n"

          "  top [--interval SECONDS] [--count N]\n"
          "                    per device, refreshed every SECONDS (default 2) until\n"
          "                    Ctrl-C or N refreshes: state, replays a second, the\n"
          "                    worker's busy share, memory free and total, captures\n"
          "                    and staging, errors a second\n"
          "  ping              one round trip to the daemon\n"
          "  version           print graphctl's version\n"
          "Sizes in text are in binary units (KiB, MiB, GiB); --json and --prometheus\n"
          "give bytes. Exit status: 0 ok, 1 the daemon reported an error, 2 usage\n"
          "error, 3 cannot connect.\n");
}

static json_object *device_json(const graphd_device_info *d) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "ordinal", json_object_new_int64(d->ordinal));
  json_object_object_add(o, "name", json_object_new_string(d->name));
  json_object_object_add(o, "uuid", json_object_new_string(d->uuid_str));
  json_object_object_add(o, "backend", json_object_new_string(d->backend));
  json_object_object_add(o, "state", json_object_new_string(d->state));
  json_object_object_add(o, "epoch", json_object_new_uint64(d->epoch));
  json_object_object_add(o, "mps_enabled", json_object_new_boolean(d->mps_enabled));
  json_object_object_add(o, "total_memory", json_object_new_uint64(d->total_memory));
  json_object_object_add(o, "free_memory", json_object_new_uint64(d->free_memory));
  json_object *c = json_object_new_object();
  json_object_object_add(c, "sessions", json_object_new_uint64(d->counters.sessions));
  json_object_object_add(c, "regions", json_object_new_uint64(d->counters.regions));
  json_object_object_add(c, "region_bytes", json_object_new_uint64(d->counters.region_bytes));
  json_object_object_add(c, "captures", json_object_new_uint64(d->counters.captures));
  json_object_object_add(c, "replays", json_object_new_uint64(d->counters.replays));
  json_object_object_add(c, "errors", json_object_new_uint64(d->counters.errors));
  json_object_object_add(c, "recaptures", json_object_new_uint64(d->counters.recaptures));
  json_object_object_add(c, "inflight", json_object_new_uint64(d->counters.inflight));
  json_object_object_add(c, "captures_built", json_object_new_uint64(d->counters.captures_built));
  json_object_object_add(c, "staging_bytes", json_object_new_uint64(d->counters.staging_bytes));
  json_object_object_add(c, "evictions", json_object_new_uint64(d->counters.evictions));
  json_object_object_add(o, "counters", c);
  return o;
}

static json_object *session_json(const graphd_session_record *r) {
  const graphd_session_info *x = &r->info;
  json_object *j = json_object_new_object();
  json_object_object_add(j, "id", json_object_new_uint64(x->id));
  json_object_object_add(j, "pid", json_object_new_int64(x->pid));
  json_object_object_add(j, "uid", json_object_new_int64(x->uid));
  json_object_object_add(j, "gid", json_object_new_int64(r->gid));
  json_object_object_add(j, "kind", json_object_new_string(x->data ? "data" : "control"));
  json_object_object_add(j, "device", json_object_new_int(x->device));
  json_object_object_add(j, "client_name", json_object_new_string(x->client_name));
  json_object_object_add(j, "admin", json_object_new_boolean(r->admin));
  json_object_object_add(j, "age_ms", json_object_new_uint64(r->age_ms));
  json_object_object_add(j, "idle_ms", json_object_new_uint64(r->idle_ms));
  json_object_object_add(j, "busy", json_object_new_boolean(r->busy));
  json_object_object_add(j, "regions", json_object_new_uint64(x->regions));
  json_object_object_add(j, "region_bytes", json_object_new_uint64(x->region_bytes));
  json_object_object_add(j, "flag_slots", json_object_new_int64(r->flag_slots));
  json_object_object_add(j, "has_ring", json_object_new_boolean(r->has_ring));
  return j;
}

static void print_status_json(const graphd_daemon_status *s) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "version", json_object_new_string(s->version));
  json_object_object_add(o, "pid", json_object_new_int64(s->pid));
  json_object_object_add(o, "uptime_ms", json_object_new_uint64(s->uptime_ms));
  json_object_object_add(o, "sessions", json_object_new_uint64(s->sessions));
  json_object *devs = json_object_new_array();
  for (uint32_t i = 0; i < s->ndevices; i++)
    json_object_array_add(devs, device_json(&s->devices[i]));
  json_object_object_add(o, "devices", devs);
  json_object_object_add(o, "modules", json_object_new_uint64(s->modules));
  json_object_object_add(o, "module_bytes", json_object_new_uint64(s->module_bytes));
  json_object_object_add(o, "programs", json_object_new_uint64(s->programs));
  json_object *sess = json_object_new_array();
  for (uint32_t i = 0; i < s->nsession_info; i++) {
    graphd_session_record r;
    if (graphd_daemon_status_session(s, i, &r, sizeof r) == GRAPHD_OK)
      json_object_array_add(sess, session_json(&r));
  }
  json_object_object_add(o, "session_list", sess);
  printf("%s\n", json_object_to_json_string_ext(
                     o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
  json_object_put(o);
}

/* A data session's line: who, where, what it holds, how old and how idle. */
static void print_session_text(const graphd_session_record *r) {
  const graphd_session_info *x = &r->info;
  char rb[32];
  cli_human_bytes(x->region_bytes, rb, sizeof rb);
  printf(
      "session %llu: pid %u uid %u gid %u%s%s%s, device %d, regions %llu (%s), flag slots %u, "
      "ring %s, up %.1f s, idle %.1f s%s\n",
      (unsigned long long)x->id, x->pid, x->uid, r->gid, r->admin ? " (admin)" : "",
      x->client_name[0] ? ", " : "", x->client_name, x->device, (unsigned long long)x->regions, rb,
      r->flag_slots, r->has_ring ? "yes" : "no", (double)r->age_ms / 1000.0,
      (double)r->idle_ms / 1000.0, r->busy ? ", busy" : "");
}

static void print_status_text(const graphd_daemon_status *s) {
  printf("graphd %s, pid %u, up %.1f s, %llu session(s)\n", s->version, s->pid,
         (double)s->uptime_ms / 1000.0, (unsigned long long)s->sessions);
  bool mps_off = false;
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_info *d = &s->devices[i];
    char tot[32], fre[32], rb[32];
    cli_human_bytes(d->total_memory, tot, sizeof tot);
    cli_human_bytes(d->free_memory, fre, sizeof fre);
    cli_human_bytes(d->counters.region_bytes, rb, sizeof rb);
    printf("device %u: %s %s\n", d->ordinal, d->name, d->uuid_str);
    printf("  backend %s, state %s, epoch %llu, MPS %s\n", d->backend, d->state,
           (unsigned long long)d->epoch, d->mps_enabled ? "on" : "off");
    printf("  memory %s total, %s free\n", tot, fre);
    char sb[32];
    cli_human_bytes(d->counters.staging_bytes, sb, sizeof sb);
    printf(
        "  sessions %llu, regions %llu (%s), captures %llu (%s staging), replays %llu, "
        "re-captures %llu, in flight %llu, errors %llu\n",
        (unsigned long long)d->counters.sessions, (unsigned long long)d->counters.regions, rb,
        (unsigned long long)d->counters.captures, sb, (unsigned long long)d->counters.replays,
        (unsigned long long)d->counters.recaptures, (unsigned long long)d->counters.inflight,
        (unsigned long long)d->counters.errors);
    if (strcmp(d->backend, "cuda") == 0 && !d->mps_enabled) mps_off = true;
  }
  char mb[32];
  cli_human_bytes(s->module_bytes, mb, sizeof mb);
  printf("registered: %llu module(s) (%s), %llu program(s)\n", (unsigned long long)s->modules, mb,
         (unsigned long long)s->programs);
  for (uint32_t i = 0; i < s->nsession_info; i++) {
    graphd_session_record r;
    if (graphd_daemon_status_session(s, i, &r, sizeof r) == GRAPHD_OK && r.info.data)
      print_session_text(&r);
  }
  if (mps_off)
    printf(
        "warning: MPS is off on some GPUs: each cross-process hand-off costs about 300 us; "
        "see the operator guide\n");
}

static int connect_control(const char *sock, int timeout_ms, graphd_client **c) {
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = sock;
  o.timeout_ms = timeout_ms;
  o.client_name = "graphctl";
  char err[GRAPHD_ERRMAX];
  graphd_status st = graphd_connect(&o, c, err, sizeof err);
  if (st != GRAPHD_OK) {
    fprintf(stderr, "graphctl: %s\n", err);
    return st == GRAPHD_UNAVAILABLE || st == GRAPHD_PERMISSION_DENIED ||
                   st == GRAPHD_DEADLINE_EXCEEDED
               ? EXIT_CONNECT
               : EXIT_DAEMON;
  }
  return EXIT_OK;
}

static int cmd_status(graphd_client *c, int argc, char **argv) {
  static const char *const switches[] = {"--json"};
  bool json;
  if (cli_switches("status", argc, argv, switches, &json, 1) != EXIT_OK) return EXIT_USAGE;
  if (!c) return EXIT_OK;
  graphd_daemon_status *s;
  graphd_status st = graphd_get_status(c, &s);
  if (st != GRAPHD_OK) return cli_call_failed(c, "status", st);
  if (json)
    print_status_json(s);
  else
    print_status_text(s);
  graphd_daemon_status_free(s);
  return EXIT_OK;
}

static const char *mode_name(uint32_t m) {
  return m == 0 ? "staged" : m == 1 ? "staged_ex" : m == 2 ? "direct" : "?";
}

static json_object *capture_json(const graphd_capture_record *r) {
  const graphd_capture_info *ci = &r->info;
  char hex[65];
  graphd_id_hex(ci->program_id, hex);
  char id[48];
  snprintf(id, sizeof id, "%.12s@%u", hex, ci->device);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "capture", json_object_new_string(id));
  json_object_object_add(o, "program", json_object_new_string(hex));
  json_object_object_add(o, "device", json_object_new_int64(ci->device));
  json_object_object_add(o, "mode", json_object_new_string(mode_name(ci->mode)));
  json_object_object_add(o, "instances", json_object_new_int64(r->instances));
  json_object_object_add(o, "staging_bytes", json_object_new_uint64(ci->staging_bytes));
  json_object_object_add(o, "nodes", json_object_new_int64(ci->nodes));
  json_object_object_add(o, "replays", json_object_new_uint64(ci->replays));
  json_object_object_add(o, "idle_ms", json_object_new_uint64(ci->idle_ms));
  json_object_object_add(o, "busy", json_object_new_boolean(ci->busy));
  json_object_object_add(o, "generation", json_object_new_int64(ci->generation));
  json_object_object_add(o, "created_unix_ms", json_object_new_uint64(ci->created_unix_ms));
  json_object_object_add(o, "repoints", json_object_new_uint64(ci->repoints));
  json_object_object_add(o, "graphs", json_object_new_int64(ci->graphs));
  json_object_object_add(o, "queue_ns", json_object_new_uint64(r->queue_ns));
  json_object *pids = json_object_new_array();
  for (uint32_t k = 0; k < ci->npids; k++)
    json_object_array_add(pids, json_object_new_int64(ci->pids[k]));
  json_object_object_add(o, "pids", pids);
  return o;
}

/* The columns of a capture's line, for list and evict. STAGING and GRAPHS
 * are over its INSTANCES. */
#define CAPTURE_HEADER_FMT "%-16s %-9s %10s %6s %10s %9s %-5s %4s %9s %6s %9s %8s  %s\n"
#define CAPTURE_ROW_FMT "%.12s@%-3u %-9s %10s %6u %10llu %9.1f %-5s %4u %9u %6u %9llu %8.1f  %s\n"

static void print_capture_header(void) {
  printf(CAPTURE_HEADER_FMT, "CAPTURE", "MODE", "STAGING", "NODES", "REPLAYS", "IDLE s", "STATE",
         "GEN", "INSTANCES", "GRAPHS", "REPOINTS", "QUEUE us", "PIDS");
}

static void print_capture(const graphd_capture_record *r) {
  const graphd_capture_info *ci = &r->info;
  char hex[65], sb[32], pids[128] = "";
  graphd_id_hex(ci->program_id, hex);
  cli_human_bytes(ci->staging_bytes, sb, sizeof sb);
  size_t n = 0;
  for (uint32_t k = 0; k < ci->npids && n < sizeof pids; k++)
    n += (size_t)snprintf(pids + n, sizeof pids - n, "%s%u", k ? "," : "", ci->pids[k]);
  printf(CAPTURE_ROW_FMT, hex, ci->device, mode_name(ci->mode), sb, ci->nodes,
         (unsigned long long)ci->replays, (double)ci->idle_ms / 1000.0, ci->busy ? "busy" : "idle",
         ci->generation, r->instances, ci->graphs, (unsigned long long)ci->repoints,
         (double)r->queue_ns / 1e3, n ? pids : "-");
}

/* Says on stderr which devices the daemon could not reach in time, and
 * returns them as a JSON array. */
static json_object *busy_devices(graphd_client *c, const char *cmd, const char *what) {
  uint32_t devs[64];
  size_t n = graphd_busy_devices(c, devs, 64);
  json_object *a = json_object_new_array();
  for (size_t i = 0; i < n && i < 64; i++) {
    json_object_array_add(a, json_object_new_int((int)devs[i]));
    fprintf(stderr, "graphctl: %s: device %u is busy (its worker is inside a long job): %s\n", cmd,
            devs[i], what);
  }
  return a;
}

static int cmd_list(graphd_client *c, int argc, char **argv) {
  static const char *const switches[] = {"--json"};
  bool json;
  if (cli_switches("list", argc, argv, switches, &json, 1) != EXIT_OK) return EXIT_USAGE;
  if (!c) return EXIT_OK;
  graphd_capture_record *ci;
  size_t n;
  if (graphd_list_capture_records(c, sizeof *ci, &ci, &n) != GRAPHD_OK) {
    fprintf(stderr, "graphctl: list: %s\n", graphd_last_error(c));
    return EXIT_DAEMON;
  }
  json_object_put(busy_devices(c, "list", "its captures are not listed"));
  if (json) {
    json_object *a = json_object_new_array();
    for (size_t i = 0; i < n; i++) json_object_array_add(a, capture_json(&ci[i]));
    printf("%s\n", json_object_to_json_string_ext(a, JSON_C_TO_STRING_PRETTY));
    json_object_put(a);
  } else {
    print_capture_header();
    for (size_t i = 0; i < n; i++) print_capture(&ci[i]);
    printf("%zu capture(s)\n", n);
  }
  graphd_capture_records_free(ci);
  return EXIT_OK;
}

static int parse_u64(const char *flag, const char *v, uint64_t *out) {
  char *end;
  unsigned long long x = strtoull(v, &end, 10);
  if (!*v || *end || v[0] == '-') {
    cli_usage_error("evict: %s takes a number, not '%s'", flag, v);
    return -1;
  }
  *out = x;
  return 0;
}

static int cmd_evict(graphd_client *c, int argc, char **argv) {
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  bool json = false;
  char program[65] = "";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    uint64_t x;
    if (strcmp(a, "--dry-run") == 0) {
      o.dry_run = 1;
    } else if (strcmp(a, "--json") == 0) {
      json = true;
    } else if (strcmp(a, "--all") == 0) {
      o.all = 1;
    } else if (!v) {
      return cli_usage_error("evict: unknown argument '%s', or it lacks its value", a);
    } else if (strcmp(a, "--capture") == 0) {
      /* PROGRAM@DEVICE, as list prints it */
      const char *at = strchr(v, '@');
      if (!at || at == v || (size_t)(at - v) >= sizeof program ||
          parse_u64("--capture", at + 1, &x) < 0)
        return cli_usage_error("evict: --capture takes PROGRAM@DEVICE, as list shows");
      snprintf(program, sizeof program, "%.*s", (int)(at - v), v);
      o.program = program;
      o.device = (int)x;
      i++;
    } else if (strcmp(a, "--program") == 0) {
      o.program = v;
      i++;
    } else if (strcmp(a, "--device") == 0 || strcmp(a, "--client") == 0 ||
               strcmp(a, "--session") == 0 || strcmp(a, "--idle") == 0) {
      if (parse_u64(a, v, &x) < 0) return EXIT_USAGE;
      if (a[2] == 'd') o.device = (int)x;
      if (a[2] == 'c') o.client_pid = (uint32_t)x;
      if (a[2] == 's') o.session = x;
      if (a[2] == 'i') o.idle_ms = x * 1000;
      i++;
    } else {
      return cli_usage_error("evict: unknown argument '%s'", a);
    }
  }
  /* The daemon's rule, checked here so that it is a usage error. */
  if (!o.all && !(o.program && *o.program) && o.device < 0 && !o.client_pid && !o.session &&
      !o.idle_ms)
    return cli_usage_error(
        "evict: say what to evict: --capture, --program, --device, --client, --session, "
        "--idle SECONDS (more than 0) or --all");
  if (!c) return EXIT_OK;
  graphd_capture_record *ci;
  size_t n;
  uint64_t bytes;
  if (graphd_evict_records(c, &o, sizeof *ci, &ci, &n, &bytes) != GRAPHD_OK) {
    fprintf(stderr, "graphctl: evict: %s\n", graphd_last_error(c));
    return EXIT_DAEMON;
  }
  json_object *busy =
      busy_devices(c, "evict", "the eviction there runs when it is free and is not in this count");
  if (json) {
    json_object *r = json_object_new_object();
    json_object_object_add(r, "busy_devices", busy);
    busy = NULL;
    json_object *a = json_object_new_array();
    for (size_t i = 0; i < n; i++) json_object_array_add(a, capture_json(&ci[i]));
    json_object_object_add(r, o.dry_run ? "would_evict" : "evicted", a);
    json_object_object_add(r, "bytes", json_object_new_uint64(bytes));
    json_object_object_add(r, "dry_run", json_object_new_boolean(o.dry_run));
    printf("%s\n", json_object_to_json_string_ext(r, JSON_C_TO_STRING_PRETTY));
    json_object_put(r);
  } else {
    if (n) print_capture_header();
    for (size_t i = 0; i < n; i++) print_capture(&ci[i]);
    char hb[32];
    cli_human_bytes(bytes, hb, sizeof hb);
    printf("%s %zu capture(s), %s of staging\n", o.dry_run ? "would evict" : "evicted", n, hb);
  }
  json_object_put(busy);
  graphd_capture_records_free(ci);
  return EXIT_OK;
}

static int cmd_ping(graphd_client *c, int argc, char **argv) {
  (void)argv;
  if (argc > 1) return cli_usage_error("ping takes no arguments");
  if (!c) return EXIT_OK;
  graphd_status st = graphd_ping(c, "graphctl", 8);
  if (st != GRAPHD_OK) return cli_call_failed(c, "ping", st);
  printf("pong from graphd (session %llu)\n", (unsigned long long)graphd_session_id(c));
  return EXIT_OK;
}

/* The commands, in the order --help lists them. */
static const struct {
  const char *name;
  int (*fn)(graphd_client *, int, char **);
} commands[] = {
    {"status", cmd_status}, {"list", cmd_list}, {"evict", cmd_evict},
    {"stats", cmd_stats},   {"top", cmd_top},   {"ping", cmd_ping},
};

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"socket", required_argument, NULL, 's'},
      {"timeout", required_argument, NULL, 't'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0},
  };
  const char *sock = NULL;
  int timeout_ms = 0;
  int c;
  opterr = 0; /* a bad option is said in one line below */
  /* '+' stops at the command, so its own flags are not taken as ours. */
  while ((c = getopt_long(argc, argv, "+s:t:hV", opts, NULL)) != -1) {
    switch (c) {
      case 's': sock = optarg; break;
      case 't': {
        char *end;
        long v = strtol(optarg, &end, 10);
        if (!*optarg || *end || v <= 0 || v > 3600000)
          return cli_usage_error("--timeout takes milliseconds from 1 to 3600000, not '%s'",
                                 optarg);
        timeout_ms = (int)v;
        break;
      }
      case 'h': usage(stdout); return EXIT_OK;
      case 'V': printf("graphctl %s\n", graphd_version()); return EXIT_OK;
      default: gd_getopt_error(stderr, "graphctl", argv, opts); return EXIT_USAGE;
    }
  }
  if (optind >= argc) return cli_usage_error("no command given");
  const char *cmd = argv[optind];
  if (strcmp(cmd, "version") == 0) {
    printf("graphctl %s\n", graphd_version());
    return EXIT_OK;
  }
  if (strcmp(cmd, "help") == 0) {
    usage(stdout);
    return EXIT_OK;
  }
  int (*fn)(graphd_client *, int, char **) = NULL;
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(cmd, commands[i].name) == 0) fn = commands[i].fn;
  if (!fn) return cli_usage_error("unknown command '%s'", cmd);
  /* `graphctl COMMAND --help` is the same as `graphctl --help`. */
  for (int i = optind + 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return EXIT_OK;
    }
  /* A command's arguments are checked before it connects: a usage error
   * is one whether a daemon runs or not. */
  int rc = fn(NULL, argc - optind, argv + optind);
  if (rc != EXIT_OK) return rc;
  graphd_client *cl;
  rc = connect_control(sock, timeout_ms, &cl);
  if (rc != EXIT_OK) return rc;
  rc = fn(cl, argc - optind, argv + optind);
  graphd_close(cl);
  return rc;
}
