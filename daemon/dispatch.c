/* Request handlers. DESIGN: loop thread only; device work goes through
 * worker_submit() and comes back in a done callback on the loop. */
#define _GNU_SOURCE
#include "dispatch.h"

#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../common/uuid.h"
#include "evict.h"
#include "graphd/status.h"
#include "log.h"
#include "prepare.h"
#include "region.h"
#include "registry.h"
#include "replay.h"
#include "server.h"
#include "version.h"
#include "wire.h"

static const char *body_name(Graphd__Wire__Request__BodyCase c) {
  switch (c) {
    case GRAPHD__WIRE__REQUEST__BODY_HELLO: return "Hello";
    case GRAPHD__WIRE__REQUEST__BODY_PING: return "Ping";
    case GRAPHD__WIRE__REQUEST__BODY_STATUS: return "Status";
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_MODULE: return "RegisterModule";
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_PROGRAM: return "RegisterProgram";
    case GRAPHD__WIRE__REQUEST__BODY_PREPARE_PROGRAM: return "PrepareProgram";
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_REGION: return "RegisterRegion";
    case GRAPHD__WIRE__REQUEST__BODY_UNREGISTER_REGION: return "UnregisterRegion";
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_FLAGS: return "RegisterFlags";
    case GRAPHD__WIRE__REQUEST__BODY_REPLAY: return "Replay";
    case GRAPHD__WIRE__REQUEST__BODY_LIST_CAPTURES: return "ListCaptures";
    case GRAPHD__WIRE__REQUEST__BODY_EVICT: return "Evict";
    default: return "unknown";
  }
}

static const char *state_name(int st) {
  return st == GD_WORKER_OK ? "ok" : st == GD_WORKER_FAILED ? "failed" : "starting";
}

/* Fills di (and dc, which it points at) for device i. */
static void fill_device(gd_server *srv, int i, uint64_t free_mem, Graphd__Wire__DeviceInfo *di,
                        Graphd__Wire__DeviceCounters *dc) {
  const gd_device_facts *f = srv->facts[i];
  const gd_device_counters *c = &srv->counters[i];
  gd_worker *w = &srv->pool.workers[i];
  graphd__wire__device_info__init(di);
  graphd__wire__device_counters__init(dc);
  di->ordinal = (uint32_t)i;
  di->name = (char *)f->name;
  di->uuid.data = (uint8_t *)f->uuid;
  di->uuid.len = 16;
  di->total_memory = f->total_memory;
  di->free_memory = free_mem;
  di->backend = (char *)srv->be->name;
  di->epoch = atomic_load(&w->epoch);
  di->mps_enabled = f->mps_enabled != 0;
  di->state = (char *)state_name(atomic_load(&w->state));
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
  di->counters = dc;
}

/* The admin rule of Decisions 11: root, the daemon's own uid, or a member
 * of the admin group (primary or supplementary, from SO_PEERGROUPS). */
