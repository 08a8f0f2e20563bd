/* libgraphd: streams, replays, and the handle's flag page.
 *
 * DESIGN: each handle owns one flag page (a 4 KiB memfd shared with the
 * daemon, registered with CUDA on GPU sessions), made with its first
 * stream; from then on the watcher (watcher.c) watches the handle.
 *
 * Each slot has three words: ready and done, shared with the daemon, and
 * passed, the client's own: every replay's last stream operation writes
 * its seq there. The page is unregistered and unmapped only when every
 * slot has passed what it issued, since a stream still behind would write
 * or wait on memory that is gone: an illegal address in the caller's
 * context. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/cuda_driver.h"
#include "common/memfd.h"
#include "graphd/encoding.h"
#include "internal.h"

#define CLOSE_WAIT_MS 2000

/* --- the flag page ---------------------------------------------------------- */

static bool cuda_session(const graphd_client *c) { return strcmp(c->device.backend, "cuda") == 0; }

static void free_page(graphd_client *c, gd_flag_page *f) {
  if (f->cuda) {
    const gd_cuda *cu;
    if (gd_cuda_load(&cu, NULL, 0) == 0) cu->cuMemHostUnregister((void *)f->host);
  }
  if (f->host) munmap((void *)f->host, GD_CLIENT_FLAG_PAGE_BYTES);
  if (f->fd >= 0) close(f->fd);
  free(f);
  (void)c;
}

/* Gives the session the page (RegisterFlags). Lock held. */
static graphd_status send_flags(graphd_client *c, gd_flag_page *f) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterFlags m = GRAPHD__WIRE__REGISTER_FLAGS__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_FLAGS;
  req.register_flags = &m;
  m.slots = GD_CLIENT_FLAG_SLOTS;
  Graphd__Wire__Reply *rep = NULL;
  graphd_status st = gd_client_call(c, &req, &f->fd, 1, &rep);
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
  return st;
}

/* Creates the page, registers it with CUDA (GPU sessions) and the daemon,
 * and starts watching the handle. Lock held. */
static graphd_status make_page(graphd_client *c) {
  graphd_status st;
  gd_flag_page *f = calloc(1, sizeof *f);
  if (!f) return gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
  f->fd = gd_memfd_new_shared("graphd-flags", GD_CLIENT_FLAG_PAGE_BYTES);
  if (f->fd < 0) {
    st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "cannot make the flag page: %s",
                           strerror(errno));
    goto fail;
  }
  void *p = mmap(NULL, GD_CLIENT_FLAG_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, 0);
  if (p == MAP_FAILED) {
    st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "cannot map the flag page: %s",
                           strerror(errno));
    goto fail;
  }
  f->host = p;
  if (cuda_session(c)) {
    const gd_cuda *cu;
    char e[256];
    CUdeviceptr dp;
    if (gd_cuda_load(&cu, e, sizeof e) < 0) {
      st = gd_client_set_err(c, GRAPHD_FAILED_PRECONDITION, "%s", e);
      goto fail;
    }
    if (cu->cuMemHostRegister(p, GD_CLIENT_FLAG_PAGE_BYTES,
                              CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE) !=
        CUDA_SUCCESS) {
      st = gd_client_set_err(c, GRAPHD_INTERNAL, "cuMemHostRegister of the flag page failed");
      goto fail;
    }
    f->cuda = true;
    if (cu->cuMemHostGetDevicePointer(&dp, p, 0) != CUDA_SUCCESS) {
      st = gd_client_set_err(c, GRAPHD_INTERNAL,
                             "cuMemHostGetDevicePointer of the flag page failed");
      goto fail;
    }
    f->dev = dp;
  }
  if ((st = send_flags(c, f)) != GRAPHD_OK) goto fail;
  c->flags = f;
  if (!gd_watch_add(c))
    return gd_client_set_err(c, GRAPHD_INTERNAL, "cannot start the watcher thread");
  return GRAPHD_OK;
