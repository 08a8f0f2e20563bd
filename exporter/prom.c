/* The Prometheus text exposition format of a daemon status (prom.h). */
#include "prom.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

size_t gd_client_rows(const graphd_daemon_status *s, uint32_t self, gd_client_row **out) {
  gd_client_row *r = calloc(s->nsession_info ? s->nsession_info : 1, sizeof *r);
  size_t n = 0;
  if (!r) {
    *out = NULL;
    return 0;
  }
  for (uint32_t i = 0; i < s->nsession_info; i++) {
    const graphd_session_info *x = &s->session_info[i];
    if ((x->pid == self && !x->data) || x->pid == s->pid) continue;
    graphd_session_record rec;
    bool timed = graphd_daemon_status_session(s, i, &rec, sizeof rec) == GRAPHD_OK &&
                 rec.size > offsetof(graphd_session_record, idle_ms);
    size_t k = 0;
    while (k < n && r[k].pid != x->pid) k++;
    if (k == n) {
      r[n].pid = x->pid;
      r[n].uid = x->uid;
      r[n].name = x->client_name;
      r[n].idle_ms = UINT64_MAX;
      n++;
    } else if (x->data && !r[k].data_sessions) {
      r[k].name = x->client_name; /* a data session's name says more */
    }
    if (timed) {
      r[k].timed = true;
      if (rec.age_ms > r[k].age_ms) r[k].age_ms = rec.age_ms;
      if (rec.idle_ms < r[k].idle_ms) r[k].idle_ms = rec.idle_ms;
    }
    r[k].sessions++;
    r[k].data_sessions += x->data != 0;
    r[k].regions += x->regions;
    r[k].region_bytes += x->region_bytes;
  }
  *out = r;
  return n;
}

/* A label value in the exposition format: \, " and newline escaped. */
static void label_value(FILE *f, const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"')
      fprintf(f, "\\%c", *v);
    else if (*v == '\n')
      fprintf(f, "\\n");
    else
      fputc(*v, f);
  }
}

static void family(FILE *f, const char *name, const char *type, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void dev_labels(FILE *f, const graphd_device_info *d) {
  fprintf(f, "{device=\"%u\",uuid=\"", d->ordinal);
  label_value(f, d->uuid_str);
  fprintf(f, "\"");
}

/* A summary per device of the workers' record: the time in the replay
 * path over the replays taken, or (gpu) the sampled GPU time over the
 * replays sampled. */
static void work_summary(FILE *f, const graphd_daemon_status *s, const char *name, const char *help,
                         bool gpu) {
  family(f, name, "summary", help);
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_work *w = &s->work[i];
    fprintf(f, "%s_sum", name);
    dev_labels(f, &s->devices[i]);
    fprintf(f, "} %.9f\n", (double)(gpu ? w->gpu_ns : w->replay_ns) / 1e9);
    fprintf(f, "%s_count", name);
    dev_labels(f, &s->devices[i]);
    fprintf(f, "} %llu\n", (unsigned long long)(gpu ? w->gpu_replays : w->replays));
  }
}

/* One gauge per device, from a value of its own. */
static void dev_gauge(FILE *f, const graphd_daemon_status *s, const char *name, const char *help,
                      uint64_t (*value)(const graphd_daemon_status *, uint32_t)) {
  family(f, name, "gauge", help);
  for (uint32_t i = 0; i < s->ndevices; i++) {
    fprintf(f, "%s", name);
    dev_labels(f, &s->devices[i]);
    fprintf(f, "} %llu\n", (unsigned long long)value(s, i));
  }
}

static uint64_t total_memory(const graphd_daemon_status *s, uint32_t i) {
  return s->devices[i].total_memory;
}
static uint64_t free_memory(const graphd_daemon_status *s, uint32_t i) {
  return s->devices[i].free_memory;
}
/* Device i's whole record (zeroed when the status has none). */
static graphd_device_record record(const graphd_daemon_status *s, uint32_t i) {
  graphd_device_record r;
  if (graphd_daemon_status_device(s, i, &r, sizeof r) != GRAPHD_OK) memset(&r, 0, sizeof r);
  return r;
}

static uint64_t budget(const graphd_daemon_status *s, uint32_t i) {
  return record(s, i).staging_budget_bytes;
}

/* The states a device reports (DeviceInfo.state), each a series of
 * graphd_device_state; a device serves in the first two. */
static const char *const states[] = {"ok", "busy", "failed", "starting"};
#define NSTATES (sizeof states / sizeof states[0])

static bool serving(const graphd_device_info *d) {
  return strcmp(d->state, "ok") == 0 || strcmp(d->state, "busy") == 0;
}
static uint64_t device_up(const graphd_daemon_status *s, uint32_t i) {
  return serving(&s->devices[i]);
}

/* Per device: whether it serves, its state as one series per state
 * (value 1 for the one it is in: a state this exporter does not know gets
 * a series of its own), and its name, backend and MPS. */
