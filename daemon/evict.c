/* See evict.h. Loop thread, except the job run functions (workers). */
#include "evict.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "graphd/status.h"
#include "log.h"
#include "server.h"

/* One request spread over the devices; the reply goes out when the last
 * device has answered. */
typedef struct gather {
  gd_session *s;
  uint64_t request_id;
  bool evict;
  gd_evict_sel sel;
  int pending;
  int status;          /* the first failure */
  char msg[512];
  gd_capture_info *ci; /* all devices' captures */
  size_t n, cap;
  uint64_t bytes;
} gather;

typedef struct dev_job {
  gd_job job; /* first */
  gather *g;
  gd_capture_info *ci;
  size_t n;
  uint64_t bytes;
} dev_job;

static void dev_run(gd_worker *w, gd_job *j) {
  dev_job *dj = (dev_job *)j;
  if (dj->g->evict)
    j->status = capture_evict(w, &dj->g->sel, &dj->ci, &dj->n, &dj->bytes, j->msg, sizeof j->msg);
  else
    j->status = capture_list(w, &dj->ci, &dj->n);
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
  w->n_pids = c->npids;
  w->pids = (uint32_t *)c->pids;
  w->busy = c->busy;
}

static void finish(gather *g) {
  gd_session *s = g->s;
  if (s->closing) return;
  if (g->status < 0) {
    session_reply_error(s, g->request_id, g->status, "%s", g->msg);
    return;
  }
  Graphd__Wire__CaptureInfo *wi = calloc(g->n + 1, sizeof *wi);
  Graphd__Wire__CaptureInfo **wp = calloc(g->n + 1, sizeof *wp);
  if (!wi || !wp) {
    free(wi);
    free(wp);
    session_reply_error(s, g->request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  for (size_t i = 0; i < g->n; i++) {
    fill_info(&wi[i], &g->ci[i]);
    wp[i] = &wi[i];
  }
  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__ListCapturesReply lr = GRAPHD__WIRE__LIST_CAPTURES_REPLY__INIT;
  Graphd__Wire__EvictReply er = GRAPHD__WIRE__EVICT_REPLY__INIT;
  r.request_id = g->request_id;
  if (g->evict) {
    r.body_case = GRAPHD__WIRE__REPLY__BODY_EVICT;
    r.evict = &er;
    er.n_evicted = g->n;
    er.evicted = wp;
    er.bytes = g->bytes;
  } else {
    r.body_case = GRAPHD__WIRE__REPLY__BODY_LIST_CAPTURES;
    r.list_captures = &lr;
    lr.n_captures = g->n;
    lr.captures = wp;
  }
  session_reply(s, &r);
  free(wi);
  free(wp);
}

static void dev_done(gd_job *j) {
  dev_job *dj = (dev_job *)j;
  gather *g = dj->g;
  gd_device_counters *c = &g->s->srv->counters[j->worker->index];
  if (j->status < 0 && g->status == 0) {
    g->status = j->status;
    snprintf(g->msg, sizeof g->msg, "%s", j->msg);
  }
  if (g->evict && !g->sel.dry_run && j->status == 0) {
    gd_counters_evicted(c, dj->n, dj->bytes);
    if (dj->n)
      GD_LOG(GD_INFO, "evict", "device %d: %zu capture(s), %llu staging bytes freed for pid %d",
             j->worker->index, dj->n, (unsigned long long)dj->bytes, (int)g->s->pid);
  }
  if (dj->n) {
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
  if (--g->pending > 0) return;
  finish(g);
  session_request_done(g->s);
  session_unref(g->s);
  free(g->ci);
  free(g);
}

/* Sends one job to each device in [first, last]. */
static void fan_out(gather *g, int first, int last) {
  gd_session *s = g->s;
  g->pending = last - first + 1;
  s->busy = true;
  session_ref(s);
  for (int i = first; i <= last; i++) {
    dev_job *dj = calloc(1, sizeof *dj);
    if (!dj) {
      /* Answer for this device ourselves, as failed. */
      g->status = -GRAPHD_RESOURCE_EXHAUSTED;
      snprintf(g->msg, sizeof g->msg, "out of memory");
      if (--g->pending == 0) {
        finish(g);
        session_request_done(s);
        session_unref(s);
        free(g);
      }
      continue;
    }
    dj->g = g;
    dj->job.run = dev_run;
    dj->job.done = dev_done;
    worker_submit(&s->srv->pool.workers[i], &dj->job);
  }
}

void evict_handle_list(gd_session *s, uint64_t request_id) {
  gather *g = calloc(1, sizeof *g);
  if (!g) {
    session_reply_error(s, request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  g->s = s;
  g->request_id = request_id;
  fan_out(g, 0, s->srv->ndevices - 1);
}

static int parse_prefix(const char *hex, gd_evict_sel *sel) {
  size_t n = strlen(hex);
  if (n > 2 * GD_ID_LEN) return -1;
  for (size_t k = 0; k < n; k++) {
    char c = hex[k];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (v < 0) return -1;
    if (k % 2 == 0)
      sel->prefix[k / 2] = (uint8_t)(v << 4);
    else
      sel->prefix[k / 2] |= (uint8_t)v;
  }
  sel->prefix_nibbles = (uint32_t)n;
  return 0;
}

void evict_handle_evict(gd_session *s, uint64_t request_id, const Graphd__Wire__Evict *m) {
  gd_server *srv = s->srv;
  gather *g = calloc(1, sizeof *g);
  if (!g) {
    session_reply_error(s, request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  g->s = s;
  g->request_id = request_id;
  g->evict = true;
  g->sel.all = m->all;
  g->sel.dry_run = m->dry_run;
  g->sel.idle_ms = m->idle_ms;
  g->sel.client_pid = m->client_pid;
  g->sel.admin = s->admin;
  g->sel.requester_pid = (uint32_t)s->pid;
  const char *why = NULL;
  int code = GRAPHD_INVALID_ARGUMENT;
  if (m->program && *m->program &&
      (strlen(m->program) < 6 || parse_prefix(m->program, &g->sel) < 0))
    why = "Evict.program must be a program id or a hex prefix of at least 6 digits";
  if (!why && m->session) {
    /* A session names its process: captures that process used. */
    gd_session *x = srv->sessions;
    while (x && x->id != m->session) x = x->next;
    if (!x)
      why = "Evict.session names no open session";
    else if (g->sel.client_pid && g->sel.client_pid != (uint32_t)x->pid)
      why = "Evict.session and Evict.client_pid name different processes";
    else
      g->sel.client_pid = (uint32_t)x->pid;
  }
  bool one_device = m->device_sel_case == GRAPHD__WIRE__EVICT__DEVICE_SEL_DEVICE;
  bool selects = g->sel.prefix_nibbles || g->sel.client_pid || g->sel.idle_ms || one_device ||
                 m->session;
  if (!why && !selects && !m->all)
    why = "say what to evict: a program, device, client, session or idle time, or all";
  if (!why && one_device && (m->device < 0 || m->device >= srv->ndevices)) {
    why = "Evict.device is not a device of this daemon";
    code = GRAPHD_NOT_FOUND;
  }
  if (!why && m->all && !s->admin) {
    why = "evicting all captures needs an admin session (root, graphd's user, or the admin group)";
    code = GRAPHD_PERMISSION_DENIED;
  }
  if (why) {
    free(g);
    session_reply_error(s, request_id, code, "%s", why);
    return;
  }
  int first = one_device ? m->device : 0;
  int last = one_device ? m->device : srv->ndevices - 1;
  fan_out(g, first, last);
}
