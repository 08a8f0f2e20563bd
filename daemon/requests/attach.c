/* See attach.h. Loop thread, except the jobs' run functions (worker). */
#define _GNU_SOURCE
#include "attach.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/sessions/daemon.h"
#include "daemon/sessions/data_session.h"
#include "graphd/status.h"
#include "common/log.h"
#include "daemon/replay/ring_replay.h"

/* --- RegisterFlags --------------------------------------------------------- */

typedef struct flags_job {
  gd_request rq;
  gd_session_stream *ds;
  int fd;
  uint32_t slots;
} flags_job;

static void flags_run(gd_job *j, void *ctx) {
  flags_job *fj = gd_container_of(j, flags_job, rq.job);
  j->status = session_stream_map_flags(ctx, fj->ds, fj->fd, fj->slots, j->msg, sizeof j->msg);
}

static void flags_done(gd_job *j) {
  flags_job *fj = gd_container_of(j, flags_job, rq.job);
  gd_session *s = fj->rq.s;
  gd_data_session *x = data_session_of(s);
  close(fj->fd);
  if (j->status < 0) data_session_maps_give(daemon_of(s), s->uid, 1); /* else the end lets it go */
  if (!s->closing) {
    if (j->status < 0) {
      session_reply_error(s, fj->rq.request_id, j->status, "RegisterFlags: %s", j->msg);
    } else {
      x->flag_slots = fj->slots;
      Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
      Graphd__Wire__RegisterFlagsReply fr = GRAPHD__WIRE__REGISTER_FLAGS_REPLY__INIT;
      r.request_id = fj->rq.request_id;
      r.body_case = GRAPHD__WIRE__REPLY__BODY_REGISTER_FLAGS;
      r.register_flags = &fr;
      session_reply(s, &r);
    }
  }
  session_end_request(s);
  free(fj);
}