static void device_health(FILE *f, const graphd_daemon_status *s) {
  family(f, "graphd_device_info", "gauge",
         "1 for each device the daemon serves, with its name and backend (cuda or host).");
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_info *d = &s->devices[i];
    fprintf(f, "graphd_device_info");
    dev_labels(f, d);
    fprintf(f, ",name=\"");
    label_value(f, d->name);
    fprintf(f, "\",backend=\"");
    label_value(f, d->backend);
    fprintf(f, "\"} 1\n");
  }
  dev_gauge(f, s, "graphd_device_up",
            "1 while the device serves (state ok, or busy: its worker in a long job), 0 when it "
            "failed or is starting.",
            device_up);
  family(f, "graphd_device_state", "gauge",
         "1 for the state the device is in (ok, busy, failed or starting), 0 for the others.");
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_info *d = &s->devices[i];
    bool known = false;
    for (size_t k = 0; k < NSTATES; k++) {
      bool in = strcmp(d->state, states[k]) == 0;
      known |= in;
      fprintf(f, "graphd_device_state");
      dev_labels(f, d);
      fprintf(f, ",state=\"%s\"} %d\n", states[k], in);
    }
    if (!known) {
      fprintf(f, "graphd_device_state");
      dev_labels(f, d);
      fprintf(f, ",state=\"");
      label_value(f, d->state);
      fprintf(f, "\"} 1\n");
    }
  }
  family(f, "graphd_device_mps_enabled", "gauge",
         "1 when MPS serves the device's clients, 0 when not (on a GPU each cross-process "
         "hand-off then costs about 300 us); labelled with the backend.");
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_info *d = &s->devices[i];
    fprintf(f, "graphd_device_mps_enabled");
    dev_labels(f, d);
    fprintf(f, ",backend=\"");
    label_value(f, d->backend);
    fprintf(f, "\"} %d\n", d->mps_enabled != 0);
  }
  dev_gauge(f, s, "graphd_device_memory_total_bytes", "The device's memory.", total_memory);
  dev_gauge(f, s, "graphd_device_memory_free_bytes",
            "The device's free memory, as its worker last found it "
            "(graphd_device_figures_age_seconds says when).",
            free_memory);
  dev_gauge(f, s, "graphd_staging_budget_bytes",
            "The staging bytes captures may hold on the device (--device-budget); 0: no limit.",
            budget);
}

/* Every device counter of the list (graphd_device_metric) with a family
 * of its own: its kind, its help, a sample per device, nanoseconds
 * written as seconds. A counter added to the list comes out here with no
 * change to this file. */
static void own_families(FILE *f, const graphd_daemon_status *s) {
  const graphd_metric_info *m;
  for (uint32_t k = 0; (m = graphd_device_metric(k)); k++) {
    if (!m->prometheus_own) continue;
    bool ns = strcmp(m->unit, "ns") == 0;
    family(f, m->prometheus, m->kind, m->help);
    for (uint32_t i = 0; i < s->ndevices; i++) {
      graphd_device_record r = record(s, i);
      uint64_t v = graphd_device_record_value(&r, m);
      fprintf(f, "%s", m->prometheus);
      dev_labels(f, &s->devices[i]);
      if (ns)
        fprintf(f, "} %.9f\n", (double)v / 1e9);
      else
        fprintf(f, "} %llu\n", (unsigned long long)v);
    }
  }
}

/* The replay latency per device as a histogram, with the daemon's bounds. */
static void latency_histogram(FILE *f, const graphd_daemon_status *s) {
  family(f, "graphd_replay_latency_seconds", "histogram",
         "Replay latency in the daemon, request read to reply ready (successful replays since "
         "start).");
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_info *d = &s->devices[i];
    graphd_device_record r = record(s, i);
    const graphd_latency_histogram *h = &r.replay_latency;
    for (uint32_t k = 0; k < h->nbounds; k++) {
      fprintf(f, "graphd_replay_latency_seconds_bucket");
      dev_labels(f, d);
      fprintf(f, ",le=\"%.9g\"} %llu\n", (double)h->le_ns[k] / 1e9,
              (unsigned long long)h->le_count[k]);
    }
    fprintf(f, "graphd_replay_latency_seconds_bucket");
    dev_labels(f, d);
    fprintf(f, ",le=\"+Inf\"} %llu\n", (unsigned long long)h->count);
    fprintf(f, "graphd_replay_latency_seconds_sum");
    dev_labels(f, d);
    fprintf(f, "} %.9f\n", (double)h->sum_ns / 1e9);
    fprintf(f, "graphd_replay_latency_seconds_count");
    dev_labels(f, d);
    fprintf(f, "} %llu\n", (unsigned long long)h->count);
  }
}

/* The request counters, a series per kind of request the daemon knows
 * (none from a daemon that does not report them). */
