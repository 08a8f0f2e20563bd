/* See control.h. Loop thread, except dev_run (workers). */
#include "control.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/device/capture.h"
#include "daemon/sessions/data_session.h"
#include "daemon/device/evict.h"
#include "device_info.h"
#include "graphd/status.h"
#include "graphd/hex.h"
#include "common/log.h"
#include "version.h"

/* --- the fan-out ------------------------------------------------------------ */

enum ask { ASK_STATUS = GD_CONTROL_STATUS, ASK_LIST = GD_CONTROL_LIST, ASK_EVICT };

/* How long Status, List and Evict wait for the devices' workers before
 * they answer without the busy ones: a worker in a long job (a replay
 * waiting for a client's ready flag, say) must not stall health checks or
 * an operator. A busy device's job still runs when its worker is free. */
#define CONTROL_WAIT_MS 500

/* Evicts whose jobs are out at once: per uid (admins aside), and in all.
 * Status and List need no bound of their own: each device runs one job of
 * each at a time, whoever asks, and a request waiting on one holds no
 * session once its client hangs up. */
#define EVICTS_PER_UID 4
#define EVICTS_MAX 64

/* One request spread over the devices; the reply goes out when the last
 * device has answered, or when the wait is over. Status and List wait on
 * the device's one shared job of their kind (waits); an Evict sends its
 * own job to each device. */
typedef struct fanout {
  gd_daemon *d;
  gd_session *s; /* until the reply, or until its client hangs up */
  uint64_t request_id;
  enum ask ask;
  uid_t uid;
  bool admin;
  gd_evict_sel sel;
  int pending;      /* devices yet to answer */
  int refs;         /* jobs out, waits linked, the timer while open, and fan_out itself */
  int jobs;         /* Evict: its jobs still out */
  bool replied;     /* replied, or its client hung up first */
  bool waited;      /* its wait ran out before every device answered */
  bool *answered;   /* per device */
  uv_timer_t timer; /* the bound on the wait */
  bool timer_open;
  int status; /* the first failure (List, Evict) */
  char msg[512];
  uint64_t *free_mem;     /* Status: per device, 0 when unknown */
  gd_control_wait *waits; /* Status, List: per device, linked while it waits */
  gd_capture_info *ci;    /* List, Evict: every device's captures */
  size_t n, cap;
  uint64_t bytes;
  struct fanout *prev, *next; /* in d->evicts while its jobs are out */
} fanout;

/* A device's answer: one job shared by every Status (or List) that came
 * before it started, or one Evict's own. */
typedef struct control_job {
  gd_job job;
  gd_daemon *d;
  int dev;
  enum ask ask;
  fanout *f;                /* Evict only */
  _Atomic bool started;     /* set by the worker: requests that come now need a later job */
  bool sealed;              /* an Evict went to the worker after it: it takes no more requests */
  uint64_t sent_ns;         /* shared: when it went to the worker */
  gd_control_wait *waits;   /* shared: the requests its answer goes to */
  struct control_job *next; /* shared: in the device's jobs, oldest first */
  gd_capture_info *ci;
  size_t n;
  uint64_t bytes;
  uint64_t free_b;
  uint64_t instances, graphs; /* Status: the device's, over its captures */
  uint64_t gpu_ns, gpu_n;     /* sampled GPU time read for Status (capture_take_gpu_time) */
} control_job;

static void dev_run(gd_job *j, void *ctx) {
  control_job *dj = gd_container_of(j, control_job, job);
  gd_device *d = ctx;
  atomic_store(&dj->started, true);
  switch (dj->ask) {
    case ASK_STATUS: {
      uint64_t total;
      j->status = d->be->ops->mem_info(d->be, d->dev, &dj->free_b, &total, j->msg, sizeof j->msg);
      /* The replays' GPU time read up to now, so that a Status after a
       * stream's work has finished counts its last samples. */
      capture_poll_gpu_time(d);
      capture_take_gpu_time(d, &dj->gpu_ns, &dj->gpu_n);
      capture_count(d, &dj->instances, &dj->graphs);
      break;
    }
    case ASK_LIST: j->status = evict_list(d, &dj->ci, &dj->n); break;
    case ASK_EVICT:
      j->status = evict_select(d, &dj->f->sel, &dj->ci, &dj->n, &dj->bytes, j->msg, sizeof j->msg);
      break;
  }
}

