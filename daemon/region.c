/* See region.h. Loop thread, except the job run functions (worker). */
#define _GNU_SOURCE
#include "region.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capture.h"
#include "fault.h"
#include "graphd/status.h"
#include "log.h"
#include "server.h"

typedef struct import_job {
  gd_job job; /* first */
  gd_session *s;
  uint64_t request_id;
  gd_region_import in;
  uint64_t client_base;
  gd_region_map out;
  uint64_t ns;
} import_job;

typedef struct release_job {
  gd_job job; /* first */
  gd_region_map map;
  struct gd_wsess *ws; /* the session's stream, drained before unmapping */
} release_job;

gd_region *region_find(gd_session *s, uint32_t id) {
  gd_region *r = NULL;
  HASH_FIND(hh, s->regions, &id, sizeof id, r);
  return r;
}

int region_check_range(const gd_region *r, uint64_t offset, uint64_t bytes, char *err,
                       size_t errlen) {
  if (offset > r->map.size || bytes > r->map.size - offset) {
    snprintf(err, errlen,
             "region %u: bytes %llu..+%llu are out of range: the region has %llu bytes", r->id,
             (unsigned long long)offset, (unsigned long long)bytes,
             (unsigned long long)r->map.size);
    return -GRAPHD_OUT_OF_RANGE;
  }
  return 0;
}

static void release_run(gd_worker *w, gd_job *j) {
  release_job *rj = (release_job *)j;
  /* GPU work of this session's replays may still read or write it. */
  capture_session_sync(w, rj->ws);
  fault_release_map(w, &rj->map);
}

static void release_done(gd_job *j) { free(j); }

/* Queues the unmapping behind whatever the worker already has. */
static void release_map(gd_server *srv, int device, const gd_region_map *map,
                        struct gd_wsess *ws) {
  release_job *rj = calloc(1, sizeof *rj);
  if (!rj) {
    GD_LOG(GD_ERROR, "region", "out of memory releasing a region: it stays mapped");
    return;
  }
  rj->map = *map;
  rj->ws = ws;
  rj->job.run = release_run;
  rj->job.done = release_done;
  worker_submit(&srv->pool.workers[device], &rj->job);
}

static void drop(gd_session *s, gd_region *r) {
  gd_server *srv = s->srv;
  HASH_DEL(s->regions, r);
  s->nregions--;
  s->region_bytes -= r->map.size;
  srv->counters[s->device].regions--;
  srv->counters[s->device].region_bytes -= r->map.size;
  release_map(srv, s->device, &r->map, s->ws);
  free(r);
}

static void import_run(gd_worker *w, gd_job *j) {
  import_job *ij = (import_job *)j;
  uint64_t t0 = gd_now_ns();
  j->status = w->be->ops->region_import(w->be, w->dev, &ij->in, &ij->out, j->msg, sizeof j->msg);
  if (j->status == 0) fault_track_map(w, &ij->out);
  ij->ns = gd_now_ns() - t0;
  if (ij->in.fd >= 0) close(ij->in.fd);
  ij->in.fd = -1;
}

