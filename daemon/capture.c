/* See capture.h. Worker thread only. */
#include "capture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graphd/status.h"
#include "fault.h"
#include "log.h"
#include "prepare.h"

#define STAGING_ALIGN 256u

typedef struct gd_capture {
  const gd_prog *prog;
  gd_staging staging;
  uint64_t *slot_addr;      /* per slot: device address in staging */
  gd_graph graph;
  gd_graph_exec exec;
  gd_node *in_node;         /* per slot: copy-in node (staged mode) or NULL */
  gd_node *out_node;        /* per slot: copy-out node (staged mode) or NULL */
  uint8_t *in_off, *out_off; /* per slot: the node is off; the copy runs outside */
  uint8_t **param_buf;      /* per step: patched parameter bytes (launches) */
  void ***kparams;          /* per step: kernelParams */
  gd_event last_use;
  bool has_event;
  gd_stream last_stream;    /* the stream of the last replay */
  uint64_t *node_src, *node_dst; /* per slot, in then out: what the nodes point at now */
  uint64_t replays;
  uint32_t nodes;
  uint64_t last_queued_ns;
  uint32_t pids[GD_CAPTURE_PIDS]; /* client processes that replayed it */
  uint32_t npids;
} gd_capture;

/* A ready wait queued on the device, watched from the host. */
typedef struct gd_watch {
  gd_wsess *ws;
  uint32_t slot;
  uint64_t seq;
  uint64_t since_ns;
  double timeout_s;
  gd_capture *cap;
  bool blocking;   /* another session queued a replay of cap behind it */
} gd_watch;

struct gd_capstate {
  gd_capture **caps;        /* indexed by program index */
  uint8_t *ever;            /* captured before on this device (re-capture count) */
  uint32_t n;
  gd_watch *watch;          /* queued ready waits (device-queued backends) */
  uint32_t nwatch, watch_cap;
};

#define OPS (w->be->ops)
#define BE w->be, w->dev

static int slot_is_in(const gd_slot *s) {
  return s->role == GD_ROLE_INPUT || s->role == GD_ROLE_INOUT;
}
static int slot_is_out(const gd_slot *s) {
  return s->role == GD_ROLE_OUTPUT || s->role == GD_ROLE_INOUT;
}
static int staged(const gd_slot *s) { return (s->flags & GD_SLOT_STAGED) != 0; }

static struct gd_capstate *capstate(gd_worker *w, uint32_t want) {
  if (!w->cs && !(w->cs = calloc(1, sizeof *w->cs))) return NULL;
  struct gd_capstate *cs = w->cs;
  if (want > cs->n) {
    uint32_t n = cs->n ? cs->n : 16;
    while (n < want) n *= 2;
    gd_capture **c = realloc(cs->caps, n * sizeof *c);
    if (!c) return NULL;
    cs->caps = c;
    uint8_t *e = realloc(cs->ever, n);
    if (!e) return NULL;
    cs->ever = e;
    memset(cs->caps + cs->n, 0, (n - cs->n) * sizeof *c);
    memset(cs->ever + cs->n, 0, n - cs->n);
    cs->n = n;
  }
  return cs;
}

static void capture_free(gd_worker *w, gd_capture *c) {
  if (!c) return;
  const gd_program *p = c->prog->program;
  if (c->exec) OPS->graph_exec_destroy(BE, c->exec);
  if (c->graph) OPS->graph_destroy(BE, c->graph);
  if (c->has_event) OPS->event_destroy(BE, c->last_use);
  if (c->staging.bytes) OPS->staging_free(BE, &c->staging);
  for (uint32_t i = 0; c->param_buf && i < p->nsteps; i++) free(c->param_buf[i]);
  for (uint32_t i = 0; c->kparams && i < p->nsteps; i++) free(c->kparams[i]);
  free(c->param_buf);
  free(c->kparams);
  free(c->slot_addr);
  free(c->in_node);
  free(c->out_node);
  free(c->in_off);
  free(c->out_off);
  free(c->node_src);
  free(c->node_dst);
  free(c);
}

/* Lays the slots out in one staging allocation. */
static int place_slots(gd_worker *w, gd_capture *c, char *err, size_t errlen) {
  const gd_program *p = c->prog->program;
  uint64_t off = 0;
  uint64_t *offs = calloc(p->nslots ? p->nslots : 1, sizeof *offs);
  if (!offs) goto oom;
  for (uint32_t s = 0; s < p->nslots; s++) {
    offs[s] = off;
    uint64_t sz = (p->slots[s].size + STAGING_ALIGN - 1) / STAGING_ALIGN * STAGING_ALIGN;
    off += sz;
  }
  if (off == 0) off = STAGING_ALIGN;
  int rc = OPS->staging_alloc(BE, off, &c->staging, err, errlen);
  if (rc < 0) {
    free(offs);
    return rc;
  }
  for (uint32_t s = 0; s < p->nslots; s++) offs[s] += c->staging.ptr;
  c->slot_addr = offs;
  return 0;
oom:
  snprintf(err, errlen, "out of memory");
  return -GRAPHD_RESOURCE_EXHAUSTED;
}