fail:
  free_page(c, f);
  return st;
}

graphd_status gd_client_flags_again(graphd_client *c) {
  gd_flag_page *f = c->flags;
  graphd_status st = send_flags(c, f);
  if (st != GRAPHD_OK) return st;
  /* The streams go on from what they issued; a daemon that closed the old
   * session may have written the ready words far ahead (a release), which
   * would let the new one run a replay before its stream is ready. */
  for (uint32_t i = 0; i < GD_CLIENT_FLAG_SLOTS; i++) {
    __atomic_store_n(gd_flag_word(f, i, GRAPHD_FLAG_WORD_READY), atomic_load(&f->issued[i]),
                     __ATOMIC_RELEASE);
    f->unrun[i] = f->reported[i] = 0;
  }
  f->snapped = false; /* the watcher is off this handle until gd_watch_add */
  if (!gd_watch_add(c))
    return gd_client_set_err(c, GRAPHD_INTERNAL, "cannot start the watcher thread");
  return GRAPHD_OK;
}

void gd_client_replay_forget(graphd_client *c) {
  gd_ring_free(c); /* this process's mapping and descriptors only */
  gd_flag_page *f = c->flags;
  if (!f) return;
  c->flags = NULL;
  if (!gd_client_foreign(c)) {
    /* A stream of this process may still wait on the page: it stays
     * mapped and registered (4 KiB), and the watcher lets go of it. */
    gd_watch_remove(c);
    if (f->fd >= 0) close(f->fd);
    free(f);
    return;
  }
  /* A child of fork: no CUDA here (the parent's registration is the
   * parent's), and nothing is written; the child's own mapping goes. */
  if (c->watch_fd >= 0) close(c->watch_fd);
  c->watch_fd = -1;
  if (f->host) munmap((void *)f->host, GD_CLIENT_FLAG_PAGE_BYTES);
  if (f->fd >= 0) close(f->fd);
  free(f);
}

void gd_client_replay_close(graphd_client *c) {
  /* The worker takes what the ring holds before the session ends (a
   * session's end drops entries not taken: its client is gone). */
  if (c->ring && !atomic_load(&c->dead) && !gd_ring_wait_taken(c, CLOSE_WAIT_MS))
    gd_client_debug(c, "close: the ring's entries were not all taken");
  gd_ring_free(c);
  gd_flag_page *f = c->flags;
  if (!f) return;
  gd_watch_remove(c);
  /* A live daemon writes done for what it accepted; give it the time.
   * Then release from the host whatever it did not (the daemon died, or
   * never ran it), and wait for the streams to get past the page. */
  bool passed = !atomic_load(&c->dead) && gd_flags_wait_passed(c, CLOSE_WAIT_MS, false);
  if (!passed) passed = gd_flags_wait_passed(c, CLOSE_WAIT_MS, true);
  gd_flags_trace(c,
                 passed ? "close, streams past the page" : "close, a stream is behind: page kept");
  c->flags = NULL;
  /* A stream stuck behind other work keeps the page (4 KiB and one
   * registration) rather than lose memory from under its queued ops. */
  if (passed) free_page(c, f);
}

/* --- streams ------------------------------------------------------------------ */

graphd_status graphd_stream_attach(graphd_client *c, void *cuda_stream, graphd_stream **out) {
  GD_OWNED(c);
  graphd_status st = GRAPHD_OK;
  *out = NULL;
  pthread_mutex_lock(&c->lock);
  if (!c->has_device) {
    st = gd_client_set_err(c, GRAPHD_FAILED_PRECONDITION,
                           "streams need a data session (one bound to a device)");
    goto exit;
  }
  if (!cuda_session(c) && cuda_stream) {
    st = gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT, "host devices take no CUDA stream");
    goto exit;
  }
  if (!c->flags && (st = make_page(c)) != GRAPHD_OK) goto exit;
  uint32_t slot = 0;
  while (slot < GD_CLIENT_FLAG_SLOTS && c->flags->used[slot]) slot++;
  if (slot == GD_CLIENT_FLAG_SLOTS) {
    st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "all %d stream slots are attached",
                           GD_CLIENT_FLAG_SLOTS);
    goto exit;
  }
  graphd_stream *s = calloc(1, sizeof *s);
  if (!s) {
    st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    goto exit;
  }
  c->flags->used[slot] = true;
  s->c = c;
  s->cu_stream = cuda_stream;
  s->slot = slot;
  /* A slot may be reused: continue above what it saw, as the daemon
   * expects sequence numbers to rise per slot. */
  s->seq = atomic_load(&c->flags->issued[slot]);
  *out = s;