/* The request counters, a row per kind of request (rq and rp hold
 * d->nrequest_kinds entries). */
static void fill_requests(const gd_daemon *d, Graphd__Wire__RequestCounters *rq,
                          Graphd__Wire__RequestCounters **rp) {
  for (uint32_t i = 0; i < d->nrequest_kinds; i++) {
    const gd_request_counters *c = &d->requests[i];
    graphd__wire__request_counters__init(&rq[i]);
    rq[i].request = (char *)c->name;
    rq[i].calls = c->calls;
    rq[i].errors = c->errors;
    rq[i].handler_ns = c->handler_ns;
    rp[i] = &rq[i];
  }
}

/* Milliseconds from t to now (0 when t is not before now). */
static uint64_t ms_since(uint64_t t, uint64_t now) { return now > t ? (now - t) / 1000000u : 0; }

/* One session of the status as the loop knows it now; w points into x. */
static void fill_session(Graphd__Wire__SessionInfo *w, gd_session *x, uint64_t now) {
  graphd__wire__session_info__init(w);
  w->id = x->id;
  w->pid = (uint32_t)x->pid;
  w->uid = (uint32_t)x->uid;
  w->gid = (uint32_t)x->gid;
  w->kind = x->kind == GD_SESSION_DATA      ? GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_DATA
            : x->kind == GD_SESSION_CONTROL ? GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_CONTROL
                                            : GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_UNSPECIFIED;
  w->device = x->device;
  w->client_name = x->client_name;
  w->age_ms = ms_since(x->opened_ns, now);
  w->idle_ms = ms_since(x->active_ns, now);
  w->admin = x->admin;
  w->busy = x->busy;
  const gd_data_session *dx = data_session_of(x);
  w->regions = dx ? dx->regions.n : 0;
  w->region_bytes = dx ? dx->regions.bytes : 0;
  w->has_ring = dx && dx->has_ring;
  w->flag_slots = dx ? dx->flag_slots : 0;
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
  size_t nr = d->nrequest_kinds;
  Graphd__Wire__RequestCounters *rq = calloc(nr + 1, sizeof *rq);
  Graphd__Wire__RequestCounters **rp = calloc(nr + 1, sizeof *rp);
  if (!di || !dc || !dp || !si || !sp || !rq || !rp) {
    session_reply_error(s, g->request_id, GRAPHD_RESOURCE_EXHAUSTED,
                        "out of memory building the status reply");
    goto exit;
  }
  uint64_t now = gd_now_ns();
  for (int i = 0; i < n; i++) {
    /* A device that did not answer this request gives the figures of its
     * last Status job, with their age; one whose job has been out past the
     * wait is in a long job. */
    const gd_device_counters *c = &d->counters[i];
    device_info_fill(d, i, g->answered[i] ? g->free_mem[i] : c->last_free_memory, &di[i], &dc[i]);
    uint64_t since = c->answered_ns ? c->answered_ns : d->start_ns;
    di[i].figures_age_ms = g->answered[i] ? 0 : (now - since) / 1000000u;
    const control_job *oldest = c->jobs[GD_CONTROL_STATUS];
    if (!g->answered[i] && device_ok(&d->devices[i]) &&
        (g->waited || (oldest && now - oldest->sent_ns >= CONTROL_WAIT_MS * 1000000ull)))
      di[i].state = "busy";
    dp[i] = &di[i];
  }
  r.request_id = g->request_id;
  r.body_case = GRAPHD__WIRE__REPLY__BODY_STATUS;
  r.status = &sr;
  sr.version = (char *)GRAPHD_VERSION_STRING;
  sr.uptime_ms = (now - d->start_ns) / 1000000u;
  sr.pid = (uint32_t)getpid();
  sr.n_devices = (size_t)n;
  sr.devices = dp;
  sr.sessions = d->sessions.n;
  size_t k = 0;
  for (gd_session *x = d->sessions.head; x && k < ns; x = x->next, k++) {
    fill_session(&si[k], x, now);
    sp[k] = &si[k];
  }
  sr.n_session_list = k;
  sr.session_list = sp;
  sr.modules = d->reg.nmodules;
  sr.module_bytes = d->reg.module_bytes;
  sr.programs = d->reg.nprograms;
  fill_requests(d, rq, rp);
  sr.n_requests = nr;
  sr.requests = rp;
  session_reply(s, &r);
exit:
  free(rq);
  free(rp);
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
  w->instances = c->instances;
  w->queue_ns = c->queue_ns;
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

/* Replies (once): when the last device answered, or when the wait is
 * over. From here f holds no session. */
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
  s->control = NULL;
  f->s = NULL;
  session_end_request(s);
}