static void import_done(gd_job *j) {
  import_job *ij = (import_job *)j;
  gd_session *s = ij->s;
  gd_server *srv = s->srv;
  if (ij->in.fd >= 0) close(ij->in.fd); /* never ran */
  if (j->status < 0) {
    if (!s->closing)
      session_reply_error(s, ij->request_id, j->status, "RegisterRegion: %s", j->msg);
    goto exit;
  }
  if (s->closing) {
    release_map(srv, s->device, &ij->out, NULL); /* never used by a replay */
    goto exit;
  }
  gd_region *r = calloc(1, sizeof *r);
  if (!r) {
    release_map(srv, s->device, &ij->out, NULL);
    session_reply_error(s, ij->request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    goto exit;
  }
  r->id = ++s->next_region_id;
  r->map = ij->out;
  r->client_base = ij->client_base;
  HASH_ADD(hh, s->regions, id, sizeof r->id, r);
  s->nregions++;
  s->region_bytes += r->map.size;
  srv->counters[s->device].regions++;
  srv->counters[s->device].region_bytes += r->map.size;
  GD_LOG(GD_DEBUG, "region", "session %llu: region %u, %llu bytes, imported in %.1f us",
         (unsigned long long)s->id, r->id, (unsigned long long)r->map.size,
         (double)ij->ns / 1e3);
  Graphd__Wire__Reply rep = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__RegisterRegionReply rr = GRAPHD__WIRE__REGISTER_REGION_REPLY__INIT;
  rep.request_id = ij->request_id;
  rep.body_case = GRAPHD__WIRE__REPLY__BODY_REGISTER_REGION;
  rep.register_region = &rr;
  rr.region_id = r->id;
  rr.size = r->map.size;
  rr.import_ns = ij->ns;
  session_reply(s, &rep);
exit:
  session_request_done(s);
  session_unref(s);
  free(ij);
}

void region_handle_register(gd_session *s, uint64_t request_id,
                            const Graphd__Wire__RegisterRegion *m, int fd) {
  const char *why = NULL;
  int code = GRAPHD_INVALID_ARGUMENT;
  bool wants_fd = m->kind == GRAPHD__WIRE__REGION_KIND__REGION_KIND_VMM_FD ||
                  m->kind == GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD;
  if (s->kind != GD_SESSION_DATA) {
    why = "RegisterRegion needs a data session (one bound to a device)";
    code = GRAPHD_FAILED_PRECONDITION;
  } else if (m->kind != GRAPHD__WIRE__REGION_KIND__REGION_KIND_VMM_FD &&
             m->kind != GRAPHD__WIRE__REGION_KIND__REGION_KIND_LEGACY_IPC &&
             m->kind != GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD) {
    why = "RegisterRegion.kind must be VMM_FD, LEGACY_IPC or HOST_MEMFD";
  } else if (wants_fd != (fd >= 0)) {
    why = wants_fd ? "RegisterRegion of this kind carries exactly one fd"
                   : "RegisterRegion of kind LEGACY_IPC carries no fd";
  } else if (m->size == 0) {
    why = "RegisterRegion.size is 0";
  } else if (m->kind == GRAPHD__WIRE__REGION_KIND__REGION_KIND_LEGACY_IPC &&
             m->ipc_handle.len != 64) {
    why = "RegisterRegion.ipc_handle must be 64 bytes (a CUipcMemHandle)";
  } else if (s->nregions >= GD_MAX_REGIONS_PER_SESSION) {
    why = "this session holds the most regions allowed (4096); unregister some first";
    code = GRAPHD_RESOURCE_EXHAUSTED;
  }
  if (why) {
    if (fd >= 0) close(fd);
    session_reply_error(s, request_id, code, "%s", why);
    return;
  }
  import_job *ij = calloc(1, sizeof *ij);
  if (!ij) {
    if (fd >= 0) close(fd);
    session_reply_error(s, request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  ij->s = s;
  ij->request_id = request_id;
  ij->in.kind = (int)m->kind; /* the wire and backend enums share values */
  ij->in.fd = fd;
  ij->in.size = m->size;
  if (m->ipc_handle.len == 64) memcpy(ij->in.ipc_handle, m->ipc_handle.data, 64);
  ij->client_base = m->client_base;
  ij->job.run = import_run;
  ij->job.done = import_done;
  s->busy = true;
  session_ref(s);
  worker_submit(&s->srv->pool.workers[s->device], &ij->job);
}

void region_handle_unregister(gd_session *s, uint64_t request_id,
                              const Graphd__Wire__UnregisterRegion *m) {
  gd_region *r = s->kind == GD_SESSION_DATA ? region_find(s, m->region_id) : NULL;
  if (!r) {
    session_reply_error(s, request_id, GRAPHD_NOT_FOUND,
                        "UnregisterRegion: this session has no region %u", m->region_id);
    return;
  }
  drop(s, r);
  Graphd__Wire__Reply rep = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__UnregisterRegionReply ur = GRAPHD__WIRE__UNREGISTER_REGION_REPLY__INIT;
  rep.request_id = request_id;
  rep.body_case = GRAPHD__WIRE__REPLY__BODY_UNREGISTER_REGION;
  rep.unregister_region = &ur;
  session_reply(s, &rep);
}

int region_take_all(gd_session *s, gd_region_map **maps, size_t *n) {
  gd_server *srv = s->srv;
  size_t k = 0;
  *maps = NULL;
  *n = 0;
  if (s->nregions == 0) return 0;
  gd_region_map *m = calloc(s->nregions, sizeof *m);
  if (!m) return -GRAPHD_RESOURCE_EXHAUSTED;
  gd_region *r, *tmp;
  HASH_ITER(hh, s->regions, r, tmp) {
    HASH_DEL(s->regions, r);
    srv->counters[s->device].regions--;
    srv->counters[s->device].region_bytes -= r->map.size;
    m[k++] = r->map;
    free(r);
  }
  s->nregions = 0;
  s->region_bytes = 0;
  *maps = m;
  *n = k;
  return 0;
}
