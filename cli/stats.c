/* graphctl stats: per-device and per-client figures from one Status reply,
 * as text, JSON (json-c) or the Prometheus text exposition format; with
 * --requests, the daemon's counters per kind of request as text (JSON and
 * Prometheus carry them always). */
#define _GNU_SOURCE
#include "stats.h"

#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exporter/prom.h"
#include "cli.h"

static void add_u64(json_object *o, const char *k, uint64_t v) {
  json_object_object_add(o, k, json_object_new_uint64(v));
}

/* The request counters: an object per kind of request. */
static json_object *requests_json(const graphd_daemon_status *s) {
  json_object *reqs = json_object_new_array();
  graphd_request_record *a = NULL;
  size_t n = 0;
  if (graphd_daemon_status_requests(s, sizeof *a, &a, &n) != GRAPHD_OK) n = 0;
  for (size_t i = 0; i < n; i++) {
    json_object *j = json_object_new_object();
    json_object_object_add(j, "request", json_object_new_string(a[i].request));
    add_u64(j, "calls", a[i].calls);
    add_u64(j, "errors", a[i].errors);
    add_u64(j, "handler_ns", a[i].handler_ns);
    json_object_array_add(reqs, j);
  }
  graphd_request_records_free(a);
  return reqs;
}

static void print_json(const graphd_daemon_status *s, const gd_client_row *cl, size_t ncl) {
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
    add_u64(j, "figures_age_ms", s->figures_age_ms[i]);
    json_object *lat = json_object_new_object();
    add_u64(lat, "p50", c->replay_p50_ns);
    add_u64(lat, "p90", c->replay_p90_ns);
    add_u64(lat, "p99", c->replay_p99_ns);
    add_u64(lat, "max", c->replay_max_ns);
    json_object_object_add(j, "replay_latency_ns", lat);
    /* Every device counter of the list, under its name on the wire. */
    graphd_device_record r;
    if (graphd_daemon_status_device(s, i, &r, sizeof r) != GRAPHD_OK) memset(&r, 0, sizeof r);
    const graphd_metric_info *m;
    for (uint32_t k = 0; (m = graphd_device_metric(k)); k++)
      add_u64(j, m->name, graphd_device_record_value(&r, m));
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
  json_object_object_add(o, "requests", requests_json(s));
  printf("%s\n", json_object_to_json_string_ext(
                     o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
  json_object_put(o);
}

static void us(char *out, size_t n, uint64_t ns) { snprintf(out, n, "%.1f", (double)ns / 1e3); }

static void print_text(const graphd_daemon_status *s, const gd_client_row *cl, size_t ncl) {
  printf("%-6s %8s %10s %10s %8s %8s %8s %8s %8s %8s %6s %9s %9s %8s %6s\n", "DEVICE", "CAPTURES",
         "STAGING", "REPLAYS", "P50 us", "P90 us", "P99 us", "MAX us", "WORK us", "GPU us", "BUSY",
         "CAPTURED", "RECAPTURE", "EVICTED", "ERRORS");
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_counters *c = &s->devices[i].counters;
    char p50[32], p90[32], p99[32], mx[32], work[32], gpu[32], sb[32], busy[32];
    cli_human_bytes(c->staging_bytes, sb, sizeof sb);
    const graphd_device_work *w = &s->work[i];
    us(work, sizeof work, w->replays ? w->replay_ns / w->replays : 0);
    us(gpu, sizeof gpu, w->gpu_replays ? w->gpu_ns / w->gpu_replays : 0);
    us(p50, sizeof p50, c->replay_p50_ns);
    us(p90, sizeof p90, c->replay_p90_ns);
    us(p99, sizeof p99, c->replay_p99_ns);
    us(mx, sizeof mx, c->replay_max_ns);
    /* One reply has no interval of its own: the share since the worker
     * began serving (graphctl top gives it over an interval). */
    graphd_device_record r;
    if (graphd_daemon_status_device(s, i, &r, sizeof r) != GRAPHD_OK) memset(&r, 0, sizeof r);
    cli_busy_share(busy, sizeof busy, 0, r.worker_busy_ns, 0, r.worker_clock_ns);
    printf("%-6u %8llu %10s %10llu %8s %8s %8s %8s %8s %8s %6s %9llu %9llu %8llu %6llu\n",
           s->devices[i].ordinal, (unsigned long long)c->captures, sb,
           (unsigned long long)c->replays, p50, p90, p99, mx, work, gpu, busy,
           (unsigned long long)c->captures_built, (unsigned long long)c->recaptures,
           (unsigned long long)c->evictions, (unsigned long long)c->errors);
  }
  printf("\n%-8s %-6s %-20s %8s %8s %12s\n", "PID", "UID", "NAME", "SESSIONS", "REGIONS",
         "REGION SIZE");
  for (size_t i = 0; i < ncl; i++) {
    char rb[32];
    cli_human_bytes(cl[i].region_bytes, rb, sizeof rb);
    printf("%-8u %-6u %-20.20s %8llu %8llu %12s\n", cl[i].pid, cl[i].uid, cl[i].name,
           (unsigned long long)cl[i].sessions, (unsigned long long)cl[i].regions, rb);
  }
  if (!ncl) printf("(no clients)\n");
}

/* The request counters: per kind of request, its calls, errors, the
 * daemon loop's time in its handler and that time's mean per call. */
static void print_requests(const graphd_daemon_status *s) {
  graphd_request_record *a = NULL;
  size_t n = 0;
  if (graphd_daemon_status_requests(s, sizeof *a, &a, &n) != GRAPHD_OK) n = 0;
  printf("%-18s %12s %10s %12s %9s\n", "REQUEST", "CALLS", "ERRORS", "HANDLER ms", "MEAN us");
  for (size_t i = 0; i < n; i++) {
    char mean[32];
    us(mean, sizeof mean, a[i].calls ? a[i].handler_ns / a[i].calls : 0);
    printf("%-18.18s %12llu %10llu %12.3f %9s\n", a[i].request, (unsigned long long)a[i].calls,
           (unsigned long long)a[i].errors, (double)a[i].handler_ns / 1e6, mean);
  }
  if (!n) printf("(the daemon does not count its requests)\n");
  graphd_request_records_free(a);
}

int cmd_stats(graphd_client *c, int argc, char **argv) {
  static const char *const switches[] = {"--json", "--prometheus", "--requests"};
  bool on[3];
  if (cli_switches("stats", argc, argv, switches, on, 3) != EXIT_OK) return EXIT_USAGE;
  bool json = on[0], prom = on[1], requests = on[2];
  if (json + prom + requests > 1)
    return cli_usage_error("stats: --json, --prometheus and --requests are exclusive");
  if (!c) return EXIT_OK;
  graphd_daemon_status *s;
  graphd_status st = graphd_get_status(c, &s);
  if (st != GRAPHD_OK) return cli_call_failed(c, "stats", st);
  gd_client_row *cl;
  size_t ncl = gd_client_rows(s, (uint32_t)getpid(), &cl);
  if (json)
    print_json(s, cl, ncl);
  else if (requests)
    print_requests(s);
  else if (prom)
    gd_prom_write(stdout, s, cl, ncl);
  else
    print_text(s, cl, ncl);
  free(cl);
  graphd_daemon_status_free(s);
  return EXIT_OK;
}