static bool peer_is_admin(gd_session *s) {
  if (s->uid == 0 || s->uid == s->srv->euid) return true;
  const char *gname = s->srv->opt->admin_group;
  if (!gname[0]) return false;
  struct group gr, *res = NULL;
  char buf[4096];
  if (getgrnam_r(gname, &gr, buf, sizeof buf, &res) != 0 || !res) return false;
  if (s->gid == gr.gr_gid) return true;
  gid_t groups[256];
  socklen_t len = sizeof groups;
  if (getsockopt(s->fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0) return false;
  for (size_t k = 0; k < len / sizeof(gid_t); k++)
    if (groups[k] == gr.gr_gid) return true;
  return false;
}

static void handle_hello(gd_session *s, Graphd__Wire__Request *req) {
  gd_server *srv = s->srv;
  Graphd__Wire__Hello *h = req->hello;
  if (s->kind != GD_SESSION_NONE) {
    session_reply_error(s, req->request_id, GRAPHD_FAILED_PRECONDITION,
                        "Hello was already sent on this session");
    return;
  }
  if (h->protocol_version != GRAPHD_PROTOCOL_VERSION) {
    session_reply_error(s, req->request_id, GRAPHD_FAILED_PRECONDITION,
                        "protocol version %u is not supported: this daemon speaks version %u",
                        h->protocol_version, GRAPHD_PROTOCOL_VERSION);
    session_close_after_flush(s);
    return;
  }
  if (h->client_name && strlen(h->client_name) > GD_CLIENT_NAME_MAX) {
    session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                        "Hello.client_name is %zu bytes, over the limit of %d",
                        strlen(h->client_name), GD_CLIENT_NAME_MAX);
    session_close_after_flush(s);
    return;
  }
  int dev = -1;
  if (h->kind == GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_DATA) {
    if (h->device_uuid.len != GD_UUID_LEN) {
      session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                          "Hello.device_uuid must be %d bytes, got %zu", GD_UUID_LEN,
                          h->device_uuid.len);
      session_close_after_flush(s);
      return;
    }
    for (int i = 0; i < srv->ndevices; i++)
      if (memcmp(srv->facts[i]->uuid, h->device_uuid.data, GD_UUID_LEN) == 0) dev = i;
    if (dev < 0) {
      char want[48], have[512] = "";
      size_t n = 0;
      gd_uuid_format(h->device_uuid.data, "", want);
      for (int i = 0; i < srv->ndevices && n < sizeof have; i++)
        n += (size_t)snprintf(have + n, sizeof have - n, "%s%s", i ? ", " : "",
                              srv->facts[i]->uuid_str);
      session_reply_error(s, req->request_id, GRAPHD_NOT_FOUND,
                          "no device with UUID %s is served by this daemon (it serves: %s)",
                          want, have);
      session_close_after_flush(s);
      return;
    }
    gd_worker *w = &srv->pool.workers[dev];
    if (atomic_load(&w->state) != GD_WORKER_OK) {
      session_reply_error(s, req->request_id, GRAPHD_UNAVAILABLE, "device %d (%s) is not usable: %s",
                          dev, srv->facts[dev]->uuid_str, w->fail_msg);
      session_close_after_flush(s);
      return;
    }
    if (replay_session_open(s) < 0) {
      session_reply_error(s, req->request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
      session_close_after_flush(s);
      return;
    }
    s->kind = GD_SESSION_DATA;
    s->device = dev;
    srv->counters[dev].sessions++;
  } else if (h->kind == GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_CONTROL) {
    s->kind = GD_SESSION_CONTROL;
  } else {
    session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                        "Hello.kind must be DATA or CONTROL, got %d", (int)h->kind);
    session_close_after_flush(s);
    return;
  }
  if (h->client_name) snprintf(s->client_name, sizeof s->client_name, "%s", h->client_name);
  s->admin = peer_is_admin(s);

  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__HelloReply hr = GRAPHD__WIRE__HELLO_REPLY__INIT;
  Graphd__Wire__DeviceInfo di;
  Graphd__Wire__DeviceCounters dc;
  r.request_id = req->request_id;
  r.body_case = GRAPHD__WIRE__REPLY__BODY_HELLO;
  r.hello = &hr;
  hr.protocol_version = GRAPHD_PROTOCOL_VERSION;
  hr.session_id = s->id;
  hr.daemon_version = (char *)GRAPHD_VERSION_STRING;
  hr.admin = s->admin;
  hr.max_frame = srv->opt->max_frame;
  if (dev >= 0) {
    fill_device(srv, dev, 0, &di, &dc);
    hr.device = &di;
  }
  GD_LOG(GD_INFO, "session", "session %llu: %s session for pid %d uid %u (%s)%s%s",
         (unsigned long long)s->id, dev >= 0 ? "data" : "control", (int)s->pid,
         (unsigned)s->uid, s->client_name[0] ? s->client_name : "unnamed",
         dev >= 0 ? " on " : "", dev >= 0 ? srv->facts[dev]->uuid_str : "");
  session_reply(s, &r);
}

static void handle_ping(gd_session *s, Graphd__Wire__Request *req) {
  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__Pong pong = GRAPHD__WIRE__PONG__INIT;
  r.request_id = req->request_id;
  r.body_case = GRAPHD__WIRE__REPLY__BODY_PONG;
  r.pong = &pong;
  pong.payload = req->ping->payload;
  session_reply(s, &r);
}

/* Status asks every worker for its free memory, then replies once all have
 * answered (a failed worker answers without running). */
typedef struct status_gather {
  gd_session *s;
  uint64_t request_id;
  int pending;
  uint64_t *free_mem;
} status_gather;

typedef struct status_job {
  gd_job job; /* first: the worker hands back this pointer */
  status_gather *g;
  uint64_t free_b, total_b;
} status_job;

static void status_run(gd_worker *w, gd_job *j) {
  status_job *sj = (status_job *)j;
  j->status = w->be->ops->mem_info(w->be, w->dev, &sj->free_b, &sj->total_b, j->msg,
                                   sizeof j->msg);
}

