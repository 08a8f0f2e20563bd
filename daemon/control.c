/* See control.h. Loop thread, except dev_run (workers). */
#include "control.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capture.h"
#include "dsession.h"
#include "evict.h"
#include "graphd/status.h"
#include "graphd/hex.h"
#include "common/log.h"
#include "version.h"

static const char *state_name(int st) {
  return st == GD_DEVICE_OK ? "ok" : st == GD_DEVICE_FAILED ? "failed" : "starting";
}

void control_fill_device(gd_daemon *d, int i, uint64_t free_mem, Graphd__Wire__DeviceInfo *di,
                         Graphd__Wire__DeviceCounters *dc) {
  const gd_device_facts *f = d->facts[i];
  const gd_device_counters *c = &d->counters[i];
  gd_device *dev = &d->devices[i];
  graphd__wire__device_info__init(di);
  graphd__wire__device_counters__init(dc);
  di->ordinal = (uint32_t)i;
  di->name = (char *)f->name;
  di->uuid.data = (uint8_t *)f->uuid;
  di->uuid.len = 16;
  di->total_memory = f->total_memory;
  di->free_memory = free_mem;
  di->backend = (char *)d->be->name;
  di->epoch = atomic_load(&dev->epoch);
  di->mps_enabled = f->mps_enabled != 0;
  di->state = (char *)state_name(atomic_load(&dev->state));
  dc->sessions = c->sessions;
  dc->regions = c->regions;
  dc->region_bytes = c->region_bytes;
  dc->captures = c->captures;
  dc->replays = c->replays;
  dc->errors = c->errors;
  dc->recaptures = c->recaptures;
  dc->inflight = c->inflight;
  dc->captures_built = c->captures_built;
  dc->staging_bytes = c->staging_bytes;
  dc->evictions = c->evictions;
  dc->replay_p50_ns = gd_hist_quantile(&c->replay_latency, 0.50);
  dc->replay_p90_ns = gd_hist_quantile(&c->replay_latency, 0.90);
  dc->replay_p99_ns = gd_hist_quantile(&c->replay_latency, 0.99);
  dc->replay_max_ns = c->replay_latency.max;
  dc->worker_replay_ns = c->worker_replay_ns;
  dc->worker_replays = c->worker_replays;
  dc->worker_launch_ns = c->worker_launch_ns;
  dc->gpu_replay_ns = c->gpu_replay_ns;
  dc->gpu_replays = c->gpu_replays;
  di->counters = dc;
}

/* --- the fan-out ------------------------------------------------------------ */

enum ask { ASK_STATUS, ASK_LIST, ASK_EVICT };

/* How long Status, List and Evict wait for the devices' workers before
 * they answer without the busy ones: a worker in a long job (a replay
 * waiting for a client's ready flag, say) must not stall health checks or
 * an operator. A busy device's job still runs when its worker is free. */
#define CONTROL_WAIT_MS 500

/* One request spread over the devices; the reply goes out when the last
 * device has answered, or when the wait is over. */

typedef struct fanout {
  gd_session *s;
  uint64_t request_id;
  enum ask ask;
  gd_evict_sel sel;
  int pending;
  int refs; /* jobs out, plus the timer while it is open */
  bool replied;
  bool *answered;   /* per device */
  uv_timer_t timer; /* the bound on the wait */
  bool timer_open;
  int status; /* the first failure (List, Evict) */
  char msg[512];
  uint64_t *free_mem;    /* Status: per device, 0 when unknown */
  gd_status_wait *waits; /* Status: per device, linked while it waits on a job already out */
  gd_capture_info *ci;   /* List, Evict: every device's captures */
  size_t n, cap;
  uint64_t bytes;
} fanout;

typedef struct dev_job {
  gd_job job;
  fanout *f;
  int dev;
  gd_capture_info *ci;
  size_t n;
  uint64_t bytes;
  uint64_t free_b;
  uint64_t gpu_ns, gpu_n; /* sampled GPU time read for Status (capture_take_gpu_time) */
} dev_job;

