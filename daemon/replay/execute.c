/* See execute.h. Worker thread, but for exec_bind. */
#include "execute.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/check.h"
#include "daemon/base/clock.h"
#include "daemon/device/evict.h"
#include "graphd/status.h"
#include "daemon/device/holwatch.h"
#include "common/log.h"
#include "daemon/device/modcache.h"

typedef struct give_up_ctx {
  gd_device *d;
  gd_worker *w;
  gd_session_stream *ds;
  gd_others_waiting_fn others_waiting;
  uint64_t start_ns;
  double timeout_s;
  bool stopping; /* gave up because graphd is stopping */
} give_up_ctx;

int exec_wait_verdict(gd_device *d, gd_worker *w, const gd_session_stream *ds, uint64_t since_ns,
                      double timeout_s, gd_others_waiting_fn others_waiting) {
  /* Waiting is work: keep the watchdog from taking it for a hang. */
  worker_heartbeat(w);
  if (atomic_load(&ds->client_gone)) return GD_GIVE_UP_GONE;
  if (worker_stopping(w)) return GD_GIVE_UP_STOPPING;
  if (!gd_ready_overdue(since_ns, gd_now_ns(), timeout_s)) return 0;
  bool others = worker_has_queued(w) || (others_waiting && others_waiting(d, ds));
  return others ? GD_GIVE_UP_HUNG : 0;
}

/* The backend's give-up while the worker itself waits for a ready flag
 * (host backend). */
static int give_up(void *arg) {
  give_up_ctx *g = arg;
  int why = exec_wait_verdict(g->d, g->w, g->ds, g->start_ns, g->timeout_s, g->others_waiting);
  /* Nothing of the replay has run: it is the next daemon's to run. */
  if (why == GD_GIVE_UP_STOPPING) g->stopping = true;
  return why;
}

/* The capture of the job's program on d, built (and made room for) on the
 * first replay there. */
static int get_capture(gd_device *d, gd_replay_exec *ex, gd_capture **out, char *err,
                       size_t errlen) {
  gd_capture *c = capture_find(d, ex->prog);
  if (c) {
    *out = c;
    return 0;
  }
  uint64_t t0 = gd_now_ns();
  int rc = capture_check_unstaged(ex->prog, ex->bind, err, errlen);
  if (rc == 0) rc = capture_build(d, ex->prog, ex->bind, ex->ds->stream, &c, err, errlen);
  if (rc < 0) return rc;
  /* In the set first, so that budget evictions keep the modules it uses. */
  if ((rc = capture_insert(d, c)) < 0) {
    snprintf(err, errlen, "out of memory");
    capture_free(d, c);
    return rc;
  }
  if (d->budget && (rc = evict_make_room(d, c, &ex->budget_evicted, &ex->budget_evicted_bytes, err,
                                         errlen)) < 0) {
    capture_remove(d, c);
    capture_free(d, c);
    return rc;
  }
  ex->captured = true;
  c->uid = ex->client_uid;
  ex->recaptured = capture_mark_built(d, c);
  ex->capture_ns = gd_now_ns() - t0;
  ex->staging_bytes = c->staging.bytes;
  char hex[2 * GD_ID_LEN + 1];
  gd_id_hex(ex->prog->id, 1, hex);
  GD_LOG(GD_INFO, "replay", "program %s captured in %.1f us: %u steps, %llu staging bytes", hex,
         (double)ex->capture_ns / 1e3, ex->prog->program->nsteps,
         (unsigned long long)c->staging.bytes);
  *out = c;
  return 0;
}

/* Runs one replay. Whatever happens once the flags are known, done = seq is
 * written after the work ordered before it; but for a replay given up
 * before it started because graphd is stopping (*not_started): that one
 * writes nothing, so that the next daemon may run it under the same
 * ordering. */
