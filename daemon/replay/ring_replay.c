/* See ring_replay.h. Worker thread. */
#include "ring_replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "graphd/encoding.h"
#include "daemon/base/clock.h"
#include "daemon/device/capture.h"
#include "execute.h"
#include "graphd/status.h"
#include "common/log.h"

/* Rounds of one entry from each ring before ring_replay_poll returns. */
#define RING_BATCH 32

int ring_replay_attach(gd_device *d, gd_worker *w, gd_session_stream *ds, const gd_ring_params *pr,
                       int fd, int doorbell, char *err, size_t errlen) {
  if (!ds->has_flags || ds->ring) {
    close(doorbell);
    snprintf(err, errlen,
             ds->ring ? "this session already registered its ring"
                      : "the session has no flag page; RegisterFlags first");
    return ds->ring ? -GRAPHD_ALREADY_EXISTS : -GRAPHD_FAILED_PRECONDITION;
  }
  gd_submit_ring *r;
  int rc = submit_ring_map(fd, doorbell, pr->entries, worker_wake_set(w), &r, err, errlen);
  if (rc < 0) return rc;
  r->ready_timeout_s = pr->ready_timeout_s;
  r->max_inflight = pr->max_inflight;
  r->client_pid = pr->client_pid;
  r->client_uid = pr->client_uid;
  ds->ring = r;
  session_stream_rings_changed(d);
  return 0;
}

