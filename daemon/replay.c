/* See replay.h. Loop thread, except the job run functions (worker). */
#define _GNU_SOURCE
#include "replay.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capture.h"
#include "graphd/status.h"
#include "log.h"
#include "region.h"
#include "registry.h"
#include "server.h"

int replay_session_open(gd_session *s) {
  gd_wsess *ws = calloc(1, sizeof *ws);
  if (!ws) return -GRAPHD_RESOURCE_EXHAUSTED;
  ws->session_id = s->id;
  s->ws = ws;
  return 0;
}

typedef struct end_job {
  gd_job job; /* first */
  gd_wsess *ws;
  gd_region_map *maps;
  size_t nmaps;
} end_job;

static void end_run(gd_worker *w, gd_job *j) {
  end_job *ej = (end_job *)j;
  capture_session_end(w, ej->ws, ej->maps, ej->nmaps);
  ej->ws = NULL;
}

static void end_done(gd_job *j) {
  end_job *ej = (end_job *)j;
  free(ej->ws); /* only when the worker was gone and nothing ran */
  free(ej->maps);
  free(ej);
}

void replay_session_close(gd_session *s) {
  end_job *ej = calloc(1, sizeof *ej);
  if (!ej || region_take_all(s, &ej->maps, &ej->nmaps) < 0) {
    GD_LOG(GD_ERROR, "replay", "out of memory ending session %llu on its worker; its "
           "mappings stay until exit", (unsigned long long)s->id);
    free(ej);
    return;
  }
  ej->ws = s->ws;
  /* A replay waiting on this client's ready flag stops waiting now. */
  if (s->ws) atomic_store(&s->ws->client_gone, 1);
  ej->job.run = end_run;
  ej->job.done = end_done;
  s->ws = NULL;
  free(s->last_seq);
  s->last_seq = NULL;
  worker_submit(&s->srv->pool.workers[s->device], &ej->job);
}

/* --- RegisterFlags -------------------------------------------------------- */

typedef struct flags_job {
  gd_job job; /* first */
  gd_session *s;
  uint64_t request_id;
  gd_wsess *ws;
  int fd;
  uint32_t slots;
} flags_job;

static void flags_run(gd_worker *w, gd_job *j) {
  flags_job *fj = (flags_job *)j;
  j->status = capture_flags_register(w, fj->ws, fj->fd, fj->slots, j->msg, sizeof j->msg);
}