/* The launch's parameter bytes with every patch pointing into staging. */
static int build_params(gd_capture *c, uint32_t i, const gd_launch *l) {
  uint8_t *buf = malloc(l->param_bytes ? l->param_bytes : 1);
  void **kp = calloc(l->nparams ? l->nparams : 1, sizeof *kp);
  if (!buf || !kp) {
    free(buf);
    free(kp);
    return -1;
  }
  memcpy(buf, l->param_data, l->param_bytes);
  for (uint32_t k = 0; k < l->npatches; k++) {
    uint64_t v = c->slot_addr[l->patches[k].slot] + l->patches[k].slot_offset;
    memcpy(buf + l->patches[k].offset, &v, 8);
  }
  for (uint32_t k = 0; k < l->nparams; k++) kp[k] = buf + l->params[k].offset;
  c->param_buf[i] = buf;
  c->kparams[i] = kp;
  return 0;
}

/* Builds the graph explicitly from the steps (Decisions 6): in staged mode
 * the copy-in nodes are roots, the steps form a chain, and the copy-out
 * nodes follow the last step; every node handle is kept. */
static int build_graph(gd_worker *w, gd_capture *c, const gd_replay_args *a, char *err,
                       size_t errlen) {
  const gd_program *p = c->prog->program;
  int rc;
  uint32_t n = p->nslots;
  gd_node *roots = calloc(n ? n : 1, sizeof *roots);
  size_t nroots = 0;
  c->in_node = calloc(n ? n : 1, sizeof *c->in_node);
  c->out_node = calloc(n ? n : 1, sizeof *c->out_node);
  c->in_off = calloc(n ? n : 1, 1);
  c->out_off = calloc(n ? n : 1, 1);
  c->node_src = calloc(n ? n : 1, sizeof *c->node_src); /* copy-in source per slot */
  c->node_dst = calloc(n ? n : 1, sizeof *c->node_dst); /* copy-out target per slot */
  c->param_buf = calloc(p->nsteps, sizeof *c->param_buf);
  c->kparams = calloc(p->nsteps, sizeof *c->kparams);
  if (!roots || !c->in_node || !c->out_node || !c->in_off || !c->out_off || !c->node_src ||
      !c->node_dst || !c->param_buf || !c->kparams) {
    free(roots);
    snprintf(err, errlen, "out of memory building a graph");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  if ((rc = OPS->graph_create(BE, &c->graph, err, errlen)) < 0) goto exit;
  if (p->mode == GD_MODE_STAGED) {
    for (uint32_t s = 0; s < n; s++) {
      const gd_slot *sl = &p->slots[s];
      if (!slot_is_in(sl) || !staged(sl)) continue;
      rc = OPS->graph_add_memcpy(BE, c->graph, NULL, 0, c->slot_addr[s], a->bind[s].addr,
                                 sl->size, &c->in_node[s], err, errlen);
      if (rc < 0) goto exit;
      c->node_src[s] = a->bind[s].addr;
      c->nodes++;
      roots[nroots++] = c->in_node[s];
    }
  }
  gd_node prev = NULL;
  for (uint32_t i = 0; i < p->nsteps; i++) {
    const gd_step *st = &p->steps[i];
    const gd_node *deps = prev ? &prev : roots;
    size_t ndeps = prev ? 1 : nroots;
    gd_node node = NULL;
    char lbl[GD_MAX_NAME + 32], e[512];
    gd_step_label(st, lbl, sizeof lbl);
    if (st->kind == GD_STEP_LAUNCH) {
      const gd_launch *l = &st->u.launch;
      gd_dev_func *f = prepare_step_function(w, c->prog, i);
      if (!f || build_params(c, i, l) < 0) {
        snprintf(err, errlen, "step %u (%s): internal error preparing the launch", i, lbl);
        rc = -GRAPHD_INTERNAL;
        goto exit;
      }
      gd_kernel_desc k = {.fn = f->fn, .shared_bytes = l->shared_bytes,
                          .params = c->kparams[i], .nparams = l->nparams};
      memcpy(k.grid, l->grid, sizeof k.grid);
      memcpy(k.block, l->block, sizeof k.block);
      rc = OPS->graph_add_kernel(BE, c->graph, deps, ndeps, &k, &node, e, sizeof e);
    } else if (st->kind == GD_STEP_MEMSET) {
      const gd_memset *m = &st->u.memset;
      rc = OPS->graph_add_memset(BE, c->graph, deps, ndeps, c->slot_addr[m->slot] + m->offset,
                                 m->element_size, m->value, m->bytes / m->element_size, &node, e,
                                 sizeof e);
    } else {
      const gd_copy *cp = &st->u.copy;
      rc = OPS->graph_add_memcpy(BE, c->graph, deps, ndeps, c->slot_addr[cp->dst_slot] + cp->dst_offset,
                                 c->slot_addr[cp->src_slot] + cp->src_offset, cp->bytes, &node, e,
                                 sizeof e);
    }
    if (rc < 0) {
      snprintf(err, errlen, "step %u (%s): %s", i, lbl, e);
      goto exit;
    }
    prev = node;
    c->nodes++;
  }
  if (p->mode == GD_MODE_STAGED) {
    for (uint32_t s = 0; s < n; s++) {
      const gd_slot *sl = &p->slots[s];
      if (!slot_is_out(sl) || !staged(sl)) continue;
      rc = OPS->graph_add_memcpy(BE, c->graph, &prev, 1, a->bind[s].addr, c->slot_addr[s],
                                 sl->size, &c->out_node[s], err, errlen);
      if (rc < 0) goto exit;
      c->node_dst[s] = a->bind[s].addr;
      c->nodes++;
    }
  }
  rc = OPS->graph_instantiate(BE, c->graph, a->ws->stream, &c->exec, err, errlen);
exit:
  free(roots);
  return rc;
}

static int capture_build(gd_worker *w, const gd_replay_args *a, gd_capture **out, char *err,
                         size_t errlen) {
  const gd_program *p = a->prog->program;
  for (uint32_t s = 0; s < p->nslots; s++) {
    const gd_slot *sl = &p->slots[s];
    if (slot_is_in(sl) && !staged(sl) && !a->bind[s].bound) {
      snprintf(err, errlen,
               "slot %u is an unstaged %s: bind it on the replay that captures (this one), "
               "which copies it once",
               s, sl->role == GD_ROLE_INPUT ? "input" : "inout");
      return -GRAPHD_INVALID_ARGUMENT;
    }
  }
  gd_capture *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  c->prog = a->prog;
  int rc = place_slots(w, c, err, errlen);
  if (rc == 0) rc = build_graph(w, c, a, err, errlen);
  if (rc == 0) {
    rc = OPS->event_create(BE, &c->last_use, err, errlen);
    c->has_event = rc == 0;
  }
  if (rc < 0) {
    capture_free(w, c);
    return rc;
  }
  *out = c;
  return 0;
}

static int ensure_stream(gd_worker *w, gd_wsess *ws, char *err, size_t errlen) {
  if (ws->has_stream) return 0;
  int rc = OPS->stream_create(BE, &ws->stream, err, errlen);
  ws->has_stream = rc == 0;
  ws->epoch = atomic_load(&w->epoch);
  return rc;
}

int capture_flags_register(gd_worker *w, gd_wsess *ws, int fd, uint32_t slots, char *err,
                           size_t errlen) {
  if (ws->has_flags) {
    snprintf(err, errlen, "this session already registered its flags");
    return -GRAPHD_ALREADY_EXISTS;
  }
  int rc = ensure_stream(w, ws, err, errlen);
  if (rc < 0) return rc;
  rc = OPS->flags_map(BE, fd, (uint64_t)slots * GD_FLAG_STRIDE, &ws->flags, err, errlen);
  if (rc < 0) return rc;
  ws->has_flags = true;
  ws->nslots = slots;
  return 0;
}

typedef struct give_up_ctx {
  gd_worker *w;
  gd_wsess *ws;
  uint64_t start_ns;
  double timeout_s;
} give_up_ctx;

/* The head-of-line policy (Decisions 7): a client whose ready flag does not
 * come is cut off only when it blocks someone else. On the host backend the
 * worker itself waits, so any other job queued on it is blocked. */
static int give_up(void *arg) {
  give_up_ctx *g = arg;
  /* Waiting is work: keep the watchdog from taking it for a hang. */
  worker_heartbeat(g->w);
  if (worker_stopping(g->w) || atomic_load(&g->ws->client_gone)) return 1;
  if (g->timeout_s <= 0) return 0;
  if ((double)(gd_now_ns() - g->start_ns) < g->timeout_s * 1e9) return 0;
  return worker_has_queued(g->w);
}

/* Re-points a copy node at this replay's memory. The driver re-points a
 * memcpy node only to memory of the kind it was made with (VMM or legacy
 * IPC), and a replay may bind either kind: when it refuses, the node is
 * switched off, keeping its last good addresses, and the caller copies
 * outside the graph; it comes back on at the next replay it accepts. */
static int repoint(gd_worker *w, gd_capture *c, gd_node n, uint8_t *off, uint64_t *now,
                   uint64_t want, uint64_t dst, uint64_t src, uint64_t bytes, char *err,
                   size_t errlen) {
  /* Already pointing there (a loop over the same buffers): nothing to do. */
  if (!*off && *now == want) return 0;
  int rc = OPS->graph_exec_set_memcpy(BE, c->exec, n, dst, src, bytes, err, errlen);
  if (rc == -GRAPHD_FAILED_PRECONDITION) {
    if (!*off && (rc = OPS->graph_exec_enable(BE, c->exec, n, 0, err, errlen)) < 0) return rc;
    *off = 1;
    return 0;
  }
  if (rc < 0) return rc;
  *now = want;
  if (*off && (rc = OPS->graph_exec_enable(BE, c->exec, n, 1, err, errlen)) < 0) return rc;
  *off = 0;
  return 0;
}

static volatile uint64_t *ready_word(gd_wsess *ws, uint32_t slot) {
  return ws->flags.host + slot * (GD_FLAG_STRIDE / 8);
}

/* Remembers a queued ready wait that has not been met yet, and marks the
 * waits of other sessions on the same capture as blocking this replay. */
static void watch_add(struct gd_capstate *cs, gd_replay_args *a, gd_capture *c) {
  for (uint32_t i = 0; i < cs->nwatch; i++)
    if (cs->watch[i].cap == c && cs->watch[i].ws != a->ws) cs->watch[i].blocking = true;
  if (a->ready_timeout_s <= 0 || a->ws->cut_off) return;
  if (__atomic_load_n(ready_word(a->ws, a->stream_slot), __ATOMIC_ACQUIRE) >= a->seq) return;
  if (cs->nwatch == cs->watch_cap) {
    uint32_t cap = cs->watch_cap ? 2 * cs->watch_cap : 16;
    gd_watch *n = realloc(cs->watch, cap * sizeof *n);
    if (!n) return; /* unwatched: only the timeout is lost */
    cs->watch = n;
    cs->watch_cap = cap;
  }
  cs->watch[cs->nwatch++] = (gd_watch){.ws = a->ws, .slot = a->stream_slot, .seq = a->seq,
                                       .since_ns = gd_now_ns(), .timeout_s = a->ready_timeout_s,
                                       .cap = c};
}

static void watch_drop_session(struct gd_capstate *cs, gd_wsess *ws) {
  uint32_t k = 0;
  for (uint32_t i = 0; cs && i < cs->nwatch; i++)
    if (cs->watch[i].ws != ws) cs->watch[k++] = cs->watch[i];
  if (cs) cs->nwatch = k;
}

int capture_watch(gd_worker *w, uint64_t *cut, int ncut, int *pending) {
  struct gd_capstate *cs = w->cs;
  int n = 0;
  *pending = 0;
  if (!cs) return 0;
  uint64_t now = gd_now_ns();
  /* Drop the waits that were met. */
  uint32_t k = 0;
  for (uint32_t i = 0; i < cs->nwatch; i++) {
    gd_watch *x = &cs->watch[i];
    if (__atomic_load_n(ready_word(x->ws, x->slot), __ATOMIC_ACQUIRE) < x->seq)
      cs->watch[k++] = *x;
  }
  cs->nwatch = k;
  for (uint32_t i = 0; i < cs->nwatch && n < ncut; i++) {
    gd_watch *x = &cs->watch[i];
    if ((double)(now - x->since_ns) < x->timeout_s * 1e9 || x->ws->cut_off) continue;
    if (!x->blocking) continue; /* slow, but in nobody's way */
    /* Hung: let its replay run now (its outputs are undefined) so the ones
     * behind it can, and have the loop close its session. */
    gd_wsess *ws = x->ws;
    ws->cut_off = true;
    for (uint32_t j = 0; j < cs->nwatch; j++)
      if (cs->watch[j].ws == ws) {
        volatile uint64_t *r = ready_word(ws, cs->watch[j].slot);
        if (__atomic_load_n(r, __ATOMIC_ACQUIRE) < cs->watch[j].seq)
          __atomic_store_n(r, cs->watch[j].seq, __ATOMIC_RELEASE);
      }
    GD_LOG(GD_WARN, "capture",
           "session %llu: its ready flag did not reach %llu within %.3g s while another "
           "session waited behind it; released from the host and cut off",
           (unsigned long long)ws->session_id, (unsigned long long)x->seq, x->timeout_s);
    cut[n++] = ws->session_id;
  }
  for (int i = 0; i < n; i++)
    for (uint32_t j = 0; j < cs->nwatch; j++)
      if (cs->watch[j].ws->session_id == cut[i]) {
        watch_drop_session(cs, cs->watch[j].ws);
        break;
      }
  *pending = cs->nwatch > 0;
  return n;
}

/* Frees the capture of program index i: in stream order, the last replay of
 * it, from any session, is done before anything is freed; then modules no
 * remaining capture on this device uses are unloaded. */
static void evict_at(gd_worker *w, uint32_t i) {
  struct gd_capstate *cs = w->cs;
  gd_capture *c = cs->caps[i];
  char e[256];
  if (c->has_event && OPS->event_sync(BE, c->last_use, e, sizeof e) < 0)
    GD_LOG(GD_WARN, "capture", "eviction: waiting for the last replay failed: %s", e);
  for (uint32_t k = 0; k < cs->nwatch;)
    if (cs->watch[k].cap == c)
      cs->watch[k] = cs->watch[--cs->nwatch];
    else
      k++;
  const gd_prog *prog = c->prog;
  capture_free(w, c);
  cs->caps[i] = NULL;
  for (uint32_t st = 0; st < prog->program->nsteps; st++) {
    const gd_module *m = prog->step_module[st];
    if (!m) continue;
    bool used = false;
    for (uint32_t j = 0; j < cs->n && !used; j++) {
      gd_capture *o = cs->caps[j];
      for (uint32_t k = 0; o && k < o->prog->program->nsteps && !used; k++)
        used = o->prog->step_module[k] == m;
    }
    if (!used) prepare_release_module(w, m);
  }
}

/* The device budget: makes room for the new capture `nc` (already in
 * cs->caps, never taken itself) by evicting the least recently used idle captures.
 * A capture whose last replay has not finished is never taken; if the idle
 * ones do not free enough, or the new one alone is over the budget, the
 * replay fails with RESOURCE_EXHAUSTED and nothing is evicted. */
static int budget_make_room(gd_worker *w, gd_replay_args *a, const gd_capture *nc, char *err,
                            size_t errlen) {
  struct gd_capstate *cs = w->cs;
  uint64_t bytes = nc->staging.bytes;
  char hex[2 * GD_ID_LEN + 1];
  gd_id_hex(a->prog->id, 1, hex);
  if (bytes > w->budget) {
    snprintf(err, errlen,
             "program %s needs %llu staging bytes, more than device %d's budget of %llu "
             "(--device-budget)",
             hex, (unsigned long long)bytes, w->index, (unsigned long long)w->budget);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  uint64_t held = 0, idle = 0;
  for (uint32_t i = 0; i < cs->n; i++) {
    gd_capture *c = cs->caps[i];
    if (!c || c == nc) continue;
    held += c->staging.bytes;
    if (!c->has_event || OPS->event_done(BE, c->last_use)) idle += c->staging.bytes;
  }
  if (held + bytes <= w->budget) return 0;
  if (held - idle + bytes > w->budget) {
    snprintf(err, errlen,
             "program %s needs %llu staging bytes; device %d's budget of %llu has %llu held "
             "by captures with replays in flight (retry, or raise --device-budget)",
             hex, (unsigned long long)bytes, w->index, (unsigned long long)w->budget,
             (unsigned long long)(held - idle));
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  while (held + bytes > w->budget) {
    uint32_t lru = UINT32_MAX;
    for (uint32_t i = 0; i < cs->n; i++) {
      gd_capture *c = cs->caps[i];
      if (!c || c == nc || (c->has_event && !OPS->event_done(BE, c->last_use))) continue;
      if (lru == UINT32_MAX || c->last_queued_ns < cs->caps[lru]->last_queued_ns) lru = i;
    }
    if (lru == UINT32_MAX) break; /* cannot happen: idle covered the need */
    gd_capture *c = cs->caps[lru];
    uint64_t b = c->staging.bytes;
    gd_id_hex(c->prog->id, 1, hex);
    GD_LOG(GD_INFO, "capture", "budget: evicting idle capture %s@%d (%llu staging bytes)", hex,
           w->index, (unsigned long long)b);
    evict_at(w, lru);
    held -= b;
    a->budget_evicted++;
    a->budget_evicted_bytes += b;
  }
  return 0;
}

int capture_replay(gd_worker *w, gd_replay_args *a, char *err, size_t errlen) {
  const gd_program *p = a->prog->program;
  gd_wsess *ws = a->ws;
  volatile uint64_t *ready = ws->flags.host + a->stream_slot * (GD_FLAG_STRIDE / 8);
  volatile uint64_t *done = ready + 1;
  uint64_t ready_dev = ws->flags.dev + (uint64_t)a->stream_slot * GD_FLAG_STRIDE;
  uint64_t done_dev = ready_dev + 8;
  int rc;
  uint64_t loaded, load_ns;
  char why[192];
  uint64_t epoch = atomic_load(&w->epoch);
  if (a->epoch != epoch || ws->epoch != epoch) {
    /* Its stream, flags or regions went with the old context: nothing of
     * it can be touched, and the loop is closing the session. */
    snprintf(err, errlen, "device %d was reset after a GPU fault; reconnect and register the "
             "regions again", w->index);
    __atomic_store_n(done, a->seq, __ATOMIC_RELEASE);
    return -GRAPHD_UNAVAILABLE;
  }
  struct gd_capstate *cs = capstate(w, a->prog->index + 1);
  if (!cs) {
    snprintf(err, errlen, "out of memory");
    rc = -GRAPHD_RESOURCE_EXHAUSTED;
    goto finish;
  }
  /* Device stage, then the capture on first use on this device. */
  if ((rc = prepare_program(w, a->prog, &loaded, &load_ns, err, errlen)) < 0) goto finish;
  gd_capture *c = cs->caps[a->prog->index];
  if (!c) {
    uint64_t t0 = gd_now_ns();
    if ((rc = capture_build(w, a, &c, err, errlen)) < 0) goto finish;
    /* In place first, so that budget evictions keep the modules it uses. */
    cs->caps[a->prog->index] = c;
    if (w->budget && (rc = budget_make_room(w, a, c, err, errlen)) < 0) {
      cs->caps[a->prog->index] = NULL;
      capture_free(w, c);
      goto finish;
    }
    a->captured = true;
    a->recaptured = cs->ever[a->prog->index] != 0;
    a->capture_ns = gd_now_ns() - t0;
    a->staging_bytes = c->staging.bytes;
    cs->caps[a->prog->index] = c;
    cs->ever[a->prog->index] = 1;
    char hex[2 * GD_ID_LEN + 1];
    gd_id_hex(a->prog->id, 1, hex);
    GD_LOG(GD_INFO, "capture", "program %s captured in %.1f us: %u steps, %llu staging bytes",
           hex, (double)a->capture_ns / 1e3, p->nsteps, (unsigned long long)c->staging.bytes);
  }
  /* 1. the client's stream has reached this call */
  give_up_ctx g = {.w = w, .ws = ws, .start_ns = gd_now_ns(), .timeout_s = a->ready_timeout_s};
  rc = OPS->wait_value(BE, ws->stream, ready, ready_dev, a->seq, give_up, &g, err, errlen);
  if (rc < 0) goto finish;
  /* 2. the last replay of this capture, from any session, is done with the
   * staging buffers (on the same stream, order is already given) */
  if (c->replays && c->last_stream != ws->stream &&
      (rc = OPS->stream_wait_event(BE, ws->stream, c->last_use, err, errlen)) < 0)
    goto finish;
  /* 3. copy in, run, copy out */
  if (a->captured) {
    for (uint32_t s = 0; s < p->nslots; s++) {
      const gd_slot *sl = &p->slots[s];
      if (slot_is_in(sl) && !staged(sl)) {
        rc = OPS->memcpy_async(BE, c->slot_addr[s], a->bind[s].addr, sl->size, ws->stream, err,
                               errlen);
        if (rc < 0) goto finish;
      }
    }
  }
  if (p->mode == GD_MODE_STAGED) {
    for (uint32_t s = 0; s < p->nslots; s++) {
      const gd_slot *sl = &p->slots[s];
      if (!staged(sl)) continue;
      if (c->in_node[s] &&
          (rc = repoint(w, c, c->in_node[s], &c->in_off[s], &c->node_src[s], a->bind[s].addr,
                        c->slot_addr[s], a->bind[s].addr, sl->size, err, errlen)) < 0)
        goto finish;
      if (c->out_node[s] &&
          (rc = repoint(w, c, c->out_node[s], &c->out_off[s], &c->node_dst[s], a->bind[s].addr,
                        a->bind[s].addr, c->slot_addr[s], sl->size, err, errlen)) < 0)
        goto finish;
      /* A node the driver would not re-point is off: copy outside. */
      if (c->in_node[s] && c->in_off[s] &&
          (rc = OPS->memcpy_async(BE, c->slot_addr[s], a->bind[s].addr, sl->size, ws->stream,
                                  err, errlen)) < 0)
        goto finish;
    }
    if ((rc = OPS->graph_launch(BE, c->exec, ws->stream, err, errlen)) < 0) goto finish;
    for (uint32_t s = 0; s < p->nslots; s++) {
      const gd_slot *sl = &p->slots[s];
      if (c->out_node[s] && c->out_off[s] &&
          (rc = OPS->memcpy_async(BE, a->bind[s].addr, c->slot_addr[s], sl->size, ws->stream,
                                  err, errlen)) < 0)
        goto finish;
    }
  } else {
    for (uint32_t s = 0; s < p->nslots; s++) {
      const gd_slot *sl = &p->slots[s];
      if (slot_is_in(sl) && staged(sl) &&
          (rc = OPS->memcpy_async(BE, c->slot_addr[s], a->bind[s].addr, sl->size, ws->stream,
                                  err, errlen)) < 0)
        goto finish;
    }
    if ((rc = OPS->graph_launch(BE, c->exec, ws->stream, err, errlen)) < 0) goto finish;
    for (uint32_t s = 0; s < p->nslots; s++) {
      const gd_slot *sl = &p->slots[s];
      if (slot_is_out(sl) && staged(sl) &&
          (rc = OPS->memcpy_async(BE, a->bind[s].addr, c->slot_addr[s], sl->size, ws->stream,
                                  err, errlen)) < 0)
        goto finish;
    }
  }
  /* 4. later replays of this capture wait for this one */
  if ((rc = OPS->event_record(BE, c->last_use, ws->stream, err, errlen)) < 0) goto finish;
  c->last_stream = ws->stream;
  c->replays++;
  c->last_queued_ns = gd_now_ns();
  {
    uint32_t k = 0;
    while (k < c->npids && c->pids[k] != a->client_pid) k++;
    if (k == c->npids && c->npids < GD_CAPTURE_PIDS) c->pids[c->npids++] = a->client_pid;
  }
  if (!w->be->waits_on_worker) watch_add(cs, a, c);
finish:
  /* A call that failed because the device faulted (this replay's kernel
   * or an earlier one): say so; the worker resets the device next. */
  if (rc < 0 && OPS->device_health && OPS->device_health(BE, why, sizeof why) < 0) {
    snprintf(err, errlen, "device %d faulted (%s); it is being reset: reconnect and register "
             "the regions again", w->index, why);
    rc = -GRAPHD_UNAVAILABLE;
  }
  /* 5. done = seq, in stream order, even for a failed replay; from the host
   * only when the stream itself cannot take it. */
  {
    char e2[256];
    if (OPS->write_value(BE, ws->stream, done, done_dev, a->seq, e2, sizeof e2) < 0) {
      GD_LOG(GD_WARN, "capture", "writing done=%llu on the stream failed (%s); writing it "
             "from the host", (unsigned long long)a->seq, e2);
      __atomic_store_n(done, a->seq, __ATOMIC_RELEASE);
    }
  }
  return rc;
}

/* Writes values[i] into one word of each of the session's flag slots. */
static void write_flags(gd_wsess *ws, uint32_t word, const uint64_t *values) {
  for (uint32_t i = 0; ws->has_flags && i < ws->nslots; i++)
    __atomic_store_n(ready_word(ws, i) + word, values[i], __ATOMIC_RELEASE);
}

void capture_release_flags(gd_wsess *ws, uint32_t word, uint64_t *written) {
  /* Stream waits compare cyclically ((int64_t)(*addr - value) >= 0), so
   * UINT64_MAX would release nothing: jump 2^62 ahead instead. */
  uint64_t own[GD_MAX_FLAG_SLOTS];
  uint64_t *v = written ? written : own;
  for (uint32_t i = 0; ws->has_flags && i < ws->nslots; i++)
    v[i] = __atomic_load_n(ready_word(ws, i) + word, __ATOMIC_ACQUIRE) + (1ull << 62);
  write_flags(ws, word, v);
}

int capture_busy(gd_worker *w) {
  struct gd_capstate *cs = w->cs;
  for (uint32_t i = 0; cs && i < cs->n; i++) {
    gd_capture *c = cs->caps[i];
    if (c && c->has_event && !OPS->event_done(BE, c->last_use)) return 1;
  }
  return 0;
}

void capture_session_sync(gd_worker *w, gd_wsess *ws) {
  /* A stream from before a reset is gone with its context. */
  if (!ws || !ws->has_stream || ws->epoch != atomic_load(&w->epoch)) return;
  char e[256];
  if (OPS->stream_sync(BE, ws->stream, e, sizeof e) < 0)
    GD_LOG(GD_WARN, "capture", "session %llu: stream sync failed: %s",
           (unsigned long long)ws->session_id, e);
}

/* A closed session's client writes no more ready values: release every
 * wait of its stream from the host so nothing queued behind them waits
 * forever. GPU work a killed client queued can still land a ready write,
 * lower than the release, until the driver has torn its context down; so
 * the same release is written again while the stream drains (at most
 * DRAIN_REWRITE_NS, then a plain sync). */
#define DRAIN_REWRITE_NS 2000000000ull
static void release_and_drain(gd_worker *w, gd_wsess *ws) {
  uint64_t target[GD_MAX_FLAG_SLOTS];
  capture_release_flags(ws, GD_FLAG_READY, target);
  gd_event ev;
  char e[256];
  if (ws->has_flags && ws->has_stream && ws->epoch == atomic_load(&w->epoch) &&
      OPS->event_create(BE, &ev, e, sizeof e) == 0) {
    if (OPS->event_record(BE, ev, ws->stream, e, sizeof e) == 0) {
      uint64_t end = gd_now_ns() + DRAIN_REWRITE_NS;
      while (!OPS->event_done(BE, ev) && gd_now_ns() < end) {
        write_flags(ws, GD_FLAG_READY, target);
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
      }
    }
    OPS->event_destroy(BE, ev);
  }
  capture_session_sync(w, ws);
}

void capture_session_end(gd_worker *w, gd_wsess *ws, gd_region_map *maps, size_t nmaps) {
  if (ws) watch_drop_session(w->cs, ws);
  if (!ws) {
    for (size_t i = 0; i < nmaps; i++) fault_release_map(w, &maps[i]);
    return;
  }
  release_and_drain(w, ws);
  for (size_t i = 0; i < nmaps; i++) fault_release_map(w, &maps[i]);
  /* After a reset the flag page's registration is gone with the old
   * context (unregistering fails, harmlessly) but the mapping is ours. */
  if (ws->has_flags) OPS->flags_unmap(BE, &ws->flags);
  if (ws->has_stream && ws->epoch == atomic_load(&w->epoch)) OPS->stream_destroy(BE, ws->stream);
  free(ws);
}

void capture_close_all(gd_worker *w) {
  struct gd_capstate *cs = w->cs;
  if (!cs) return;
  for (uint32_t i = 0; i < cs->n; i++) capture_free(w, cs->caps[i]);
  free(cs->caps);
  free(cs->ever);
  free(cs->watch);
  free(cs);
  w->cs = NULL;
}

static void info_of(gd_worker *w, const gd_capture *c, gd_capture_info *ci) {
  memset(ci, 0, sizeof *ci);
  memcpy(ci->program_id, c->prog->id, GD_ID_LEN);
  ci->device = (uint32_t)w->index;
  ci->mode = c->prog->program->mode;
  ci->staging_bytes = c->staging.bytes;
  ci->nodes = c->nodes;
  ci->replays = c->replays;
  ci->idle_ms = c->last_queued_ns ? (gd_now_ns() - c->last_queued_ns) / 1000000u : 0;
  memcpy(ci->pids, c->pids, sizeof ci->pids);
  ci->npids = c->npids;
  ci->busy = c->has_event && !OPS->event_done(BE, c->last_use);
}

int capture_list(gd_worker *w, gd_capture_info **out, size_t *n) {
  struct gd_capstate *cs = w->cs;
  *out = NULL;
  *n = 0;
  size_t count = 0;
  for (uint32_t i = 0; cs && i < cs->n; i++) count += cs->caps[i] != NULL;
  if (!count) return 0;
  gd_capture_info *ci = calloc(count, sizeof *ci);
  if (!ci) return -GRAPHD_RESOURCE_EXHAUSTED;
  for (uint32_t i = 0; i < cs->n; i++)
    if (cs->caps[i]) info_of(w, cs->caps[i], &ci[(*n)++]);
  *out = ci;
  return 0;
}

static bool prefix_matches(const gd_evict_sel *sel, const uint8_t id[GD_ID_LEN]) {
  for (uint32_t k = 0; k < sel->prefix_nibbles; k++) {
    uint8_t a = (uint8_t)(k % 2 ? sel->prefix[k / 2] & 15 : sel->prefix[k / 2] >> 4);
    uint8_t b = (uint8_t)(k % 2 ? id[k / 2] & 15 : id[k / 2] >> 4);
    if (a != b) return false;
  }
  return true;
}

static bool selected(gd_worker *w, const gd_evict_sel *sel, const gd_capture *c) {
  if (!prefix_matches(sel, c->prog->id)) return false;
  if (sel->idle_ms && (!c->last_queued_ns ||
                       (gd_now_ns() - c->last_queued_ns) / 1000000u < sel->idle_ms))
    return false;
  if (sel->client_pid) {
    bool used = false;
    for (uint32_t k = 0; k < c->npids && !used; k++) used = c->pids[k] == sel->client_pid;
    if (!used) return false;
  }
  (void)w;
  return true;
}

/* A capture only the requester's process used. */
static bool own(const gd_evict_sel *sel, const gd_capture *c) {
  for (uint32_t k = 0; k < c->npids; k++)
    if (c->pids[k] != sel->requester_pid) return false;
  return true;
}

int capture_evict(gd_worker *w, const gd_evict_sel *sel, gd_capture_info **out, size_t *n,
                  uint64_t *bytes, char *err, size_t errlen) {
  struct gd_capstate *cs = w->cs;
  *out = NULL;
  *n = 0;
  *bytes = 0;
  size_t count = 0;
  for (uint32_t i = 0; cs && i < cs->n; i++) {
    gd_capture *c = cs->caps[i];
    if (!c || !selected(w, sel, c)) continue;
    if (!sel->admin && !own(sel, c)) {
      char hex[2 * GD_ID_LEN + 1];
      gd_id_hex(c->prog->id, 1, hex);
      snprintf(err, errlen,
               "capture %s@%d is shared with other processes: evicting it needs an admin "
               "session (root, graphd's user, or the admin group)",
               hex, w->index);
      return -GRAPHD_PERMISSION_DENIED;
    }
    count++;
  }
  if (!count) return 0;
  gd_capture_info *ci = calloc(count, sizeof *ci);
  if (!ci) return -GRAPHD_RESOURCE_EXHAUSTED;
  for (uint32_t i = 0; i < cs->n; i++) {
    gd_capture *c = cs->caps[i];
    if (!c || !selected(w, sel, c)) continue;
    info_of(w, c, &ci[*n]);
    *bytes += c->staging.bytes;
    (*n)++;
    if (!sel->dry_run) evict_at(w, i);
  }
  *out = ci;
  return 0;
}