int exec_run(gd_device *d, gd_worker *w, gd_replay_exec *ex, bool *not_started, char *err,
             size_t errlen) {
  const gd_backend_ops *ops = d->be->ops;
  gd_session_stream *ds = ex->ds;
  volatile uint64_t *ready = session_stream_word(ds, ex->stream_slot, GRAPHD_FLAG_WORD_READY);
  volatile uint64_t *done = session_stream_word(ds, ex->stream_slot, GRAPHD_FLAG_WORD_DONE);
  uint64_t ready_dev = session_stream_word_dev(ds, ex->stream_slot, GRAPHD_FLAG_WORD_READY);
  uint64_t done_dev = session_stream_word_dev(ds, ex->stream_slot, GRAPHD_FLAG_WORD_DONE);
  int rc;
  uint64_t loaded, load_ns;
  char why[192];
  uint64_t epoch = atomic_load(&d->epoch);
  if (ex->epoch != epoch || ds->epoch != epoch) {
    /* Its stream, flags or regions went with the old context: nothing of
     * it can be touched, and the loop is closing the session. */
    snprintf(err, errlen,
             "device %d was reset after a GPU fault; reconnect and register the "
             "regions again",
             d->index);
    __atomic_store_n(done, ex->seq, __ATOMIC_RELEASE);
    return -GRAPHD_UNAVAILABLE;
  }
  gd_capture *c = NULL;
  /* The device stage, then the capture on first use on this device. */
  if ((rc = modcache_prepare(d, ex->prog, &loaded, &load_ns, err, errlen)) < 0) goto finish;
  if ((rc = get_capture(d, ex, &c, err, errlen)) < 0) goto finish;
  /* The client's stream has reached this call. */
  give_up_ctx g = {.d = d,
                   .w = w,
                   .ds = ds,
                   .others_waiting = ex->others_waiting,
                   .start_ns = gd_now_ns(),
                   .timeout_s = ex->ready_timeout_s};
  /* A ready write the worker already sees needs no wait on the stream:
   * the client's stream wrote it after that stream's work, behind a
   * memory fence, so the replay may start at once. Most replays of a
   * device that serves many rings come here after ready_held saw their
   * write, and a wait the GPU never polls costs no hand-off. */
  if (graphd_seq_reached(__atomic_load_n(ready, __ATOMIC_ACQUIRE), ex->seq))
    rc = 0;
  else
    rc = ops->wait_value(d->be, d->dev, ds->stream, ready, ready_dev, ex->seq, give_up, &g, err,
                         errlen);
  if (rc < 0 && g.stopping) {
    *not_started = true;
    return rc;
  }
  if (rc < 0) goto finish;
  uint32_t instances = capture_instances(c);
  gd_capture *used = NULL;
  rc = capture_enqueue(d, c, ds->stream, ex->bind, ex->captured, ex->client_pid, ex->client_uid,
                       ds->session_id, &used, err, errlen);
  if (capture_instances(c) > instances) ex->instance_bytes = used->staging.bytes;
  if (rc < 0) goto finish;
  if (!d->be->waits_on_worker)
    holwatch_add(d, ds, ex->stream_slot, ex->seq, ex->ready_timeout_s, used);
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
  if (ops->write_value(d->be, d->dev, ds->stream, done, done_dev, ex->seq, e2, sizeof e2) < 0) {
    GD_LOG(GD_WARN, "replay",
           "writing done=%llu on the stream failed (%s); writing it "
           "from the host",
           (unsigned long long)ex->seq, e2);
    __atomic_store_n(done, ex->seq, __ATOMIC_RELEASE);
  }
  return rc;
}

void exec_write_done(gd_device *d, gd_session_stream *ds, uint32_t slot, uint64_t seq) {
  volatile uint64_t *done = session_stream_word(ds, slot, GRAPHD_FLAG_WORD_DONE);
  char e[256];
  if (!ds->has_stream || ds->epoch != atomic_load(&d->epoch) ||
      d->be->ops->write_value(d->be, d->dev, ds->stream, done,
                              session_stream_word_dev(ds, slot, GRAPHD_FLAG_WORD_DONE), seq, e,
                              sizeof e) < 0)
    __atomic_store_n(done, seq, __ATOMIC_RELEASE);
}

static const char *role_name(uint32_t role) {
  static const char *const n[] = {"input", "output", "inout", "scratch"};
  return role < 4 ? n[role] : "?";
}

