/* See capture.h. Worker thread only. */
#include "capture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/base/clock.h"
#include "graphd/status.h"
#include "holwatch.h"
#include "common/log.h"
#include "gpusample.h"
#include "modcache.h"
#include "daemon/base/share.h"

#define STAGING_ALIGN 256u

/* A device's captures, by program index, its sampler, and graphd's own
 * fill and copy kernels on it (asked for once: 1 found, -1 none). */
typedef struct gd_capture_set {
  gd_capture **caps;
  uint32_t *ever; /* captures of the program built on this device (its generation) */
  uint32_t n;
  gd_gpu_sampler gpu;
  uint64_t launch_ns; /* the worker's time in graph launches, not taken yet */
  uint64_t trimmed;   /* staging of idle instances freed for room, not taken yet */
  void *util[GD_UTIL_COUNT];
  int util_state[GD_UTIL_COUNT];
} gd_capture_set;

#define OPS (d->be->ops)
#define BE d->be, d->dev

void capture_poll_gpu_time(gd_device *d) {
  if (d->caps) gpu_sample_poll(d, &d->caps->gpu);
}

void capture_take_gpu_time(gd_device *d, uint64_t *ns, uint64_t *n) {
  if (d->caps) gpu_sample_take(&d->caps->gpu, ns, n);
}

void capture_take_launch_time(gd_device *d, uint64_t *ns) {
  if (!d->caps) return;
  *ns += d->caps->launch_ns;
  d->caps->launch_ns = 0;
}

void capture_take_trimmed(gd_device *d, uint64_t *bytes) {
  if (!d->caps) return;
  *bytes += d->caps->trimmed;
  d->caps->trimmed = 0;
}

/* The graph launch of a replay, timed: the driver blocks in it while the
 * stream's queue is full, so this is where the worker waits for the GPU. */
static int launch(gd_device *d, gd_graph_exec e, gd_stream st, char *err, size_t errlen) {
  uint64_t t0 = gd_now_ns();
  int rc = OPS->graph_launch(BE, e, st, err, errlen);
  if (d->caps) d->caps->launch_ns += gd_now_ns() - t0;
  return rc;
}

static bool slot_is_in(const gd_slot *s) {
  return s->role == GD_ROLE_INPUT || s->role == GD_ROLE_INOUT;
}
static bool slot_is_out(const gd_slot *s) {
  return s->role == GD_ROLE_OUTPUT || s->role == GD_ROLE_INOUT;
}
static bool staged(const gd_slot *s) { return (s->flags & GD_SLOT_STAGED) != 0; }

/* Whether a replay of p leaves something in daemon memory that the next
 * one reads: a scratch slot (state). Such a program has an instance per
 * session, which holds that session's state; any other runs from any
 * instance, an idle one or one of its own for a stream that replays it
 * while the others are busy. */
static bool keeps_state(const gd_program *p) {
  for (uint32_t s = 0; s < p->nslots; s++)
    if (p->slots[s].role == GD_ROLE_SCRATCH) return true;
  return false;
}

/* Zeroes x's daemon-owned slots on st: all of them (a new instance, or one
 * that passes to another session), or only the temporaries (an instance
 * that passes to another user). */
static int zero_owned(gd_device *d, gd_capture *x, gd_stream st, bool temps_only, char *err,
                      size_t errlen) {
  const gd_program *p = x->prog->program;
  for (uint32_t s = 0; s < p->nslots; s++) {
    uint32_t role = p->slots[s].role;
    if (!gd_role_owned(role) || (temps_only && role != GD_ROLE_TEMP)) continue;
    uint64_t bytes = (p->slots[s].size + 3) / 4 * 4; /* slots are 256-byte aligned and padded */
    int rc = OPS->zero_async(BE, x->slot_addr[s], bytes, st, err, errlen);
    if (rc < 0) return rc;
  }
  return 0;
}

/* d's set, grown to hold index want - 1. */
static gd_capture_set *set_of(gd_device *d, uint32_t want) {
  if (!d->caps && !(d->caps = calloc(1, sizeof *d->caps))) return NULL;
  gd_capture_set *cs = d->caps;
  if (want > cs->n) {
    uint32_t n = cs->n ? cs->n : 16;
    while (n < want) n *= 2;
    gd_capture **c = realloc(cs->caps, n * sizeof *c);
    if (!c) return NULL;
    cs->caps = c;
    uint32_t *e = realloc(cs->ever, n * sizeof *e);
    if (!e) return NULL;
    cs->ever = e;
    memset(cs->caps + cs->n, 0, (n - cs->n) * sizeof *c);
    memset(cs->ever + cs->n, 0, (n - cs->n) * sizeof *e);
    cs->n = n;
  }
  return cs;
}

gd_capture *capture_next(gd_device *d, uint32_t *i) {
  gd_capture_set *cs = d->caps;
  while (cs && *i < cs->n) {
    gd_capture *c = cs->caps[(*i)++];
    if (c) return c;
  }
  return NULL;
}

gd_capture *capture_find(gd_device *d, const gd_regprog *p) {
  gd_capture_set *cs = d->caps;
  return cs && p->index < cs->n ? cs->caps[p->index] : NULL;
}

int capture_insert(gd_device *d, gd_capture *c) {
  gd_capture_set *cs = set_of(d, c->prog->index + 1);
  if (!cs) return -GRAPHD_RESOURCE_EXHAUSTED;
  cs->caps[c->prog->index] = c;
  return 0;
}

void capture_remove(gd_device *d, gd_capture *c) {
  if (capture_find(d, c->prog) == c) d->caps->caps[c->prog->index] = NULL;
}

bool capture_mark_built(gd_device *d, gd_capture *c) {
  gd_capture_set *cs = d->caps;
  c->generation = ++cs->ever[c->prog->index];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  c->created_unix_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
  return c->generation > 1;
}

void capture_free(gd_device *d, gd_capture *c) {
  if (!c) return;
  const gd_program *p = c->prog->program;
  for (uint32_t i = 0; i < c->nmore; i++) capture_free(d, c->more[i]);
  for (uint32_t i = 0; i < c->nexecs; i++) {
    gd_exec *x = &c->execs[i];
    OPS->graph_exec_destroy(BE, x->exec);
    free(x->node_src);
    free(x->node_dst);
    free(x->in_outside);
    free(x->out_outside);
    free(x->direct_addr);
    for (uint32_t k = 0; x->param_buf && k < p->nsteps; k++) free(x->param_buf[k]);
    for (uint32_t k = 0; x->kparams && k < p->nsteps; k++) free(x->kparams[k]);
    free(x->param_buf);
    free(x->kparams);
  }
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
  free(c->built_src);
  free(c->built_dst);
  free(c->direct);
  free(c->step_node);
  free(c->loop_reader);
  free(c->cond_handle);
  free(c->built_direct);
  free(c->users);
  free(c);
}