exit:
  pthread_mutex_unlock(&c->lock);
  return st;
}

void graphd_stream_detach(graphd_stream *s) {
  if (!s) return;
  graphd_client *c = s->c;
  if (gd_client_foreign(c)) {
    free(s); /* the slot is the parent's */
    return;
  }
  pthread_mutex_lock(&c->lock);
  if (c->flags) c->flags->used[s->slot] = false;
  pthread_mutex_unlock(&c->lock);
  free(s);
}

/* --- one call's part in the flag protocol ------------------------------------- */

/* The flag words one replay touches, sync or async (docs/design.md, "A
 * replay, step by step"): its stream writes ready = seq, waits for done >=
 * seq, and last writes passed = seq. Where the request or the ring entry
 * goes between them is the caller's; the order of the words is this. */
enum {
  FLAG_READY = 1u << GRAPHD_FLAG_WORD_READY,
  FLAG_DONE = 1u << GRAPHD_FLAG_WORD_DONE,
  FLAG_PASSED = 1u << GRAPHD_FLAG_WORD_PASSED,
};

typedef struct flag_call {
  gd_flag_page *f;
  const gd_cuda *cu; /* NULL on a host device, whose stream is the caller */
  CUstream stream;
  uint32_t slot;
  uint64_t seq;
} flag_call;

/* Takes the next seq of s; writes nothing. False when a GPU session
 * cannot load the driver. Lock held. */
static bool flag_call_begin(graphd_client *c, const graphd_stream *s, flag_call *fc) {
  *fc = (flag_call){
      .f = c->flags, .stream = (CUstream)s->cu_stream, .slot = s->slot, .seq = s->seq + 1};
  return !fc->f->cuda || gd_cuda_load(&fc->cu, NULL, 0) == 0;
}

/* Counts the seq as issued on its slot. From here the daemon may write
 * done = seq, so the watcher's release must cover it. Lock held. */
static void flag_call_issue(graphd_stream *s, const flag_call *fc) {
  atomic_store(&fc->f->issued[fc->slot], fc->seq);
  s->seq = fc->seq;
}

/* Stores the call's word of kind `word` (GRAPHD_FLAG_WORD_*) from the host. */
static void flag_store(const flag_call *fc, int word) {
  __atomic_store_n(gd_flag_word(fc->f, fc->slot, word), fc->seq, __ATOMIC_RELEASE);
}

/* A host device's caller is the stream: the writes are stores, and the
 * wait spins until done, or until the daemon is seen gone (the watcher
 * then releases the word itself). */
static void flag_ops_host(graphd_client *c, const flag_call *fc, unsigned ops) {
  if (ops & FLAG_READY) flag_store(fc, GRAPHD_FLAG_WORD_READY);
  if (ops & FLAG_DONE) {
    volatile uint64_t *done = gd_flag_word(fc->f, fc->slot, GRAPHD_FLAG_WORD_DONE);
    while (!graphd_seq_reached(__atomic_load_n(done, __ATOMIC_ACQUIRE), fc->seq) &&
           !atomic_load(&c->dead)) {
    }
  }
  if (ops & FLAG_PASSED) flag_store(fc, GRAPHD_FLAG_WORD_PASSED);
}

/* On the GPU the steps are one driver call: one step through its own
 * entry point, several as one batch, so either all are queued or none is
 * (false then). */
