/* See replay.h. Loop thread, except replay_run (worker). */
#include "replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/device/capture.h"
#include "daemon/base/check.h"
#include "daemon/sessions/daemon.h"
#include "daemon/sessions/data_session.h"
#include "daemon/replay/execute.h"
#include "graphd/status.h"
#include "common/log.h"
#include "daemon/replay/ring_replay.h"

/* One Replay: read on the loop, run on the worker's one replay path. */
typedef struct replay_job {
  gd_request rq;
  uint64_t t0;         /* the request was read */
  uint64_t latency_ns; /* from t0 until the reply was ready */
  uint64_t server_ns;
  bool replied; /* the worker sent the reply itself */
  gd_session_stream *ds;
  gd_replay_req req; /* req.bindings is b[] */
  gd_replay_tally tally;
  gd_replay_exec ran;           /* what exec_replay ran (captured, its time) */
  struct replay_job *next_held; /* held back by --max-inflight-replays */
  uint64_t held_ns;
  gd_bind_req b[]; /* the request's bindings */
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
  rr->captured = rj->ran.captured;
  rr->capture_ns = rj->ran.capture_ns;
  rr->server_ns = rj->server_ns;
}

static void replay_run(gd_job *j, void *ctx) {
  replay_job *rj = gd_container_of(j, replay_job, rq.job);
  uint64_t t0 = gd_now_ns();
  /* Ring entries the client published before sending this go first. */
  ring_replay_drain(ctx, j->worker, rj->ds);
  j->status = exec_replay(ctx, j->worker, rj->ds, &rj->req, &rj->tally, &rj->ran, &j->not_started,
                          j->msg, sizeof j->msg);
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
  if (j->ran) {
    gd_counters_add_tally(c, &rj->tally);
  } else {
    c->errors++; /* failed without running: shutdown, an unusable worker */
  }
  if (j->status == 0) gd_hist_add(&c->replay_latency, rj->latency_ns);
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
  } else if (rj->replied && j->status < 0) {
    session_request_failed(s); /* the worker sent the failure itself */
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
    gd_data_session *x = s->closing ? NULL : data_session_of(s);
    double waited = (double)(now - rj->held_ns) / 1e9;
    if (x && data_session_inflight(x) >= d->opt->max_inflight_replays &&
        !gd_ready_overdue(rj->held_ns, now, d->opt->ready_timeout_s)) {
      pp = &rj->next_held;
      continue;
    }
    *pp = rj->next_held;
    char msg[256];
    if (!x) {
      fail_held(rj, GRAPHD_UNAVAILABLE, "the session closed while the replay waited");
    } else if (data_session_inflight(x) >= d->opt->max_inflight_replays) {
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

void replay_handle_replay(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  (void)fds;
  uint64_t request_id = req->request_id;
  const Graphd__Wire__Replay *m = req->replay;
  uint64_t t0 = gd_now_ns();
  char err[512];
  size_t errlen = sizeof err;
  int rc = 0;
  replay_job *rj = NULL;
  gd_daemon *d = daemon_of(s);
  gd_data_session *x = data_session_of(s);
  if (m->program_id.len != GD_ID_LEN)
    REFUSE_GOTO(GRAPHD_INVALID_ARGUMENT, refuse, "Replay.program_id must be %d bytes", GD_ID_LEN);
  gd_regprog *prog = registry_find_program(&d->reg, m->program_id.data);
  if (!prog) {
    char hex[2 * GD_ID_LEN + 1];
    gd_id_hex(m->program_id.data, 0, hex);
    REFUSE_GOTO(GRAPHD_NOT_FOUND, refuse, "program %s is not registered; register it first", hex);
  }
  /* The frame's size bounds the count; the worker checks them. */
  rj = calloc(1, sizeof *rj + (m->n_bindings ? m->n_bindings : 1) * sizeof rj->b[0]);
  if (!rj) REFUSE_GOTO(GRAPHD_RESOURCE_EXHAUSTED, refuse, "out of memory");
  /* The session holds the program while it is open (the fast path: the
   * same program as last time). */
  if (s->last_held != prog) {
    if ((rc = registry_hold(&d->reg, &s->holds, (uint32_t)s->uid, true, prog, err, errlen)) < 0)
      goto refuse;
    s->last_held = prog;
  }
  for (size_t i = 0; i < m->n_bindings; i++)
    rj->b[i] = (gd_bind_req){.slot = m->bindings[i]->slot,
                             .region_id = m->bindings[i]->region_id,
                             .offset = m->bindings[i]->offset,
                             .bytes = m->bindings[i]->bytes};
  rj->t0 = t0;
  rj->ds = x->ds;
  rj->req = (gd_replay_req){.prog = prog,
                            .stream_slot = m->stream_slot,
                            .seq = m->seq,
                            .bindings = rj->b,
                            .nbindings = (uint32_t)m->n_bindings,
                            .ready_timeout_s = d->opt->ready_timeout_s,
                            .client_pid = (uint32_t)s->pid,
                            .client_uid = (uint32_t)s->uid,
                            .others_waiting = ring_replay_others_waiting};
  d->counters[s->device].inflight++;
  if (data_session_inflight(x) >= d->opt->max_inflight_replays) {
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
  session_reply_error(s, request_id, -rc, "replay: %s", err);
}