/* Lays the slots out in one staging allocation. */
static int place_slots(gd_device *d, gd_capture *c, char *err, size_t errlen) {
  const gd_program *p = c->prog->program;
  uint64_t off = 0;
  uint64_t *offs = calloc(p->nslots ? p->nslots : 1, sizeof *offs);
  if (!offs) goto oom;
  for (uint32_t s = 0; s < p->nslots; s++) {
    offs[s] = off;
    if (c->direct && c->direct[s]) continue; /* the client's buffer, bound per replay */
    uint64_t sz = (p->slots[s].size + STAGING_ALIGN - 1) / STAGING_ALIGN * STAGING_ALIGN;
    off += sz;
  }
  if (off == 0) off = STAGING_ALIGN;
  int rc = OPS->staging_alloc(BE, off, &c->staging, err, errlen);
  if (rc < 0) {
    free(offs);
    return rc;
  }
  for (uint32_t s = 0; s < p->nslots; s++)
    offs[s] = c->direct && c->direct[s] ? c->built_direct[s] : offs[s] + c->staging.ptr;
  c->slot_addr = offs;
  return 0;
oom:
  snprintf(err, errlen, "out of memory");
  return -GRAPHD_RESOURCE_EXHAUSTED;
}

/* The launch's parameter bytes in (*buf, *kp), made on first use, with
 * every patch pointing at addr[slot]. */
static int fill_params(const gd_launch *l, const uint64_t *addr, uint8_t **buf, void ***kp) {
  if (!*buf) {
    *buf = malloc(l->param_bytes ? l->param_bytes : 1);
    *kp = calloc(l->nparams ? l->nparams : 1, sizeof **kp);
    if (!*buf || !*kp) {
      free(*buf);
      free(*kp);
      *buf = NULL;
      *kp = NULL;
      return -1;
    }
    for (uint32_t k = 0; k < l->nparams; k++) (*kp)[k] = *buf + l->params[k].offset;
  }
  memcpy(*buf, l->param_data, l->param_bytes);
  for (uint32_t k = 0; k < l->npatches; k++) {
    uint64_t v = addr[l->patches[k].slot] + l->patches[k].slot_offset;
    memcpy(*buf + l->patches[k].offset, &v, 8);
  }
  return 0;
}

/* Launch step i pointing at addr[slot]: its parameters in (*buf, *kp),
 * made on first use, and the launch in *k. -1 when its function is not
 * loaded or there is no memory. */
static int launch_desc(gd_device *d, const gd_capture *c, uint32_t i, const uint64_t *addr,
                       uint8_t **buf, void ***kp, gd_kernel_desc *k) {
  const gd_launch *l = &c->prog->program->steps[i].u.launch;
  gd_dev_func *f = modcache_function(d, c->prog, i);
  if (!f || fill_params(l, addr, buf, kp) < 0) return -1;
  *k = (gd_kernel_desc){
      .fn = f->fn, .shared_bytes = l->shared_bytes, .params = *kp, .nparams = l->nparams};
  memcpy(k->grid, l->grid, sizeof k->grid);
  memcpy(k->block, l->block, sizeof k->block);
  return 0;
}

/* Whether step st (a launch, memset or copy) uses a slot marked in mark
 * (NULL: none is). */
static bool step_uses(const bool *mark, const gd_step *st) {
  if (!mark) return false;
  if (st->kind == GD_STEP_LAUNCH) {
    for (uint32_t k = 0; k < st->u.launch.npatches; k++)
      if (mark[st->u.launch.patches[k].slot]) return true;
    return false;
  }
  if (st->kind == GD_STEP_MEMSET) return mark[st->u.memset.slot];
  if (st->kind == GD_STEP_COPY) return mark[st->u.copy.dst_slot] || mark[st->u.copy.src_slot];
  return mark[st->u.cond.slot]; /* a loop or a branch: its condition word */
}

/* graphd's fill or copy kernel on d, or NULL when its backend has none. */
static void *util_fn(gd_device *d, int which) {
  gd_capture_set *cs = set_of(d, 0);
  if (!cs || !OPS->util_function) return NULL;
  if (!cs->util_state[which]) {
    char e[256] = "";
    void *fn = NULL;
    int rc = OPS->util_function(BE, which, &fn, e, sizeof e);
    cs->util_state[which] = rc == 0 ? 1 : -1;
    cs->util[which] = fn;
    if (rc < 0)
      GD_LOG(GD_INFO, "capture",
             "device %d: direct mode keeps the slots of memset and copy steps staged: %s", d->index,
             e);
  }
  return cs->util_state[which] > 0 ? cs->util[which] : NULL;
}

/* Whether memset or copy step st touches a direct slot: then it runs as a
 * node of graphd's fill or copy kernel, re-pointed like a launch. */
static bool util_direct(const gd_capture *c, const gd_step *st) {
  return (st->kind == GD_STEP_MEMSET || st->kind == GD_STEP_COPY) && step_uses(c->direct, st);
}

#define UTIL_THREADS 256u
#define UTIL_MAX_BLOCKS 1024u

/* Memset or copy step st as a launch of graphd's fill or copy kernel on
 * addr[slot]: its parameters in (*buf, *kp), made on first use, and the
 * launch in *k. -1 when there is no such kernel or no memory. */
static int util_params(gd_device *d, const gd_step *st, const uint64_t *addr, uint8_t **buf,
                       void ***kp, gd_kernel_desc *k) {
  bool fill = st->kind == GD_STEP_MEMSET;
  void *fn = util_fn(d, fill ? GD_UTIL_FILL : GD_UTIL_COPY);
  if (!fn) return -1;
  if (!*buf) {
    *buf = calloc(1, 24);
    *kp = calloc(4, sizeof **kp);
    if (!*buf || !*kp) {
      free(*buf);
      free(*kp);
      *buf = NULL;
      *kp = NULL;
      return -1;
    }
    (*kp)[0] = *buf;
    (*kp)[1] = *buf + 8;
    (*kp)[2] = *buf + 16;
    (*kp)[3] = *buf + 20; /* fill: u64 dst, u64 count, u32 value, u32 element size */
  }
  uint64_t bytes;
  if (fill) {
    const gd_memset *m = &st->u.memset;
    uint64_t dst = addr[m->slot] + m->offset, count = m->bytes / m->element_size;
    memcpy(*buf, &dst, 8);
    memcpy(*buf + 8, &count, 8);
    memcpy(*buf + 16, &m->value, 4);
    memcpy(*buf + 20, &m->element_size, 4);
    bytes = m->bytes;
  } else {
    const gd_copy *cp = &st->u.copy; /* copy: u64 dst, u64 src, u64 bytes */
    uint64_t dst = addr[cp->dst_slot] + cp->dst_offset, src = addr[cp->src_slot] + cp->src_offset;
    memcpy(*buf, &dst, 8);
    memcpy(*buf + 8, &src, 8);
    memcpy(*buf + 16, &cp->bytes, 8);
    bytes = cp->bytes;
  }
  /* A thread moves 16 bytes a pass where the memory allows. */
  uint64_t blocks = (bytes + 16u * UTIL_THREADS - 1) / (16u * UTIL_THREADS);
  blocks = blocks < 1 ? 1 : blocks > UTIL_MAX_BLOCKS ? UTIL_MAX_BLOCKS : blocks;
  *k = (gd_kernel_desc){.fn = fn,
                        .grid = {(uint32_t)blocks, 1, 1},
                        .block = {UTIL_THREADS, 1, 1},
                        .params = *kp,
                        .nparams = fill ? 4u : 3u};
  return 0;
}