static bool flag_ops_gpu(const flag_call *fc, unsigned ops) {
  CUstreamBatchMemOpParams op[3];
  unsigned k = 0;
  memset(op, 0, sizeof op);
  for (int word = GRAPHD_FLAG_WORD_READY; word <= GRAPHD_FLAG_WORD_PASSED; word++) {
    if (!(ops & (1u << word))) continue;
    if (word == GRAPHD_FLAG_WORD_DONE) {
      op[k].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
      op[k].waitValue.address = gd_flag_word_dev(fc->f, fc->slot, word);
      op[k].waitValue.value64 = fc->seq;
      op[k++].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    } else {
      op[k].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
      op[k].writeValue.address = gd_flag_word_dev(fc->f, fc->slot, word);
      op[k++].writeValue.value64 = fc->seq;
    }
  }
  if (k == 0) return true;
  if (k > 1) return fc->cu->cuStreamBatchMemOp(fc->stream, k, op, 0) == CUDA_SUCCESS;
  if (op[0].operation == CU_STREAM_MEM_OP_WAIT_VALUE_64)
    return fc->cu->cuStreamWaitValue64(fc->stream, op[0].waitValue.address, fc->seq,
                                       CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS;
  return fc->cu->cuStreamWriteValue64(fc->stream, op[0].writeValue.address, fc->seq, 0) ==
         CUDA_SUCCESS;
}

/* Puts the steps `ops` (FLAG_*) of the call on its stream, in the
 * protocol's order: ready, the wait for done, passed. False when the
 * driver refused them (none is queued then); a host device never does. */
static bool flag_call_ops(graphd_client *c, const flag_call *fc, unsigned ops) {
  if (fc->cu) return flag_ops_gpu(fc, ops);
  flag_ops_host(c, fc, ops);
  return true;
}

/* --- replays --------------------------------------------------------------------- */

/* What every replay starts with, lock held: the stream must be the
 * handle's, a daemon that went away since the last call is replaced by a
 * new session, and an asynchronous replay's failure is this call's
 * answer. */
static graphd_status replay_begin(graphd_client *c, const graphd_stream *s) {
  if (!s || s->c != c || !c->flags)
    return gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT,
                             "the stream does not belong to this handle");
  graphd_status st;
  if (atomic_load(&c->dead) && c->reconnect_ms > 0 && (st = c->reconnect(c)) != GRAPHD_OK)
    return st;
  gd_ring_reap(c);
  return gd_ring_take_error(c);
}

/* The region of binding b, registered or found in the cache, as the
 * daemon is sent it (both ways of replaying). On failure the error names
 * the slot. Lock held. */
static graphd_status resolve_binding(graphd_client *c, const graphd_binding *b,
                                     graphd_ring_binding *out) {
  graphd_region_ref r;
  graphd_status st = gd_region_register_locked(c, b->ptr, b->bytes, &r);
  if (st != GRAPHD_OK) {
    char e[GRAPHD_ERRMAX];
    snprintf(e, sizeof e, "%s", c->err);
    return gd_client_set_err(c, st, "binding of slot %u: %s", b->slot, e);
  }
  *out = (graphd_ring_binding){
      .slot = b->slot, .region_id = r.region_id, .offset = r.offset, .bytes = b->bytes};
  return GRAPHD_OK;
}

/* Says in c's error what a failed Replay request means for replay seq of
 * slot, and notes on the page what a reconnect must know of it. *unrun:
 * the daemon certainly did not run it. Lock held. */