int exec_bind(const gd_program *p, gd_region_lookup find, void *table, uint64_t epoch, int dev,
              const gd_bind_req *bindings, size_t n, gd_bound *bind, char *err, size_t errlen) {
  int rc = 0;
  if (n > p->nslots)
    REFUSE_GOTO(GRAPHD_INVALID_ARGUMENT, out, "%zu bindings for a program of %u slots", n,
                p->nslots);
  for (size_t i = 0; i < n; i++) {
    const gd_bind_req *b = &bindings[i];
    if (b->slot >= p->nslots)
      REFUSE_GOTO(GRAPHD_INVALID_ARGUMENT, out,
                  "binding %zu names slot %u; the program has %u slots", i, b->slot, p->nslots);
    const gd_slot *sl = &p->slots[b->slot];
    if (gd_role_owned(sl->role))
      REFUSE_GOTO(GRAPHD_INVALID_ARGUMENT, out, "slot %u is %s (daemon-owned) and cannot be bound",
                  b->slot, sl->role == GD_ROLE_TEMP ? "temp" : "scratch");
    if (bind[b->slot].bound)
      REFUSE_GOTO(GRAPHD_INVALID_ARGUMENT, out, "slot %u is bound twice", b->slot);
    if (b->bytes != sl->size)
      REFUSE_GOTO(GRAPHD_INVALID_ARGUMENT, out,
                  "slot %u (%s) is %llu bytes, but its binding covers %llu", b->slot,
                  role_name(sl->role), (unsigned long long)sl->size, (unsigned long long)b->bytes);
    const gd_region_map *m = find(table, b->region_id);
    if (!m)
      REFUSE_GOTO(GRAPHD_NOT_FOUND, out,
                  "slot %u is bound to region %u, which this session does not have", b->slot,
                  b->region_id);
    if (m->epoch != epoch)
      REFUSE_GOTO(GRAPHD_UNAVAILABLE, out,
                  "device %d was reset after a GPU fault and region %u went with "
                  "it; reconnect and register the regions again",
                  dev, b->region_id);
    if (b->offset > m->size || b->bytes > m->size - b->offset)
      REFUSE_GOTO(GRAPHD_OUT_OF_RANGE, out,
                  "slot %u: region %u: bytes %llu..+%llu are out of range: the region has %llu "
                  "bytes",
                  b->slot, b->region_id, (unsigned long long)b->offset,
                  (unsigned long long)b->bytes, (unsigned long long)m->size);
    bind[b->slot].bound = true;
    bind[b->slot].addr = m->ptr + b->offset;
    bind[b->slot].bytes = b->bytes;
  }
  for (uint32_t k = 0; k < p->nslots; k++) {
    const gd_slot *sl = &p->slots[k];
    if (!gd_role_owned(sl->role) && (sl->flags & GD_SLOT_STAGED) && !bind[k].bound)
      REFUSE_GOTO(GRAPHD_INVALID_ARGUMENT, out, "slot %u (staged %s) is not bound", k,
                  role_name(sl->role));
  }
out:
  return rc;
}

static const gd_region_map *view_find(void *table, uint32_t id) {
  return session_stream_region_find(table, id);
}

/* Whether rq names what r was resolved from, with nothing that resolved it
 * changed since: the same program (its id as well, in case another took
 * its place), the same bindings, the region view and the device epoch as
 * they were. */
static bool same_as(const gd_resolved *r, const gd_session_stream *ds, const gd_replay_req *rq,
                    uint64_t epoch) {
  return r->prog == rq->prog && r->regions_gen == ds->regions_gen && r->epoch == epoch &&
         r->n == rq->nbindings && memcmp(r->prog->id, rq->prog->id, GD_ID_LEN) == 0 &&
         (!rq->nbindings ||
          memcmp(r->b, rq->bindings, (size_t)rq->nbindings * sizeof *rq->bindings) == 0);
}

/* rq's bindings resolved against ds's view of its regions (exec_bind),
 * kept in one of ds->resolved (the least recently used goes) so that a
 * later replay naming the same ones does no work per binding: a loop over
 * the same buffers, or a step of a few programs or buffer sets in turn,
 * costs a comparison or a few. NULL with *rc and err set when refused. */
