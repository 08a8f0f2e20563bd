/* See replay.h. Loop thread, except replay_run (worker). */
#include "replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "daemon.h"
#include "dsession.h"
#include "execute.h"
#include "graphd/status.h"
#include "common/log.h"
#include "ring.h"

/* One replay, resolved on the loop and run on the worker. */
typedef struct replay_job {
  gd_request rq;
  uint64_t t0;         /* the request was read */
  uint64_t latency_ns; /* from t0 until the reply was ready */
  uint64_t server_ns;
  bool replied;                 /* the worker sent the reply itself */
  gd_replay_exec ex;            /* ex.bind is bind[] */
  struct replay_job *next_held; /* held back by --max-inflight-replays */
  uint64_t held_ns;
  gd_bound bind[]; /* one per slot of the program */
} replay_job;

/* --- on the loop ----------------------------------------------------------- */

static void fill_reply(replay_job *rj, Graphd__Wire__Reply *r, Graphd__Wire__ReplayReply *rr,
                       char *msg, size_t msglen) {
  r->request_id = rj->rq.request_id;
  if (rj->rq.job.status < 0) {
    r->code = (uint32_t)-rj->rq.job.status;
    r->not_started = rj->rq.job.not_started;
    snprintf(msg, msglen, "replay: %s", rj->rq.job.msg);
    r->message = msg;
    return;
  }
  r->body_case = GRAPHD__WIRE__REPLY__BODY_REPLAY;
  r->replay = rr;
  rr->captured = rj->ex.captured;
  rr->capture_ns = rj->ex.capture_ns;
  rr->server_ns = rj->server_ns;
}

static void replay_run(gd_job *j, void *ctx) {
  replay_job *rj = gd_container_of(j, replay_job, rq.job);
  uint64_t t0 = gd_now_ns();
  /* Ring entries the client published before sending this go first. */
  ring_drain(ctx, j->worker, rj->ex.ds);
  dstream_saw(rj->ex.ds, rj->ex.stream_slot, rj->ex.seq);
  j->status = exec_run(ctx, j->worker, &rj->ex, &j->not_started, j->msg, sizeof j->msg);
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
  if (session_pack_reply(rj->rq.s, &r, &frame, &len) < 0) return;
  rj->replied = session_send_direct(rj->rq.s, frame, len);
  if (!rj->replied) free(frame);
}

static void replay_done(gd_job *j) {
  replay_job *rj = gd_container_of(j, replay_job, rq.job);
  gd_session *s = rj->rq.s;
  gd_device_counters *c = &daemon_of(s)->counters[s->device];
  c->inflight--;
  if (rj->ex.captured) {
    c->captures++;
    c->captures_built++;
    c->staging_bytes += rj->ex.staging_bytes;
    if (rj->ex.recaptured) c->recaptures++;
  }
  gd_counters_evicted(c, rj->ex.budget_evicted, rj->ex.budget_evicted_bytes);
  if (j->status < 0) {
    c->errors++;
  } else {
    c->replays++;
    gd_hist_add(&c->replay_latency, rj->latency_ns);
  }
  if (!s->closing && !rj->replied) {
    if (j->status < 0) {
      session_reply_error(s, rj->rq.request_id, j->status, "replay: %s", j->msg);
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
  session_end_request(s);
  free(rj);
}

/* --- replays held back ------------------------------------------------------
 * A session may have at most --max-inflight-replays replays queued on its
 * device and not done (by the done words of its flag page): past that the
 * device's queue would grow without bound, and a client far ahead of its
 * GPU could fill the driver's queue and block the device's worker for
 * everyone. The next replay is held on the loop, its session not read,
 * until the count drops: the client waits in its call, as a launch into a
 * full queue waits in-process. */

static uint64_t session_inflight(const gd_dsession *x) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < x->nused_slots; i++) {
    uint32_t slot = x->used_slots[i];
    uint64_t done = __atomic_load_n(
        x->flags_host + (uint64_t)slot * GRAPHD_FLAG_WORDS_PER_SLOT + GRAPHD_FLAG_WORD_DONE,
        __ATOMIC_ACQUIRE);
    if (x->last_seq[slot] > done) n += x->last_seq[slot] - done;
  }
  return n;
}