static void replay_failed(graphd_client *c, uint32_t slot, uint64_t seq, graphd_status st,
                          bool *unrun) {
  gd_flag_page *f = c->flags;
  char e[GRAPHD_ERRMAX];
  snprintf(e, sizeof e, "%s", c->err);
  if (st == GRAPHD_UNAVAILABLE && (c->fail == GD_FAIL_UNSENT || c->fail == GD_FAIL_NOT_STARTED)) {
    /* The daemon did not run it and never writes done = seq: the seq is
     * left unused (a retry takes the next one), and a reconnect does not
     * count it as cut off. */
    *unrun = true;
    f->unrun[slot] = seq;
    gd_client_set_err(c, st, "%s; this replay (seq %llu) did not run", e, (unsigned long long)seq);
  } else if (st == GRAPHD_UNAVAILABLE && c->fail == GD_FAIL_LOST) {
    /* It may have run, in part: never sent again, reported here once. */
    f->reported[slot] = seq;
    gd_client_set_err(c, st,
                      "%s; graphd went away after taking this replay (seq %llu), which may "
                      "have run in part: it is not sent again",
                      e, (unsigned long long)seq);
  }
  if (st == GRAPHD_DEADLINE_EXCEEDED) {
    /* No answer in time: the session is broken; release our own wait
     * from the host, and say what that means for the outputs. (A daemon
     * that went away was handled in the call already.) */
    __atomic_store_n(gd_flag_word(f, slot, GRAPHD_FLAG_WORD_DONE), seq, __ATOMIC_RELEASE);
    gd_client_set_err(c, st, "%s; the outputs of this replay are undefined", e);
  }
  gd_client_debug(c, "replay seq %llu on slot %u failed: %s: %s", (unsigned long long)seq, slot,
                  graphd_status_name(st), c->err);
}

/* The Replay request of call fc, its bindings resolved. Lock held. */
static graphd_status send_replay(graphd_client *c, const flag_call *fc,
                                 const uint8_t program_id[32], Graphd__Wire__Binding **wp, size_t n,
                                 graphd_replay_info *info, bool *unrun) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Replay m = GRAPHD__WIRE__REPLAY__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REPLAY;
  req.replay = &m;
  m.program_id.data = (uint8_t *)program_id;
  m.program_id.len = 32;
  m.stream_slot = fc->slot;
  m.seq = fc->seq;
  m.n_bindings = n;
  m.bindings = wp;
  Graphd__Wire__Reply *rep = NULL;
  graphd_status st = gd_client_call(c, &req, NULL, 0, &rep);
  if (st != GRAPHD_OK) {
    replay_failed(c, fc->slot, fc->seq, st, unrun);
    return st;
  }
  if (info && rep->body_case == GRAPHD__WIRE__REPLY__BODY_REPLAY) {
    info->captured = rep->replay->captured;
    info->capture_ns = rep->replay->capture_ns;
    info->server_ns = rep->replay->server_ns;
  }
  graphd__wire__reply__free_unpacked(rep, NULL);
  return GRAPHD_OK;
}

/* One attempt at a synchronous replay, lock held: ready on the stream, the
 * request, then (answered OK) the wait for done, and passed in any case
 * once ready is queued. *unrun says, on a failure, that the daemon
 * certainly did not run it (it went away before the request reached it,
 * or answered that it had not started it), so it may be sent to the next
 * daemon. */