static gd_bound *resolve(gd_device *d, gd_session_stream *ds, const gd_replay_req *rq,
                         uint64_t epoch, int *rc, char *err, size_t errlen) {
  gd_resolved *r = &ds->resolved[0];
  for (int i = 0; i < GD_RESOLVED_KEPT; i++) {
    gd_resolved *x = &ds->resolved[i];
    if (x->prog && same_as(x, ds, rq, epoch)) {
      x->used = ++ds->resolved_clock;
      return x->bind;
    }
    if (!x->prog ? r->prog != NULL : r->prog && x->used < r->used) r = x;
  }
  const gd_program *p = rq->prog->program;
  uint32_t nslots = p->nslots ? p->nslots : 1;
  r->prog = NULL;
  if (!session_stream_reserve((void **)&r->bind, &r->bind_cap, nslots, sizeof(gd_bound)) ||
      !session_stream_reserve((void **)&r->b, &r->b_cap, rq->nbindings ? rq->nbindings : 1,
                              sizeof(gd_bind_req))) {
    snprintf(err, errlen, "out of memory");
    *rc = -GRAPHD_RESOURCE_EXHAUSTED;
    return NULL;
  }
  memset(r->bind, 0, (size_t)nslots * sizeof(gd_bound));
  if ((*rc = exec_bind(p, view_find, ds, epoch, d->index, rq->bindings, rq->nbindings, r->bind, err,
                       errlen)) < 0)
    return NULL;
  if (rq->nbindings) memcpy(r->b, rq->bindings, (size_t)rq->nbindings * sizeof *rq->bindings);
  r->n = rq->nbindings;
  r->regions_gen = ds->regions_gen;
  r->epoch = epoch;
  r->prog = rq->prog;
  r->used = ++ds->resolved_clock;
  return r->bind;
}

/* What one replay did, counted. */
static void tally(gd_replay_tally *t, const gd_replay_exec *ex, int rc) {
  if (ex->captured) {
    t->captures++;
    t->staging_bytes += ex->staging_bytes;
    if (ex->recaptured) t->recaptures++;
  }
  t->staging_bytes += ex->instance_bytes;
  t->evicted += ex->budget_evicted;
  t->evicted_bytes += ex->budget_evicted_bytes;
  if (rc < 0)
    t->errors++;
  else
    t->replays++;
}

int exec_replay(gd_device *d, gd_worker *w, gd_session_stream *ds, const gd_replay_req *rq,
                gd_replay_tally *t, gd_replay_exec *ran_out, bool *not_started, char *err,
                size_t errlen) {
  int rc = 0;
  bool flags_known = false; /* done = seq must be written even when refused */
  bool ran = false;         /* exec_run wrote done itself */
  gd_bound *bind = NULL;
  gd_replay_exec ex = {0};
  uint64_t t0 = gd_now_ns();
  *not_started = false;
  if (!ds->has_flags)
    REFUSE_GOTO(GRAPHD_FAILED_PRECONDITION, finish,
                "the session has no flag page; RegisterFlags first");
  if (rq->stream_slot >= ds->nslots)
    REFUSE_GOTO(GRAPHD_OUT_OF_RANGE, finish, "stream slot %u is out of range: the flag page has %u",
                rq->stream_slot, ds->nslots);
  if (!session_stream_seq_next(ds, rq->stream_slot, rq->seq))
    REFUSE_GOTO(GRAPHD_INVALID_ARGUMENT, finish,
                "seq %llu on stream slot %u must be above the last one, %llu, by at most %llu "
                "(a slot's first seq: any but 0)",
                (unsigned long long)rq->seq, rq->stream_slot,
                (unsigned long long)ds->seen[rq->stream_slot],
                (unsigned long long)GRAPHD_SEQ_MAX_STEP);
  flags_known = true;
  session_stream_saw(ds, rq->stream_slot, rq->seq);
  if (rq->refused) REFUSE_GOTO(rq->refused, finish, "%s", rq->refusal);
  uint64_t epoch = atomic_load(&d->epoch);
  if (!(bind = resolve(d, ds, rq, epoch, &rc, err, errlen))) goto finish;
  ex = (gd_replay_exec){.prog = rq->prog,
                        .ds = ds,
                        .stream_slot = rq->stream_slot,
                        .seq = rq->seq,
                        .ready_timeout_s = rq->ready_timeout_s,
                        .client_pid = rq->client_pid,
                        .client_uid = rq->client_uid,
                        .epoch = epoch,
                        .others_waiting = rq->others_waiting,
                        .bind = bind};
  ran = true;
  rc = exec_run(d, w, &ex, not_started, err, errlen);
finish:
  if (rc < 0 && flags_known && !ran) exec_write_done(d, ds, rq->stream_slot, rq->seq);
  tally(t, &ex, rc);
  capture_take_gpu_time(d, &t->gpu_replay_ns, &t->gpu_replays);
  capture_take_launch_time(d, &t->worker_launch_ns);
  capture_take_trimmed(d, &t->trimmed_bytes);
  t->worker_replay_ns += gd_now_ns() - t0;
  t->worker_replays++;
  ex.bind = NULL;
  if (ran_out) *ran_out = ex;
  return rc;
}