void attach_handle_register_flags(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  uint64_t request_id = req->request_id;
  const Graphd__Wire__RegisterFlags *m = req->register_flags;
  int fd = fds[0]; /* taken */
  gd_data_session *x = data_session_of(s);
  const char *why = NULL;
  char over[512];
  int code = GRAPHD_INVALID_ARGUMENT;
  if (x->flag_slots) {
    why = "this session already registered its flag page";
    code = GRAPHD_ALREADY_EXISTS;
  } else if (fd < 0) {
    why = "RegisterFlags carries the flag page's memfd (one fd)";
  } else if (m->slots == 0 || m->slots > GRAPHD_MAX_FLAG_SLOTS) {
    why = "RegisterFlags.slots must be 1 to 1024";
  } else if (!data_session_maps_fit(daemon_of(s), s->uid, false, over, sizeof over)) {
    why = over;
    code = GRAPHD_RESOURCE_EXHAUSTED;
  }
  if (why) {
    if (fd >= 0) close(fd);
    session_reply_error(s, request_id, code, "%s", why);
    return;
  }
  flags_job *fj = calloc(1, sizeof *fj);
  if (!fj || data_session_maps_take(daemon_of(s), s->uid) < 0) {
    free(fj);
    close(fd);
    session_reply_error(s, request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  fj->ds = x->ds;
  fj->fd = fd;
  fj->slots = m->slots;
  session_submit(s, request_id, &fj->rq, daemon_worker(daemon_of(s), s->device), flags_run,
                 flags_done);
}

/* --- regions --------------------------------------------------------------- */

typedef struct import_job {
  gd_request rq;
  struct release_job *release; /* made with the request: what lets the region go */
  gd_region_import in;
  uint32_t id;           /* the region's id, given before the import */
  gd_session_stream *ds; /* whose region view learns it */
  uint64_t client_base;
  gd_region_map out;
  uint64_t ns;
} import_job;

static void import_run(gd_job *j, void *ctx) {
  import_job *ij = gd_container_of(j, import_job, rq.job);
  uint64_t t0 = gd_now_ns();
  j->status = device_import(ctx, &ij->in, &ij->out, j->msg, sizeof j->msg);
  if (j->status == 0 && session_stream_region_add(ij->ds, ij->id, &ij->out) < 0) {
    device_release_import(ctx, &ij->out);
    snprintf(j->msg, sizeof j->msg, "out of memory");
    j->status = -GRAPHD_RESOURCE_EXHAUSTED;
  }
  ij->ns = gd_now_ns() - t0;
  if (ij->in.fd >= 0) close(ij->in.fd);
  ij->in.fd = -1;
}

/* Regions and their bytes that the sessions of uid have mapped, on every
 * device. */
static void uid_regions(gd_daemon *d, uid_t uid, uint64_t *n, uint64_t *bytes) {
  *n = *bytes = 0;
  for (gd_session *y = d->sessions.head; y; y = y->next) {
    const gd_data_session *yx = y->uid == uid ? data_session_of(y) : NULL;
    if (!yx) continue;
    *n += yx->regions.n;
    *bytes += yx->regions.bytes;
  }
}

/* Whether one more region of `more` bytes keeps s within the region
 * limits, per session and per uid; if not, err names the limit. */
static bool region_fits(gd_session *s, uint64_t more, char *err, size_t errlen) {
  gd_daemon *d = daemon_of(s);
  const gd_options *o = d->opt;
  const gd_region_table *t = &data_session_of(s)->regions;
  if (t->n >= o->max_regions_per_session) {
    snprintf(err, errlen,
             "this session holds %llu regions, the most --max-regions-per-session %u allows; "
             "unregister some first",
             (unsigned long long)t->n, o->max_regions_per_session);
    return false;
  }
  uint64_t cap = o->max_region_bytes_per_session;
  if (cap && (more > cap || t->bytes > cap - more)) {
    snprintf(err, errlen,
             "this session has %llu bytes of regions mapped and this one needs %llu: over "
             "--max-region-bytes-per-session %llu; unregister some first",
             (unsigned long long)t->bytes, (unsigned long long)more, (unsigned long long)cap);
    return false;
  }
  if (!o->max_regions_per_uid && !o->max_region_bytes_per_uid) return true;
  uint64_t n, held;
  uid_regions(d, s->uid, &n, &held);
  if (o->max_regions_per_uid && n >= o->max_regions_per_uid) {
    snprintf(err, errlen,
             "uid %u holds %llu regions over its sessions, the most --max-regions-per-uid %u "
             "allows; unregister some first",
             (unsigned)s->uid, (unsigned long long)n, o->max_regions_per_uid);
    return false;
  }
  cap = o->max_region_bytes_per_uid;
  if (cap && (more > cap || held > cap - more)) {
    snprintf(err, errlen,
             "uid %u has %llu bytes of regions mapped and this one needs %llu: over "
             "--max-region-bytes-per-uid %llu; unregister some first",
             (unsigned)s->uid, (unsigned long long)held, (unsigned long long)more,
             (unsigned long long)cap);
    return false;
  }
  return true;
}

static void import_done(gd_job *j) {
  import_job *ij = gd_container_of(j, import_job, rq.job);
  gd_session *s = ij->rq.s;
  gd_daemon *d = daemon_of(s);
  if (ij->in.fd >= 0) close(ij->in.fd); /* never ran */
  if (j->status < 0) {
    free(ij->release); /* nothing was mapped */
    data_session_maps_give(d, s->uid, 1);
    if (!s->closing)
      session_reply_error(s, ij->rq.request_id, j->status, "RegisterRegion: %s", j->msg);
    goto exit;
  }
  if (s->closing) {
    /* The session's end ran or comes first: it stops the ring and frees
     * the view; only the mapping is left. */
    data_session_release_map(ij->release, d, s->device, &ij->out, NULL, 0, s->uid);
    goto exit;
  }
  gd_data_session *x = data_session_of(s);
  char over[256];
  /* The mapping may be larger than asked (granularity): check what it is. */
  if (!region_fits(s, ij->out.size, over, sizeof over)) {
    data_session_release_map(ij->release, d, s->device, &ij->out, x->ds, ij->id, s->uid);
    session_reply_error(s, ij->rq.request_id, GRAPHD_RESOURCE_EXHAUSTED, "RegisterRegion: %s",
                        over);
    goto exit;
  }
  gd_region *r = region_add_as(&x->regions, ij->id, &ij->out, ij->client_base);
  if (!r) {
    data_session_release_map(ij->release, d, s->device, &ij->out, x->ds, ij->id, s->uid);
    session_reply_error(s, ij->rq.request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    goto exit;
  }
  r->release = ij->release;
  d->counters[s->device].regions++;
  d->counters[s->device].region_bytes += r->map.size;
  GD_LOG(GD_DEBUG, "data_session", "session %llu: region %u, %llu bytes, imported in %.1f us",
         (unsigned long long)s->id, r->id, (unsigned long long)r->map.size, (double)ij->ns / 1e3);
  Graphd__Wire__Reply rep = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__RegisterRegionReply rr = GRAPHD__WIRE__REGISTER_REGION_REPLY__INIT;
  rep.request_id = ij->rq.request_id;
  rep.body_case = GRAPHD__WIRE__REPLY__BODY_REGISTER_REGION;
  rep.register_region = &rr;
  rr.region_id = r->id;
  rr.size = r->map.size;
  rr.import_ns = ij->ns;
  session_reply(s, &rep);
exit:
  session_end_request(s);
  free(ij);
}

void attach_handle_register_region(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  uint64_t request_id = req->request_id;
  const Graphd__Wire__RegisterRegion *m = req->register_region;
  int fd = fds[0]; /* taken */
  gd_data_session *x = data_session_of(s);
  const char *why = NULL;
  char over[512];
  int code = GRAPHD_INVALID_ARGUMENT;
  bool wants_fd = m->kind == GRAPHD__WIRE__REGION_KIND__REGION_KIND_VMM_FD ||
                  m->kind == GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD;
  if (m->kind != GRAPHD__WIRE__REGION_KIND__REGION_KIND_VMM_FD &&
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
  } else if (!region_fits(s, m->size, over, sizeof over) ||
             !data_session_maps_fit(daemon_of(s), s->uid, true, over, sizeof over)) {
    why = over;
    code = GRAPHD_RESOURCE_EXHAUSTED;
  }
  if (why) {
    if (fd >= 0) close(fd);
    session_reply_error(s, request_id, code, "%s", why);
    return;
  }
  /* What letting it go needs, now: its release job and its place in the
   * session's end. */
  import_job *ij = calloc(1, sizeof *ij);
  struct release_job *rel = ij ? data_session_release_new() : NULL;
  if (rel && x->end_maps_cap < x->regions.n + 1) {
    size_t cap = x->end_maps_cap ? 2 * x->end_maps_cap : 16;
    gd_region_map *m2 = realloc(x->end_maps, cap * sizeof *m2);
    if (m2) {
      x->end_maps = m2;
      x->end_maps_cap = cap;
    }
  }
  if (!rel || x->end_maps_cap < x->regions.n + 1 ||
      data_session_maps_take(daemon_of(s), s->uid) < 0) {
    free(ij);
    free(rel);
    if (fd >= 0) close(fd);
    session_reply_error(s, request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  ij->release = rel;
  ij->in.kind = (int)m->kind; /* equal by graphd/protocol.h's static asserts */
  ij->in.fd = fd;
  ij->in.size = m->size;
  if (m->ipc_handle.len == 64) memcpy(ij->in.ipc_handle, m->ipc_handle.data, 64);
  ij->client_base = m->client_base;
  ij->id = region_new_id(&x->regions);
  ij->ds = x->ds;
  session_submit(s, request_id, &ij->rq, daemon_worker(daemon_of(s), s->device), import_run,
                 import_done);
}

void attach_handle_unregister_region(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  (void)fds;
  uint64_t request_id = req->request_id;
  const Graphd__Wire__UnregisterRegion *m = req->unregister_region;
  gd_daemon *d = daemon_of(s);
  gd_data_session *x = data_session_of(s);
  gd_region *r = x ? region_find(&x->regions, m->region_id) : NULL;
  if (!r) {
    session_reply_error(s, request_id, GRAPHD_NOT_FOUND,
                        "UnregisterRegion: this session has no region %u", m->region_id);
    return;
  }
  d->counters[s->device].regions--;
  d->counters[s->device].region_bytes -= r->map.size;
  data_session_release_map(r->release, d, s->device, &r->map, x->ds, r->id, s->uid);
  region_remove(&x->regions, r);
  Graphd__Wire__Reply rep = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__UnregisterRegionReply ur = GRAPHD__WIRE__UNREGISTER_REGION_REPLY__INIT;
  rep.request_id = request_id;
  rep.body_case = GRAPHD__WIRE__REPLY__BODY_UNREGISTER_REGION;
  rep.unregister_region = &ur;
  session_reply(s, &rep);
}

/* --- the submission ring ---------------------------------------------------- */

typedef struct ring_job {
  gd_request rq;
  gd_session_stream *ds;
  gd_ring_params params;
  int fd, doorbell;
} ring_job;

static void ring_run(gd_job *j, void *ctx) {
  ring_job *rj = gd_container_of(j, ring_job, rq.job);
  j->status = ring_replay_attach(ctx, j->worker, rj->ds, &rj->params, rj->fd, rj->doorbell, j->msg,
                                 sizeof j->msg);
  rj->doorbell = -1; /* the ring's, or closed */
}

static void ring_done(gd_job *j) {
  ring_job *rj = gd_container_of(j, ring_job, rq.job);
  gd_session *s = rj->rq.s;
  gd_data_session *x = data_session_of(s);
  close(rj->fd);
  if (rj->doorbell >= 0) close(rj->doorbell);                         /* never ran */
  if (j->status < 0) data_session_maps_give(daemon_of(s), s->uid, 1); /* else the end lets it go */
  if (x) x->ring_pending = false;
  if (!s->closing) {
    if (j->status < 0) {
      session_reply_error(s, rj->rq.request_id, j->status, "RegisterRing: %s", j->msg);
    } else {
      x->has_ring = true;
      Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
      Graphd__Wire__RegisterRingReply rr = GRAPHD__WIRE__REGISTER_RING_REPLY__INIT;
      r.request_id = rj->rq.request_id;
      r.body_case = GRAPHD__WIRE__REPLY__BODY_REGISTER_RING;
      r.register_ring = &rr;
      rr.max_bindings = GD_MAX_SLOTS;
      session_reply(s, &r);
    }
  }
  session_end_request(s);
  free(rj);
}

void attach_handle_register_ring(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  uint64_t request_id = req->request_id;
  const Graphd__Wire__RegisterRing *m = req->register_ring; /* both fds taken */
  gd_daemon *d = daemon_of(s);
  gd_data_session *x = data_session_of(s);
  const char *why = NULL;
  char over[512];
  int code = GRAPHD_INVALID_ARGUMENT;
  if (!x->flag_slots) {
    why = "the session has no flag page; RegisterFlags first";
    code = GRAPHD_FAILED_PRECONDITION;
  } else if (x->has_ring || x->ring_pending) {
    why = "this session already registered its ring";
    code = GRAPHD_ALREADY_EXISTS;
  } else if (fds[0] < 0 || fds[1] < 0) {
    why = "RegisterRing carries two fds: the ring's memfd, then its doorbell eventfd";
  } else if (m->entries < GRAPHD_RING_MIN_ENTRIES || m->entries > GRAPHD_RING_MAX_ENTRIES ||
             (m->entries & (m->entries - 1))) {
    why = "RegisterRing.entries must be a power of two from 2 to 4096";
  } else if (!data_session_maps_fit(d, s->uid, false, over, sizeof over)) {
    why = over;
    code = GRAPHD_RESOURCE_EXHAUSTED;
  }
  ring_job *rj = why ? NULL : calloc(1, sizeof *rj);
  if (!why && (!rj || data_session_maps_take(d, s->uid) < 0)) {
    free(rj);
    rj = NULL;
    why = "out of memory";
    code = GRAPHD_RESOURCE_EXHAUSTED;
  }
  if (why) {
    for (int i = 0; i < 2; i++)
      if (fds[i] >= 0) close(fds[i]);
    session_reply_error(s, request_id, code, "%s", why);
    return;
  }
  rj->ds = x->ds;
  rj->fd = fds[0];
  rj->doorbell = fds[1];
  rj->params = (gd_ring_params){.entries = m->entries,
                                .ready_timeout_s = d->opt->ready_timeout_s,
                                .max_inflight = d->opt->max_inflight_replays,
                                .client_pid = (uint32_t)s->pid,
                                .client_uid = (uint32_t)s->uid};
  x->ring_pending = true;
  session_submit(s, request_id, &rj->rq, daemon_worker(d, s->device), ring_run, ring_done);
}

typedef struct ring_prog_job {
  gd_request rq;
  gd_session_stream *ds;
  const gd_regprog *prog;
  uint32_t handle;
} ring_prog_job;

static void ring_prog_run(gd_job *j, void *ctx) {
  (void)ctx;
  ring_prog_job *pj = gd_container_of(j, ring_prog_job, rq.job);
  j->status = ring_replay_set_program(pj->ds, pj->handle, pj->prog, j->msg, sizeof j->msg);
}

static void reply_handle(gd_session *s, uint64_t request_id, uint32_t handle) {
  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__RingProgramReply rp = GRAPHD__WIRE__RING_PROGRAM_REPLY__INIT;
  r.request_id = request_id;
  r.body_case = GRAPHD__WIRE__REPLY__BODY_RING_PROGRAM;
  r.ring_program = &rp;
  rp.handle = handle;
  session_reply(s, &r);
}

static void ring_prog_done(gd_job *j) {
  ring_prog_job *pj = gd_container_of(j, ring_prog_job, rq.job);
  gd_session *s = pj->rq.s;
  gd_data_session *x = data_session_of(s);
  if (!s->closing) {
    if (j->status < 0) {
      if (x) x->ring_progs[pj->handle] = NULL; /* asked again, it is given again */
      session_reply_error(s, pj->rq.request_id, j->status, "RingProgram: %s", j->msg);
    } else {
      reply_handle(s, pj->rq.request_id, pj->handle);
    }
  }
  session_end_request(s);
  free(pj);
}

void attach_handle_ring_program(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  (void)fds;
  uint64_t request_id = req->request_id;
  const Graphd__Wire__RingProgram *m = req->ring_program;
  gd_daemon *d = daemon_of(s);
  gd_data_session *x = data_session_of(s);
  if (!x || !x->has_ring) {
    session_reply_error(s, request_id, GRAPHD_FAILED_PRECONDITION,
                        "RingProgram: the session has no ring; RegisterRing first");
    return;
  }
  if (m->program_id.len != GD_ID_LEN) {
    session_reply_error(s, request_id, GRAPHD_INVALID_ARGUMENT,
                        "RingProgram.program_id must be %d bytes", GD_ID_LEN);
    return;
  }
  gd_regprog *prog = registry_find_program(&d->reg, m->program_id.data);
  if (!prog) {
    char hex[2 * GD_ID_LEN + 1];
    gd_id_hex(m->program_id.data, 0, hex);
    session_reply_error(s, request_id, GRAPHD_NOT_FOUND,
                        "RingProgram: program %s is not registered; register it first", hex);
    return;
  }
  for (uint32_t h = 0; h < x->nring_progs; h++)
    if (x->ring_progs[h] == prog) {
      reply_handle(s, request_id, h);
      return;
    }
  /* The session holds the program while it is open, so the worker may
   * keep the pointer. */
  char err[512] = "out of memory";
  ring_prog_job *pj = calloc(1, sizeof *pj);
  int hrc = pj ? registry_hold(&d->reg, &s->holds, (uint32_t)s->uid, true, prog, err, sizeof err)
               : -GRAPHD_RESOURCE_EXHAUSTED;
  if (hrc < 0) {
    free(pj);
    session_reply_error(s, request_id, -hrc, "RingProgram: %s", err);
    return;
  }
  if (x->nring_progs == x->ring_progs_cap) {
    uint32_t cap = x->ring_progs_cap ? 2 * x->ring_progs_cap : 16;
    const gd_regprog **np = realloc(x->ring_progs, cap * sizeof *np);
    if (!np) {
      free(pj);
      session_reply_error(s, request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
    x->ring_progs = np;
    x->ring_progs_cap = cap;
  }
  pj->handle = x->nring_progs++;
  x->ring_progs[pj->handle] = prog;
  pj->ds = x->ds;
  pj->prog = prog;
  session_submit(s, request_id, &pj->rq, daemon_worker(d, s->device), ring_prog_run,
                 ring_prog_done);
}
