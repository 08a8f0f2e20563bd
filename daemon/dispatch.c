/* See dispatch.h. Loop thread, except prepare_run (worker). */
#define _GNU_SOURCE
#include "dispatch.h"

#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../common/uuid.h"
#include "control.h"
#include "daemon.h"
#include "dsession.h"
#include "graphd/status.h"
#include "log.h"
#include "modcache.h"
#include "reclaim.h"
#include "registry.h"
#include "replay.h"
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
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_RING: return "RegisterRing";
    case GRAPHD__WIRE__REQUEST__BODY_RING_PROGRAM: return "RingProgram";
    default: return "unknown";
  }
}

/* The admin rule (docs/design.md, "Privilege"): root, the daemon's own
 * uid, or a member of the admin group (primary or supplementary, from
 * SO_PEERGROUPS). */
static bool peer_is_admin(gd_session *s) {
  gd_daemon *d = daemon_of(s);
  if (s->uid == 0 || s->uid == d->euid) return true;
  const char *gname = d->opt->admin_group;
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

/* A client's name goes into logs, status, JSON and terminals as it is: it
 * must be UTF-8 without control characters. Returns the offending byte's
 * offset, or -1 when the name is fine; *what says what is wrong there. */
static long name_fault(const char *name, const char **what) {
  const unsigned char *p = (const unsigned char *)name;
  for (size_t i = 0; p[i];) {
    unsigned c = p[i], need, cp;
    if (c < 0x80) {
      need = 0, cp = c;
    } else if (c >= 0xc2 && c <= 0xdf) {
      need = 1, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      need = 2, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      need = 3, cp = c & 0x07;
    } else {
      *what = "is not valid UTF-8";
      return (long)i;
    }
    for (unsigned k = 1; k <= need; k++) {
      if ((p[i + k] & 0xc0) != 0x80) {
        *what = "is not valid UTF-8";
        return (long)i;
      }
      cp = cp << 6 | (p[i + k] & 0x3f);
    }
    if ((need == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (need == 3 && (cp < 0x10000 || cp > 0x10ffff))) {
      *what = "is not valid UTF-8";
      return (long)i;
    }
    if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f)) {
      *what = "has a control character";
      return (long)i;
    }
    i += 1 + need;
  }
  return -1;
}