static graphd_status replay_once(graphd_client *c, graphd_stream *s, const uint8_t program_id[32],
                                 const graphd_binding *b, size_t n, graphd_replay_info *info,
                                 bool *unrun) {
  graphd_status st = GRAPHD_OK;
  Graphd__Wire__Binding *wb = NULL;
  Graphd__Wire__Binding **wp = NULL;
  *unrun = false;
  if (n > GD_MAX_SLOTS) {
    st = gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT, "%zu bindings: at most %u (one a slot)", n,
                           GD_MAX_SLOTS);
    goto exit;
  }
  wb = calloc(n ? n : 1, sizeof *wb);
  wp = calloc(n ? n : 1, sizeof *wp);
  if (!wb || !wp) {
    st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory for %zu bindings", n);
    goto exit;
  }
  gd_region_batch(c);
  for (size_t i = 0; i < n; i++) {
    graphd_ring_binding r;
    if ((st = resolve_binding(c, &b[i], &r)) != GRAPHD_OK) {
      /* The daemon went away: the replay was never sent. */
      *unrun = st == GRAPHD_UNAVAILABLE && c->fail != GD_FAIL_NONE;
      goto exit;
    }
    graphd__wire__binding__init(&wb[i]);
    wb[i].slot = r.slot;
    wb[i].region_id = r.region_id;
    wb[i].offset = r.offset;
    wb[i].bytes = r.bytes;
    wp[i] = &wb[i];
  }
  flag_call fc;
  if (!flag_call_begin(c, s, &fc) || !flag_call_ops(c, &fc, FLAG_READY)) {
    st = gd_client_set_err(c, GRAPHD_INTERNAL, "cannot enqueue the ready write on the stream");
    goto exit;
  }
  flag_call_issue(s, &fc);
  /* After a failed request the ready write stays queued, and no wait for
   * done follows it: only passed. On a host device the daemon ran the
   * replay before it replied, so the wait for done returns at once. */
  st = send_replay(c, &fc, program_id, wp, n, info, unrun);
  if (st == GRAPHD_OK && !flag_call_ops(c, &fc, FLAG_DONE))
    st = gd_client_set_err(c, GRAPHD_INTERNAL, "cannot enqueue the wait for done on the stream");
  /* The stream's last touch of the page for this seq (graphd_close). If
   * this cannot be queued, close finds the slot behind and keeps the page. */
  (void)flag_call_ops(c, &fc, FLAG_PASSED);
exit:
  free(wb);
  free(wp);
  return st;
}

graphd_status graphd_replay(graphd_client *c, graphd_stream *s, const uint8_t program_id[32],
                            const graphd_binding *b, size_t n, graphd_replay_info *info) {
  GD_OWNED(c);
  graphd_status st;
  pthread_mutex_lock(&c->lock);
  if ((st = replay_begin(c, s)) != GRAPHD_OK) goto exit;
  bool unrun;
  st = replay_once(c, s, program_id, b, n, info, &unrun);
  if (st != GRAPHD_OK && unrun && c->reconnect_ms > 0) {
    /* Never run: once more, on the next daemon, under a new seq (its
     * stream's ready write for the old one is harmless: waits are >=). */
    gd_client_debug(c, "replay on slot %u was not run (%s); reconnecting to send it again", s->slot,
                    c->err);
    st = c->reconnect(c);
    if (st == GRAPHD_OK) st = replay_once(c, s, program_id, b, n, info, &unrun);
  }
exit:
  pthread_mutex_unlock(&c->lock);
  return st;
}

/* --- asynchronous replays ------------------------------------------------------ */

/* One asynchronous replay, lock held: the ring entry, with the same flag
 * steps as replay_once around it. On the GPU the stream's part comes after
 * the entry, in one batch (the worker's ready wait may be queued already,
 * which is fine: it waits on the GPU); a host device's caller writes ready
 * before the entry and does not wait for done. */