/* Drops one reference; the last frees f. */
static void release(fanout *f) {
  if (--f->refs > 0) return;
  free(f->free_mem);
  free(f->waits);
  free(f->answered);
  free(f->ci);
  free(f);
}

static void wait_link(control_job *j, fanout *f, gd_control_wait *w) {
  w->request = f;
  w->job = j;
  w->prev = NULL;
  w->next = j->waits;
  if (w->next) w->next->prev = w;
  j->waits = w;
}

static void wait_unlink(gd_control_wait *w) {
  if (w->prev)
    w->prev->next = w->next;
  else
    w->job->waits = w->next;
  if (w->next) w->next->prev = w->prev;
  w->prev = w->next = NULL;
  w->request = NULL;
  w->job = NULL;
}

static void close_timer(fanout *f);

/* Device i answered f (or will not in time). */
static void device_answered(fanout *f) {
  if (--f->pending == 0) {
    reply_once(f);
    close_timer(f);
  }
}

/* f stops waiting on device i's shared job (answered from it, or not). */
static void wait_end(fanout *f, int i) {
  wait_unlink(&f->waits[i]);
  device_answered(f);
  release(f);
}

/* The reply is out, or its client gone: f leaves every shared job's list
 * at once, so that a wedged worker holds no request past the wait. */
static void drop_waits(fanout *f) {
  if (!f->waits) return;
  for (int i = 0; i < f->d->ndevices; i++)
    if (f->waits[i].request) wait_end(f, i);
}

static void timer_closed_cb(uv_handle_t *h) { release(h->data); }

static void close_timer(fanout *f) {
  if (!f->timer_open) return;
  f->timer_open = false;
  uv_close((uv_handle_t *)&f->timer, timer_closed_cb);
}

static void wait_over_cb(uv_timer_t *t) {
  fanout *f = t->data;
  f->waited = true;
  reply_once(f);
  drop_waits(f);
  close_timer(f);
}

void control_session_closed(gd_session *s) {
  fanout *f = s->control;
  if (!f) return;
  /* Nothing to answer: the request ends now and lets the session go. Its
   * Evict jobs still run (what was asked is done), their results dropped. */
  f->replied = true;
  f->s = NULL;
  s->control = NULL;
  session_end_request(s);
  f->refs++;
  drop_waits(f);
  close_timer(f);
  release(f);
}

/* Adds a device's captures to f's reply. */
static void take_captures(fanout *f, const gd_capture_info *ci, size_t n, uint64_t bytes) {
  if (!n || f->replied) return;
  if (f->n + n > f->cap) {
    size_t cap = f->n + n + 16;
    gd_capture_info *m = realloc(f->ci, cap * sizeof *m);
    if (m) {
      f->ci = m;
      f->cap = cap;
    }
  }
  if (f->n + n <= f->cap) {
    memcpy(f->ci + f->n, ci, n * sizeof *ci);
    f->n += n;
  }
  f->bytes += bytes;
}

static void fail(fanout *f, int status, const char *msg) {
  if (f->status == 0) {
    f->status = status;
    snprintf(f->msg, sizeof f->msg, "%s", msg);
  }
}