static void dev_run(gd_job *j, void *ctx) {
  dev_job *dj = gd_container_of(j, dev_job, job);
  gd_device *d = ctx;
  switch (dj->f->ask) {
    case ASK_STATUS: {
      uint64_t total;
      j->status = d->be->ops->mem_info(d->be, d->dev, &dj->free_b, &total, j->msg, sizeof j->msg);
      /* The replays' GPU time read up to now, so that a Status after a
       * stream's work has finished counts its last samples. */
      capture_poll_gpu_time(d);
      capture_take_gpu_time(d, &dj->gpu_ns, &dj->gpu_n);
      break;
    }
    case ASK_LIST: j->status = evict_list(d, &dj->ci, &dj->n); break;
    case ASK_EVICT:
      j->status = evict_select(d, &dj->f->sel, &dj->ci, &dj->n, &dj->bytes, j->msg, sizeof j->msg);
      break;
  }
}

static void reply_status(fanout *g) {
  gd_session *s = g->s;
  gd_daemon *d = daemon_of(s);
  int n = d->ndevices;
  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__StatusReply sr = GRAPHD__WIRE__STATUS_REPLY__INIT;
  Graphd__Wire__DeviceInfo *di = calloc((size_t)n, sizeof *di);
  Graphd__Wire__DeviceCounters *dc = calloc((size_t)n, sizeof *dc);
  Graphd__Wire__DeviceInfo **dp = calloc((size_t)n, sizeof *dp);
  size_t ns = (size_t)d->sessions.n;
  Graphd__Wire__SessionInfo *si = calloc(ns + 1, sizeof *si);
  Graphd__Wire__SessionInfo **sp = calloc(ns + 1, sizeof *sp);
  if (!di || !dc || !dp || !si || !sp) {
    session_reply_error(s, g->request_id, GRAPHD_RESOURCE_EXHAUSTED,
                        "out of memory building the status reply");
    goto exit;
  }
  for (int i = 0; i < n; i++) {
    /* Its worker did not answer in time: it is in a long job (its free
     * memory is the last figure it gave). */
    control_fill_device(d, i, g->answered[i] ? g->free_mem[i] : d->counters[i].last_free_memory,
                        &di[i], &dc[i]);
    if (!g->answered[i] && device_ok(&d->devices[i])) di[i].state = "busy";
    dp[i] = &di[i];
  }
  r.request_id = g->request_id;
  r.body_case = GRAPHD__WIRE__REPLY__BODY_STATUS;
  r.status = &sr;
  sr.version = (char *)GRAPHD_VERSION_STRING;
  sr.uptime_ms = (gd_now_ns() - d->start_ns) / 1000000u;
  sr.pid = (uint32_t)getpid();
  sr.n_devices = (size_t)n;
  sr.devices = dp;
  sr.sessions = d->sessions.n;
  size_t k = 0;
  for (gd_session *x = d->sessions.head; x && k < ns; x = x->next, k++) {
    graphd__wire__session_info__init(&si[k]);
    si[k].id = x->id;
    si[k].pid = (uint32_t)x->pid;
    si[k].uid = (uint32_t)x->uid;
    si[k].kind = x->kind == GD_SESSION_DATA ? GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_DATA
                 : x->kind == GD_SESSION_CONTROL
                     ? GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_CONTROL
                     : GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_UNSPECIFIED;
    si[k].device = x->device;
    si[k].client_name = x->client_name;
    const gd_dsession *dx = dsession_of(x);
    si[k].regions = dx ? dx->regions.n : 0;
    si[k].region_bytes = dx ? dx->regions.bytes : 0;
    sp[k] = &si[k];
  }
  sr.n_session_list = k;
  sr.session_list = sp;
  sr.modules = d->reg.nmodules;
  sr.module_bytes = d->reg.module_bytes;
  sr.programs = d->reg.nprograms;
  session_reply(s, &r);
exit:
  free(si);
  free(sp);
  free(di);
  free(dc);
  free(dp);
}

static void fill_info(Graphd__Wire__CaptureInfo *w, const gd_capture_info *c) {
  graphd__wire__capture_info__init(w);
  w->program_id.data = (uint8_t *)c->program_id;
  w->program_id.len = GD_ID_LEN;
  w->device = c->device;
  w->mode = c->mode;
  w->staging_bytes = c->staging_bytes;
  w->nodes = c->nodes;
  w->replays = c->replays;
  w->idle_ms = c->idle_ms;
  w->generation = c->generation;
  w->created_unix_ms = c->created_unix_ms;
  w->repoints = c->repoints;
  w->graphs = c->graphs;
  w->n_pids = c->npids;
  w->pids = (uint32_t *)c->pids;
  w->busy = c->busy;
}

