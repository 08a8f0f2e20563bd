/* graphctl stats: per-device and per-client figures from one Status reply,
 * as text, JSON (json-c) or the Prometheus text exposition format. */
#define _GNU_SOURCE
#include "stats.h"

#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli.h"

/* One client process: its sessions folded together. */
typedef struct client_row {
  uint32_t pid, uid;
  const char *name;
  uint64_t sessions, data_sessions, regions, region_bytes;
} client_row;

/* The client processes, in first-seen order; graphctl's own session is left
 * out. Returns the count; *out is freed by the caller. */
static size_t fold_clients(const graphd_daemon_status *s, client_row **out) {
  client_row *r = calloc(s->nsession_info ? s->nsession_info : 1, sizeof *r);
  size_t n = 0;
  if (!r) {
    *out = NULL;
    return 0;
  }
  uint32_t self = (uint32_t)getpid();
  for (uint32_t i = 0; i < s->nsession_info; i++) {
    const graphd_session_info *x = &s->session_info[i];
    if (x->pid == self && !x->data) continue;
    size_t k = 0;
    while (k < n && r[k].pid != x->pid) k++;
    if (k == n) {
      r[n].pid = x->pid;
      r[n].uid = x->uid;
      r[n].name = x->client_name;
      n++;
    }
    r[k].sessions++;
    r[k].data_sessions += x->data != 0;
    r[k].regions += x->regions;
    r[k].region_bytes += x->region_bytes;
  }
  *out = r;
  return n;
}

static void add_u64(json_object *o, const char *k, uint64_t v) {
  json_object_object_add(o, k, json_object_new_uint64(v));
}

static void print_json(const graphd_daemon_status *s, const client_row *cl, size_t ncl) {
  json_object *o = json_object_new_object();
  add_u64(o, "uptime_ms", s->uptime_ms);
  add_u64(o, "modules", s->modules);
  add_u64(o, "programs", s->programs);
  json_object *devs = json_object_new_array();
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_info *d = &s->devices[i];
    const graphd_device_counters *c = &d->counters;
    json_object *j = json_object_new_object();
    add_u64(j, "device", d->ordinal);
    json_object_object_add(j, "uuid", json_object_new_string(d->uuid_str));
    json_object_object_add(j, "state", json_object_new_string(d->state));
    add_u64(j, "captures", c->captures);
    add_u64(j, "graphs", c->captures); /* one executable graph per capture */
    add_u64(j, "staging_bytes", c->staging_bytes);
    add_u64(j, "replays", c->replays);
    add_u64(j, "inflight", c->inflight);
    json_object *lat = json_object_new_object();
    add_u64(lat, "p50", c->replay_p50_ns);
    add_u64(lat, "p90", c->replay_p90_ns);
    add_u64(lat, "p99", c->replay_p99_ns);
    add_u64(lat, "max", c->replay_max_ns);
    json_object_object_add(j, "replay_latency_ns", lat);
    add_u64(j, "captures_built", c->captures_built);
    add_u64(j, "recaptures", c->recaptures);
    add_u64(j, "evictions", c->evictions);
    add_u64(j, "errors", c->errors);
    add_u64(j, "sessions", c->sessions);
    add_u64(j, "regions", c->regions);
    add_u64(j, "region_bytes", c->region_bytes);
    json_object_array_add(devs, j);
  }
  json_object_object_add(o, "devices", devs);
  json_object *cls = json_object_new_array();
  for (size_t i = 0; i < ncl; i++) {
    json_object *j = json_object_new_object();
    add_u64(j, "pid", cl[i].pid);
    add_u64(j, "uid", cl[i].uid);
    json_object_object_add(j, "name", json_object_new_string(cl[i].name));
    add_u64(j, "sessions", cl[i].sessions);
    add_u64(j, "data_sessions", cl[i].data_sessions);
    add_u64(j, "regions", cl[i].regions);
    add_u64(j, "region_bytes", cl[i].region_bytes);
    json_object_array_add(cls, j);
  }
  json_object_object_add(o, "clients", cls);
  printf("%s\n", json_object_to_json_string_ext(
                     o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
  json_object_put(o);
}

/* A label value in the exposition format: \, " and newline escaped. */
static void label_value(const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"')
      printf("\\%c", *v);
    else if (*v == '\n')
      printf("\\n");
    else
      putchar(*v);
  }
}

