/* See registration.h. Loop thread, except reg_work_cb (libuv's thread
 * pool) and prepare_run (worker). */
#define _GNU_SOURCE
#include "registration.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/base/allowlist.h"
#include "daemon/sessions/daemon.h"
#include "graphd/status.h"
#include "common/log.h"
#include "daemon/device/modcache.h"
#include "reclaim.h"
#include "daemon/base/registry.h"

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

void registration_handle_module(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  int fd = fds[0]; /* the router closes it after */
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

void registration_handle_program(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  int fd = fds[0]; /* mapped only while decoding; the router closes it after */
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

void registration_handle_prepare(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  (void)fds;
  Graphd__Wire__PrepareProgram *m = req->prepare_program;
  if (!id_ok(s, req->request_id, &m->program_id, "PrepareProgram.program_id")) return;
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