static void status_finish(status_gather *g) {
  gd_session *s = g->s;
  gd_server *srv = s->srv;
  int n = srv->ndevices;
  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__StatusReply sr = GRAPHD__WIRE__STATUS_REPLY__INIT;
  Graphd__Wire__DeviceInfo *di = calloc((size_t)n, sizeof *di);
  Graphd__Wire__DeviceCounters *dc = calloc((size_t)n, sizeof *dc);
  Graphd__Wire__DeviceInfo **dp = calloc((size_t)n, sizeof *dp);
  size_t ns = (size_t)srv->nsessions;
  Graphd__Wire__SessionInfo *si = calloc(ns + 1, sizeof *si);
  Graphd__Wire__SessionInfo **sp = calloc(ns + 1, sizeof *sp);
  if (!di || !dc || !dp || !si || !sp) {
    session_reply_error(s, g->request_id, GRAPHD_RESOURCE_EXHAUSTED,
                        "out of memory building the status reply");
    goto exit;
  }
  for (int i = 0; i < n; i++) {
    fill_device(srv, i, g->free_mem[i], &di[i], &dc[i]);
    dp[i] = &di[i];
  }
  r.request_id = g->request_id;
  r.body_case = GRAPHD__WIRE__REPLY__BODY_STATUS;
  r.status = &sr;
  sr.version = (char *)GRAPHD_VERSION_STRING;
  sr.uptime_ms = (gd_now_ns() - srv->start_ns) / 1000000u;
  sr.pid = (uint32_t)getpid();
  sr.n_devices = (size_t)n;
  sr.devices = dp;
  sr.sessions = srv->nsessions;
  size_t k = 0;
  for (gd_session *x = srv->sessions; x && k < ns; x = x->next, k++) {
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
    si[k].regions = x->nregions;
    si[k].region_bytes = x->region_bytes;
    sp[k] = &si[k];
  }
  sr.n_session_list = k;
  sr.session_list = sp;
  sr.modules = srv->reg.nmodules;
  sr.module_bytes = srv->reg.module_bytes;
  sr.programs = srv->reg.nprograms;
  session_reply(s, &r);
exit:
  free(si);
  free(sp);
  free(di);
  free(dc);
  free(dp);
}

static void status_release(status_gather *g) {
  if (!g->s->closing) status_finish(g);
  session_request_done(g->s);
  session_unref(g->s);
  free(g->free_mem);
  free(g);
}

static void status_done(gd_job *j) {
  status_job *sj = (status_job *)j;
  status_gather *g = sj->g;
  if (j->status == 0) g->free_mem[j->worker->index] = sj->free_b;
  free(sj);
  if (--g->pending == 0) status_release(g);
}

static void handle_status(gd_session *s, Graphd__Wire__Request *req) {
  gd_server *srv = s->srv;
  status_gather *g = calloc(1, sizeof *g);
  uint64_t *fm = calloc((size_t)srv->ndevices + 1, sizeof *fm);
  status_job *jobs = NULL;
  if (!g || !fm) goto oom;
  g->s = s;
  g->request_id = req->request_id;
  g->free_mem = fm;
  g->pending = srv->ndevices;
  s->busy = true;
  session_ref(s);
  for (int i = 0; i < srv->ndevices; i++) {
    jobs = calloc(1, sizeof *jobs);
    if (!jobs) {
      /* Count it as answered so the gather still completes. */
      g->pending--;
      continue;
    }
    jobs->g = g;
    jobs->job.run = status_run;
    jobs->job.done = status_done;
    worker_submit(&srv->pool.workers[i], &jobs->job);
  }
  /* Completions always arrive later, through the loop, so this only
   * happens when no job could be allocated at all. */
  if (g->pending == 0) status_release(g);
  return;
oom:
  free(g);
  free(fm);
  session_reply_error(s, req->request_id, GRAPHD_RESOURCE_EXHAUSTED,
                      "out of memory handling a status request");
}

static bool takes_fd(Graphd__Wire__Request__BodyCase body) {
  return body == GRAPHD__WIRE__REQUEST__BODY_REGISTER_MODULE ||
         body == GRAPHD__WIRE__REQUEST__BODY_REGISTER_PROGRAM ||
         body == GRAPHD__WIRE__REQUEST__BODY_REGISTER_REGION ||
         body == GRAPHD__WIRE__REQUEST__BODY_REGISTER_FLAGS;
}

static bool id_ok(gd_session *s, uint64_t request_id, const ProtobufCBinaryData *id,
                  const char *field) {
  if (id->len == GD_ID_LEN) return true;
  session_reply_error(s, request_id, GRAPHD_INVALID_ARGUMENT, "%s must be %d bytes, got %zu",
                      field, GD_ID_LEN, id->len);
  return false;
}