static void family(const char *name, const char *type, const char *help) {
  printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

typedef enum {
  DEV_CAPTURES,
  DEV_GRAPHS,
  DEV_STAGING,
  DEV_REPLAYS,
  DEV_INFLIGHT,
  DEV_BUILT,
  DEV_RECAPTURES,
  DEV_EVICTIONS,
  DEV_ERRORS,
  DEV_SESSIONS,
  DEV_REGIONS,
  DEV_REGION_BYTES,
  DEV_N
} dev_metric;

static const struct {
  const char *name, *type, *help;
} dev_metrics[DEV_N] = {
    {"graphd_captures", "gauge", "Captures held now."},
    {"graphd_graphs", "gauge", "Executable graphs held now (one per capture)."},
    {"graphd_staging_bytes", "gauge", "Staging bytes the captures hold."},
    {"graphd_replays_total", "counter", "Replays that ran."},
    {"graphd_replays_inflight", "gauge", "Replays with the device's worker now."},
    {"graphd_captures_built_total", "counter", "Captures built since start."},
    {"graphd_recaptures_total", "counter", "Captures built again after an eviction."},
    {"graphd_evictions_total", "counter", "Captures evicted (by request or budget)."},
    {"graphd_errors_total", "counter", "Requests on the device that failed."},
    {"graphd_sessions", "gauge", "Data sessions bound to the device."},
    {"graphd_regions", "gauge", "Client memory regions imported on the device."},
    {"graphd_region_bytes", "gauge", "Bytes of the imported regions."},
};

static uint64_t dev_value(const graphd_device_counters *c, dev_metric m) {
  switch (m) {
    case DEV_CAPTURES:
    case DEV_GRAPHS: return c->captures;
    case DEV_STAGING: return c->staging_bytes;
    case DEV_REPLAYS: return c->replays;
    case DEV_INFLIGHT: return c->inflight;
    case DEV_BUILT: return c->captures_built;
    case DEV_RECAPTURES: return c->recaptures;
    case DEV_EVICTIONS: return c->evictions;
    case DEV_ERRORS: return c->errors;
    case DEV_SESSIONS: return c->sessions;
    case DEV_REGIONS: return c->regions;
    case DEV_REGION_BYTES: return c->region_bytes;
    default: return 0;
  }
}

static void dev_labels(const graphd_device_info *d) {
  printf("{device=\"%u\",uuid=\"", d->ordinal);
  label_value(d->uuid_str);
  printf("\"");
}

static void print_prometheus(const graphd_daemon_status *s, const client_row *cl, size_t ncl) {
  family("graphd_uptime_seconds", "gauge", "Seconds since the daemon started.");
  printf("graphd_uptime_seconds %.3f\n", (double)s->uptime_ms / 1e3);
  family("graphd_modules", "gauge", "Registered modules.");
  printf("graphd_modules %llu\n", (unsigned long long)s->modules);
  family("graphd_programs", "gauge", "Registered programs.");
  printf("graphd_programs %llu\n", (unsigned long long)s->programs);
  for (int m = 0; m < DEV_N; m++) {
    family(dev_metrics[m].name, dev_metrics[m].type, dev_metrics[m].help);
    for (uint32_t i = 0; i < s->ndevices; i++) {
      printf("%s", dev_metrics[m].name);
      dev_labels(&s->devices[i]);
      printf("} %llu\n", (unsigned long long)dev_value(&s->devices[i].counters, (dev_metric)m));
    }
  }
  family("graphd_replay_latency_seconds", "gauge",
         "Replay latency in the daemon, request read to reply ready, at a quantile "
         "(successful replays since start; within 12.5%).");
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_counters *c = &s->devices[i].counters;
    const struct {
      const char *q;
      uint64_t v;
    } qs[] = {{"0.5", c->replay_p50_ns},
              {"0.9", c->replay_p90_ns},
              {"0.99", c->replay_p99_ns},
              {"1", c->replay_max_ns}};
    for (size_t k = 0; k < sizeof qs / sizeof qs[0]; k++) {
      printf("graphd_replay_latency_seconds");
      dev_labels(&s->devices[i]);
      printf(",quantile=\"%s\"} %.9f\n", qs[k].q, (double)qs[k].v / 1e9);
    }
  }
  static const char *const cnames[] = {"graphd_client_sessions", "graphd_client_regions",
                                       "graphd_client_region_bytes"};
  static const char *const chelp[] = {"Sessions the client process has open.",
                                      "Memory regions the client process registered.",
                                      "Bytes of the client process's regions."};
  for (int m = 0; m < 3; m++) {
    family(cnames[m], "gauge", chelp[m]);
    for (size_t i = 0; i < ncl; i++) {
      uint64_t v = m == 0 ? cl[i].sessions : m == 1 ? cl[i].regions : cl[i].region_bytes;
      printf("%s{pid=\"%u\",uid=\"%u\",name=\"", cnames[m], cl[i].pid, cl[i].uid);
      label_value(cl[i].name);
      printf("\"} %llu\n", (unsigned long long)v);
    }
  }
}