static void reply_captures(fanout *g) {
  gd_session *s = g->s;
  if (g->status < 0) {
    session_reply_error(s, g->request_id, g->status, "%s", g->msg);
    return;
  }
  int ndev = daemon_of(s)->ndevices;
  Graphd__Wire__CaptureInfo *wi = calloc(g->n + 1, sizeof *wi);
  Graphd__Wire__CaptureInfo **wp = calloc(g->n + 1, sizeof *wp);
  uint32_t *busy = calloc((size_t)ndev + 1, sizeof *busy);
  if (!wi || !wp || !busy) {
    free(wi);
    free(wp);
    free(busy);
    session_reply_error(s, g->request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  /* A program id is shown to the users charged for the program (who
   * registered or hold it) and to admins only: ids are content hashes,
   * and another user who learnt one could name the program in requests. */
  gd_daemon *d = daemon_of(s);
  size_t nshown = 0;
  for (size_t i = 0; i < g->n; i++) {
    if (g->ask == ASK_LIST && !s->admin) {
      const gd_regprog *p = registry_find_program(&d->reg, g->ci[i].program_id);
      if (!p || !registry_owns(&p->use, (uint32_t)s->uid)) continue;
    }
    fill_info(&wi[nshown], &g->ci[i]);
    wp[nshown] = &wi[nshown];
    nshown++;
  }
  /* Devices whose worker has not answered: their part is missing. */
  size_t nbusy = 0;
  for (int i = 0; i < ndev; i++)
    if (!g->answered[i]) busy[nbusy++] = (uint32_t)i;
  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__ListCapturesReply lr = GRAPHD__WIRE__LIST_CAPTURES_REPLY__INIT;
  Graphd__Wire__EvictReply er = GRAPHD__WIRE__EVICT_REPLY__INIT;
  r.request_id = g->request_id;
  if (g->ask == ASK_EVICT) {
    r.body_case = GRAPHD__WIRE__REPLY__BODY_EVICT;
    r.evict = &er;
    er.n_evicted = nshown;
    er.evicted = wp;
    er.bytes = g->bytes;
    er.n_busy_devices = nbusy;
    er.busy_devices = busy;
  } else {
    r.body_case = GRAPHD__WIRE__REPLY__BODY_LIST_CAPTURES;
    r.list_captures = &lr;
    lr.n_captures = nshown;
    lr.captures = wp;
    lr.n_busy_devices = nbusy;
    lr.busy_devices = busy;
  }
  session_reply(s, &r);
  free(busy);
  free(wi);
  free(wp);
}

/* Replies (once): when the last device answered, or when Status stops
 * waiting. */
static void reply_once(fanout *f) {
  if (f->replied) return;
  f->replied = true;
  gd_session *s = f->s;
  if (!s->closing) {
    if (f->ask == ASK_STATUS)
      reply_status(f);
    else
      reply_captures(f);
  }
  session_end_request(s);
}

/* Drops one reference; the last frees f (its jobs are all back). */
static void release(fanout *f) {
  if (--f->refs > 0) return;
  session_unref(f->s);
  free(f->free_mem);
  free(f->waits);
  free(f->answered);
  free(f->ci);
  free(f);
}

static void timer_closed_cb(uv_handle_t *h) { release(h->data); }

static void close_timer(fanout *f);

static void finish(fanout *f) {
  reply_once(f);
  close_timer(f);
}

static void wait_link(gd_device_counters *c, gd_status_wait *w) {
  w->prev = NULL;
  w->next = c->status_waits;
  if (w->next) w->next->prev = w;
  c->status_waits = w;
}

static void wait_unlink(gd_device_counters *c, gd_status_wait *w) {
  if (w->prev)
    w->prev->next = w->next;
  else
    c->status_waits = w->next;
  if (w->next) w->next->prev = w->prev;
  w->prev = w->next = NULL;
  w->request = NULL;
}

/* f stops waiting on device i's Status job (answered from it, or not). */
static void wait_end(fanout *f, int i) {
  wait_unlink(&daemon_of(f->s)->counters[i], &f->waits[i]);
  if (--f->pending == 0) finish(f);
  release(f);
}

/* The wait is over, and the reply out with the devices f still waits on
 * as busy. Its request leaves their lists, so that a wedged worker holds
 * no request (nor its session) past the wait. */
static void drop_waits(fanout *f) {
  if (!f->waits) return;
  int n = daemon_of(f->s)->ndevices;
  for (int i = 0; i < n; i++)
    if (f->waits[i].request) wait_end(f, i);
}

static void close_timer(fanout *f) {
  if (!f->timer_open) return;
  f->timer_open = false;
  uv_close((uv_handle_t *)&f->timer, timer_closed_cb);
}

static void wait_over_cb(uv_timer_t *t) {
  fanout *f = t->data;
  reply_once(f);
  drop_waits(f);
  close_timer(f);
}

static void dev_done(gd_job *j) {
  dev_job *dj = gd_container_of(j, dev_job, job);
  fanout *g = dj->f;
  gd_daemon *d = daemon_of(g->s);
  g->answered[dj->dev] = true;
  if (g->ask == ASK_STATUS) {
    gd_device_counters *c = &d->counters[dj->dev];
    c->status_asked = false;
    if (j->status == 0) g->free_mem[dj->dev] = c->last_free_memory = dj->free_b;
    c->gpu_replay_ns += dj->gpu_ns;
    c->gpu_replays += dj->gpu_n;
    /* The requests that came while this job was out get its answer. */
    while (c->status_waits) {
      fanout *w = c->status_waits->request;
      w->answered[dj->dev] = true;
      if (j->status == 0) w->free_mem[dj->dev] = dj->free_b;
      wait_end(w, dj->dev);
    }
  } else if (j->status < 0 && g->status == 0) {
    g->status = j->status;
    snprintf(g->msg, sizeof g->msg, "%s", j->msg);
  }
  if (g->ask == ASK_EVICT && !g->sel.dry_run && j->status == 0) {
    gd_counters_evicted(&d->counters[dj->dev], dj->n, dj->bytes);
    if (dj->n)
      GD_LOG(GD_INFO, "control", "device %d: %zu capture(s), %llu staging bytes freed for pid %d",
             dj->dev, dj->n, (unsigned long long)dj->bytes, (int)g->s->pid);
  }
  if (dj->n && !g->replied) {
    if (g->n + dj->n > g->cap) {
      size_t cap = g->n + dj->n + 16;
      gd_capture_info *n = realloc(g->ci, cap * sizeof *n);
      if (n) {
        g->ci = n;
        g->cap = cap;
      }
    }
    if (g->n + dj->n <= g->cap) {
      memcpy(g->ci + g->n, dj->ci, dj->n * sizeof *dj->ci);
      g->n += dj->n;
    }
    g->bytes += dj->bytes;
  }
  free(dj->ci);
  free(dj);
  if (--g->pending == 0) finish(g);
  release(g);
}

/* Sends one job to each device in [first, last]; f is the session's
 * request in flight until the last answer. */
static void fan_out(fanout *f, int first, int last) {
  gd_session *s = f->s;
  gd_daemon *d = daemon_of(s);
  f->pending = last - first + 1;
  f->refs = f->pending;
  for (int i = 0; i < d->ndevices; i++) f->answered[i] = i < first || i > last;
  session_begin_request(s);
  session_ref(s); /* until the last job is back, which may be after the reply */
  if (uv_timer_init(d->loop, &f->timer) == 0) {
    f->refs++;
    f->timer_open = true;
    f->timer.data = f;
    uv_timer_start(&f->timer, wait_over_cb, CONTROL_WAIT_MS, 0);
  }
  for (int i = first; i <= last; i++) {
    if (f->ask == ASK_STATUS && d->counters[i].status_asked) {
      /* The last Status job has not come back: its worker is busy, in a
       * long job or wedged. Another job would only queue behind it (one
       * per request or scrape, held until the worker is free), so this
       * request waits on that one, up to the end of its own wait. */
      f->waits[i].request = f;
      wait_link(&d->counters[i], &f->waits[i]);
      continue;
    }
    dev_job *dj = calloc(1, sizeof *dj);
    if (!dj) {
      /* Answer for this device here, as failed. */
      f->answered[i] = true;
      if (f->ask != ASK_STATUS) {
        f->status = -GRAPHD_RESOURCE_EXHAUSTED;
        snprintf(f->msg, sizeof f->msg, "out of memory");
      }
      if (--f->pending == 0) finish(f);
      release(f);
      continue;
    }
    dj->f = f;
    dj->dev = i;
    dj->job.run = dev_run;
    dj->job.done = dev_done;
    if (f->ask == ASK_STATUS) d->counters[i].status_asked = true;
    worker_submit(daemon_worker(d, i), &dj->job);
  }
}

static fanout *fanout_new(gd_session *s, uint64_t request_id, enum ask ask) {
  size_t n = (size_t)daemon_of(s)->ndevices + 1;
  fanout *f = calloc(1, sizeof *f);
  if (f && !(f->answered = calloc(n, sizeof *f->answered))) {
    free(f);
    f = NULL;
  }
  if (f) {
    f->s = s;
    f->request_id = request_id;
    f->ask = ask;
  }
  if (!f) session_reply_error(s, request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
  return f;
}

void control_handle_status(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  (void)fds;
  uint64_t request_id = req->request_id;
  gd_daemon *d = daemon_of(s);
  fanout *f = fanout_new(s, request_id, ASK_STATUS);
  if (!f) return;
  f->free_mem = calloc((size_t)d->ndevices + 1, sizeof *f->free_mem);
  f->waits = calloc((size_t)d->ndevices + 1, sizeof *f->waits);
  if (!f->free_mem || !f->waits) {
    free(f->free_mem);
    free(f->waits);
    free(f->answered);
    free(f);
    session_reply_error(s, request_id, GRAPHD_RESOURCE_EXHAUSTED,
                        "out of memory handling a status request");
    return;
  }
  fan_out(f, 0, d->ndevices - 1);
}

void control_handle_list(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  (void)fds;
  uint64_t request_id = req->request_id;
  fanout *f = fanout_new(s, request_id, ASK_LIST);
  if (f) fan_out(f, 0, daemon_of(s)->ndevices - 1);
}

static int parse_prefix(const char *hex, gd_evict_sel *sel) {
  int n = gd_hex_decode_prefix(hex, strlen(hex), sel->prefix, 2 * GD_ID_LEN, NULL, 0);
  if (n < 0) return -1;
  sel->prefix_nibbles = (uint32_t)n;
  return 0;
}

void control_handle_evict(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  (void)fds;
  uint64_t request_id = req->request_id;
  const Graphd__Wire__Evict *m = req->evict;
  gd_daemon *d = daemon_of(s);
  fanout *g = fanout_new(s, request_id, ASK_EVICT);
  if (!g) return;
  g->sel.dry_run = m->dry_run;
  g->sel.idle_ms = m->idle_ms;
  g->sel.client_pid = m->client_pid;
  g->sel.admin = s->admin;
  g->sel.requester_uid = (uint32_t)s->uid;
  const char *why = NULL;
  int code = GRAPHD_INVALID_ARGUMENT;
  if (m->program && *m->program &&
      (strlen(m->program) < 6 || parse_prefix(m->program, &g->sel) < 0))
    why = "Evict.program must be a program id or a hex prefix of at least 6 digits";
  if (!why && m->session) {
    /* A session names its process: captures that process used. */
    gd_session *x = d->sessions.head;
    while (x && x->id != m->session) x = x->next;
    if (!x)
      why = "Evict.session names no open session";
    else if (g->sel.client_pid && g->sel.client_pid != (uint32_t)x->pid)
      why = "Evict.session and Evict.client_pid name different processes";
    else
      g->sel.client_pid = (uint32_t)x->pid;
  }
  bool one_device = m->device_sel_case == GRAPHD__WIRE__EVICT__DEVICE_SEL_DEVICE;
  bool selects =
      g->sel.prefix_nibbles || g->sel.client_pid || g->sel.idle_ms || one_device || m->session;
  if (!why && !selects && !m->all)
    why = "say what to evict: a program, device, client, session or idle time, or all";
  if (!why && one_device && (m->device < 0 || m->device >= d->ndevices)) {
    why = "Evict.device is not a device of this daemon";
    code = GRAPHD_NOT_FOUND;
  }
  if (!why && m->all && !s->admin) {
    why = "evicting all captures needs an admin session (root, graphd's user, or the admin group)";
    code = GRAPHD_PERMISSION_DENIED;
  }
  if (why) {
    free(g->answered);
    free(g);
    session_reply_error(s, request_id, code, "%s", why);
    return;
  }
  int first = one_device ? m->device : 0;
  int last = one_device ? m->device : d->ndevices - 1;
  fan_out(g, first, last);
}