int ring_replay_set_program(gd_session_stream *ds, uint32_t h, const gd_regprog *p, char *err,
                            size_t errlen) {
  if (!ds->ring) {
    snprintf(err, errlen, "the session has no ring; RegisterRing first");
    return -GRAPHD_FAILED_PRECONDITION;
  }
  if (submit_ring_set_program(ds->ring, h, p) < 0) {
    snprintf(err, errlen, "out of memory");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  return 0;
}

/* Tells the client how entry e (its slots) ended: its completion, and the
 * text of the first failure it has not read yet. */
static void complete(gd_submit_ring *r, const graphd_ring_sqe *e, uint32_t slots, int rc,
                     const char *err) {
  /* Its continuation slots' completions first: seq 0, status 0. */
  for (uint32_t k = 1; k < slots; k++) {
    volatile graphd_ring_cqe *f = &r->cq[(r->head + k) & (r->entries - 1)];
    f->seq = 0;
    f->stream_slot = 0;
    f->status = 0;
  }
  volatile graphd_ring_cqe *c = &r->cq[r->head & (r->entries - 1)];
  c->seq = e->seq;
  c->stream_slot = e->stream_slot;
  c->status = rc < 0 ? (uint32_t)-rc : 0;
  volatile graphd_ring_header *h = r->hdr;
  if (rc < 0 && __atomic_load_n(&h->err_seq, __ATOMIC_ACQUIRE) == 0) {
    h->err_slot = e->stream_slot;
    h->err_code = (uint32_t)-rc;
    size_t n = strnlen(err, sizeof h->err_text - 1);
    memcpy((char *)h->err_text, err, n);
    h->err_text[n] = '\0';
    __atomic_store_n(&h->err_seq, e->seq ? e->seq : 1, __ATOMIC_RELEASE);
  }
  r->head += slots;
  __atomic_store_n(&h->cq_tail, r->head, __ATOMIC_RELEASE);
  __atomic_store_n(&h->sq_head, r->head, __ATOMIC_RELEASE);
}

/* Copies the bindings of entry e, whose first slot is at the ring's head,
 * into b: its own, then those of the slots after it. */
static void entry_bindings(const gd_submit_ring *r, const graphd_ring_sqe *e, gd_bind_req *b) {
  uint32_t n = e->nbindings, i = 0;
  const graphd_ring_binding *src = e->bindings;
  uint32_t here = n < GRAPHD_RING_MAX_BINDINGS ? n : GRAPHD_RING_MAX_BINDINGS;
  graphd_ring_cont cont;
  for (uint32_t slot = 1;; slot++) {
    for (uint32_t k = 0; k < here; k++, i++)
      b[i] = (gd_bind_req){.slot = src[k].slot,
                           .region_id = src[k].region_id,
                           .offset = src[k].offset,
                           .bytes = src[k].bytes};
    if (i == n) return;
    /* One copy of each slot too: the client may write it at any time. */
    memcpy(&cont, (const void *)&r->sq[(r->head + slot) & (r->entries - 1)], sizeof cont);
    src = cont.bindings;
    here = n - i < GRAPHD_RING_CONT_BINDINGS ? n - i : GRAPHD_RING_CONT_BINDINGS;
  }
}

/* ds held others up past the ready timeout: its ring is read no more, and
 * ring_replay_take_hung hands it to the loop, which closes the session. */
static void mark_hung(gd_session_stream *ds) {
  if (ds->ring) ds->ring->hung = true;
}

/* How long a ring's head entry waits on the worker for its ready write
 * (ready_held) before its wait goes on the GPU all the same. */
#define READY_HOLD_NS 200000u

/* Reads the entry at the ring's head into a request, runs it on the one
 * replay path, and completes it. */
static int take_one(gd_device *d, gd_worker *w, gd_session_stream *ds, gd_submit_ring *r) {
  graphd_ring_sqe e;
  if (r->ready_held_since) {
    /* The head was held for its ready write: how long, and whether to the
     * bound. */
    uint64_t held = gd_now_ns() - r->ready_held_since;
    r->tally.ready_hold_ns += held;
    r->tally.ready_holds_expired += held >= READY_HOLD_NS;
  }
  r->ready_held_since = 0; /* the head moves on, by whichever path took it */
  /* One copy: the client may write the shared entry at any time. */
  memcpy(&e, (const void *)&r->sq[r->head & (r->entries - 1)], sizeof e);
  /* The slots it takes are published with it, or the ring is not to be
   * trusted any longer (as for a tail out of range). */
  uint32_t slots = GRAPHD_RING_ENTRY_SLOTS(e.nbindings);
  uint64_t avail = 0;
  if (!submit_ring_avail(r, &avail) || slots > avail) {
    r->broken = true;
    GD_LOG(GD_WARN, "ring",
           "session %llu: an entry of %u bindings needs %u slots, but %llu are published; the "
           "ring is not read any more",
           (unsigned long long)ds->session_id, e.nbindings, slots, (unsigned long long)avail);
    r->warned = true;
    return -GRAPHD_INVALID_ARGUMENT;
  }
  char err[512], why[128];
  gd_replay_req rq = {.stream_slot = e.stream_slot,
                      .seq = e.seq,
                      .nbindings = e.nbindings,
                      .ready_timeout_s = r->ready_timeout_s,
                      .client_pid = r->client_pid,
                      .client_uid = r->client_uid,
                      .others_waiting = ring_replay_others_waiting,
                      .refusal = why};
  if (e.program >= r->nprogs || !(rq.prog = r->progs[e.program])) {
    rq.refused = GRAPHD_NOT_FOUND;
    snprintf(why, sizeof why,
             "program handle %u is not one of this session's (RingProgram gives them)", e.program);
  } else if (e.nbindings > GD_MAX_SLOTS) {
    rq.refused = GRAPHD_INVALID_ARGUMENT;
    snprintf(why, sizeof why, "%u bindings: a ring entry carries at most %u", e.nbindings,
             GD_MAX_SLOTS);
  } else if (!session_stream_reserve((void **)&ds->entry_b, &ds->entry_b_cap,
                                     e.nbindings ? e.nbindings : 1, sizeof(gd_bind_req))) {
    rq.refused = GRAPHD_RESOURCE_EXHAUSTED;
    snprintf(why, sizeof why, "out of memory");
  } else {
    entry_bindings(r, &e, ds->entry_b);
    rq.bindings = ds->entry_b;
  }
  bool not_started;
  int rc = exec_replay(d, w, ds, &rq, &r->tally, NULL, &not_started, err, sizeof err);
  r->tally.ring_replays++;
  /* A ready flag that did not come while others waited (the host
   * backend's give-up): the entry failed with its done written, and the
   * session is read no more and reported, to be cut off. */
  if (rc == -GRAPHD_DEADLINE_EXCEEDED && !atomic_load(&ds->client_gone)) mark_hung(ds);
  if (rc < 0)
    GD_LOG(GD_DEBUG, "ring", "session %llu: entry seq %llu on slot %u: %s",
           (unsigned long long)ds->session_id, (unsigned long long)e.seq, e.stream_slot, err);
  complete(r, &e, slots, rc, rc < 0 ? err : "");
  return rc;
}

/* Whether ds's ring has entries, and whether they may run now. */
static bool has_entries(gd_session_stream *ds, bool *held) {
  gd_submit_ring *r = ds->ring;
  uint64_t n;
  *held = false;
  if (!r || r->hung || ds->cut_off || atomic_load(&ds->client_gone)) return false;
  if (!submit_ring_avail(r, &n)) {
    if (r->broken && !r->warned) {
      GD_LOG(GD_WARN, "ring", "session %llu: its ring's tail is not within its entries; not read",
             (unsigned long long)ds->session_id);
      r->warned = true;
    }
    return false;
  }
  if (!n) return false;
  *held = session_stream_inflight(ds) >= r->max_inflight;
  return true;
}

/* Whether rings a and b number their entries together: the same process
 * (as the kernel names it) and the same nonzero group. */
static bool same_group(const gd_submit_ring *a, const gd_submit_ring *b) {
  return a->order_group && a->order_group == b->order_group && a->client_pid == b->client_pid;
}

static uint32_t head_order(const gd_submit_ring *r) {
  return __atomic_load_n(&r->sq[r->head & (r->entries - 1)].order, __ATOMIC_RELAXED);
}

/* Looks at a group's tails: a client that numbers and publishes its
 * entries in order settles within three (see group_first). */
#define GROUP_LOOKS 4

/* Of the sessions in ds's order group that have entries (ds among them),
 * the one whose head entry the client numbered first. The client
 * publishes its entries in their order, so an entry numbered before one
 * we saw is visible to a look at the tails after that one: look again
 * until a look finds nothing earlier. Entries published meanwhile are
 * numbered after all we saw, so the third look agrees with the second.
 * The numbers are the client's word, a hint only: a client that rewrites
 * them gets some order of its own entries after GROUP_LOOKS looks. */
static gd_session_stream *group_first(gd_device *d, gd_session_stream *ds) {
  gd_session_stream *best = ds;
  for (int look = 0;; look++) {
    gd_session_stream *first = NULL;
    uint32_t first_order = 0;
    bool held;
    for (gd_session_stream *o = session_stream_first(d); o; o = o->next) {
      if (o != ds && (!o->ring || !same_group(o->ring, ds->ring))) continue;
      if (!has_entries(o, &held)) continue;
      uint32_t ord = head_order(o->ring);
      if (!first || (int32_t)(ord - first_order) < 0) {
        first = o;
        first_order = ord;
      }
    }
    if (!first || first == best || look + 1 == GROUP_LOOKS) return first;
    best = first;
  }
}

/* Counts the device's rings, and those of ds's order group besides ds's,
 * again only when the set of rings changed: a ring alone in its group (a
 * process with one session on the device) costs no scan. */
static void count_rings(gd_device *d, gd_session_stream *ds) {
  gd_submit_ring *r = ds->ring;
  uint64_t gen = session_stream_rings_gen(d);
  if (r->counted_gen == gen) return;
  r->rings = r->peers = 0;
  for (gd_session_stream *o = session_stream_first(d); o; o = o->next) {
    if (!o->ring) continue;
    r->rings++;
    if (o != ds && same_group(o->ring, r)) r->peers++;
  }
  r->counted_gen = gen;
}

/* Whether ds's ring shares its order group with another ring of d. */
static bool has_peers(gd_device *d, gd_session_stream *ds) {
  count_rings(d, ds);
  return ds->ring->peers > 0;
}

/* The session whose head entry runs next for ds's sake: ds, or for a ring
 * in an order group the group's first; NULL when ds has no entries.
 * *held: that entry waits for --max-inflight-replays. */
static gd_session_stream *next_for(gd_device *d, gd_session_stream *ds, bool *held) {
  if (!has_entries(ds, held)) return NULL;
  if (!ds->ring->order_group || !has_peers(d, ds)) return ds;
  gd_session_stream *t = group_first(d, ds);
  if (t && t != ds) has_entries(t, held);
  return t;
}

bool ring_replay_others_waiting(gd_device *d, const gd_session_stream *ds) {
  bool held;
  for (gd_session_stream *o = session_stream_first(d); o; o = o->next) {
    if (o == ds || !o->ring || (ds->ring && same_group(o->ring, ds->ring))) continue;
    if (next_for(d, o, &held) && !held) return true;
  }
  return false;
}

/* Slots published and not taken in ds's ring and in the rings of its
 * order group: what a drain may take at most. */
static uint64_t published(gd_device *d, gd_session_stream *ds) {
  uint64_t n, sum = 0;
  for (gd_session_stream *o = session_stream_first(d); o; o = o->next)
    if (o->ring && (o == ds || same_group(o->ring, ds->ring)) && submit_ring_avail(o->ring, &n))
      sum += n;
  return sum;
}

/* How long a drain naps while an entry it must take is held back. */
#define HELD_NAP_NS 200000L

/* Whether a drain that waits for t's held entry gives up: the client has
 * gone, graphd is stopping, or (the session then marked hung) the entry
 * stayed held for the ready timeout while other work waited behind it, as
 * exec_wait_verdict rules for a ready wait too. */
static bool held_give_up(gd_device *d, gd_worker *w, gd_session_stream *t, uint64_t since_ns) {
  double timeout = t->ring->ready_timeout_s;
  int why = exec_wait_verdict(d, w, t, since_ns, timeout, ring_replay_others_waiting);
  if (why != GD_GIVE_UP_HUNG) return why != 0;
  GD_LOG(GD_WARN, "ring",
         "session %llu: its entries stayed held back by --max-inflight-replays %u for the ready "
         "timeout (%.1f s) while other work waited; cutting it off",
         (unsigned long long)t->session_id, t->ring->max_inflight, timeout);
  mark_hung(t);
  return true;
}

void ring_replay_drain(gd_device *d, gd_worker *w, gd_session_stream *ds) {
  if (!ds || !ds->ring) return;
  /* Only what the client had published when the job began, in ds's ring
   * (up to its tail then) and in its group's: a client that keeps its
   * ring full cannot hold the worker, and entries published after the
   * request are the poll's. */
  uint64_t avail;
  if (!submit_ring_avail(ds->ring, &avail)) return;
  uint64_t end = ds->ring->head + avail;
  uint64_t budget = published(d, ds);
  uint64_t held_since = 0;
  bool held;
  gd_session_stream *t;
  while (budget && ds->ring && (int64_t)(end - ds->ring->head) > 0 &&
         (t = next_for(d, ds, &held))) {
    if (held) {
      /* The job behind them must follow them (on a GPU its ready wait
       * could otherwise sit before theirs on the session stream): wait
       * for the device to catch up, as the poll does, within bounds. */
      if (!held_since) held_since = gd_now_ns();
      if (held_give_up(d, w, t, held_since)) return;
      struct timespec nap = {0, HELD_NAP_NS};
      nanosleep(&nap, NULL);
      continue;
    }
    held_since = 0;
    uint64_t head = t->ring->head;
    take_one(d, w, t, t->ring);
    uint64_t took = t->ring->head - head;
    if (!took) took = 1; /* a refusal that stops the ring still counts */
    budget = took < budget ? budget - took : 0;
  }
}

int ring_replay_take_hung(gd_device *d, uint64_t *ids, int n) {
  int k = 0;
  for (gd_session_stream *ds = session_stream_first(d); ds && k < n; ds = ds->next)
    if (ds->ring && ds->ring->hung && !ds->ring->hung_told) {
      ds->ring->hung_told = true;
      ids[k++] = ds->session_id;
    }
  return k;
}

bool ring_replay_pending(gd_device *d) {
  bool held;
  for (gd_session_stream *ds = session_stream_first(d); ds; ds = ds->next)
    if (next_for(d, ds, &held) && !held) return true;
  return false;
}

bool ring_replay_held(gd_device *d) {
  bool held;
  for (gd_session_stream *ds = session_stream_first(d); ds; ds = ds->next)
    if (next_for(d, ds, &held) && held) return true;
  return false;
}

/* Whether a replay of the program with handle h in r may wait on the
 * worker for its ready write: one already captured on d, whose replays
 * the worker queues within --ready-hold-max-us on the mean. A held replay
 * is queued only once its write lands, so the worker's queueing of it
 * (above all the graph's launch) comes after the client's work rather
 * than during it: for a program of many kernels, tens of microseconds on
 * every call, against the little a wait on the GPU costs beside such a
 * replay (docs/design.md, "Ready waits"). */
static bool cheap_to_hold(gd_device *d, const gd_session_stream *t, const gd_submit_ring *r,
                          uint32_t h) {
  gd_capture *c = h < r->nprogs && r->progs[h] ? capture_find(d, r->progs[h]) : NULL;
  if (!c || !c->queue_ns) return false;
  if (c->queue_ns <= d->ready_hold_max_ns) return true;
  if (!c->hold_cost_told) {
    char hex[2 * GD_ID_LEN + 1];
    gd_id_hex(c->prog->id, 1, hex);
    GD_LOG(GD_INFO, "ring",
           "session %llu: program %s takes the worker %.1f us to queue a replay, so its replays "
           "queue their ready waits on the GPU ahead of the client's work (--ready-hold-max-us "
           "%llu)",
           (unsigned long long)t->session_id, hex, (double)c->queue_ns / 1e3,
           (unsigned long long)(d->ready_hold_max_ns / 1000));
    c->hold_cost_told = true;
  }
  return false;
}

/* Whether t's head entry waits on the worker for now: its client's stream
 * has not written its ready word yet, the device serves more rings than
 * --ready-hold-rings, and its program is cheap to queue (cheap_to_hold).
 * A session stream's wait on the GPU polls host memory, and many at once
 * slow every hand-off of the device (docs/design.md, "Ready waits"); a
 * few are the quickest hand-off there is. An entry held here is queued as
 * soon as its write lands, its wait then passing at once, or after
 * READY_HOLD_NS with its wait on the GPU as any other. The poll only: a
 * drain for a synchronous request takes what it must at once. Never a
 * ring of an order group with others on the device: its head holds the
 * whole group back, so held, one stream's late ready write would stop the
 * group's other streams as well. */
static bool ready_held(gd_device *d, gd_session_stream *t) {
  gd_submit_ring *r = t->ring;
  if (d->be->waits_on_worker) return false;
  count_rings(d, t);
  if (r->peers || r->rings <= d->ready_hold_rings) return false;
  const volatile graphd_ring_sqe *e = &r->sq[r->head & (r->entries - 1)];
  uint32_t slot = e->stream_slot;
  uint64_t seq = e->seq;
  uint32_t prog = e->program;
  if (slot >= t->nslots ||
      graphd_seq_reached(
          __atomic_load_n(session_stream_word(t, slot, GRAPHD_FLAG_WORD_READY), __ATOMIC_ACQUIRE),
          seq) ||
      !cheap_to_hold(d, t, r, prog))
    return false;
  uint64_t now = gd_now_ns();
  if (!r->ready_held_told) {
    GD_LOG(GD_INFO, "ring",
           "session %llu: its replays wait on the worker for their ready writes while the device "
           "serves %u rings (--ready-hold-rings %u)",
           (unsigned long long)t->session_id, r->rings, d->ready_hold_rings);
    r->ready_held_told = true;
  }
  if (!r->ready_held_since) {
    r->ready_held_since = now;
    r->tally.ready_holds++;
  }
  return now - r->ready_held_since < READY_HOLD_NS;
}

/* One entry from each ring in turn, not a run of one ring's entries: a
 * client's next entry usually waits (on the GPU) for its stream to see the
 * previous one done, and on a capture that sessions share the next
 * session's entry would queue behind that whole run, hand-off by hand-off.
 * Taken in turn, the sessions' hand-offs overlap each other's work. An
 * entry that waits for its ready write (ready_held) is left at its ring's
 * head and looked at again on the next poll: the ring stays pending, so
 * the worker comes back at once rather than sleep. */
int ring_replay_poll(gd_device *d, gd_worker *w) {
  int first = 0;
  bool held;
  for (int k = 0; k < RING_BATCH; k++) {
    bool took = false;
    for (gd_session_stream *ds = session_stream_first(d); ds; ds = ds->next) {
      gd_session_stream *t = next_for(d, ds, &held);
      if (!t || held || ready_held(d, t)) continue;
      int rc = take_one(d, w, t, t->ring);
      took = true;
      if (rc < 0 && !first) first = rc;
      if (worker_jobs_waiting(w)) return first;
    }
    if (!took) break;
  }
  return first;
}

bool ring_replay_sleep(gd_device *d, bool asleep) {
  bool any = false;
  for (gd_session_stream *ds = session_stream_first(d); ds; ds = ds->next) {
    if (!ds->ring) continue;
    /* The flag before the last look at the tails (sequentially consistent,
     * as submit_ring_avail's load of the tail); the client publishes its tail
     * before it looks at the flag. */
    __atomic_store_n(&ds->ring->hdr->flags, asleep ? GRAPHD_RING_NEED_WAKEUP : 0u,
                     __ATOMIC_SEQ_CST);
    any = true;
  }
  if (!asleep || !any) return false;
  return ring_replay_pending(d);
}

#define STATS_PERIOD_NS 1000000u

bool ring_replay_has_stats(gd_device *d) {
  for (gd_session_stream *ds = session_stream_first(d); ds; ds = ds->next)
    if (ds->ring && (ds->ring->tally.replays || ds->ring->tally.errors)) return true;
  return false;
}

bool ring_replay_take_stats(gd_device *d, bool all, gd_replay_tally *st) {
  memset(st, 0, sizeof *st);
  bool any = false;
  uint64_t now = gd_now_ns();
  for (gd_session_stream *ds = session_stream_first(d); ds; ds = ds->next) {
    gd_submit_ring *r = ds->ring;
    if (!r || !(r->tally.replays || r->tally.errors)) continue;
    if (!all && now - r->taken_ns < STATS_PERIOD_NS) continue;
    r->taken_ns = now;
    gd_tally_add(st, &r->tally);
    memset(&r->tally, 0, sizeof r->tally);
    any = true;
  }
  return any;
}
