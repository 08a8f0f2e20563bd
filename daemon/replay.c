/* See replay.h. Loop thread, except replay_run (worker). */
#include "replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "daemon.h"
#include "dsession.h"
#include "evict.h"
#include "graphd/status.h"
#include "holwatch.h"
#include "log.h"
#include "modcache.h"

/* One replay, resolved on the loop and run on the worker. */
typedef struct replay_job {
  gd_request rq;
  uint64_t t0;         /* the request was read */
  uint64_t latency_ns; /* from t0 until the reply was ready */
  uint64_t server_ns;
  bool replied; /* the worker sent the reply itself */
  const gd_regprog *prog;
  gd_dstream *ds;
  uint32_t stream_slot;
  uint64_t seq;
  double ready_timeout_s;
  uint32_t client_pid;
  uint32_t client_uid;
  uint64_t epoch; /* the device epoch the bindings were resolved in */
  /* Set by the worker: */
  bool captured;
  bool recaptured;
  uint64_t capture_ns;
  uint64_t staging_bytes;
  uint32_t budget_evicted; /* captures the budget dropped to fit this one */
  uint64_t budget_evicted_bytes;
  struct replay_job *next_held; /* held back by --max-inflight-replays */
  uint64_t held_ns;
  gd_bound bind[]; /* one per slot of the program */
} replay_job;

/* --- on the worker --------------------------------------------------------- */

typedef struct give_up_ctx {
  gd_worker *w;
  gd_dstream *ds;
  uint64_t start_ns;
  double timeout_s;
  bool stopping; /* gave up because graphd is stopping */
} give_up_ctx;

/* The head-of-line policy where the worker itself waits for the ready flag
 * (host backend): a client whose flag does not come is cut off only when
 * it blocks someone else, that is, when another job waits on the worker. */
static int give_up(void *arg) {
  give_up_ctx *g = arg;
  /* Waiting is work: keep the watchdog from taking it for a hang. */
  worker_heartbeat(g->w);
  if (atomic_load(&g->ds->client_gone)) return GD_GIVE_UP_GONE;
  if (worker_stopping(g->w)) {
    /* Nothing of the replay has run: it is the next daemon's to run. */
    g->stopping = true;
    return GD_GIVE_UP_STOPPING;
  }
  if (g->timeout_s <= 0) return 0;
  if ((double)(gd_now_ns() - g->start_ns) < g->timeout_s * 1e9) return 0;
  return worker_has_queued(g->w) ? GD_GIVE_UP_HUNG : 0;
}

/* The capture of the job's program on d, built (and made room for) on the
 * first replay there. */
static int get_capture(gd_device *d, replay_job *rj, gd_capture **out, char *err, size_t errlen) {
  gd_capture *c = capture_find(d, rj->prog);
  if (c) {
    *out = c;
    return 0;
  }
  uint64_t t0 = gd_now_ns();
  int rc = capture_build(d, rj->prog, rj->bind, rj->ds->stream, &c, err, errlen);
  if (rc < 0) return rc;
  /* In the set first, so that budget evictions keep the modules it uses. */
  if ((rc = capture_insert(d, c)) < 0) {
    snprintf(err, errlen, "out of memory");
    capture_free(d, c);
    return rc;
  }
  if (d->budget && (rc = evict_make_room(d, c, &rj->budget_evicted, &rj->budget_evicted_bytes, err,
                                         errlen)) < 0) {
    capture_remove(d, c);
    capture_free(d, c);
    return rc;
  }
  rj->captured = true;
  rj->recaptured = capture_mark_built(d, c);
  rj->capture_ns = gd_now_ns() - t0;
  rj->staging_bytes = c->staging.bytes;
  char hex[2 * GD_ID_LEN + 1];
  gd_id_hex(rj->prog->id, 1, hex);
  GD_LOG(GD_INFO, "replay", "program %s captured in %.1f us: %u steps, %llu staging bytes", hex,
         (double)rj->capture_ns / 1e3, rj->prog->program->nsteps,
         (unsigned long long)c->staging.bytes);
  *out = c;
  return 0;
}

/* Runs one replay. Whatever happens once the flags are known, done = seq is
 * written after the work ordered before it; but for a replay given up
 * before it started because graphd is stopping (*not_started): that one
 * writes nothing, so that the next daemon may run it under the same
 * ordering. */