static void handle_register_module(gd_session *s, Graphd__Wire__Request *req, int fd) {
  Graphd__Wire__RegisterModule *m = req->register_module;
  char err[512];
  bool known = false;
  if (!id_ok(s, req->request_id, &m->module_id, "RegisterModule.module_id")) return;
  if (fd >= 0 && m->inline_bytes.len) {
    session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                        "RegisterModule carries both inline bytes and a memfd; send one");
    return;
  }
  if (fd < 0 && m->size && m->size != m->inline_bytes.len) {
    session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                        "RegisterModule.size says %llu bytes but %zu came inline (a memfd was "
                        "expected)",
                        (unsigned long long)m->size, m->inline_bytes.len);
    return;
  }
  size_t len = fd >= 0 ? (size_t)m->size : m->inline_bytes.len;
  int rc = registry_add_module(&s->srv->reg, m->module_id.data, m->kind, m->inline_bytes.data,
                               len, fd, &known, err, sizeof err);
  if (rc < 0) {
    session_reply_error(s, req->request_id, rc, "RegisterModule: %s", err);
    return;
  }
  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__RegisterModuleReply mr = GRAPHD__WIRE__REGISTER_MODULE_REPLY__INIT;
  r.request_id = req->request_id;
  r.body_case = GRAPHD__WIRE__REPLY__BODY_REGISTER_MODULE;
  r.register_module = &mr;
  mr.module_id = m->module_id;
  mr.already_known = known;
  session_reply(s, &r);
}

static void handle_register_program(gd_session *s, Graphd__Wire__Request *req, int fd) {
  Graphd__Wire__RegisterProgram *m = req->register_program;
  char err[1024];
  bool known = false;
  if (!id_ok(s, req->request_id, &m->program_id, "RegisterProgram.program_id")) return;
  const uint8_t *enc = m->encoding.data;
  size_t len = m->encoding.len;
  if (fd >= 0) {
    if (len) {
      session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                          "RegisterProgram carries both an inline encoding and a memfd; send one");
      return;
    }
    if (m->size > GD_MAX_PROGRAM_BYTES) {
      session_reply_error(s, req->request_id, GRAPHD_RESOURCE_EXHAUSTED,
                          "RegisterProgram: the encoding is %llu bytes, over the limit of %u",
                          (unsigned long long)m->size, GD_MAX_PROGRAM_BYTES);
      return;
    }
    len = (size_t)m->size;
    int mrc = registry_map_sealed(fd, len, "program", &enc, err, sizeof err);
    if (mrc < 0) {
      session_reply_error(s, req->request_id, mrc, "RegisterProgram: %s", err);
      return;
    }
  }
  /* The registry decodes (copies) what it keeps; the mapping can go after. */
  int rc = registry_add_program(&s->srv->reg, m->program_id.data, enc, len, &known, err,
                                sizeof err);
  if (fd >= 0) munmap((void *)enc, len ? len : 1);
  if (rc < 0) {
    session_reply_error(s, req->request_id, rc, "RegisterProgram: %s", err);
    return;
  }
  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__RegisterProgramReply pr = GRAPHD__WIRE__REGISTER_PROGRAM_REPLY__INIT;
  r.request_id = req->request_id;
  r.body_case = GRAPHD__WIRE__REPLY__BODY_REGISTER_PROGRAM;
  r.register_program = &pr;
  pr.program_id = m->program_id;
  pr.already_known = known;
  session_reply(s, &r);
}

typedef struct prepare_job {
  gd_job job; /* first */
  gd_session *s;
  uint64_t request_id;
  const gd_prog *prog;
  uint64_t loaded, load_ns;
} prepare_job;

static void prepare_run(gd_worker *w, gd_job *j) {
  prepare_job *pj = (prepare_job *)j;
  j->status = prepare_program(w, pj->prog, &pj->loaded, &pj->load_ns, j->msg, sizeof j->msg);
}

static void prepare_done(gd_job *j) {
  prepare_job *pj = (prepare_job *)j;
  gd_session *s = pj->s;
  if (!s->closing) {
    if (j->status < 0) {
      s->srv->counters[s->device].errors++;
      session_reply_error(s, pj->request_id, j->status, "%s", j->msg);
    } else {
      Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
      Graphd__Wire__PrepareProgramReply pr = GRAPHD__WIRE__PREPARE_PROGRAM_REPLY__INIT;
      r.request_id = pj->request_id;
      r.body_case = GRAPHD__WIRE__REPLY__BODY_PREPARE_PROGRAM;
      r.prepare_program = &pr;
      pr.modules_loaded = pj->loaded;
      pr.load_ns = pj->load_ns;
      session_reply(s, &r);
    }
  }
  session_request_done(s);
  session_unref(s);
  free(pj);
}

