/* libgraphd: listing and evicting captures. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void copy_info(graphd_capture_info *ci, const Graphd__Wire__CaptureInfo *w) {
  if (w->program_id.len == 32) memcpy(ci->program_id, w->program_id.data, 32);
  ci->device = w->device;
  ci->mode = w->mode;
  ci->staging_bytes = w->staging_bytes;
  ci->nodes = w->nodes;
  ci->replays = w->replays;
  ci->idle_ms = w->idle_ms;
  ci->generation = w->generation;
  ci->created_unix_ms = w->created_unix_ms;
  ci->repoints = w->repoints;
  ci->graphs = w->graphs;
  ci->npids = (uint32_t)(w->n_pids < 16 ? w->n_pids : 16);
  memcpy(ci->pids, w->pids, ci->npids * sizeof(uint32_t));
  ci->busy = w->busy;
}

/* The smallest record size a caller may pass: the record's first two
 * members. */
#define RECORD_MIN offsetof(graphd_capture_record, info)

/* The captures of a reply: an array of 0.1.0's infos (size 0), or of
 * records of `size` bytes each, filled up to what both sides know. */
static graphd_status copy_captures(graphd_client *c, Graphd__Wire__CaptureInfo **w, size_t n,
                                   size_t size, void **out, size_t *nout) {
  *out = NULL;
  *nout = 0;
  if (!n) return GRAPHD_OK;
  size_t stride = size ? size : sizeof(graphd_capture_info);
  char *a = calloc(n, stride);
  if (!a) return gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < n; i++) {
    if (!size) {
      copy_info((graphd_capture_info *)(void *)(a + i * stride), w[i]);
      continue;
    }
    graphd_capture_record r;
    memset(&r, 0, sizeof r);
    r.instances = w[i]->instances;
    r.queue_ns = w[i]->queue_ns;
    copy_info(&r.info, w[i]);
    gd_record_fill(a + i * stride, stride, &r, sizeof r);
  }
  *out = a;
  *nout = n;
  return GRAPHD_OK;
}

/* Keeps the devices a list or evict reply says were busy (none on error). */
static void keep_busy(graphd_client *c, const uint32_t *devs, size_t n) {
  uint32_t *b = n ? malloc(n * sizeof *b) : NULL;
  if (b) memcpy(b, devs, n * sizeof *b);
  free(c->busy);
  c->busy = b;
  c->nbusy = b ? n : 0;
}

size_t graphd_busy_devices(graphd_client *c, uint32_t *devs, size_t max) {
  if (gd_client_foreign(c)) return 0;
  pthread_mutex_lock(&c->lock);
  size_t n = c->nbusy;
  for (size_t i = 0; i < n && i < max; i++) devs[i] = c->busy[i];
  pthread_mutex_unlock(&c->lock);
  return n;
}

static graphd_status list_captures(graphd_client *c, size_t size, void **out, size_t *n) {
  GD_OWNED(c);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__ListCaptures m = GRAPHD__WIRE__LIST_CAPTURES__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_LIST_CAPTURES;
  req.list_captures = &m;
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&c->lock);
  Graphd__Wire__Reply *rep = NULL;
  graphd_status st = gd_client_call(c, &req, NULL, 0, &rep);
  keep_busy(c, NULL, 0);
  if (st == GRAPHD_OK && rep->body_case == GRAPHD__WIRE__REPLY__BODY_LIST_CAPTURES) {
    keep_busy(c, rep->list_captures->busy_devices, rep->list_captures->n_busy_devices);
    st = copy_captures(c, rep->list_captures->captures, rep->list_captures->n_captures, size, out,
                       n);
  }
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
  pthread_mutex_unlock(&c->lock);
  return st;
}

graphd_status graphd_list_captures(graphd_client *c, graphd_capture_info **out, size_t *n) {
  void *a = NULL;
  graphd_status st = list_captures(c, 0, &a, n);
  *out = a;
  return st;
}

graphd_status graphd_list_capture_records(graphd_client *c, size_t size,
                                          graphd_capture_record **out, size_t *n) {
  *out = NULL;
  *n = 0;
  if (size < RECORD_MIN) return GRAPHD_INVALID_ARGUMENT;
  void *a = NULL;
  graphd_status st = list_captures(c, size, &a, n);
  *out = a;
  return st;
}

void graphd_capture_info_free(graphd_capture_info *list) { free(list); }

void graphd_evict_options_init(graphd_evict_options *o) {
  memset(o, 0, sizeof *o);
  o->device = -1;
}

static graphd_status evict(graphd_client *c, const graphd_evict_options *o, size_t size,
                           void **evicted, size_t *n, uint64_t *bytes) {
  GD_OWNED(c);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Evict m = GRAPHD__WIRE__EVICT__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_EVICT;
  req.evict = &m;
  m.program = (char *)(o->program ? o->program : "");
  if (o->device >= 0) {
    m.device_sel_case = GRAPHD__WIRE__EVICT__DEVICE_SEL_DEVICE;
    m.device = o->device;
  }
  m.client_pid = o->client_pid;
  m.session = o->session;
  m.idle_ms = o->idle_ms;
  m.all = o->all != 0;
  m.dry_run = o->dry_run != 0;
  if (evicted) *evicted = NULL;
  if (n) *n = 0;
  if (bytes) *bytes = 0;
  pthread_mutex_lock(&c->lock);
  Graphd__Wire__Reply *rep = NULL;
  graphd_status st = gd_client_call(c, &req, NULL, 0, &rep);
  keep_busy(c, NULL, 0);
  if (st == GRAPHD_OK && rep->body_case == GRAPHD__WIRE__REPLY__BODY_EVICT) {
    keep_busy(c, rep->evict->busy_devices, rep->evict->n_busy_devices);
    if (bytes) *bytes = rep->evict->bytes;
    if (evicted) {
      size_t k;
      st = copy_captures(c, rep->evict->evicted, rep->evict->n_evicted, size, evicted, &k);
      if (n) *n = k;
    } else if (n) {
      *n = rep->evict->n_evicted;
    }
  }
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
  pthread_mutex_unlock(&c->lock);
  return st;
}

graphd_status graphd_evict(graphd_client *c, const graphd_evict_options *o,
                           graphd_capture_info **evicted, size_t *n, uint64_t *bytes) {
  void *a = NULL;
  graphd_status st = evict(c, o, 0, evicted ? &a : NULL, n, bytes);
  if (evicted) *evicted = a;
  return st;
}

graphd_status graphd_evict_records(graphd_client *c, const graphd_evict_options *o, size_t size,
                                   graphd_capture_record **evicted, size_t *n, uint64_t *bytes) {
  if (evicted) *evicted = NULL;
  if (n) *n = 0;
  if (bytes) *bytes = 0;
  if (size < RECORD_MIN) return GRAPHD_INVALID_ARGUMENT;
  void *a = NULL;
  graphd_status st = evict(c, o, size, evicted ? &a : NULL, n, bytes);
  if (evicted) *evicted = a;
  return st;
}

void graphd_capture_records_free(graphd_capture_record *list) { free(list); }