static void fail_held(replay_job *rj, int code, const char *msg) {
  rj->rq.job.status = -code;
  snprintf(rj->rq.job.msg, sizeof rj->rq.job.msg, "%s", msg);
  replay_done(&rj->rq.job);
}

static void wait_cb(uv_timer_t *t) {
  gd_daemon *d = t->data;
  uint64_t now = gd_now_ns();
  for (replay_job **pp = &d->held_replays; *pp;) {
    replay_job *rj = *pp;
    gd_session *s = rj->rq.s;
    gd_dsession *x = s->closing ? NULL : dsession_of(s);
    double waited = (double)(now - rj->held_ns) / 1e9;
    if (x && session_inflight(x) >= d->opt->max_inflight_replays &&
        (d->opt->ready_timeout_s <= 0 || waited < d->opt->ready_timeout_s)) {
      pp = &rj->next_held;
      continue;
    }
    *pp = rj->next_held;
    char msg[256];
    if (!x) {
      fail_held(rj, GRAPHD_UNAVAILABLE, "the session closed while the replay waited");
    } else if (session_inflight(x) >= d->opt->max_inflight_replays) {
      snprintf(msg, sizeof msg,
               "over --max-inflight-replays %u: the session's earlier replays did not finish "
               "within the ready timeout (%.1f s)",
               d->opt->max_inflight_replays, waited);
      fail_held(rj, GRAPHD_RESOURCE_EXHAUSTED, msg);
    } else {
      worker_submit(daemon_worker(d, s->device), &rj->rq.job);
    }
  }
  if (!d->held_replays) uv_timer_stop(t);
}

static void hold(gd_daemon *d, replay_job *rj) {
  rj->held_ns = gd_now_ns();
  session_begin_request(rj->rq.s);
  rj->next_held = d->held_replays;
  d->held_replays = rj;
  if (!uv_is_active((uv_handle_t *)&d->wait_timer)) uv_timer_start(&d->wait_timer, wait_cb, 1, 1);
}

void replay_release_held(gd_daemon *d) {
  while (d->held_replays) {
    replay_job *rj = d->held_replays;
    d->held_replays = rj->next_held;
    rj->rq.s->unrun_request_id = rj->rq.request_id; /* never began: it may be sent again */
    fail_held(rj, GRAPHD_UNAVAILABLE, "graphd is shutting down; the replay was not run");
  }
  if (d->wait_timer.loop) uv_timer_stop(&d->wait_timer);
}

static const gd_region_map *table_find(void *table, uint32_t id) {
  gd_region *r = region_find(table, id);
  return r ? &r->map : NULL;
}