static void request_families(FILE *f, const graphd_daemon_status *s) {
  static const struct {
    const char *name, *help;
  } fams[] = {
      {"graphd_requests_total",
       "Requests of each kind the daemon read, those it refused among them."},
      {"graphd_request_errors_total",
       "Requests of each kind answered with a status other than OK (refused by the request table, "
       "the handler or the device's worker)."},
      {"graphd_request_seconds_total",
       "The daemon's loop thread's time in the handler of each kind of request (what the "
       "handler hands to a worker or the thread pool not counted)."},
  };
  graphd_request_record *a = NULL;
  size_t n = 0;
  if (graphd_daemon_status_requests(s, sizeof *a, &a, &n) != GRAPHD_OK) n = 0;
  for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++) {
    family(f, fams[k].name, "counter", fams[k].help);
    for (size_t i = 0; i < n; i++) {
      fprintf(f, "%s{request=\"", fams[k].name);
      label_value(f, a[i].request);
      if (k == 2)
        fprintf(f, "\"} %.9f\n", (double)a[i].handler_ns / 1e9);
      else
        fprintf(f, "\"} %llu\n", (unsigned long long)(k == 0 ? a[i].calls : a[i].errors));
    }
  }
  graphd_request_records_free(a);
}

/* A client row's series name and labels. */
static void client_labels(FILE *f, const char *name, const gd_client_row *c) {
  fprintf(f, "%s{pid=\"%u\",uid=\"%u\",name=\"", name, c->pid, c->uid);
  label_value(f, c->name);
  fprintf(f, "\"}");
}

void gd_prom_write(FILE *f, const graphd_daemon_status *s, const gd_client_row *cl, size_t ncl) {
  family(f, "graphd_build_info", "gauge", "1, labelled with the daemon's version.");
  fprintf(f, "graphd_build_info{version=\"");
  label_value(f, s->version);
  fprintf(f, "\"} 1\n");
  family(f, "graphd_uptime_seconds", "gauge", "Seconds since the daemon started.");
  fprintf(f, "graphd_uptime_seconds %.3f\n", (double)s->uptime_ms / 1e3);
  family(f, "graphd_modules", "gauge", "Registered modules.");
  fprintf(f, "graphd_modules %llu\n", (unsigned long long)s->modules);
  family(f, "graphd_programs", "gauge", "Registered programs.");
  fprintf(f, "graphd_programs %llu\n", (unsigned long long)s->programs);
  device_health(f, s);
  own_families(f, s);
  latency_histogram(f, s);
  family(f, "graphd_replay_latency_quantile_seconds", "summary",
         "Replay latency in the daemon, request read to reply ready, at a quantile "
         "(successful replays since start; within 12.5%; 1 is the largest).");
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
      fprintf(f, "graphd_replay_latency_quantile_seconds");
      dev_labels(f, &s->devices[i]);
      fprintf(f, ",quantile=\"%s\"} %.9f\n", qs[k].q, (double)qs[k].v / 1e9);
    }
  }
  work_summary(f, s, "graphd_replay_worker_seconds",
               "The device worker's time per replay: checks, binding resolution, the capture on "
               "first use and queueing (on a host device the run too), over the replays it took.",
               false);
  family(f, "graphd_device_figures_age_seconds", "gauge",
         "How old the device's free memory and sampled GPU time are: 0 when its worker answered "
         "this scrape, else the time since it last did (a worker in a long job does not answer).");
  for (uint32_t i = 0; i < s->ndevices; i++) {
    fprintf(f, "graphd_device_figures_age_seconds");
    dev_labels(f, &s->devices[i]);
    fprintf(f, "} %.3f\n", s->figures_age_ms ? (double)s->figures_age_ms[i] / 1e3 : 0.0);
  }
  work_summary(f, s, "graphd_replay_gpu_seconds",
               "The device's time running a replay (its copies and launch on the worker's stream), "
               "over the replays sampled: one in 16 per device, or one a millisecond when fewer "
               "come.",
               true);
  request_families(f, s);
  static const char *const cnames[] = {"graphd_client_sessions", "graphd_client_regions",
                                       "graphd_client_region_bytes"};
  static const char *const chelp[] = {"Sessions the client process has open.",
                                      "Memory regions the client process registered.",
                                      "Bytes of the client process's regions."};
  for (int m = 0; m < 3; m++) {
    family(f, cnames[m], "gauge", chelp[m]);
    for (size_t i = 0; i < ncl; i++) {
      uint64_t v = m == 0 ? cl[i].sessions : m == 1 ? cl[i].regions : cl[i].region_bytes;
      client_labels(f, cnames[m], &cl[i]);
      fprintf(f, " %llu\n", (unsigned long long)v);
    }
  }
  static const char *const tnames[] = {"graphd_client_idle_seconds", "graphd_client_age_seconds"};
  static const char *const thelp[] = {
      "Seconds since the client process's most recent request or ring entry, over its sessions "
      "(within about a second for ring entries).",
      "Seconds since the client process's oldest open session connected."};
  for (int m = 0; m < 2; m++) {
    family(f, tnames[m], "gauge", thelp[m]);
    for (size_t i = 0; i < ncl; i++) {
      if (!cl[i].timed) continue;
      client_labels(f, tnames[m], &cl[i]);
      fprintf(f, " %.3f\n", (double)(m == 0 ? cl[i].idle_ms : cl[i].age_ms) / 1e3);
    }
  }
}
