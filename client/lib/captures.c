/* libgraphd: listing and evicting captures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static graphd_status copy_infos(graphd_client *c, Graphd__Wire__CaptureInfo **w, size_t n,
                                graphd_capture_info **out, size_t *nout) {
  *out = NULL;
  *nout = 0;
  if (!n) return GRAPHD_OK;
  graphd_capture_info *ci = calloc(n, sizeof *ci);
  if (!ci) return gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < n; i++) {
    if (w[i]->program_id.len == 32) memcpy(ci[i].program_id, w[i]->program_id.data, 32);
    ci[i].device = w[i]->device;
    ci[i].mode = w[i]->mode;
    ci[i].staging_bytes = w[i]->staging_bytes;
    ci[i].nodes = w[i]->nodes;
    ci[i].replays = w[i]->replays;
    ci[i].idle_ms = w[i]->idle_ms;
    ci[i].generation = w[i]->generation;
    ci[i].created_unix_ms = w[i]->created_unix_ms;
    ci[i].repoints = w[i]->repoints;
    ci[i].graphs = w[i]->graphs;
    ci[i].npids = (uint32_t)(w[i]->n_pids < 16 ? w[i]->n_pids : 16);
    memcpy(ci[i].pids, w[i]->pids, ci[i].npids * sizeof(uint32_t));
    ci[i].busy = w[i]->busy;
  }
  *out = ci;
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

graphd_status graphd_list_captures(graphd_client *c, graphd_capture_info **out, size_t *n) {
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
    st = copy_infos(c, rep->list_captures->captures, rep->list_captures->n_captures, out, n);
  }
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
  pthread_mutex_unlock(&c->lock);
  return st;
}

void graphd_capture_info_free(graphd_capture_info *list) { free(list); }

void graphd_evict_options_init(graphd_evict_options *o) {
  memset(o, 0, sizeof *o);
  o->device = -1;
}

graphd_status graphd_evict(graphd_client *c, const graphd_evict_options *o,
                           graphd_capture_info **evicted, size_t *n, uint64_t *bytes) {
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
      st = copy_infos(c, rep->evict->evicted, rep->evict->n_evicted, evicted, &k);
      if (n) *n = k;
    } else if (n) {
      *n = rep->evict->n_evicted;
    }
  }
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
  pthread_mutex_unlock(&c->lock);
  return st;
}