/* A shared job is back: its answer goes to every request waiting on it. */
static void shared_done(control_job *dj, int status, const char *msg) {
  gd_device_counters *c = &dj->d->counters[dj->dev];
  control_job **p = &c->jobs[dj->ask];
  while (*p != dj) p = &(*p)->next;
  *p = dj->next;
  if (dj->ask == ASK_STATUS) {
    if (status == 0) c->last_free_memory = dj->free_b;
    c->last_instances = dj->instances;
    c->last_graphs = dj->graphs;
    c->answered_ns = gd_now_ns();
    c->gpu_replay_ns += dj->gpu_ns;
    c->gpu_replays += dj->gpu_n;
  }
  while (dj->waits) {
    fanout *w = dj->waits->request;
    w->answered[dj->dev] = true;
    if (dj->ask == ASK_STATUS && status == 0) w->free_mem[dj->dev] = dj->free_b;
    if (dj->ask == ASK_LIST) {
      if (status < 0)
        fail(w, status, msg);
      else
        take_captures(w, dj->ci, dj->n, 0);
    }
    wait_end(w, dj->dev);
  }
}

static void evict_done(control_job *dj, int status, const char *msg) {
  fanout *g = dj->f;
  gd_daemon *d = dj->d;
  if (status < 0) fail(g, status, msg);
  if (!g->sel.dry_run && status == 0) {
    gd_counters_evicted(&d->counters[dj->dev], dj->n, dj->bytes);
    if (dj->n)
      GD_LOG(GD_INFO, "control", "device %d: %zu capture(s), %llu staging bytes freed for uid %u",
             dj->dev, dj->n, (unsigned long long)dj->bytes, (unsigned)g->uid);
  }
  if (!g->replied) g->answered[dj->dev] = true;
  take_captures(g, dj->ci, dj->n, dj->bytes);
  if (--g->jobs == 0) {
    if (g->prev)
      g->prev->next = g->next;
    else
      d->evicts = g->next;
    if (g->next) g->next->prev = g->prev;
    d->nevicts--;
  }
  if (!g->replied) device_answered(g);
  release(g);
}

static void dev_done(gd_job *j) {
  control_job *dj = gd_container_of(j, control_job, job);
  if (dj->ask == ASK_EVICT)
    evict_done(dj, j->status, j->msg);
  else
    shared_done(dj, j->status, j->msg);
  free(dj->ci);
  free(dj);
}

/* Sends device i a job for f: its own (Evict), or the device's shared job
 * of f's kind, unless one is out already. Returns false when out of
 * memory. */
static bool ask_device(fanout *f, int i) {
  gd_daemon *d = f->d;
  gd_device_counters *c = &d->counters[i];
  bool shared = f->ask != ASK_EVICT;
  control_job *last = NULL;
  for (control_job *x = shared ? c->jobs[f->ask] : NULL; x; x = x->next) last = x;
  control_job *dj = NULL;
  if (last && !last->sealed && !atomic_load(&last->started)) {
    /* Not started, and nothing went to the worker after it that a request
     * sent now could have seen done (the worker runs its jobs in order;
     * only an Evict can be answered before it ran): its answer is fresh. */
    dj = last;
  } else {
    if (!(dj = calloc(1, sizeof *dj))) return false;
    dj->d = d;
    dj->dev = i;
    dj->ask = f->ask;
    dj->job.run = dev_run;
    dj->job.done = dev_done;
    if (shared) {
      dj->sent_ns = gd_now_ns();
      if (last)
        last->next = dj;
      else
        c->jobs[f->ask] = dj;
    } else {
      /* A list or status asked after this Evict must not take the answer of
       * a job queued before it. */
      for (int k = 0; k < GD_CONTROL_SHARED; k++)
        for (control_job *x = c->jobs[k]; x; x = x->next) x->sealed = true;
      dj->f = f;
      f->refs++;
      if (f->jobs++ == 0) {
        f->next = d->evicts;
        if (f->next) f->next->prev = f;
        d->evicts = f;
        d->nevicts++;
      }
    }
  }
  if (shared) {
    wait_link(dj, f, &f->waits[i]);
    f->refs++;
  }
  if (dj != last) worker_submit(daemon_worker(d, i), &dj->job);
  return true;
}