static void handle_hello(gd_session *s, Graphd__Wire__Request *req) {
  gd_daemon *d = daemon_of(s);
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
  const char *what = NULL;
  long at = h->client_name ? name_fault(h->client_name, &what) : -1;
  if (at >= 0) {
    session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                        "Hello.client_name %s (byte %ld, 0x%02x): it must be UTF-8 without "
                        "control characters",
                        what, at, (unsigned char)h->client_name[at]);
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
    for (int i = 0; i < d->ndevices; i++)
      if (memcmp(d->facts[i]->uuid, h->device_uuid.data, GD_UUID_LEN) == 0) dev = i;
    if (dev < 0) {
      char want[48], have[512] = "";
      size_t n = 0;
      gd_uuid_format(h->device_uuid.data, "", want);
      for (int i = 0; i < d->ndevices && n < sizeof have; i++)
        n += (size_t)snprintf(have + n, sizeof have - n, "%s%s", i ? ", " : "",
                              d->facts[i]->uuid_str);
      session_reply_error(s, req->request_id, GRAPHD_NOT_FOUND,
                          "no device with UUID %s is served by this daemon (it serves: %s)", want,
                          have);
      session_close_after_flush(s);
      return;
    }
    gd_device *device = &d->devices[dev];
    if (!device_ok(device)) {
      session_reply_error(s, req->request_id, GRAPHD_UNAVAILABLE,
                          "device %d (%s) is not usable: %s", dev, d->facts[dev]->uuid_str,
                          device->fail_msg);
      session_close_after_flush(s);
      return;
    }
    if (dsession_open(s, dev) < 0) {
      session_reply_error(s, req->request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
      session_close_after_flush(s);
      return;
    }
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
  hr.max_frame = d->opt->max_frame;
  if (dev >= 0) {
    control_fill_device(d, dev, 0, &di, &dc);
    hr.device = &di;
  }
  GD_LOG(GD_INFO, "session", "session %llu: %s session for pid %d uid %u (%s)%s%s",
         (unsigned long long)s->id, dev >= 0 ? "data" : "control", (int)s->pid, (unsigned)s->uid,
         s->client_name[0] ? s->client_name : "unnamed", dev >= 0 ? " on " : "",
         dev >= 0 ? d->facts[dev]->uuid_str : "");
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

/* The most fds a request takes. */
static int max_fds(Graphd__Wire__Request__BodyCase body) {
  switch (body) {
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_MODULE:
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_PROGRAM:
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_REGION:
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_FLAGS: return 1;
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_RING: return 2;
    default: return 0;
  }
}

static bool id_ok(gd_session *s, uint64_t request_id, const ProtobufCBinaryData *id,
                  const char *field) {
  if (id->len == GD_ID_LEN) return true;
  session_reply_error(s, request_id, GRAPHD_INVALID_ARGUMENT, "%s must be %d bytes, got %zu", field,
                      GD_ID_LEN, id->len);
  return false;
}

static void reply_registered(gd_session *s, uint64_t request_id, bool program,
                             const uint8_t id[GD_ID_LEN], bool known) {
  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__RegisterModuleReply mr = GRAPHD__WIRE__REGISTER_MODULE_REPLY__INIT;
  Graphd__Wire__RegisterProgramReply pr = GRAPHD__WIRE__REGISTER_PROGRAM_REPLY__INIT;
  ProtobufCBinaryData bid = {GD_ID_LEN, (uint8_t *)id};
  r.request_id = request_id;
  if (program) {
    r.body_case = GRAPHD__WIRE__REPLY__BODY_REGISTER_PROGRAM;
    r.register_program = &pr;
    pr.program_id = bid;
    pr.already_known = known;
  } else {
    r.body_case = GRAPHD__WIRE__REPLY__BODY_REGISTER_MODULE;
    r.register_module = &mr;
    mr.module_id = bid;
    mr.already_known = known;
  }
  session_reply(s, &r);
}

/* A registration went through (the entry is new or known): the session's
 * user pays for it and the session holds it, then the reply. Over the
 * user's limit, the user's unused entries make room or the answer is
 * RESOURCE_EXHAUSTED. */
static void registered(gd_session *s, uint64_t request_id, bool program,
                       const uint8_t id[GD_ID_LEN], bool known) {
  gd_daemon *d = daemon_of(s);
  void *e = program ? (void *)registry_find_program(&d->reg, id)
                    : (void *)registry_find_module(&d->reg, id);
  char err[512];
  int rc = e ? registry_claim(&d->reg, (uint32_t)s->uid, program, e, err, sizeof err) : 0;
  if (rc == 0 && e)
    rc = registry_hold(&d->reg, &s->holds, (uint32_t)s->uid, program, e, err, sizeof err);
  if (rc < 0)
    session_reply_error(s, request_id, rc, "%s: %s", program ? "RegisterProgram" : "RegisterModule",
                        err);
  else
    reply_registered(s, request_id, program, id, known);
}

void dispatch_session_closed(gd_session *s) {
  registry_release(&daemon_of(s)->reg, &s->holds);
  dsession_close(s);
}

/* Registrations whose bytes take time to hash or decode (over this size)
 * go to libuv's thread pool, so the loop serves other sessions meanwhile;
 * the registry itself changes on the loop only. */
#define OFFLOOP_BYTES (64u << 10)

typedef struct reg_work {
  uv_work_t work;
  gd_session *s;
  uint64_t request_id;
  bool program;
  uint8_t id[GD_ID_LEN];
  gd_module *mod;     /* module: its bytes, hashed off the loop */
  const uint8_t *enc; /* program: its encoding, mapped from a memfd */
  uint8_t *enc_copy;  /* ... or copied from the request */
  size_t len;
  bool maybe_known; /* program: the id is registered already */
  bool same;        /* ... and these bytes hash to it */
  gd_program *prog; /* program: decoded off the loop */
  int rc;
  char err[1024];
} reg_work;

static void reg_work_cb(uv_work_t *w) {
  reg_work *rw = gd_container_of(w, reg_work, work);
  if (!rw->program) {
    rw->rc = registry_module_verify(rw->mod, rw->err, sizeof rw->err);
    return;
  }
  const uint8_t *enc = rw->enc_copy ? rw->enc_copy : rw->enc;
  if (rw->maybe_known && (rw->same = registry_same_program(rw->id, enc, rw->len))) return;
  rw->rc = registry_program_decode(rw->id, enc, rw->len, &rw->prog, rw->err, sizeof rw->err);
}

static void reg_after_cb(uv_work_t *w, int status) {
  reg_work *rw = gd_container_of(w, reg_work, work);
  gd_session *s = rw->s;
  gd_registry *reg = &daemon_of(s)->reg;
  bool known = rw->same;
  int rc = status < 0 ? -GRAPHD_INTERNAL : rw->rc;
  if (status < 0) snprintf(rw->err, sizeof rw->err, "the work was cancelled");
  if (rw->program) {
    if (rc == 0 && !known)
      rc = registry_program_insert(reg, rw->prog, &known, rw->err, sizeof rw->err);
    else
      gd_program_free(rw->prog);
    if (rw->enc) munmap((void *)rw->enc, rw->len ? rw->len : 1);
    free(rw->enc_copy);
  } else if (rc == 0) {
    rc = registry_module_insert(reg, rw->mod, &known, rw->err, sizeof rw->err);
  } else {
    registry_module_discard(rw->mod);
  }
  if (!s->closing) {
    if (rc < 0)
      session_reply_error(s, rw->request_id, rc, "%s: %s",
                          rw->program ? "RegisterProgram" : "RegisterModule", rw->err);
    else
      registered(s, rw->request_id, rw->program, rw->id, known);
  }
  reclaim_flush(daemon_of(s)); /* an insert may have made room */
  session_end_request(s);
  free(rw);
}

/* Hands rw to the thread pool as the session's request in flight. */
static void reg_work_start(gd_session *s, reg_work *rw) {
  rw->s = s;
  session_begin_request(s);
  int rc = uv_queue_work(daemon_of(s)->loop, &rw->work, reg_work_cb, reg_after_cb);
  if (rc < 0) {
    rw->rc = -GRAPHD_INTERNAL;
    snprintf(rw->err, sizeof rw->err, "uv_queue_work: %s", uv_strerror(rc));
    reg_after_cb(&rw->work, 0);
  }
}

/* Host modules are native code that the daemon loads: only admins bring
 * new ones, or anyone when an admin listed the id. One already registered
 * (by an admin) may be named again by anyone. */
static bool host_module_allowed(gd_session *s, uint32_t kind, const uint8_t *id) {
  return kind != GD_MODULE_HOST_ELF || s->admin || allowlist_has(&daemon_of(s)->host_allow, id);
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
  gd_module *mod = NULL;
  int rc = registry_module_new(&daemon_of(s)->reg, m->module_id.data, m->kind, m->inline_bytes.data,
                               len, fd, &mod, &known, err, sizeof err);
  if (rc == 0 && mod && !host_module_allowed(s, m->kind, m->module_id.data)) {
    registry_module_discard(mod);
    session_reply_error(s, req->request_id, GRAPHD_PERMISSION_DENIED,
                        "RegisterModule: a host module runs as graphd's user, so registering a "
                        "new one needs an admin session (root, graphd's user, or the admin "
                        "group) or its id in graphd's --host-module-allow file");
    return;
  }
  if (rc == 0 && !known && len > OFFLOOP_BYTES) {
    reg_work *rw = calloc(1, sizeof *rw);
    if (rw) {
      rw->request_id = req->request_id;
      rw->mod = mod;
      memcpy(rw->id, m->module_id.data, GD_ID_LEN);
      reg_work_start(s, rw);
      return;
    }
  }
  if (rc == 0 && mod) {
    /* Hashed here (small, or the hand-off had no memory); insert takes the
     * module, a failed verify leaves it to us. */
    rc = registry_module_verify(mod, err, sizeof err);
    if (rc < 0)
      registry_module_discard(mod);
    else
      rc = registry_module_insert(&daemon_of(s)->reg, mod, &known, err, sizeof err);
  }
  if (rc < 0) {
    session_reply_error(s, req->request_id, rc, "RegisterModule: %s", err);
    return;
  }
  registered(s, req->request_id, false, m->module_id.data, known);
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
  if (len > OFFLOOP_BYTES) {
    reg_work *rw = calloc(1, sizeof *rw);
    if (rw && fd < 0 && !(rw->enc_copy = malloc(len))) {
      free(rw);
      rw = NULL;
    }
    if (rw) {
      rw->request_id = req->request_id;
      rw->program = true;
      memcpy(rw->id, m->program_id.data, GD_ID_LEN);
      if (fd >= 0)
        rw->enc = enc;
      else
        memcpy(rw->enc_copy, enc, len);
      rw->len = len;
      rw->maybe_known = registry_find_program(&daemon_of(s)->reg, rw->id) != NULL;
      reg_work_start(s, rw);
      return;
    }
  }
  /* The registry decodes (copies) what it keeps; the mapping can go after. */
  int rc = registry_add_program(&daemon_of(s)->reg, m->program_id.data, enc, len, &known, err,
                                sizeof err);
  if (fd >= 0) munmap((void *)enc, len ? len : 1);
  if (rc < 0) {
    session_reply_error(s, req->request_id, rc, "RegisterProgram: %s", err);
    return;
  }
  registered(s, req->request_id, true, m->program_id.data, known);
}

typedef struct prepare_job {
  gd_request rq;
  const gd_regprog *prog;
  uint64_t loaded, load_ns;
} prepare_job;

static void prepare_run(gd_job *j, void *ctx) {
  prepare_job *pj = gd_container_of(j, prepare_job, rq.job);
  j->status = modcache_prepare(ctx, pj->prog, &pj->loaded, &pj->load_ns, j->msg, sizeof j->msg);
}

static void prepare_done(gd_job *j) {
  prepare_job *pj = gd_container_of(j, prepare_job, rq.job);
  gd_session *s = pj->rq.s;
  if (!s->closing) {
    if (j->status < 0) {
      daemon_of(s)->counters[s->device].errors++;
      session_reply_error(s, pj->rq.request_id, j->status, "%s", j->msg);
    } else {
      Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
      Graphd__Wire__PrepareProgramReply pr = GRAPHD__WIRE__PREPARE_PROGRAM_REPLY__INIT;
      r.request_id = pj->rq.request_id;
      r.body_case = GRAPHD__WIRE__REPLY__BODY_PREPARE_PROGRAM;
      r.prepare_program = &pr;
      pr.modules_loaded = pj->loaded;
      pr.load_ns = pj->load_ns;
      session_reply(s, &r);
    }
  }
  session_end_request(s);
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
  gd_regprog *p = registry_find_program(&daemon_of(s)->reg, m->program_id.data);
  if (!p) {
    char hex[2 * GD_ID_LEN + 1];
    gd_id_hex(m->program_id.data, 0, hex);
    session_reply_error(s, req->request_id, GRAPHD_NOT_FOUND,
                        "program %s is not registered; register it first", hex);
    return;
  }
  char err[512] = "out of memory";
  prepare_job *pj = calloc(1, sizeof *pj);
  gd_daemon *d = daemon_of(s);
  int rc = pj ? registry_hold(&d->reg, &s->holds, (uint32_t)s->uid, true, p, err, sizeof err)
              : -GRAPHD_RESOURCE_EXHAUSTED;
  if (rc < 0) {
    free(pj);
    session_reply_error(s, req->request_id, -rc, "PrepareProgram: %s", err);
    return;
  }
  pj->prog = p;
  session_submit(s, req->request_id, &pj->rq, daemon_worker(daemon_of(s), s->device), prepare_run,
                 prepare_done);
}

void dispatch_request(gd_session *s, Graphd__Wire__Request *req, int *fds, int nfds) {
  Graphd__Wire__Request__BodyCase body = req->body_case;
  int fd = -1;
  int fd2 = -1;
  if (nfds > max_fds(body)) {
    for (int i = 0; i < nfds; i++) close(fds[i]);
    if (max_fds(body))
      session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                          "%s takes at most %s, but %d were sent", body_name(body),
                          max_fds(body) == 1 ? "one file descriptor" : "two file descriptors",
                          nfds);
    else
      session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                          "%s takes no file descriptors, but %d were sent", body_name(body), nfds);
    goto exit;
  }
  if (nfds >= 1) fd = fds[0];
  if (nfds == 2) fd2 = fds[1];
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
    case GRAPHD__WIRE__REQUEST__BODY_STATUS: control_handle_status(s, req->request_id); break;
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_MODULE:
      handle_register_module(s, req, fd); /* the registry maps the memfd; exit closes it */
      break;
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_PROGRAM:
      handle_register_program(s, req, fd); /* mapped only while decoding; exit closes it */
      break;
    case GRAPHD__WIRE__REQUEST__BODY_PREPARE_PROGRAM: handle_prepare_program(s, req); break;
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_REGION:
      dsession_handle_register_region(s, req->request_id, req->register_region, fd);
      fd = -1; /* owned by the import job now */
      break;
    case GRAPHD__WIRE__REQUEST__BODY_UNREGISTER_REGION:
      dsession_handle_unregister_region(s, req->request_id, req->unregister_region);
      break;
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_FLAGS:
      dsession_handle_register_flags(s, req->request_id, req->register_flags, fd);
      fd = -1; /* owned by the job now */
      break;
    case GRAPHD__WIRE__REQUEST__BODY_REPLAY: replay_handle(s, req->request_id, req->replay); break;
    case GRAPHD__WIRE__REQUEST__BODY_LIST_CAPTURES: control_handle_list(s, req->request_id); break;
    case GRAPHD__WIRE__REQUEST__BODY_EVICT:
      control_handle_evict(s, req->request_id, req->evict);
      break;
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_RING: {
      const int two[2] = {fd, fd2};
      dsession_handle_register_ring(s, req->request_id, req->register_ring, two);
      fd = fd2 = -1; /* taken */
      break;
    }
    case GRAPHD__WIRE__REQUEST__BODY_RING_PROGRAM:
      dsession_handle_ring_program(s, req->request_id, req->ring_program);
      break;
    default:
      session_reply_error(s, req->request_id, GRAPHD_UNIMPLEMENTED, "request %d is not handled",
                          (int)body);
      break;
  }
exit:
  if (fd >= 0) close(fd);
  if (fd2 >= 0) close(fd2);
  graphd__wire__request__free_unpacked(req, NULL);
  reclaim_flush(daemon_of(s)); /* what a registration made room by */
}