static int run_replay(gd_device *d, gd_worker *w, replay_job *rj, bool *not_started, char *err,
                      size_t errlen) {
  const gd_backend_ops *ops = d->be->ops;
  gd_dstream *ds = rj->ds;
  volatile uint64_t *ready = dstream_word(ds, rj->stream_slot, GRAPHD_FLAG_WORD_READY);
  volatile uint64_t *done = dstream_word(ds, rj->stream_slot, GRAPHD_FLAG_WORD_DONE);
  uint64_t ready_dev = dstream_word_dev(ds, rj->stream_slot, GRAPHD_FLAG_WORD_READY);
  uint64_t done_dev = dstream_word_dev(ds, rj->stream_slot, GRAPHD_FLAG_WORD_DONE);
  int rc;
  uint64_t loaded, load_ns;
  char why[192];
  uint64_t epoch = atomic_load(&d->epoch);
  if (rj->epoch != epoch || ds->epoch != epoch) {
    /* Its stream, flags or regions went with the old context: nothing of
     * it can be touched, and the loop is closing the session. */
    snprintf(err, errlen,
             "device %d was reset after a GPU fault; reconnect and register the "
             "regions again",
             d->index);
    __atomic_store_n(done, rj->seq, __ATOMIC_RELEASE);
    return -GRAPHD_UNAVAILABLE;
  }
  gd_capture *c = NULL;
  /* The device stage, then the capture on first use on this device. */
  if ((rc = modcache_prepare(d, rj->prog, &loaded, &load_ns, err, errlen)) < 0) goto finish;
  if ((rc = get_capture(d, rj, &c, err, errlen)) < 0) goto finish;
  /* The client's stream has reached this call. */
  give_up_ctx g = {.w = w, .ds = ds, .start_ns = gd_now_ns(), .timeout_s = rj->ready_timeout_s};
  rc = ops->wait_value(d->be, d->dev, ds->stream, ready, ready_dev, rj->seq, give_up, &g, err,
                       errlen);
  if (rc < 0 && g.stopping) {
    *not_started = true;
    return rc;
  }
  if (rc < 0) goto finish;
  rc = capture_enqueue(d, c, ds->stream, rj->bind, rj->captured, rj->client_pid, rj->client_uid,
                       err, errlen);
  if (rc < 0) goto finish;
  if (!d->be->waits_on_worker)
    holwatch_add(d, ds, rj->stream_slot, rj->seq, rj->ready_timeout_s, c);
finish:
  /* A call that failed because the device faulted (this replay's kernel
   * or an earlier one): say so; the worker resets the device next. */
  if (rc < 0 && device_faulted(d, why, sizeof why) < 0) {
    snprintf(err, errlen,
             "device %d faulted (%s); it is being reset: reconnect and register "
             "the regions again",
             d->index, why);
    rc = -GRAPHD_UNAVAILABLE;
  }
  /* done = seq, in stream order, even for a failed replay; from the host
   * only when the stream itself cannot take it. */
  char e2[256];
  if (ops->write_value(d->be, d->dev, ds->stream, done, done_dev, rj->seq, e2, sizeof e2) < 0) {
    GD_LOG(GD_WARN, "replay",
           "writing done=%llu on the stream failed (%s); writing it "
           "from the host",
           (unsigned long long)rj->seq, e2);
    __atomic_store_n(done, rj->seq, __ATOMIC_RELEASE);
  }
  return rc;
}

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
  rr->captured = rj->captured;
  rr->capture_ns = rj->capture_ns;
  rr->server_ns = rj->server_ns;
}