static int add_steps(gd_device *d, gd_capture *c, gd_graph g, uint32_t first, uint32_t count,
                     const gd_node *deps0, size_t ndeps0, gd_node *last, char *err, size_t errlen);

/* Adds conditional step i (a loop or a branch) to g after deps: the node,
 * then its bodies, built like the rest. */
static int add_cond(gd_device *d, gd_capture *c, gd_graph g, uint32_t i, const gd_node *deps,
                    size_t ndeps, gd_node *node, char *err, size_t errlen) {
  const gd_step *st = &c->prog->program->steps[i];
  const gd_cond *cd = &st->u.cond;
  bool loop = st->kind == GD_STEP_WHILE;
  uint64_t word = c->slot_addr[cd->slot] + cd->offset;
  gd_graph bodies[2] = {NULL, NULL};
  uint64_t handle = 0;
  gd_node reader = NULL;
  char e[512];
  int rc = OPS->graph_add_conditional(BE, g, deps, ndeps, loop ? GD_COND_WHILE : GD_COND_IF, word,
                                      node, &reader, bodies, &handle, e, sizeof e);
  if (rc < 0) {
    snprintf(err, errlen, "step %u (%s): %s", i, loop ? "while" : "if", e);
    return rc;
  }
  c->nodes++;
  c->cond_handle[i] = handle;
  if (c->direct && c->direct[cd->slot]) {
    c->step_node[i] = reader;
    c->direct_nodes++;
  }
  gd_node body_last = NULL;
  if ((rc = add_steps(d, c, bodies[0], i + 1, cd->body, NULL, 0, &body_last, err, errlen)) < 0)
    return rc;
  if (!loop)
    return add_steps(d, c, bodies[1], i + 1 + cd->body, cd->orelse, NULL, 0, &body_last, err,
                     errlen);
  reader = NULL;
  rc = OPS->graph_close_loop(BE, bodies[0], body_last ? &body_last : NULL, body_last ? 1 : 0,
                             handle, word, &reader, e, sizeof e);
  if (rc < 0) snprintf(err, errlen, "step %u (while): %s", i, e);
  if (rc == 0 && c->direct && c->direct[cd->slot]) c->loop_reader[i] = reader;
  return rc;
}

/* Adds steps [first, first + count) to graph g as a chain after deps0;
 * *last gets the chain's last node (NULL when count is 0). */
static int add_steps(gd_device *d, gd_capture *c, gd_graph g, uint32_t first, uint32_t count,
                     const gd_node *deps0, size_t ndeps0, gd_node *last, char *err, size_t errlen) {
  const gd_program *p = c->prog->program;
  gd_node prev = NULL;
  for (uint32_t i = first; i < first + count;) {
    const gd_step *st = &p->steps[i];
    const gd_node *deps = prev ? &prev : deps0;
    size_t ndeps = prev ? 1 : ndeps0;
    gd_node node = NULL;
    char lbl[GD_MAX_NAME + 32], e[512];
    int rc;
    gd_step_label(st, lbl, sizeof lbl);
    if (st->kind == GD_STEP_WHILE || st->kind == GD_STEP_IF) {
      if ((rc = add_cond(d, c, g, i, deps, ndeps, &node, err, errlen)) < 0) return rc;
      prev = node;
      i += 1 + st->u.cond.body + st->u.cond.orelse;
      continue;
    }
    if (st->kind == GD_STEP_LAUNCH) {
      /* Its parameters: patches into staging, or at the bound buffers of
       * direct slots. */
      gd_kernel_desc k;
      if (launch_desc(d, c, i, c->slot_addr, &c->param_buf[i], &c->kparams[i], &k) < 0) {
        snprintf(err, errlen, "step %u (%s): internal error preparing the launch", i, lbl);
        return -GRAPHD_INTERNAL;
      }
      rc = OPS->graph_add_kernel(BE, g, deps, ndeps, &k, &node, e, sizeof e);
      if (rc == 0 && step_uses(c->direct, st)) { /* top level or inside a conditional body */
        c->step_node[i] = node;
        c->direct_nodes++;
      }
    } else if (util_direct(c, st)) {
      gd_kernel_desc k;
      if (util_params(d, st, c->slot_addr, &c->param_buf[i], &c->kparams[i], &k) < 0) {
        snprintf(err, errlen, "step %u (%s): internal error preparing graphd's kernel for it", i,
                 lbl);
        return -GRAPHD_INTERNAL;
      }
      rc = OPS->graph_add_kernel(BE, g, deps, ndeps, &k, &node, e, sizeof e);
      if (rc == 0) {
        c->step_node[i] = node;
        c->direct_nodes++;
      }
    } else if (st->kind == GD_STEP_MEMSET) {
      const gd_memset *m = &st->u.memset;
      rc = OPS->graph_add_memset(BE, g, deps, ndeps, c->slot_addr[m->slot] + m->offset,
                                 m->element_size, m->value, m->bytes / m->element_size, &node, e,
                                 sizeof e);
    } else {
      const gd_copy *cp = &st->u.copy;
      rc = OPS->graph_add_memcpy(BE, g, deps, ndeps, c->slot_addr[cp->dst_slot] + cp->dst_offset,
                                 c->slot_addr[cp->src_slot] + cp->src_offset, cp->bytes, &node, e,
                                 sizeof e);
    }
    if (rc < 0) {
      snprintf(err, errlen, "step %u (%s): %s", i, lbl, e);
      return rc;
    }
    prev = node;
    c->nodes++;
    i++;
  }
  *last = prev;
  return 0;
}

/* Whether p has a loop or a branch: its graph has a conditional node, and
 * the driver instantiates such a graph once at a time (CUDA answers
 * CUDA_ERROR_NOT_SUPPORTED to a second cuGraphInstantiateWithFlags), so
 * its one executable graph is re-pointed for every binding set. */
static bool has_conditional(const gd_program *p) {
  for (uint32_t i = 0; i < p->nsteps; i++)
    if (p->steps[i].kind == GD_STEP_WHILE || p->steps[i].kind == GD_STEP_IF) return true;
  return false;
}

/* One more executable graph of c, its copy nodes where the graph made them
 * point. */
static int add_exec(gd_device *d, gd_capture *c, gd_stream stream, char *err, size_t errlen) {
  uint32_t n = c->prog->program->nslots ? c->prog->program->nslots : 1;
  gd_exec *x = &c->execs[c->nexecs];
  memset(x, 0, sizeof *x);
  x->node_src = malloc(n * sizeof *x->node_src);
  x->node_dst = malloc(n * sizeof *x->node_dst);
  x->in_outside = calloc(n, sizeof *x->in_outside);
  x->out_outside = calloc(n, sizeof *x->out_outside);
  int rc = -GRAPHD_RESOURCE_EXHAUSTED;
  if (!x->node_src || !x->node_dst || !x->in_outside || !x->out_outside) {
    snprintf(err, errlen, "out of memory instantiating a graph");
    goto fail;
  }
  memcpy(x->node_src, c->built_src, n * sizeof *x->node_src);
  memcpy(x->node_dst, c->built_dst, n * sizeof *x->node_dst);
  if (c->direct) {
    uint32_t nsteps = c->prog->program->nsteps;
    x->direct_addr = malloc(n * sizeof *x->direct_addr);
    x->param_buf = calloc(nsteps, sizeof *x->param_buf);
    x->kparams = calloc(nsteps, sizeof *x->kparams);
    if (!x->direct_addr || !x->param_buf || !x->kparams) {
      snprintf(err, errlen, "out of memory instantiating a graph");
      goto fail;
    }
    memcpy(x->direct_addr, c->built_direct, n * sizeof *x->direct_addr);
  }
  if ((rc = OPS->graph_instantiate(BE, c->graph, stream, &x->exec, err, errlen)) < 0) goto fail;
  c->nexecs++;
  return 0;
fail:
  free(x->node_src);
  free(x->node_dst);
  free(x->in_outside);
  free(x->out_outside);
  free(x->direct_addr);
  free(x->param_buf);
  free(x->kparams);
  memset(x, 0, sizeof *x);
  return rc;
}