static graphd_status async_once(graphd_client *c, graphd_stream *s, const uint8_t program_id[32],
                                const graphd_binding *b, size_t n, uint64_t *seq_out) {
  graphd_status st;
  graphd_ring_sqe e;
  memset(&e, 0, sizeof e);
  if ((st = gd_ring_handle(c, program_id, &e.program)) != GRAPHD_OK) return st;
  e.nbindings = (uint32_t)n;
  /* Bindings past the entry's own go in the slots after it, written
   * straight into the ring once there is room for them all. */
  uint32_t nslots = GRAPHD_RING_ENTRY_SLOTS(n);
  if ((st = gd_ring_reserve(c, nslots)) != GRAPHD_OK) return st;
  gd_region_batch(c);
  for (size_t i = 0; i < n; i++) {
    size_t k = i - GRAPHD_RING_MAX_BINDINGS;
    graphd_ring_binding *to =
        i < GRAPHD_RING_MAX_BINDINGS
            ? &e.bindings[i]
            : &gd_ring_cont_slot(c, 1 + (uint32_t)(k / GRAPHD_RING_CONT_BINDINGS))
                   ->bindings[k % GRAPHD_RING_CONT_BINDINGS];
    if ((st = resolve_binding(c, &b[i], to)) != GRAPHD_OK) return st;
  }
  flag_call fc;
  if (!flag_call_begin(c, s, &fc))
    return gd_client_set_err(c, GRAPHD_INTERNAL, "cannot load the CUDA driver");
  e.seq = fc.seq;
  e.stream_slot = fc.slot;
  /* From the publish to the last stream operation, in this process's
   * order on the GPU, which the worker follows across its handles. */
  e.order = gd_order_begin(c);
  if (!fc.cu) (void)flag_call_ops(c, &fc, FLAG_READY); /* the caller is the stream */
  flag_call_issue(s, &fc);
  gd_ring_publish(c, &e, nslots);
  s->ring_seq = fc.seq;
  s->ring_tail = c->ring->tail;
  s->ring_gen = c->ring->gen;
  if (!flag_call_ops(c, &fc, fc.cu ? FLAG_READY | FLAG_DONE | FLAG_PASSED : FLAG_PASSED)) {
    /* The daemon's stream must not wait for a ready write that never
     * comes, nor the watcher for a passed one: both from the host. The
     * replay then runs unordered with the stream, which the error says. */
    flag_store(&fc, GRAPHD_FLAG_WORD_READY);
    flag_store(&fc, GRAPHD_FLAG_WORD_PASSED);
    st = gd_client_set_err(c, GRAPHD_INTERNAL,
                           "cannot enqueue the flag operations on the stream; replay seq "
                           "%llu ran without waiting for the stream's earlier work",
                           (unsigned long long)fc.seq);
  }
  gd_order_end(c);
  if (st == GRAPHD_OK && seq_out) *seq_out = fc.seq;
  return st;
}

graphd_status graphd_replay_async(graphd_client *c, graphd_stream *s, const uint8_t program_id[32],
                                  const graphd_binding *b, size_t n, uint64_t *seq) {
  GD_OWNED(c);
  graphd_status st;
  pthread_mutex_lock(&c->lock);
  if ((st = replay_begin(c, s)) != GRAPHD_OK) goto exit;
  /* The ring outlives the daemon in our memory: nothing would read it. */
  if (atomic_load(&c->dead)) {
    st = gd_client_set_err(c, GRAPHD_UNAVAILABLE, "graphd went away; the replay was not sent");
    goto exit;
  }
  if (!c->ring && !c->ring_off && (st = gd_ring_open(c)) != GRAPHD_OK) {
    if (st != GRAPHD_UNIMPLEMENTED) goto exit;
    gd_client_debug(c, "graphd has no submission rings: async replays go the synchronous way");
    c->ring_off = true;
  }
  if (c->ring_off || n > c->ring->max_bindings) {
    /* The synchronous way, with the same ordering. */
    pthread_mutex_unlock(&c->lock);
    st = graphd_replay(c, s, program_id, b, n, NULL);
    if (st == GRAPHD_OK && seq) *seq = s->seq;
    return st;
  }
  st = async_once(c, s, program_id, b, n, seq);
exit:
  pthread_mutex_unlock(&c->lock);
  return st;
}

graphd_status graphd_replay_collect(graphd_client *c, graphd_async_info *info) {
  GD_OWNED(c);
  pthread_mutex_lock(&c->lock);
  gd_ring_reap(c);
  if (info) {
    gd_ring *r = c->ring;
    info->completed = r ? r->completed : 0;
    info->failed = r ? r->failed : 0;
    info->queued = r ? r->issued - r->completed : 0;
  }
  graphd_status st = gd_ring_take_error(c);
  pthread_mutex_unlock(&c->lock);
  return st;
}