static void us(char *out, size_t n, uint64_t ns) { snprintf(out, n, "%.1f", (double)ns / 1e3); }

static void print_text(const graphd_daemon_status *s, const client_row *cl, size_t ncl) {
  printf("%-6s %8s %14s %10s %8s %8s %8s %8s %9s %9s %8s %6s\n", "DEVICE", "CAPTURES", "STAGING",
         "REPLAYS", "P50 us", "P90 us", "P99 us", "MAX us", "CAPTURED", "RECAPTURE", "EVICTED",
         "ERRORS");
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_counters *c = &s->devices[i].counters;
    char p50[32], p90[32], p99[32], mx[32];
    us(p50, sizeof p50, c->replay_p50_ns);
    us(p90, sizeof p90, c->replay_p90_ns);
    us(p99, sizeof p99, c->replay_p99_ns);
    us(mx, sizeof mx, c->replay_max_ns);
    printf("%-6u %8llu %14llu %10llu %8s %8s %8s %8s %9llu %9llu %8llu %6llu\n",
           s->devices[i].ordinal, (unsigned long long)c->captures,
           (unsigned long long)c->staging_bytes, (unsigned long long)c->replays, p50, p90, p99, mx,
           (unsigned long long)c->captures_built, (unsigned long long)c->recaptures,
           (unsigned long long)c->evictions, (unsigned long long)c->errors);
  }
  printf("\n%-8s %-6s %-20s %8s %8s %14s\n", "PID", "UID", "NAME", "SESSIONS", "REGIONS",
         "REGION BYTES");
  for (size_t i = 0; i < ncl; i++)
    printf("%-8u %-6u %-20.20s %8llu %8llu %14llu\n", cl[i].pid, cl[i].uid, cl[i].name,
           (unsigned long long)cl[i].sessions, (unsigned long long)cl[i].regions,
           (unsigned long long)cl[i].region_bytes);
  if (!ncl) printf("(no clients)\n");
}

int cmd_stats(graphd_client *c, int argc, char **argv) {
  static const char *const switches[] = {"--json", "--prometheus"};
  bool on[2];
  if (cli_switches("stats", argc, argv, switches, on, 2) != EXIT_OK) return EXIT_USAGE;
  bool json = on[0], prom = on[1];
  if (json && prom) {
    fprintf(stderr, "graphctl: stats: --json and --prometheus are exclusive\n");
    return EXIT_USAGE;
  }
  graphd_daemon_status *s;
  graphd_status st = graphd_get_status(c, &s);
  if (st != GRAPHD_OK) return cli_call_failed(c, "stats", st);
  client_row *cl;
  size_t ncl = fold_clients(s, &cl);
  if (json)
    print_json(s, cl, ncl);
  else if (prom)
    print_prometheus(s, cl, ncl);
  else
    print_text(s, cl, ncl);
  free(cl);
  graphd_daemon_status_free(s);
  return EXIT_OK;
}