/* Builds the graph explicitly from the steps: in staged mode the copy-in
 * nodes are roots, the steps form a chain (a loop or a branch is one node
 * of it, its bodies chains of their own), and the copy-out nodes follow
 * the last step; every node handle is kept. */
static int build_graph(gd_device *d, gd_capture *c, const gd_bound *bind, gd_stream stream,
                       char *err, size_t errlen) {
  const gd_program *p = c->prog->program;
  int rc;
  uint32_t n = p->nslots;
  gd_node *roots = calloc(n ? n : 1, sizeof *roots);
  size_t nroots = 0;
  c->in_node = calloc(n ? n : 1, sizeof *c->in_node);
  c->out_node = calloc(n ? n : 1, sizeof *c->out_node);
  c->built_src = calloc(n ? n : 1, sizeof *c->built_src); /* copy-in source per slot */
  c->built_dst = calloc(n ? n : 1, sizeof *c->built_dst); /* copy-out target per slot */
  c->param_buf = calloc(p->nsteps, sizeof *c->param_buf);
  c->kparams = calloc(p->nsteps, sizeof *c->kparams);
  if (!roots || !c->in_node || !c->out_node || !c->built_src || !c->built_dst || !c->param_buf ||
      !c->kparams) {
    free(roots);
    snprintf(err, errlen, "out of memory building a graph");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  if ((rc = OPS->graph_create(BE, &c->graph, err, errlen)) < 0) goto exit;
  c->step_node = calloc(p->nsteps, sizeof *c->step_node);
  c->loop_reader = calloc(p->nsteps, sizeof *c->loop_reader);
  c->cond_handle = calloc(p->nsteps, sizeof *c->cond_handle);
  if (!c->step_node || !c->loop_reader || !c->cond_handle) {
    free(roots);
    snprintf(err, errlen, "out of memory building a graph");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  if (c->mode == GD_MODE_STAGED) {
    for (uint32_t s = 0; s < n; s++) {
      const gd_slot *sl = &p->slots[s];
      if (!slot_is_in(sl) || !staged(sl)) continue;
      rc = OPS->graph_add_memcpy(BE, c->graph, NULL, 0, c->slot_addr[s], bind[s].addr, sl->size,
                                 &c->in_node[s], err, errlen);
      if (rc < 0) goto exit;
      c->built_src[s] = bind[s].addr;
      c->nodes++;
      roots[nroots++] = c->in_node[s];
    }
  }
  gd_node prev = NULL;
  if ((rc = add_steps(d, c, c->graph, 0, p->nsteps, roots, nroots, &prev, err, errlen)) < 0)
    goto exit;
  if (c->mode == GD_MODE_STAGED) {
    for (uint32_t s = 0; s < n; s++) {
      const gd_slot *sl = &p->slots[s];
      if (!slot_is_out(sl) || !staged(sl)) continue;
      rc = OPS->graph_add_memcpy(BE, c->graph, &prev, 1, bind[s].addr, c->slot_addr[s], sl->size,
                                 &c->out_node[s], err, errlen);
      if (rc < 0) goto exit;
      c->built_dst[s] = bind[s].addr;
      c->nodes++;
    }
  }
  rc = add_exec(d, c, stream, err, errlen);
exit:
  free(roots);
  return rc;
}

/* Bound bytes per kernel node to re-point above which auto mode goes
 * direct: below it, copying the slots costs less than giving the nodes new
 * parameters when the buffers move. Auto also goes direct when the slots
 * outnumber those nodes: staging them takes a copy node per slot and way,
 * more nodes to run and, when the buffers move, to re-point than direct
 * mode's kernel nodes (MJX's step: 325 slots over about 80 launches; a
 * graph with a conditional node cannot be instantiated twice, so the
 * instance kept per binding set is not there to spare the re-pointing). */
#define AUTO_DIRECT_BYTES_PER_NODE (64u << 10)

/* Which staged slots direct mode binds straight into the kernels: every
 * bound one a launch uses, at the top level or inside a loop or branch
 * (a kernel node of a conditional body takes new parameters in the
 * executable graph as a top-level one does), one a memset or copy step
 * uses (the step then runs as graphd's fill or copy kernel; where the
 * backend has none, such a slot stays staged), and the slot of a loop's
 * or branch's condition word (the nodes that read the word take its new
 * address as a kernel does). For auto, whether that is worth it. Sets
 * c->mode. */
static int choose_mode(gd_device *d, gd_capture *c, const gd_bound *bind, char *err,
                       size_t errlen) {
  const gd_program *p = c->prog->program;
  c->mode = p->mode == GD_MODE_STAGED_EX ? GD_MODE_STAGED_EX : GD_MODE_STAGED;
  if (p->mode != GD_MODE_DIRECT && p->mode != GD_MODE_AUTO) return 0;
  uint32_t n = p->nslots ? p->nslots : 1;
  bool *direct = calloc(n, sizeof *direct);
  uint64_t *addr = calloc(n, sizeof *addr);
  if (!direct || !addr) {
    free(direct);
    free(addr);
    snprintf(err, errlen, "out of memory");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  for (uint32_t s = 0; s < p->nslots; s++)
    direct[s] = staged(&p->slots[s]) && !gd_role_owned(p->slots[s].role) && bind[s].bound;
  bool util = false;
  for (uint32_t i = 0; i < p->nsteps && !util; i++)
    util = p->steps[i].kind == GD_STEP_MEMSET || p->steps[i].kind == GD_STEP_COPY;
  util = util && util_fn(d, GD_UTIL_FILL) && util_fn(d, GD_UTIL_COPY);
  for (uint32_t i = 0; i < p->nsteps; i++) {
    const gd_step *st = &p->steps[i];
    if (st->kind == GD_STEP_MEMSET && !util) {
      direct[st->u.memset.slot] = false;
    } else if (st->kind == GD_STEP_COPY && !util) {
      direct[st->u.copy.src_slot] = direct[st->u.copy.dst_slot] = false;
    }
  }
  uint64_t bytes = 0;
  uint32_t nodes = 0, nd = 0;
  for (uint32_t s = 0; s < p->nslots; s++) {
    if (direct[s]) bytes += p->slots[s].size;
    nd += direct[s];
    addr[s] = bind[s].addr;
  }
  for (uint32_t i = 0; i < p->nsteps; i++) nodes += step_uses(direct, &p->steps[i]);
  if (p->mode == GD_MODE_AUTO &&
      (bytes == 0 || (bytes < (uint64_t)nodes * AUTO_DIRECT_BYTES_PER_NODE && nd <= nodes))) {
    free(direct);
    free(addr);
    return 0; /* staged */
  }
  c->mode = GD_MODE_DIRECT;
  c->direct = direct;
  c->built_direct = addr;
  return 0;
}

int capture_check_unstaged(const gd_regprog *prog, const gd_bound *bind, char *err, size_t errlen) {
  const gd_program *p = prog->program;
  for (uint32_t s = 0; s < p->nslots; s++) {
    const gd_slot *sl = &p->slots[s];
    if (slot_is_in(sl) && !staged(sl) && !bind[s].bound) {
      snprintf(err, errlen,
               "slot %u is an unstaged %s: bind it on the replay that captures (this one), "
               "which copies it once",
               s, sl->role == GD_ROLE_INPUT ? "input" : "inout");
      return -GRAPHD_INVALID_ARGUMENT;
    }
  }
  return 0;
}

int capture_build(gd_device *d, const gd_regprog *prog, const gd_bound *bind, gd_stream stream,
                  gd_capture **out, char *err, size_t errlen) {
  gd_capture *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  c->prog = prog;
  int rc = choose_mode(d, c, bind, err, errlen);
  if (rc == 0) rc = place_slots(d, c, err, errlen);
  if (rc == 0) rc = build_graph(d, c, bind, stream, err, errlen);
  if (rc == 0 && has_conditional(prog->program)) {
    char hex[2 * GD_ID_LEN + 1];
    gd_id_hex(prog->id, 1, hex);
    GD_LOG(GD_DEBUG, "capture",
           "program %s has a loop or a branch: one executable graph (a graph with a conditional "
           "node is instantiated once), re-pointed for other binding sets",
           hex);
  }
  if (rc == 0) {
    rc = OPS->event_create(BE, &c->last_use, err, errlen);
    c->has_event = rc == 0;
  }
  c->stateful = keeps_state(prog->program); /* asked once, not per replay */
  c->fresh = true;
  if (rc < 0) {
    capture_free(d, c);
    return rc;
  }
  *out = c;
  return 0;
}

/* Points a copy node at this replay's memory; a node the backend cannot
 * point there is left off (*outside) and the caller copies outside. */
static int repoint(gd_device *d, gd_capture *c, gd_exec *x, gd_node n, bool *outside, uint64_t *now,
                   uint64_t want, uint64_t dst, uint64_t src, uint64_t bytes, char *err,
                   size_t errlen) {
  /* Already pointing there (a loop over the same buffers): nothing to do. */
  if (!*outside && *now == want) return 0;
  c->repoints++;
  int rc = OPS->graph_exec_repoint_memcpy(BE, x->exec, n, dst, src, bytes, outside, err, errlen);
  if (rc == 0 && !*outside) *now = want;
  return rc;
}

/* Whether x's copy nodes all point at this replay's memory already. */
static bool points_at(const gd_capture *c, const gd_exec *x, const gd_bound *bind) {
  for (uint32_t s = 0; s < c->prog->program->nslots; s++) {
    if (c->direct && c->direct[s] && x->direct_addr[s] != bind[s].addr) return false;
    if (c->in_node[s] && (x->in_outside[s] || x->node_src[s] != bind[s].addr)) return false;
    if (c->out_node[s] && (x->out_outside[s] || x->node_dst[s] != bind[s].addr)) return false;
  }
  return true;
}

/* A key for a binding set (FNV-1a over the bound addresses). */
static uint64_t bind_key(const gd_capture *c, const gd_bound *bind) {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t s = 0; s < c->prog->program->nslots; s++) {
    h ^= bind[s].addr;
    h *= 1099511628211ull;
  }
  return h;
}

/* The executable graph for this replay: one already pointing at its
 * memory; else, for a binding set seen lately (it comes back: a loop over
 * a few sets of buffers), a new one while there is room (never for a graph
 * with a conditional node: that is the expected path, not a failure, and
 * says nothing); else the least recently used, to be re-pointed. */
static int pick_exec(gd_device *d, gd_capture *c, gd_stream st, const gd_bound *bind, gd_exec **out,
                     char *err, size_t errlen) {
  gd_exec *lru = &c->execs[0];
  for (uint32_t i = 0; i < c->nexecs; i++) {
    gd_exec *x = &c->execs[i];
    if (points_at(c, x, bind)) {
      *out = x;
      return 0;
    }
    if (x->used_ns < lru->used_ns) lru = x;
  }
  uint64_t key = bind_key(c, bind);
  bool back = false;
  for (uint32_t i = 0; i < GD_CAPTURE_RECENT && !back; i++) back = c->recent[i] == key;
  c->recent[c->recent_next++ % GD_CAPTURE_RECENT] = key;
  if (back && c->nexecs < GD_CAPTURE_EXECS && !has_conditional(c->prog->program)) {
    if (c->template_stale) {
      char hex[2 * GD_ID_LEN + 1];
      gd_id_hex(c->prog->id, 1, hex);
      GD_LOG(GD_DEBUG, "capture",
             "program %s: its graph points at memory unmapped since; re-pointing an executable "
             "graph instead of instantiating another",
             hex);
    } else if (add_exec(d, c, st, err, errlen) == 0) {
      *out = &c->execs[c->nexecs - 1];
      return 0;
    } else {
      GD_LOG(GD_WARN, "capture", "another instance of a graph: %s; re-pointing one instead", err);
    }
  }
  *out = lru;
  return 0;
}

static int copy(gd_device *d, uint64_t dst, uint64_t src, uint64_t bytes, gd_stream s, char *err,
                size_t errlen) {
  return OPS->memcpy_async(BE, dst, src, bytes, s, err, errlen);
}

/* Direct mode: gives x's kernel nodes (launches, and graphd's fill and
 * copy kernels for memset and copy steps) that use a moved direct slot
 * their new parameters. */
static int repoint_direct(gd_device *d, gd_capture *c, gd_exec *x, const gd_bound *bind, char *err,
                          size_t errlen) {
  const gd_program *p = c->prog->program;
  bool any = false;
  for (uint32_t s = 0; s < p->nslots && !any; s++)
    any = c->direct[s] && x->direct_addr[s] != bind[s].addr;
  if (!any) return 0;
  /* Where each slot is now (the bound buffer for direct slots, staging for
   * the rest), and which have moved. */
  uint32_t n = p->nslots ? p->nslots : 1;
  uint64_t *addr = malloc(n * sizeof *addr);
  bool *moved = malloc(n * sizeof *moved);
  if (!addr || !moved) {
    free(addr);
    free(moved);
    snprintf(err, errlen, "out of memory");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  for (uint32_t s = 0; s < p->nslots; s++) {
    addr[s] = c->direct[s] ? bind[s].addr : c->slot_addr[s];
    moved[s] = c->direct[s] && x->direct_addr[s] != bind[s].addr;
  }
  int rc = 0;
  for (uint32_t i = 0; i < p->nsteps && rc == 0; i++) {
    const gd_step *st = &p->steps[i];
    if (!c->step_node[i] || !step_uses(moved, st)) continue;
    char e[256], lbl[GD_MAX_NAME + 32];
    if (st->kind == GD_STEP_WHILE || st->kind == GD_STEP_IF) {
      uint64_t word = addr[st->u.cond.slot] + st->u.cond.offset;
      rc = OPS->graph_exec_condition_word(BE, x->exec, c->step_node[i], c->cond_handle[i], word, e,
                                          sizeof e);
      if (rc == 0 && c->loop_reader[i])
        rc = OPS->graph_exec_condition_word(BE, x->exec, c->loop_reader[i], c->cond_handle[i], word,
                                            e, sizeof e);
      if (rc < 0)
        snprintf(err, errlen, "step %u (%s): re-pointing its condition: %s", i,
                 gd_step_label(st, lbl, sizeof lbl), e);
      c->repoints++;
      continue;
    }
    gd_kernel_desc k;
    int made = st->kind == GD_STEP_LAUNCH
                   ? launch_desc(d, c, i, addr, &x->param_buf[i], &x->kparams[i], &k)
                   : util_params(d, st, addr, &x->param_buf[i], &x->kparams[i], &k);
    if (made < 0) {
      snprintf(err, errlen, "out of memory");
      rc = -GRAPHD_RESOURCE_EXHAUSTED;
      break;
    }
    rc = OPS->graph_exec_kernel_params(BE, x->exec, c->step_node[i], &k, e, sizeof e);
    if (rc < 0)
      snprintf(err, errlen, "step %u (%s): re-pointing: %s", i, gd_step_label(st, lbl, sizeof lbl),
               e);
    c->repoints++;
  }
  if (rc == 0)
    for (uint32_t s = 0; s < p->nslots; s++)
      if (c->direct[s]) x->direct_addr[s] = bind[s].addr;
  free(addr);
  free(moved);
  return rc;
}

/* Queues one replay on instance c (see capture_enqueue), for a process of
 * user uid. */
static int enqueue_on(gd_device *d, gd_capture *c, gd_stream st, const gd_bound *bind, bool first,
                      uint32_t uid, char *err, size_t errlen) {
  const gd_program *p = c->prog->program;
  int rc;
  /* The last replay of this instance, from any session, is done with the
   * staging buffers (on the same stream, order is already given). */
  if (c->queued && c->last_stream != st &&
      (rc = OPS->stream_wait_event(BE, st, c->last_use, err, errlen)) < 0)
    return rc;
  /* What the daemon keeps for a session is never seen by another: a new
   * instance, or one that passes to another session, starts with its
   * state and temporaries zeroed (as CUDA gives a process zeroed memory);
   * one that passes to another user has its temporaries zeroed. */
  if ((c->fresh || (c->queued && c->last_uid != uid)) &&
      (rc = zero_owned(d, c, st, !c->fresh, err, errlen)) < 0)
    return rc;
  c->fresh = false;
  c->last_uid = uid;
  int timed = d->caps ? gpu_sample_begin(d, &d->caps->gpu, st) : -1;
  if (first) {
    for (uint32_t s = 0; s < p->nslots; s++) {
      const gd_slot *sl = &p->slots[s];
      if (slot_is_in(sl) && !staged(sl) &&
          (rc = copy(d, c->slot_addr[s], bind[s].addr, sl->size, st, err, errlen)) < 0)
        return rc;
    }
  }
  gd_exec *x = &c->execs[0];
  if (c->mode == GD_MODE_STAGED) {
    if ((rc = pick_exec(d, c, st, bind, &x, err, errlen)) < 0) return rc;
    for (uint32_t s = 0; s < p->nslots; s++) {
      const gd_slot *sl = &p->slots[s];
      if (!staged(sl)) continue;
      if (c->in_node[s] &&
          (rc = repoint(d, c, x, c->in_node[s], &x->in_outside[s], &x->node_src[s], bind[s].addr,
                        c->slot_addr[s], bind[s].addr, sl->size, err, errlen)) < 0)
        return rc;
      if (c->out_node[s] &&
          (rc = repoint(d, c, x, c->out_node[s], &x->out_outside[s], &x->node_dst[s], bind[s].addr,
                        bind[s].addr, c->slot_addr[s], sl->size, err, errlen)) < 0)
        return rc;
      if (c->in_node[s] && x->in_outside[s] &&
          (rc = copy(d, c->slot_addr[s], bind[s].addr, sl->size, st, err, errlen)) < 0)
        return rc;
    }
    if ((rc = launch(d, x->exec, st, err, errlen)) < 0) return rc;
    for (uint32_t s = 0; s < p->nslots; s++) {
      const gd_slot *sl = &p->slots[s];
      if (c->out_node[s] && x->out_outside[s] &&
          (rc = copy(d, bind[s].addr, c->slot_addr[s], sl->size, st, err, errlen)) < 0)
        return rc;
    }
  } else {
    /* staged_ex, and direct mode's slots that stay staged */
    if (c->mode == GD_MODE_DIRECT) {
      if ((rc = pick_exec(d, c, st, bind, &x, err, errlen)) < 0 ||
          (rc = repoint_direct(d, c, x, bind, err, errlen)) < 0)
        return rc;
    }
    for (uint32_t s = 0; s < p->nslots; s++) {
      const gd_slot *sl = &p->slots[s];
      if (slot_is_in(sl) && staged(sl) && !(c->direct && c->direct[s]) &&
          (rc = copy(d, c->slot_addr[s], bind[s].addr, sl->size, st, err, errlen)) < 0)
        return rc;
    }
    if ((rc = launch(d, x->exec, st, err, errlen)) < 0) return rc;
    for (uint32_t s = 0; s < p->nslots; s++) {
      const gd_slot *sl = &p->slots[s];
      if (slot_is_out(sl) && staged(sl) && !(c->direct && c->direct[s]) &&
          (rc = copy(d, bind[s].addr, c->slot_addr[s], sl->size, st, err, errlen)) < 0)
        return rc;
    }
  }
  /* Later replays of this instance wait for this one. */
  if ((rc = OPS->event_record(BE, c->last_use, st, err, errlen)) < 0) return rc;
  c->last_stream = st;
  c->queued++;
  c->last_queued_ns = gd_now_ns();
  if (timed >= 0) gpu_sample_end(d, &d->caps->gpu, st, timed);
  x->used_ns = c->last_queued_ns;
  return 0;
}

static gd_capture *instance(gd_capture *c, uint32_t i) { return i ? c->more[i - 1] : c; }

uint32_t capture_instances(const gd_capture *c) { return 1 + c->nmore; }

uint32_t capture_graphs(const gd_capture *c) {
  uint32_t n = c->nexecs;
  for (uint32_t i = 0; i < c->nmore; i++) n += c->more[i]->nexecs;
  return n;
}

void capture_count(gd_device *d, uint64_t *instances, uint64_t *graphs) {
  gd_capture *c;
  *instances = *graphs = 0;
  for (uint32_t i = 0; (c = capture_next(d, &i));) {
    *instances += capture_instances(c);
    *graphs += capture_graphs(c);
  }
}

uint64_t capture_held_bytes(gd_device *d, const gd_capture *except) {
  uint64_t held = 0;
  gd_capture *c;
  for (uint32_t i = 0; (c = capture_next(d, &i));)
    if (c != except) held += capture_staging_bytes(c);
  return held;
}

uint64_t capture_staging_bytes(const gd_capture *c) {
  uint64_t b = c->staging.bytes;
  for (uint32_t i = 0; i < c->nmore; i++) b += c->more[i]->staging.bytes;
  return b;
}

static bool busy(gd_device *d, const gd_capture *x) {
  return x->has_event && x->queued && !OPS->event_done(BE, x->last_use);
}

/* Copies the unstaged inputs into n, a new instance of c, on st: from this
 * replay's bindings where it binds them, else from c's staging, which
 * holds them since c was built. */
static int copy_unstaged(gd_device *d, gd_capture *c, gd_capture *n, gd_stream st,
                         const gd_bound *bind, char *err, size_t errlen) {
  const gd_program *p = c->prog->program;
  bool waited = false;
  for (uint32_t s = 0; s < p->nslots; s++) {
    const gd_slot *sl = &p->slots[s];
    if (!slot_is_in(sl) || staged(sl)) continue;
    int rc = 0;
    if (!bind[s].bound && !waited && c->queued && c->last_stream != st) {
      rc = OPS->stream_wait_event(BE, st, c->last_use, err, errlen);
      waited = true;
    }
    if (rc == 0)
      rc = copy(d, n->slot_addr[s], bind[s].bound ? bind[s].addr : c->slot_addr[s], sl->size, st,
                err, errlen);
    if (rc < 0) return rc;
  }
  return 0;
}

#define SHARE_USERS 64 /* users told apart when counting shares of the budget */

/* Whether user uid may build an instance of `bytes` within its fair share
 * of the device's budget (share.h), counting each instance's staging to
 * the user it was built for. *share gets the share. */
static bool within_share(gd_device *d, uint32_t uid, uint64_t bytes, uint64_t *share) {
  uint32_t users[SHARE_USERS], nusers = 0;
  uint64_t held = 0, mine = 0;
  gd_capture *c;
  for (uint32_t i = 0; (c = capture_next(d, &i));)
    for (uint32_t k = 0; k <= c->nmore; k++) {
      const gd_capture *x = instance(c, k);
      held += x->staging.bytes;
      if (x->uid == uid) mine += x->staging.bytes;
      uint32_t u = 0;
      while (u < nusers && users[u] != x->uid) u++;
      if (u == nusers && nusers < SHARE_USERS) users[nusers++] = x->uid;
    }
  gd_share_ask a = {.bound = d->budget,
                    .held = held,
                    .users = nusers,
                    .mine = mine,
                    .more = bytes,
                    .grows = bytes};
  return gd_share_check(&a, share) == GD_SHARE_OK;
}

/* Another instance of c for stream st, for user uid, or NULL: then, for a
 * program that keeps no state, no more are tried when one could not be
 * built or would not fit the budget; a user past its fair share of the
 * budget gets none, and its streams share the instances there are. */
static gd_capture *add_instance(gd_device *d, gd_capture *c, gd_stream st, const gd_bound *bind,
                                uint32_t uid) {
  char hex[2 * GD_ID_LEN + 1], err[256];
  gd_id_hex(c->prog->id, 1, hex);
  uint64_t share;
  if (d->budget && d->fair_shares && !c->stateful &&
      !within_share(d, uid, c->staging.bytes, &share)) {
    GD_LOG(GD_DEBUG, "capture",
           "program %s: uid %u is past its fair share of device %d's budget (%llu bytes of "
           "--device-budget %llu): its streams share the instances there are",
           hex, uid, d->index, (unsigned long long)share, (unsigned long long)d->budget);
    return NULL;
  }
  if (d->budget) {
    uint64_t held = capture_held_bytes(d, NULL);
    if (held + c->staging.bytes > d->budget)
      held -= capture_trim(d, held + c->staging.bytes - d->budget, c);
    if (held + c->staging.bytes > d->budget) {
      GD_LOG(GD_INFO, "capture",
             "program %s: no further instance: device %d's budget (--device-budget) has no "
             "room; %s",
             hex, d->index,
             c->stateful ? "a session that needs one for its state is refused"
                         : "its replays share the instances it has");
      c->no_more = !c->stateful;
      return NULL;
    }
  }
  gd_capture *n = NULL;
  if (capture_build(d, c->prog, bind, st, &n, err, sizeof err) < 0 || n->mode != c->mode ||
      copy_unstaged(d, c, n, st, bind, err, sizeof err) < 0) {
    GD_LOG(GD_WARN, "capture", "program %s: another instance: %s; %s", hex,
           n && n->mode != c->mode ? "it would run another way" : err,
           c->stateful ? "a session that needs one for its state is refused"
                       : "its replays share the instances it has");
    capture_free(d, n);
    c->no_more = !c->stateful;
    return NULL;
  }
  n->generation = c->generation;
  n->created_unix_ms = c->created_unix_ms;
  n->uid = uid;
  c->more[c->nmore++] = n;
  GD_LOG(GD_INFO, "capture", "program %s: instance %u, for %s (%llu staging bytes)", hex,
         capture_instances(c),
         c->stateful ? "another session's state" : "another stream replaying it at once",
         (unsigned long long)n->staging.bytes);
  return n;
}

/* The instance of c a replay on st goes to, for a program that keeps no
 * state (see capture_enqueue). */
static gd_capture *pick_instance(gd_device *d, gd_capture *c, gd_stream st, const gd_bound *bind,
                                 uint32_t uid) {
  if (!c->nmore && c->no_more) return c; /* one, and no more to come: no driver query */
  gd_capture *lru = c;
  for (uint32_t i = 0; i <= c->nmore; i++) {
    gd_capture *x = instance(c, i);
    if (x->last_stream == st && x->queued) return x;
    if (x->last_queued_ns < lru->last_queued_ns) lru = x;
  }
  for (uint32_t i = 0; i <= c->nmore; i++)
    if (!busy(d, instance(c, i))) return instance(c, i);
  if (c->nmore + 1 < GD_CAPTURE_INSTANCES && !c->no_more) {
    gd_capture *n = add_instance(d, c, st, bind, uid);
    if (n) return n;
  }
  return lru;
}

/* The instance that holds session's state of c: its own, else one no
 * session holds (zeroed before it runs), else a new one; NULL when none can
 * be had. */
static gd_capture *session_instance(gd_device *d, gd_capture *c, uint64_t session, gd_stream st,
                                    const gd_bound *bind, uint32_t uid) {
  gd_capture *unheld = NULL;
  for (uint32_t i = 0; i <= c->nmore; i++) {
    gd_capture *x = instance(c, i);
    if (x->owner == session) return x;
    if (!x->owner && !unheld) unheld = x;
  }
  gd_capture *x = unheld;
  if (!x && c->nmore + 1 < GD_CAPTURE_INSTANCES) x = add_instance(d, c, st, bind, uid);
  if (!x) return NULL;
  x->owner = session;
  x->fresh = true;
  return x;
}

/* uid joins c's users, who decide who may evict it: every one is kept,
 * however many processes replayed it. Without memory for another, c is
 * marked so that only an admin may evict it. */
static void add_user(gd_capture *c, uint32_t uid) {
  for (uint32_t k = 0; k < c->nusers; k++)
    if (c->users[k] == uid) return;
  if (c->nusers == c->users_cap) {
    uint32_t cap = c->users_cap ? 2 * c->users_cap : 4;
    uint32_t *n = realloc(c->users, cap * sizeof *n);
    if (!n) {
      c->users_lost = true;
      return;
    }
    c->users = n;
    c->users_cap = cap;
  }
  c->users[c->nusers++] = uid;
}

int capture_enqueue(gd_device *d, gd_capture *c, gd_stream st, const gd_bound *bind, bool first,
                    uint32_t pid, uint32_t uid, uint64_t session, gd_capture **used, char *err,
                    size_t errlen) {
  gd_capture *x = c->stateful ? session_instance(d, c, session, st, bind, uid)
                              : pick_instance(d, c, st, bind, uid);
  if (used) *used = x;
  if (!x) {
    char hex[2 * GD_ID_LEN + 1];
    gd_id_hex(c->prog->id, 1, hex);
    snprintf(err, errlen,
             "program %s keeps state (scratch slots), which each session has apart, and device "
             "%d has no room for this session's instance (%u sessions hold one; "
             "--device-budget)",
             hex, d->index, capture_instances(c));
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  uint64_t t0 = gd_now_ns();
  int rc = enqueue_on(d, x, st, bind, first && x == c, uid, err, errlen);
  if (rc < 0) return rc;
  /* A mean over the last eight or so, each replay's time counted as at
   * most four times the mean: a worker preempted in a launch, or the
   * first replay of an instance (its zeroing, its unstaged inputs), moves
   * it by three eighths at most, while a program that really costs more raises it
   * by more than a third a replay. */
  uint64_t took = gd_now_ns() - t0, q = c->queue_ns;
  if (q && took > 4 * q) took = 4 * q;
  c->queue_ns = q ? q - q / 8 + took / 8 : (took ? took : 1);
  c->replays++;
  c->last_queued_ns = x->last_queued_ns;
  uint32_t k = 0;
  while (k < c->npids && (c->pids[k] != pid || c->pid_uids[k] != uid)) k++;
  if (k == c->npids && c->npids < GD_CAPTURE_PIDS) {
    c->pids[c->npids] = pid;
    c->pid_uids[c->npids++] = uid;
  }
  add_user(c, uid);
  return 0;
}

void capture_release_session(gd_device *d, uint64_t session) {
  gd_capture *c;
  for (uint32_t i = 0; (c = capture_next(d, &i));)
    for (uint32_t k = 0; c->stateful && k <= c->nmore; k++)
      if (instance(c, k)->owner == session) instance(c, k)->owner = 0;
}

/* Frees extra instance k of c (not the first), after its last replay. */
static uint64_t drop_instance(gd_device *d, gd_capture *c, uint32_t k) {
  gd_capture *x = c->more[k];
  uint64_t bytes = x->staging.bytes;
  holwatch_drop_key(d, x);
  capture_free(d, x);
  c->more[k] = c->more[--c->nmore];
  c->no_more = false; /* room again: more may be built when wanted */
  return bytes;
}

uint64_t capture_trim(gd_device *d, uint64_t want, const gd_capture *keep) {
  uint64_t freed = 0;
  while (freed < want) {
    gd_capture *c, *best = NULL;
    uint32_t best_k = 0;
    uint64_t best_ns = UINT64_MAX;
    for (uint32_t i = 0; (c = capture_next(d, &i));)
      for (uint32_t k = 0; c != keep && k < c->nmore; k++) {
        const gd_capture *x = c->more[k];
        if (x->owner || busy(d, x) || x->last_queued_ns >= best_ns) continue;
        best = c;
        best_k = k;
        best_ns = x->last_queued_ns;
      }
    if (!best) break;
    freed += drop_instance(d, best, best_k);
  }
  if (d->caps) d->caps->trimmed += freed;
  return freed;
}

/* Whether c's graph has a copy node made to point into [ptr, ptr + bytes). */
static bool points_into(const gd_capture *c, uint64_t ptr, uint64_t bytes) {
  for (uint32_t s = 0; s < c->prog->program->nslots; s++) {
    uint64_t a[2] = {c->in_node[s] ? c->built_src[s] : 0, c->out_node[s] ? c->built_dst[s] : 0};
    for (int k = 0; k < 2; k++)
      if (a[k] && a[k] >= ptr && a[k] - ptr < bytes) return true;
  }
  return false;
}

void capture_forget_memory(gd_device *d, uint64_t ptr, uint64_t bytes) {
  gd_capture *c;
  for (uint32_t i = 0; (c = capture_next(d, &i));)
    for (uint32_t k = 0; k <= c->nmore; k++) {
      gd_capture *x = instance(c, k);
      if (!x->template_stale && points_into(x, ptr, bytes)) x->template_stale = true;
    }
}

bool capture_busy(gd_device *d, const gd_capture *c) {
  if (busy(d, c)) return true;
  for (uint32_t i = 0; i < c->nmore; i++)
    if (busy(d, c->more[i])) return true;
  return false;
}

bool capture_any_busy(gd_device *d) {
  gd_capture *c;
  for (uint32_t i = 0; (c = capture_next(d, &i));)
    if (capture_busy(d, c)) return true;
  return false;
}

void capture_drop(gd_device *d, gd_capture *c) {
  for (uint32_t i = 0; i <= c->nmore; i++) {
    gd_capture *x = instance(c, i);
    /* A replay of it that waits for a ready write that does not come is
     * cut off after the ready timeout, rather than holding the worker. */
    if (x->has_event) holwatch_wait_event(d, x->last_use);
    holwatch_drop_key(d, x);
  }
  const gd_regprog *prog = c->prog;
  capture_remove(d, c);
  capture_free(d, c);
  for (uint32_t st = 0; st < prog->program->nsteps; st++) {
    const gd_module *m = prog->step_module[st];
    if (!m) continue;
    bool used = false;
    gd_capture *o;
    for (uint32_t j = 0; !used && (o = capture_next(d, &j));)
      for (uint32_t k = 0; k < o->prog->program->nsteps && !used; k++)
        used = o->prog->step_module[k] == m;
    if (!used) modcache_release_module(d, m);
  }
}

bool capture_forget_program(gd_device *d, const gd_regprog *p, uint64_t *staging_bytes) {
  gd_capture *c = capture_find(d, p);
  *staging_bytes = c ? capture_staging_bytes(c) : 0;
  if (c) capture_drop(d, c);
  if (d->caps && p->index < d->caps->n) d->caps->ever[p->index] = 0;
  modcache_forget_program(d, p);
  return c != NULL;
}

void capture_close_all(gd_device *d) {
  gd_capture_set *cs = d->caps;
  if (!cs) return;
  for (uint32_t i = 0; i < cs->n; i++) capture_free(d, cs->caps[i]);
  gpu_sample_free(d, &cs->gpu);
  free(cs->caps);
  free(cs->ever);
  free(cs);
  d->caps = NULL;
}