static void flags_done(gd_job *j) {
  flags_job *fj = (flags_job *)j;
  gd_session *s = fj->s;
  close(fj->fd);
  if (!s->closing) {
    if (j->status < 0) {
      session_reply_error(s, fj->request_id, j->status, "RegisterFlags: %s", j->msg);
    } else if (!(s->last_seq = calloc(fj->slots, sizeof *s->last_seq))) {
      session_reply_error(s, fj->request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    } else {
      s->flag_slots = fj->slots;
      Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
      Graphd__Wire__RegisterFlagsReply fr = GRAPHD__WIRE__REGISTER_FLAGS_REPLY__INIT;
      r.request_id = fj->request_id;
      r.body_case = GRAPHD__WIRE__REPLY__BODY_REGISTER_FLAGS;
      r.register_flags = &fr;
      session_reply(s, &r);
    }
  }
  session_request_done(s);
  session_unref(s);
  free(fj);
}

void replay_handle_register_flags(gd_session *s, uint64_t request_id,
                                  const Graphd__Wire__RegisterFlags *m, int fd) {
  const char *why = NULL;
  int code = GRAPHD_INVALID_ARGUMENT;
  if (s->kind != GD_SESSION_DATA) {
    why = "RegisterFlags needs a data session (one bound to a device)";
    code = GRAPHD_FAILED_PRECONDITION;
  } else if (s->flag_slots) {
    why = "this session already registered its flag page";
    code = GRAPHD_ALREADY_EXISTS;
  } else if (fd < 0) {
    why = "RegisterFlags carries the flag page's memfd (one fd)";
  } else if (m->slots == 0 || m->slots > GD_MAX_FLAG_SLOTS) {
    why = "RegisterFlags.slots must be 1 to 1024";
  }
  if (why) {
    if (fd >= 0) close(fd);
    session_reply_error(s, request_id, code, "%s", why);
    return;
  }
  flags_job *fj = calloc(1, sizeof *fj);
  if (!fj) {
    close(fd);
    session_reply_error(s, request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  fj->s = s;
  fj->request_id = request_id;
  fj->ws = s->ws;
  fj->fd = fd;
  fj->slots = m->slots;
  fj->job.run = flags_run;
  fj->job.done = flags_done;
  s->busy = true;
  session_ref(s);
  worker_submit(&s->srv->pool.workers[s->device], &fj->job);
}

/* --- Replay --------------------------------------------------------------- */

typedef struct replay_job {
  gd_job job; /* first */
  gd_session *s;
  uint64_t request_id;
  uint64_t t0;         /* the request was read */
  uint64_t latency_ns; /* from t0 until the reply was ready */
  uint64_t server_ns;
  bool replied; /* the worker sent the reply itself */
  gd_replay_args a;
} replay_job;

static void fill_reply(replay_job *rj, Graphd__Wire__Reply *r, Graphd__Wire__ReplayReply *rr,
                       char *msg, size_t msglen) {
  r->request_id = rj->request_id;
  if (rj->job.status < 0) {
    r->code = (uint32_t)-rj->job.status;
    snprintf(msg, msglen, "replay: %s", rj->job.msg);
    r->message = msg;
    return;
  }
  r->body_case = GRAPHD__WIRE__REPLY__BODY_REPLAY;
  r->replay = rr;
  rr->captured = rj->a.captured;
  rr->capture_ns = rj->a.capture_ns;
  rr->server_ns = rj->server_ns;
}

static void replay_run(gd_worker *w, gd_job *j) {
  replay_job *rj = (replay_job *)j;
  uint64_t t0 = gd_now_ns();
  j->status = capture_replay(w, &rj->a, j->msg, sizeof j->msg);
  uint64_t t1 = gd_now_ns();
  rj->server_ns = t1 - t0;
  rj->latency_ns = t1 - rj->t0;
  /* The hot path: answer from here rather than through the loop thread
   * (the loop still does the bookkeeping when the job comes back). A hung
   * client's failure closes its session, so that one goes by the loop. */
  if (j->status == -GRAPHD_DEADLINE_EXCEEDED) return;
  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__ReplayReply rr = GRAPHD__WIRE__REPLAY_REPLY__INIT;
  char msg[sizeof j->msg + 16];
  fill_reply(rj, &r, &rr, msg, sizeof msg);
  uint8_t *frame;
  size_t len;
  if (session_pack_reply(rj->s, &r, &frame, &len) < 0) return;
  rj->replied = session_send_direct(rj->s, frame, len);
  if (!rj->replied) free(frame);
}

static void replay_done(gd_job *j) {
  replay_job *rj = (replay_job *)j;
  gd_session *s = rj->s;
  gd_device_counters *c = &s->srv->counters[s->device];
  c->inflight--;
  if (rj->a.captured) {
    c->captures++;
    c->captures_built++;
    c->staging_bytes += rj->a.staging_bytes;
    if (rj->a.recaptured) c->recaptures++;
  }
  gd_counters_evicted(c, rj->a.budget_evicted, rj->a.budget_evicted_bytes);
  if (j->status < 0) {
    c->errors++;
  } else {
    c->replays++;
    gd_hist_add(&c->replay_latency, rj->latency_ns);
  }
  if (!s->closing && !rj->replied) {
    if (j->status < 0) {
      session_reply_error(s, rj->request_id, j->status, "replay: %s", j->msg);
      if (j->status == -GRAPHD_DEADLINE_EXCEEDED && j->ran) {
        /* The head-of-line policy: a hung client is cut off. */
        GD_LOG(GD_WARN, "replay", "session %llu (pid %d): %s; closing it",
               (unsigned long long)s->id, (int)s->pid, j->msg);
        session_close_after_flush(s);
      }
    } else {
      Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
      Graphd__Wire__ReplayReply rr = GRAPHD__WIRE__REPLAY_REPLY__INIT;
      char msg[sizeof j->msg + 16];
      fill_reply(rj, &r, &rr, msg, sizeof msg);
      session_reply(s, &r);
    }
  }
  session_request_done(s);
  session_unref(s);
  free(rj);
}

static const char *role_name(uint32_t role) {
  static const char *const n[] = {"input", "output", "inout", "scratch"};
  return role < 4 ? n[role] : "?";
}

void replay_handle(gd_session *s, uint64_t request_id, const Graphd__Wire__Replay *m) {
  uint64_t t0 = gd_now_ns();
  char err[512];
  int code = GRAPHD_INVALID_ARGUMENT;
  replay_job *rj = NULL;
#define REFUSE(c, ...)                        \
  do {                                        \
    code = (c);                               \
    snprintf(err, sizeof err, __VA_ARGS__);   \
    goto refuse;                              \
  } while (0)
  if (s->kind != GD_SESSION_DATA)
    REFUSE(GRAPHD_FAILED_PRECONDITION, "Replay needs a data session (one bound to a device)");
  if (m->program_id.len != GD_ID_LEN)
    REFUSE(GRAPHD_INVALID_ARGUMENT, "Replay.program_id must be %d bytes", GD_ID_LEN);
  const gd_prog *prog = registry_find_program(&s->srv->reg, m->program_id.data);
  if (!prog) {
    char hex[2 * GD_ID_LEN + 1];
    gd_id_hex(m->program_id.data, 0, hex);
    REFUSE(GRAPHD_NOT_FOUND, "program %s is not registered; register it first", hex);
  }
  const gd_program *p = prog->program;
  uint64_t epoch = atomic_load(&s->srv->pool.workers[s->device].epoch);
  if (!s->flag_slots)
    REFUSE(GRAPHD_FAILED_PRECONDITION, "the session has no flag page; RegisterFlags first");
  if (m->stream_slot >= s->flag_slots)
    REFUSE(GRAPHD_OUT_OF_RANGE, "stream slot %u is out of range: the flag page has %u",
           m->stream_slot, s->flag_slots);
  if (m->seq <= s->last_seq[m->stream_slot])
    REFUSE(GRAPHD_INVALID_ARGUMENT, "seq %llu on stream slot %u must be above the last one, %llu",
           (unsigned long long)m->seq, m->stream_slot,
           (unsigned long long)s->last_seq[m->stream_slot]);
  rj = calloc(1, sizeof *rj);
  if (!rj) REFUSE(GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
  rj->t0 = t0;
  if (m->n_bindings > p->nslots)
    REFUSE(GRAPHD_INVALID_ARGUMENT, "%zu bindings for a program of %u slots", m->n_bindings,
           p->nslots);
  for (size_t i = 0; i < m->n_bindings; i++) {
    const Graphd__Wire__Binding *b = m->bindings[i];
    if (b->slot >= p->nslots)
      REFUSE(GRAPHD_INVALID_ARGUMENT, "binding %zu names slot %u; the program has %u slots", i,
             b->slot, p->nslots);
    const gd_slot *sl = &p->slots[b->slot];
    if (sl->role == GD_ROLE_SCRATCH)
      REFUSE(GRAPHD_INVALID_ARGUMENT, "slot %u is scratch (daemon-owned) and cannot be bound",
             b->slot);
    if (rj->a.bind[b->slot].bound)
      REFUSE(GRAPHD_INVALID_ARGUMENT, "slot %u is bound twice", b->slot);
    if (b->bytes != sl->size)
      REFUSE(GRAPHD_INVALID_ARGUMENT, "slot %u (%s) is %llu bytes, but its binding covers %llu",
             b->slot, role_name(sl->role), (unsigned long long)sl->size,
             (unsigned long long)b->bytes);
    gd_region *r = region_find(s, b->region_id);
    if (!r)
      REFUSE(GRAPHD_NOT_FOUND, "slot %u is bound to region %u, which this session does not have",
             b->slot, b->region_id);
    if (r->map.epoch != epoch)
      REFUSE(GRAPHD_UNAVAILABLE, "device %d was reset after a GPU fault and region %u went with "
             "it; reconnect and register the regions again", s->device, r->id);
    char e[256];
    if (region_check_range(r, b->offset, b->bytes, e, sizeof e) < 0)
      REFUSE(GRAPHD_OUT_OF_RANGE, "slot %u: %s", b->slot, e);
    rj->a.bind[b->slot].bound = true;
    rj->a.bind[b->slot].addr = r->map.ptr + b->offset;
    rj->a.bind[b->slot].bytes = b->bytes;
  }
  for (uint32_t k = 0; k < p->nslots; k++) {
    const gd_slot *sl = &p->slots[k];
    if (sl->role != GD_ROLE_SCRATCH && (sl->flags & GD_SLOT_STAGED) && !rj->a.bind[k].bound)
      REFUSE(GRAPHD_INVALID_ARGUMENT, "slot %u (staged %s) is not bound", k, role_name(sl->role));
  }
  s->last_seq[m->stream_slot] = m->seq;
  rj->s = s;
  rj->request_id = request_id;
  rj->a.prog = prog;
  rj->a.ws = s->ws;
  rj->a.stream_slot = m->stream_slot;
  rj->a.seq = m->seq;
  rj->a.ready_timeout_s = s->srv->opt->ready_timeout_s;
  rj->a.client_pid = (uint32_t)s->pid;
  rj->a.epoch = epoch;
  rj->job.run = replay_run;
  rj->job.done = replay_done;
  s->busy = true;
  session_ref(s);
  s->srv->counters[s->device].inflight++;
  worker_submit(&s->srv->pool.workers[s->device], &rj->job);
  return;
refuse:
  free(rj);
  if (s->kind == GD_SESSION_DATA) s->srv->counters[s->device].errors++;
  session_reply_error(s, request_id, code, "replay: %s", err);
#undef REFUSE
}

void replay_device_reset(void *owner, int device) {
  gd_server *srv = owner;
  gd_device_counters *c = &srv->counters[device];
  c->errors++;
  /* The worker dropped every capture with the old context. */
  c->captures = 0;
  c->staging_bytes = 0;
  gd_session *next;
  for (gd_session *s = srv->sessions; s; s = next) {
    next = s->next;
    if (s->kind != GD_SESSION_DATA || s->device != device || s->closing) continue;
    /* Whatever its stream waits for from the old context will not come:
     * write every done value from the host, so no client stream waits
     * forever. The worker's last write to the page came before the reset,
     * whose news comes through the completion queue. */
    if (s->ws) capture_release_flags(s->ws, GD_FLAG_DONE, NULL);
    GD_LOG(GD_WARN, "replay", "session %llu (pid %d): device %d was reset after a GPU fault; "
           "closing the session (the client reconnects)", (unsigned long long)s->id, (int)s->pid,
           device);
    session_close(s, "device reset after a GPU fault");
  }
  if (atomic_load(&srv->pool.workers[device].state) != GD_WORKER_FAILED || srv->shutting_down)
    return;
  /* The reset failed: CUDA (13, as measured) makes no new context in a
   * process whose context took a sticky fault. Only a new process brings
   * the GPU back, so stop cleanly and let the service manager start one;
   * every client reconnects. */
  GD_LOG(GD_ERROR, "replay", "%s; exiting with status %d so that the service manager restarts "
         "graphd (clients of every device reconnect)", srv->pool.workers[device].fail_msg,
         GD_EXIT_FAULT);
  srv->exit_code = GD_EXIT_FAULT;
  /* Through the signal path, so the shutdown starts from the loop's top
   * level rather than inside the completion callbacks it drains. */
  if (uv_kill(getpid(), SIGTERM) != 0) _exit(GD_EXIT_FAULT);
}

void replay_cut_off(void *owner, uint64_t session_id) {
  gd_server *srv = owner;
  for (gd_session *s = srv->sessions; s; s = s->next) {
    if (s->id != session_id) continue;
    GD_LOG(GD_WARN, "replay", "session %llu (pid %d) is hung: its ready flag did not come within "
           "--ready-timeout while another session waited behind it; closing it",
           (unsigned long long)s->id, (int)s->pid);
    srv->counters[s->device].errors++;
    session_close(s, "cut off as hung");
    return;
  }
}