graphd_status graphd_stream_wait(graphd_stream *s, uint64_t seq, int timeout_ms) {
  if (!s) return GRAPHD_INVALID_ARGUMENT;
  graphd_client *c = s->c;
  GD_OWNED(c);
  pthread_mutex_lock(&c->lock);
  gd_flag_page *f = c->flags;
  int ms = timeout_ms >= 0 ? timeout_ms : c->timeout_ms;
  if (!f) {
    graphd_status st =
        gd_client_set_err(c, GRAPHD_FAILED_PRECONDITION, "the handle has no streams");
    pthread_mutex_unlock(&c->lock);
    return st;
  }
  pthread_mutex_unlock(&c->lock);
  /* The done word only rises (a release from the watcher too), so no lock
   * is needed to watch it. */
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  volatile uint64_t *done = gd_flag_word(f, s->slot, GRAPHD_FLAG_WORD_DONE);
  for (unsigned i = 0; (int64_t)(__atomic_load_n(done, __ATOMIC_ACQUIRE) - seq) < 0; i++) {
    if (i > 1024) {
      struct timespec now, nap = {0, 10000};
      clock_gettime(CLOCK_MONOTONIC, &now);
      double el = (double)(now.tv_sec - t0.tv_sec) * 1e3 + (double)(now.tv_nsec - t0.tv_nsec) / 1e6;
      if (ms > 0 && el > ms) {
        pthread_mutex_lock(&c->lock);
        graphd_status st =
            gd_client_set_err(c, GRAPHD_DEADLINE_EXCEEDED,
                              "replay seq %llu on stream slot %u is not done after %d ms",
                              (unsigned long long)seq, s->slot, ms);
        pthread_mutex_unlock(&c->lock);
        return st;
      }
      nanosleep(&nap, NULL);
    }
  }
  /* Released from here, not done by the daemon: it went away first. */
  uint64_t finished;
  if (gd_flags_lost(c, s->slot, seq, &finished)) {
    pthread_mutex_lock(&c->lock);
    /* Said here, so the reconnect need not say it again for this slot. */
    c->flags->reported[s->slot] = atomic_load(&c->flags->issued[s->slot]);
    graphd_status st = gd_client_set_err(
        c, GRAPHD_UNAVAILABLE,
        "graphd went away before it finished replay seq %llu on stream slot %u (it had "
        "finished up to seq %llu there): that replay did not run, or not whole, and its "
        "outputs are undefined",
        (unsigned long long)seq, s->slot, (unsigned long long)finished);
    pthread_mutex_unlock(&c->lock);
    return st;
  }
  /* The worker writes done before the entry's completion: wait for the
   * completions up to the stream's last async replay at or after seq, so
   * that a failure of seq is reported here. */
  pthread_mutex_lock(&c->lock);
  gd_ring *r = c->ring;
  uint64_t need = r && r->gen == s->ring_gen && seq <= s->ring_seq ? s->ring_tail : 0;
  pthread_mutex_unlock(&c->lock);
  while (r && (int64_t)(__atomic_load_n(&r->hdr->cq_tail, __ATOMIC_ACQUIRE) - need) < 0 &&
         !atomic_load(&c->dead)) {
    struct timespec nap = {0, 1000};
    nanosleep(&nap, NULL);
  }
  return graphd_replay_collect(c, NULL);
}

graphd_status graphd_set_ring_entries(graphd_client *c, uint32_t entries) {
  GD_OWNED(c);
  graphd_status st = GRAPHD_OK;
  pthread_mutex_lock(&c->lock);
  if (c->ring)
    st = gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT, "the handle's ring is made already");
  else if (entries < GRAPHD_RING_MIN_ENTRIES || entries > GRAPHD_RING_MAX_ENTRIES ||
           (entries & (entries - 1)))
    st = gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT,
                           "ring entries must be a power of two from %d to %d, not %u",
                           GRAPHD_RING_MIN_ENTRIES, GRAPHD_RING_MAX_ENTRIES, entries);
  else
    c->ring_entries = entries;
  pthread_mutex_unlock(&c->lock);
  return st;
}