static void handle_prepare_program(gd_session *s, Graphd__Wire__Request *req) {
  Graphd__Wire__PrepareProgram *m = req->prepare_program;
  if (!id_ok(s, req->request_id, &m->program_id, "PrepareProgram.program_id")) return;
  if (s->kind != GD_SESSION_DATA) {
    session_reply_error(s, req->request_id, GRAPHD_FAILED_PRECONDITION,
                        "PrepareProgram needs a data session (one bound to a device)");
    return;
  }
  const gd_prog *p = registry_find_program(&s->srv->reg, m->program_id.data);
  if (!p) {
    char hex[2 * GD_ID_LEN + 1];
    gd_id_hex(m->program_id.data, 0, hex);
    session_reply_error(s, req->request_id, GRAPHD_NOT_FOUND,
                        "program %s is not registered; register it first", hex);
    return;
  }
  prepare_job *pj = calloc(1, sizeof *pj);
  if (!pj) {
    session_reply_error(s, req->request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  pj->s = s;
  pj->request_id = req->request_id;
  pj->prog = p;
  pj->job.run = prepare_run;
  pj->job.done = prepare_done;
  s->busy = true;
  session_ref(s);
  worker_submit(&s->srv->pool.workers[s->device], &pj->job);
}

void dispatch_request(gd_session *s, Graphd__Wire__Request *req, int *fds, int nfds) {
  Graphd__Wire__Request__BodyCase body = req->body_case;
  int fd = -1;
  if (nfds > 0 && (!takes_fd(body) || nfds > 1)) {
    for (int i = 0; i < nfds; i++) close(fds[i]);
    session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                        takes_fd(body) ? "%s takes at most one file descriptor, but %d were sent"
                                       : "%s takes no file descriptors, but %d were sent",
                        body_name(body), nfds);
    goto exit;
  }
  if (nfds == 1) fd = fds[0];
  if (body == GRAPHD__WIRE__REQUEST__BODY__NOT_SET) {
    uint32_t field = gd_wire_first_unknown_field(&req->base);
    if (field)
      session_reply_error(s, req->request_id, GRAPHD_UNIMPLEMENTED,
                          "unknown request (field %u): this daemon speaks protocol version %u",
                          field, GRAPHD_PROTOCOL_VERSION);
    else
      session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                          "empty request: no request body was set");
    goto exit;
  }
  if (s->kind == GD_SESSION_NONE && body != GRAPHD__WIRE__REQUEST__BODY_HELLO) {
    session_reply_error(s, req->request_id, GRAPHD_FAILED_PRECONDITION,
                        "the first request on a session must be Hello, not %s; closing",
                        body_name(body));
    session_close_after_flush(s);
    goto exit;
  }
  switch (body) {
    case GRAPHD__WIRE__REQUEST__BODY_HELLO: handle_hello(s, req); break;
    case GRAPHD__WIRE__REQUEST__BODY_PING: handle_ping(s, req); break;
    case GRAPHD__WIRE__REQUEST__BODY_STATUS: handle_status(s, req); break;
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_MODULE:
      handle_register_module(s, req, fd); /* the registry maps the memfd; exit closes it */
      break;
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_PROGRAM:
      handle_register_program(s, req, fd); /* mapped only while decoding; exit closes it */
      break;
    case GRAPHD__WIRE__REQUEST__BODY_PREPARE_PROGRAM: handle_prepare_program(s, req); break;
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_REGION:
      region_handle_register(s, req->request_id, req->register_region, fd);
      fd = -1; /* owned by the import job now */
      break;
    case GRAPHD__WIRE__REQUEST__BODY_UNREGISTER_REGION:
      region_handle_unregister(s, req->request_id, req->unregister_region);
      break;
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_FLAGS:
      replay_handle_register_flags(s, req->request_id, req->register_flags, fd);
      fd = -1; /* owned by the job now */
      break;
    case GRAPHD__WIRE__REQUEST__BODY_REPLAY: replay_handle(s, req->request_id, req->replay); break;
    case GRAPHD__WIRE__REQUEST__BODY_LIST_CAPTURES: evict_handle_list(s, req->request_id); break;
    case GRAPHD__WIRE__REQUEST__BODY_EVICT: evict_handle_evict(s, req->request_id, req->evict); break;
    default:
      session_reply_error(s, req->request_id, GRAPHD_UNIMPLEMENTED, "request %d is not handled",
                          (int)body);
      break;
  }
exit:
  if (fd >= 0) close(fd);
  graphd__wire__request__free_unpacked(req, NULL);
}