int replay_bind(const gd_program *p, gd_region_table *regions, uint64_t epoch, int dev,
                Graphd__Wire__Binding *const *bindings, size_t n, gd_bound *bind, char *err,
                size_t errlen) {
  if (n > p->nslots) {
    snprintf(err, errlen, "%zu bindings for a program of %u slots", n, p->nslots);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  gd_bind_req *b = malloc((n ? n : 1) * sizeof *b);
  if (!b) {
    snprintf(err, errlen, "out of memory");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  for (size_t i = 0; i < n; i++)
    b[i] = (gd_bind_req){.slot = bindings[i]->slot,
                         .region_id = bindings[i]->region_id,
                         .offset = bindings[i]->offset,
                         .bytes = bindings[i]->bytes};
  int rc = exec_bind(p, table_find, regions, epoch, dev, b, n, bind, err, errlen);
  free(b);
  return rc;
}

void replay_handle(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  (void)fds;
  uint64_t request_id = req->request_id;
  const Graphd__Wire__Replay *m = req->replay;
  uint64_t t0 = gd_now_ns();
  char err[512];
  int code = GRAPHD_INVALID_ARGUMENT;
  replay_job *rj = NULL;
#define REFUSE(c, ...)                                                                             \
  do {                                                                                             \
    code = (c);                                                                                    \
    snprintf(err, sizeof err, __VA_ARGS__);                                                        \
    goto refuse;                                                                                   \
  } while (0)
  gd_daemon *d = daemon_of(s);
  gd_dsession *x = dsession_of(s);
  if (m->program_id.len != GD_ID_LEN)
    REFUSE(GRAPHD_INVALID_ARGUMENT, "Replay.program_id must be %d bytes", GD_ID_LEN);
  gd_regprog *prog = registry_find_program(&d->reg, m->program_id.data);
  if (!prog) {
    char hex[2 * GD_ID_LEN + 1];
    gd_id_hex(m->program_id.data, 0, hex);
    REFUSE(GRAPHD_NOT_FOUND, "program %s is not registered; register it first", hex);
  }
  const gd_program *p = prog->program;
  uint64_t epoch = atomic_load(&d->devices[s->device].epoch);
  if (!x->flag_slots)
    REFUSE(GRAPHD_FAILED_PRECONDITION, "the session has no flag page; RegisterFlags first");
  if (m->stream_slot >= x->flag_slots)
    REFUSE(GRAPHD_OUT_OF_RANGE, "stream slot %u is out of range: the flag page has %u",
           m->stream_slot, x->flag_slots);
  if (m->seq <= x->last_seq[m->stream_slot])
    REFUSE(GRAPHD_INVALID_ARGUMENT, "seq %llu on stream slot %u must be above the last one, %llu",
           (unsigned long long)m->seq, m->stream_slot,
           (unsigned long long)x->last_seq[m->stream_slot]);
  rj = calloc(1, sizeof *rj + (size_t)p->nslots * sizeof rj->bind[0]);
  if (!rj) REFUSE(GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
  rj->t0 = t0;
  rj->ex.bind = rj->bind;
  int rc = replay_bind(p, &x->regions, epoch, s->device, m->bindings, m->n_bindings, rj->bind, err,
                       sizeof err);
  if (rc < 0) {
    code = -rc;
    goto refuse;
  }
  /* The session holds the program while it is open (the fast path: the
   * same program as last time). */
  if (s->last_held != prog) {
    int hrc = registry_hold(&d->reg, &s->holds, (uint32_t)s->uid, true, prog, err, sizeof err);
    if (hrc < 0) {
      code = -hrc;
      goto refuse;
    }
    s->last_held = prog;
  }
  if (!x->last_seq[m->stream_slot]) x->used_slots[x->nused_slots++] = m->stream_slot;
  bool full = session_inflight(x) >= d->opt->max_inflight_replays;
  x->last_seq[m->stream_slot] = m->seq;
  rj->ex.prog = prog;
  rj->ex.ds = x->ds;
  rj->ex.stream_slot = m->stream_slot;
  rj->ex.seq = m->seq;
  rj->ex.ready_timeout_s = d->opt->ready_timeout_s;
  rj->ex.client_pid = (uint32_t)s->pid;
  rj->ex.client_uid = (uint32_t)s->uid;
  rj->ex.epoch = epoch;
  rj->ex.others_waiting = ring_others_waiting;
  d->counters[s->device].inflight++;
  if (full) {
    rj->rq.s = s;
    rj->rq.request_id = request_id;
    rj->rq.job.run = replay_run;
    rj->rq.job.done = replay_done;
    hold(d, rj);
    return;
  }
  session_submit(s, request_id, &rj->rq, daemon_worker(d, s->device), replay_run, replay_done);
  return;
refuse:
  free(rj);
  if (s->kind == GD_SESSION_DATA) daemon_of(s)->counters[s->device].errors++;
  session_reply_error(s, request_id, code, "replay: %s", err);
#undef REFUSE
}
