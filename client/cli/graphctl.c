/* graphctl: the admin CLI. Exit codes: 0 ok, 1 the daemon reported an
 * error, 2 usage error, 3 cannot connect. Errors are one line on stderr. */
#define _GNU_SOURCE
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphd/graphd.h"

enum { EXIT_OK = 0, EXIT_DAEMON = 1, EXIT_USAGE = 2, EXIT_CONNECT = 3 };

static void usage(FILE *f) {
  fprintf(f,
          "usage: graphctl [--socket PATH] [--timeout MS] COMMAND [ARGS]\n"
          "commands:\n"
          "  status [--json]   daemon version, uptime, devices and counters\n"
          "  ping              one round trip to the daemon\n"
          "  version           print graphctl's version\n");
}

static void human_bytes(uint64_t b, char *out, size_t n) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  snprintf(out, n, u ? "%.1f %s" : "%.0f %s", v, units[u]);
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
  json_object_object_add(o, "counters", c);
  return o;
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
    const graphd_session_info *x = &s->session_info[i];
    json_object *j = json_object_new_object();
    json_object_object_add(j, "id", json_object_new_uint64(x->id));
    json_object_object_add(j, "pid", json_object_new_int64(x->pid));
    json_object_object_add(j, "uid", json_object_new_int64(x->uid));
    json_object_object_add(j, "kind", json_object_new_string(x->data ? "data" : "control"));
    json_object_object_add(j, "device", json_object_new_int(x->device));
    json_object_object_add(j, "client_name", json_object_new_string(x->client_name));
    json_object_object_add(j, "regions", json_object_new_uint64(x->regions));
    json_object_object_add(j, "region_bytes", json_object_new_uint64(x->region_bytes));
    json_object_array_add(sess, j);
  }
  json_object_object_add(o, "session_list", sess);
  printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY |
                                                       JSON_C_TO_STRING_NOSLASHESCAPE));
  json_object_put(o);
}

static void print_status_text(const graphd_daemon_status *s) {
  printf("graphd %s, pid %u, up %.1f s, %llu session(s)\n", s->version, s->pid,
         (double)s->uptime_ms / 1000.0, (unsigned long long)s->sessions);
  int mps_off = 0;
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_info *d = &s->devices[i];
    char tot[32], fre[32], rb[32];
    human_bytes(d->total_memory, tot, sizeof tot);
    human_bytes(d->free_memory, fre, sizeof fre);
    human_bytes(d->counters.region_bytes, rb, sizeof rb);
    printf("device %u: %s %s\n", d->ordinal, d->name, d->uuid_str);
    printf("  backend %s, state %s, epoch %llu, MPS %s\n", d->backend, d->state,
           (unsigned long long)d->epoch, d->mps_enabled ? "on" : "off");
    printf("  memory %s total, %s free\n", tot, fre);
    char sb[32];
    human_bytes(d->counters.staging_bytes, sb, sizeof sb);
    printf("  sessions %llu, regions %llu (%s), captures %llu (%s staging), replays %llu, "
           "re-captures %llu, in flight %llu, errors %llu\n",
           (unsigned long long)d->counters.sessions, (unsigned long long)d->counters.regions, rb,
           (unsigned long long)d->counters.captures, sb, (unsigned long long)d->counters.replays,
           (unsigned long long)d->counters.recaptures, (unsigned long long)d->counters.inflight,
           (unsigned long long)d->counters.errors);
    if (strcmp(d->backend, "cuda") == 0 && !d->mps_enabled) mps_off = 1;
  }
  char mb[32];
  human_bytes(s->module_bytes, mb, sizeof mb);
  printf("registered: %llu module(s) (%s), %llu program(s)\n", (unsigned long long)s->modules,
         mb, (unsigned long long)s->programs);
  for (uint32_t i = 0; i < s->nsession_info; i++) {
    const graphd_session_info *x = &s->session_info[i];
    if (!x->data) continue;
    char rb[32];
    human_bytes(x->region_bytes, rb, sizeof rb);
    printf("session %llu: pid %u uid %u%s%s, device %d, regions %llu (%s)\n",
           (unsigned long long)x->id, x->pid, x->uid, x->client_name[0] ? ", " : "",
           x->client_name, x->device, (unsigned long long)x->regions, rb);
  }
  if (mps_off)
    printf("warning: MPS is off on some GPUs: each cross-process hand-off costs about 300 us; "
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
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else {
      fprintf(stderr, "graphctl: status: unknown argument '%s'\n", argv[i]);
      return EXIT_USAGE;
    }
  }
  graphd_daemon_status *s;
  graphd_status st = graphd_get_status(c, &s);
  if (st != GRAPHD_OK) {
    fprintf(stderr, "graphctl: status: %s: %s\n", graphd_status_name(st), graphd_last_error(c));
    return EXIT_DAEMON;
  }
  if (json)
    print_status_json(s);
  else
    print_status_text(s);
  graphd_daemon_status_free(s);
  return EXIT_OK;
}

static int cmd_ping(graphd_client *c, int argc, char **argv) {
  (void)argv;
  if (argc > 1) {
    fprintf(stderr, "graphctl: ping takes no arguments\n");
    return EXIT_USAGE;
  }
  graphd_status st = graphd_ping(c, "graphctl", 8);
  if (st != GRAPHD_OK) {
    fprintf(stderr, "graphctl: ping: %s: %s\n", graphd_status_name(st), graphd_last_error(c));
    return EXIT_DAEMON;
  }
  printf("pong from graphd (session %llu)\n", (unsigned long long)graphd_session_id(c));
  return EXIT_OK;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"socket", required_argument, NULL, 's'},
      {"timeout", required_argument, NULL, 't'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  const char *sock = NULL;
  int timeout_ms = 0;
  int c;
  /* '+' stops at the command, so its own flags are not taken as ours. */
  while ((c = getopt_long(argc, argv, "+s:t:h", opts, NULL)) != -1) {
    switch (c) {
      case 's': sock = optarg; break;
      case 't': {
        char *end;
        long v = strtol(optarg, &end, 10);
        if (!*optarg || *end || v <= 0 || v > 3600000) {
          fprintf(stderr, "graphctl: --timeout must be milliseconds from 1 to 3600000\n");
          return EXIT_USAGE;
        }
        timeout_ms = (int)v;
        break;
      }
      case 'h': usage(stdout); return EXIT_OK;
      default: usage(stderr); return EXIT_USAGE;
    }
  }
  if (optind >= argc) {
    usage(stderr);
    return EXIT_USAGE;
  }
  const char *cmd = argv[optind];
  int (*fn)(graphd_client *, int, char **) = NULL;
  if (strcmp(cmd, "status") == 0)
    fn = cmd_status;
  else if (strcmp(cmd, "ping") == 0)
    fn = cmd_ping;
  else if (strcmp(cmd, "version") == 0) {
    printf("graphctl %s\n", graphd_version());
    return EXIT_OK;
  } else {
    fprintf(stderr, "graphctl: unknown command '%s' (try --help)\n", cmd);
    return EXIT_USAGE;
  }
  graphd_client *cl;
  int rc = connect_control(sock, timeout_ms, &cl);
  if (rc != EXIT_OK) return rc;
  rc = fn(cl, argc - optind, argv + optind);
  graphd_close(cl);
  return rc;
}