/* Asks each device in [first, last]; f is the session's request in flight
 * until it is answered. no_wait: answer at once from the devices' last
 * figures (Status). */
static void fan_out(fanout *f, int first, int last, bool no_wait) {
  gd_session *s = f->s;
  gd_daemon *d = f->d;
  f->pending = last - first + 1;
  f->refs = 1; /* fan_out's own, so that f outlives the loop below */
  for (int i = 0; i < d->ndevices; i++) f->answered[i] = i < first || i > last;
  session_begin_request(s);
  s->control = f;
  if (!no_wait && uv_timer_init(d->loop, &f->timer) == 0) {
    f->refs++;
    f->timer_open = true;
    f->timer.data = f;
    uv_timer_start(&f->timer, wait_over_cb, CONTROL_WAIT_MS, 0);
  }
  for (int i = first; i <= last && !f->replied; i++) {
    if (ask_device(f, i)) continue;
    /* Answered here, as failed. */
    f->answered[i] = true;
    if (f->ask != ASK_STATUS) fail(f, -GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    device_answered(f);
  }
  if (no_wait) {
    reply_once(f);
    drop_waits(f);
  }
  release(f);
}

static fanout *fanout_new(gd_session *s, uint64_t request_id, enum ask ask) {
  gd_daemon *d = daemon_of(s);
  size_t n = (size_t)d->ndevices + 1;
  fanout *f = calloc(1, sizeof *f);
  if (f) {
    f->d = d;
    f->s = s;
    f->request_id = request_id;
    f->ask = ask;
    f->uid = s->uid;
    f->admin = s->admin;
    f->answered = calloc(n, sizeof *f->answered);
    if (ask == ASK_STATUS) f->free_mem = calloc(n, sizeof *f->free_mem);
    if (ask != ASK_EVICT) f->waits = calloc(n, sizeof *f->waits);
    if (!f->answered || (ask == ASK_STATUS && !f->free_mem) || (ask != ASK_EVICT && !f->waits)) {
      f->refs = 1;
      release(f);
      f = NULL;
    }
  }
  if (!f) session_reply_error(s, request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
  return f;
}

void control_handle_status(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  (void)fds;
  fanout *f = fanout_new(s, req->request_id, ASK_STATUS);
  if (!f) return;
  /* No wait asked for (the exporter's scrapes): the last figures at once,
   * once every device has given some. */
  bool no_wait = req->status && req->status->no_wait;
  for (int i = 0; i < f->d->ndevices; i++) no_wait = no_wait && f->d->counters[i].answered_ns;
  fan_out(f, 0, f->d->ndevices - 1, no_wait);
}

void control_handle_list(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  (void)fds;
  fanout *f = fanout_new(s, req->request_id, ASK_LIST);
  if (f) fan_out(f, 0, f->d->ndevices - 1, false);
}

/* Evicts of uid u with jobs out. */
static uint32_t evicts_of(const gd_daemon *d, uid_t u) {
  uint32_t n = 0;
  for (const fanout *f = d->evicts; f; f = f->next) n += f->uid == u && !f->admin;
  return n;
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
  if (!why && !s->admin && d->nevicts >= EVICTS_MAX) {
    why = "too many evictions wait on busy devices; try again once they are done";
    code = GRAPHD_RESOURCE_EXHAUSTED;
  }
  if (!why && !s->admin && evicts_of(d, s->uid) >= EVICTS_PER_UID) {
    why =
        "this uid has the most evictions that may wait on busy devices at once ("
        "4); try again once they are done";
    code = GRAPHD_RESOURCE_EXHAUSTED;
  }
  if (why) {
    g->refs = 1;
    release(g);
    session_reply_error(s, request_id, code, "%s", why);
    return;
  }
  int first = one_device ? m->device : 0;
  int last = one_device ? m->device : d->ndevices - 1;
  fan_out(g, first, last, false);
}