static void replay_run(gd_job *j, void *ctx) {
  replay_job *rj = gd_container_of(j, replay_job, rq.job);
  uint64_t t0 = gd_now_ns();
  j->status = run_replay(ctx, j->worker, rj, &j->not_started, j->msg, sizeof j->msg);
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
  if (rj->captured) {
    c->captures++;
    c->captures_built++;
    c->staging_bytes += rj->staging_bytes;
    if (rj->recaptured) c->recaptures++;
  }
  gd_counters_evicted(c, rj->budget_evicted, rj->budget_evicted_bytes);
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

static const char *role_name(uint32_t role) {
  static const char *const n[] = {"input", "output", "inout", "scratch"};
  return role < 4 ? n[role] : "?";
}

int replay_bind(const gd_program *p, gd_region_table *regions, uint64_t epoch, int dev,
                Graphd__Wire__Binding *const *bindings, size_t n, gd_bound *bind, char *err,
                size_t errlen) {
#define REFUSE(c, ...)                                                                             \
  do {                                                                                             \
    snprintf(err, errlen, __VA_ARGS__);                                                            \
    return -(c);                                                                                   \
  } while (0)
  if (n > p->nslots)
    REFUSE(GRAPHD_INVALID_ARGUMENT, "%zu bindings for a program of %u slots", n, p->nslots);
  for (size_t i = 0; i < n; i++) {
    const Graphd__Wire__Binding *b = bindings[i];
    if (b->slot >= p->nslots)
      REFUSE(GRAPHD_INVALID_ARGUMENT, "binding %zu names slot %u; the program has %u slots", i,
             b->slot, p->nslots);
    const gd_slot *sl = &p->slots[b->slot];
    if (sl->role == GD_ROLE_SCRATCH)
      REFUSE(GRAPHD_INVALID_ARGUMENT, "slot %u is scratch (daemon-owned) and cannot be bound",
             b->slot);
    if (bind[b->slot].bound) REFUSE(GRAPHD_INVALID_ARGUMENT, "slot %u is bound twice", b->slot);
    if (b->bytes != sl->size)
      REFUSE(GRAPHD_INVALID_ARGUMENT, "slot %u (%s) is %llu bytes, but its binding covers %llu",
             b->slot, role_name(sl->role), (unsigned long long)sl->size,
             (unsigned long long)b->bytes);
    gd_region *r = region_find(regions, b->region_id);
    if (!r)
      REFUSE(GRAPHD_NOT_FOUND, "slot %u is bound to region %u, which this session does not have",
             b->slot, b->region_id);
    if (r->map.epoch != epoch)
      REFUSE(GRAPHD_UNAVAILABLE,
             "device %d was reset after a GPU fault and region %u went with "
             "it; reconnect and register the regions again",
             dev, r->id);
    char e[256];
    if (region_check_range(r, b->offset, b->bytes, e, sizeof e) < 0)
      REFUSE(GRAPHD_OUT_OF_RANGE, "slot %u: %s", b->slot, e);
    bind[b->slot].bound = true;
    bind[b->slot].addr = r->map.ptr + b->offset;
    bind[b->slot].bytes = b->bytes;
  }
  for (uint32_t k = 0; k < p->nslots; k++) {
    const gd_slot *sl = &p->slots[k];
    if (sl->role != GD_ROLE_SCRATCH && (sl->flags & GD_SLOT_STAGED) && !bind[k].bound)
      REFUSE(GRAPHD_INVALID_ARGUMENT, "slot %u (staged %s) is not bound", k, role_name(sl->role));
  }
  return 0;
#undef REFUSE
}

void replay_handle(gd_session *s, uint64_t request_id, const Graphd__Wire__Replay *m) {
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
  if (!x) REFUSE(GRAPHD_FAILED_PRECONDITION, "Replay needs a data session (one bound to a device)");
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
  int rc = replay_bind(p, &x->regions, epoch, s->device, m->bindings, m->n_bindings, rj->bind, err,
                       sizeof err);
  if (rc < 0) {
    code = -rc;
    goto refuse;
  }
  /* The session holds the program while it is open (the fast path: the
   * same program as last time). */
  if (s->last_held != prog) {
    if (registry_hold(&d->reg, &s->holds, true, prog) < 0)
      REFUSE(GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    s->last_held = prog;
  }
  if (!x->last_seq[m->stream_slot]) x->used_slots[x->nused_slots++] = m->stream_slot;
  bool full = session_inflight(x) >= d->opt->max_inflight_replays;
  x->last_seq[m->stream_slot] = m->seq;
  rj->prog = prog;
  rj->ds = x->ds;
  rj->stream_slot = m->stream_slot;
  rj->seq = m->seq;
  rj->ready_timeout_s = d->opt->ready_timeout_s;
  rj->client_pid = (uint32_t)s->pid;
  rj->client_uid = (uint32_t)s->uid;
  rj->epoch = epoch;
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
