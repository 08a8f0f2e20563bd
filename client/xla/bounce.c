/* See bounce.h. The caller holds t->lock in every function but init and
 * close. */
#include "bounce.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The last serial given to an xla_exec: 64 bits never wrap in a
 * process's life. */
static uint64_t exec_serials;

xla_exec *xla_exec_new(void) {
  xla_exec *e = calloc(1, sizeof *e);
  if (e) e->serial = __atomic_add_fetch(&exec_serials, 1, __ATOMIC_RELAXED);
  return e;
}

void xla_exec_free(void *exec) { free(exec); }

void xla_bounce_init(xla_bounce_table *t, int cap) {
  memset(t, 0, sizeof *t);
  pthread_mutex_init(&t->lock, NULL);
  t->cap = cap > 0 ? cap : 1;
}

static void use_put(const gd_cuda *cu, xla_bounce_table *t, xla_bounce_use *u) {
  if (!u || --u->refs > 0) return;
  if (t->nspare < XLA_SPARE_EVENTS) {
    t->spare[t->nspare++] = u;
    return;
  }
  /* Destroying an event whose record is still pending is allowed: the
   * driver lets it complete first. */
  cu->cuEventDestroy(u->ev);
  free(u);
}

/* An event for a call that bound copies, recorded on its stream: a spare
 * one, or made; NULL when neither works. */
static xla_bounce_use *use_get(const gd_cuda *cu, xla_bounce_table *t, CUstream stream) {
  xla_bounce_use *u = t->nspare ? t->spare[--t->nspare] : calloc(1, sizeof *u);
  if (u && !u->ev && cu->cuEventCreate(&u->ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    free(u);
    return NULL;
  }
  if (u && cu->cuEventRecord(u->ev, stream) != CUDA_SUCCESS) {
    cu->cuEventDestroy(u->ev);
    free(u);
    return NULL;
  }
  return u;
}

/* Whether no queued call uses e any more: its last call's event is done
 * (bounce.h says why that is enough). */
static bool idle(const gd_cuda *cu, const xla_bounce *e) {
  return !e->use || cu->cuEventQuery(e->use->ev) == CUDA_SUCCESS;
}

/* One copy of block base is gone: the block goes with its last. */
static void block_put(const gd_cuda *cu, xla_bounce_table *t, CUdeviceptr base) {
  for (int k = 0; k < t->nblocks; k++) {
    if (t->blocks[k].base != base) continue;
    if (--t->blocks[k].live == 0) {
      cu->cuMemFree(base);
      t->blocks[k] = t->blocks[--t->nblocks];
    }
    return;
  }
}

static bool grow_blocks(xla_bounce_table *t) {
  int alloc = t->blocks_alloc ? 2 * t->blocks_alloc : 16;
  xla_block *v = realloc(t->blocks, (size_t)alloc * sizeof *v);
  if (!v) return false;
  t->blocks = v;
  t->blocks_alloc = alloc;
  return true;
}

static void drop(const gd_cuda *cu, xla_bounce_table *t, int i) {
  xla_bounce *e = &t->v[i];
  block_put(cu, t, e->block);
  use_put(cu, t, e->use);
  memmove(&t->v[i], &t->v[i + 1], (size_t)(t->n - i - 1) * sizeof *t->v);
  t->n--;
  t->freed++;
}

void xla_bounce_close(xla_bounce_table *t) {
  const gd_cuda *cu;
  if (t->n && gd_cuda_load(&cu, NULL, 0) == 0)
    for (int i = 0; i < t->n; i++) {
      if (t->v[i].use) cu->cuEventSynchronize(t->v[i].use->ev);
      block_put(cu, t, t->v[i].block);
      use_put(cu, t, t->v[i].use);
    }
  if (t->nspare && gd_cuda_load(&cu, NULL, 0) == 0)
    for (int i = 0; i < t->nspare; i++) {
      cu->cuEventDestroy(t->spare[i]->ev);
      free(t->spare[i]);
    }
  free(t->v);
  free(t->blocks);
  free(t->scratch);
  pthread_mutex_destroy(&t->lock);
  memset(t, 0, sizeof *t);
}

/* Device memory at ptr that graphd cannot map (libgraphd's region.c takes
 * legacy IPC and POSIX-fd VMM memory, and refuses pool memory): UNMAP_POOL
 * or UNMAP_MODULE (neither pool memory nor exportable: a module's memory);
 * MAPPABLE for memory that graphd maps, and for anything that is not
 * device memory, whose refusal stands. */
enum { MAPPABLE, UNMAP_POOL, UNMAP_MODULE };
static int unmappable(const gd_cuda *cu, uint64_t ptr) {
  unsigned kind = gd_cuda_mem_kind(cu, (CUdeviceptr)ptr);
  if (!(kind & GD_CUDA_MEM_DEVICE)) return MAPPABLE;
  if (kind & GD_CUDA_MEM_POOL) return UNMAP_POOL;
  return kind & (GD_CUDA_MEM_LEGACY_IPC | GD_CUDA_MEM_VMM_FD) ? MAPPABLE : UNMAP_MODULE;
}

/* Where (src, bytes) is or would go: every binding of every call is
 * looked up, so the copies are kept sorted. */
static int find_at(const xla_bounce_table *t, uint64_t src, uint64_t bytes) {
  int lo = 0, hi = t->n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    const xla_bounce *m = &t->v[mid];
    if (m->src < src || (m->src == src && m->bytes < bytes))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

xla_bounce *xla_bounce_find(xla_bounce_table *t, uint64_t src, uint64_t bytes) {
  int i = find_at(t, src, bytes);
  return i < t->n && t->v[i].src == src && t->v[i].bytes == bytes ? &t->v[i] : NULL;
}

/* Frees the least recently used copy that no queued call uses and that the
 * call stamped `stamp` does not bind; false when there is none. */
static bool free_lru(const gd_cuda *cu, xla_bounce_table *t, uint64_t stamp) {
  int lru = -1;
  for (int i = 0; i < t->n; i++) {
    const xla_bounce *e = &t->v[i];
    if (e->last_call >= stamp || (lru >= 0 && e->last_call >= t->v[lru].last_call)) continue;
    if (idle(cu, e)) lru = i;
  }
  if (lru < 0) return false;
  drop(cu, t, lru);
  return true;
}

/* A new copy of one call, until its block is made. */
typedef struct fresh {
  uint64_t src, bytes;
  uint32_t slot;
  bool constant;
} fresh;

static uint64_t aligned(uint64_t bytes) {
  return (bytes + XLA_COPY_ALIGN - 1) / XLA_COPY_ALIGN * XLA_COPY_ALIGN;
}

/* Takes the call's new entries of one kind out of the table again. */
static void forget_fresh(xla_bounce_table *t, const fresh *f, int nf, bool constant) {
  for (int k = 0; k < nf; k++) {
    if (f[k].constant != constant) continue;
    int at = find_at(t, f[k].src, f[k].bytes);
    memmove(&t->v[at], &t->v[at + 1], (size_t)(t->n - at - 1) * sizeof *t->v);
    t->n--;
  }
}

/* Makes one block for the call's new copies of one kind (constants, or
 * pool memory) and points their entries into it, each 256-byte aligned;
 * on failure takes them out of the table again, *slot naming the first. */
static CUresult make_block(const gd_cuda *cu, xla_bounce_table *t, const fresh *f, int nf,
                           bool constant, uint64_t stamp, uint32_t *slot) {
  uint64_t total = 0;
  int count = 0;
  for (int k = 0; k < nf; k++)
    if (f[k].constant == constant) {
      total += aligned(f[k].bytes);
      if (!count++) *slot = f[k].slot;
    }
  if (!count) return CUDA_SUCCESS;
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  CUdeviceptr base = 0;
  if (t->nblocks < t->blocks_alloc || grow_blocks(t)) {
    r = cu->cuMemAlloc(&base, total);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      /* Room on the device first: every copy no queued call uses. */
      while (free_lru(cu, t, stamp)) {
      }
      r = cu->cuMemAlloc(&base, total);
    }
  }
  if (r != CUDA_SUCCESS) {
    forget_fresh(t, f, nf, constant);
    return r;
  }
  t->blocks[t->nblocks++] = (xla_block){.base = base, .live = count};
  uint64_t off = 0;
  for (int k = 0; k < nf; k++) {
    if (f[k].constant != constant) continue;
    xla_bounce *e = xla_bounce_find(t, f[k].src, f[k].bytes);
    e->copy = base + off;
    e->block = base;
    off += aligned(f[k].bytes);
  }
  return CUDA_SUCCESS;
}

int xla_bounce_add(xla_bounce_table *t, const graphd_binding *b, int64_t nb, char *err,
                   size_t errlen) {
  const gd_cuda *cu;
  if (gd_cuda_load(&cu, NULL, 0) < 0) return 0;
  uint64_t stamp = ++t->stamp;
  /* The call's copies that exist already are its own: none is freed for
   * another of its buffers. */
  for (int64_t i = 0; i < nb; i++) {
    xla_bounce *e = xla_bounce_find(t, b[i].ptr, b[i].bytes);
    if (e) e->last_call = stamp;
  }
  /* The new ones enter the table first (a buffer bound twice gets one),
   * then get their memory: one block for the call's constants and one for
   * its pool buffers, so that the daemon maps one allocation for many
   * copies (a step of MuJoCo's binds some 70 constants). */
  fresh *f = NULL;
  int nf = 0, fcap = 0;
  bool host_ok = true;
  for (int64_t i = 0; i < nb && host_ok; i++) {
    int kind;
    if (xla_bounce_find(t, b[i].ptr, b[i].bytes) || (kind = unmappable(cu, b[i].ptr)) == MAPPABLE)
      continue;
    while (t->n >= t->cap && free_lru(cu, t, stamp)) {
    }
    if (nf == fcap) {
      int c = fcap ? 2 * fcap : 16;
      fresh *g = realloc(f, (size_t)c * sizeof *g);
      if (g) {
        f = g;
        fcap = c;
      }
    }
    if (t->n == t->alloc) {
      int alloc = t->alloc ? 2 * t->alloc : 16;
      xla_bounce *v = realloc(t->v, (size_t)alloc * sizeof *v);
      if (v) {
        t->v = v;
        t->alloc = alloc;
      }
    }
    if (nf == fcap || t->n == t->alloc) {
      snprintf(err, errlen, "out of host memory for a copy of slot %u's buffer", b[i].slot);
      host_ok = false;
      break;
    }
    f[nf++] = (fresh){b[i].ptr, b[i].bytes, b[i].slot, kind == UNMAP_MODULE};
    int at = find_at(t, b[i].ptr, b[i].bytes);
    memmove(&t->v[at + 1], &t->v[at], (size_t)(t->n - at) * sizeof *t->v);
    t->v[at] = (xla_bounce){
        .src = b[i].ptr, .bytes = b[i].bytes, .constant = kind == UNMAP_MODULE, .last_call = stamp};
    t->n++;
  }
  CUresult r = CUDA_SUCCESS;
  uint32_t slot = 0;
  for (int k = 0; k < 2; k++) {
    bool constant = k == 0;
    if (!host_ok || r != CUDA_SUCCESS)
      forget_fresh(t, f, nf, constant);
    else
      r = make_block(cu, t, f, nf, constant, stamp, &slot);
  }
  if (host_ok && r != CUDA_SUCCESS) {
    char e[160];
    const fresh *x = f;
    while (x->slot != slot) x++;
    snprintf(err, errlen,
             "slot %u is bound to memory graphd cannot map (0x%llx, %llu bytes), and no copy "
             "of it could be made (%d copies, each bound by a call still queued): %s",
             slot, (unsigned long long)x->src, (unsigned long long)x->bytes, t->n,
             gd_cuda_strerror(cu, r, e, sizeof e));
  }
  free(f);
  return host_ok && r == CUDA_SUCCESS ? nf : -1;
}

/* The buffer id of the allocation at base now, asked of the driver once a
 * call (XLA puts a module's constants in one allocation: one query for
 * them all). */
static unsigned long long allocation_id(const gd_cuda *cu, xla_bounce_call *call,
                                        CUdeviceptr base) {
  for (int k = 0; k < call->nids; k++)
    if (call->ids[k].base == base) return call->ids[k].id;
  unsigned long long id = gd_cuda_buffer_id(cu, base);
  call->id_queries++;
  if (call->nids < XLA_CALL_IDS) {
    call->ids[call->nids].base = base;
    call->ids[call->nids++].id = id;
  }
  return id;
}

/* Whether constant x's copy holds it still: filled from an allocation
 * that still lives. Buffer ids are never reused, and an allocation never
 * changes its range, so the same id at the allocation's base means src is
 * still in it. */
static bool constant_holds(const gd_cuda *cu, xla_bounce_call *call, const xla_bounce *x) {
  if (!x->filled) return false;
  unsigned long long id = allocation_id(cu, call, x->alloc);
  return id && id == x->src_id;
}

/* Notes which allocation holds constant x now, before its copy is filled
 * from it. No executable has shown the new fill yet. */
static void constant_learn(const gd_cuda *cu, xla_bounce_call *call, xla_bounce *x) {
  CUdeviceptr base;
  size_t size;
  if (cu->cuMemGetAddressRange(&base, &size, (CUdeviceptr)x->src) != CUDA_SUCCESS) base = x->src;
  x->alloc = base;
  x->src_id = gd_cuda_buffer_id(cu, base);
  call->id_queries++;
  x->filled = x->src_id != 0;
  memset(x->shown, 0, sizeof x->shown);
}

/* Whether a call of executable exec has shown that x holds its constant
 * (bounce.h says why that holds for all its later calls). */
static bool shown_by(const xla_bounce *x, uint64_t exec) {
  if (!exec) return false;
  for (int k = 0; k < XLA_SHOWN; k++)
    if (x->shown[k] == exec) return true;
  return false;
}

/* Notes that a call of exec has shown x to hold its constant: first in
 * the list, the one least recently noted dropped. */
static void show(xla_bounce *x, uint64_t exec) {
  if (!exec || shown_by(x, exec)) return;
  memmove(&x->shown[1], &x->shown[0], (XLA_SHOWN - 1) * sizeof x->shown[0]);
  x->shown[0] = exec;
}

/* Queues the copies of the bindings that have one: the operands into their
 * copies (in: before the replay, from from[i] where set; a constant's
 * copy only once), or the copies out to the results (after it). */
static graphd_status copy_way(const gd_cuda *cu, xla_bounce_call *call, const graphd_binding *b,
                              const uint64_t *from, const uint8_t *dir, int64_t nb, bool in,
                              char *err, size_t errlen) {
  for (int64_t i = 0; i < nb; i++) {
    xla_bounce *x = call->x[i];
    if (!x || !(dir[i] & (in ? XLA_DIR_IN : XLA_DIR_OUT))) continue;
    bool constant = in && x->constant && dir[i] == XLA_DIR_IN;
    if (constant) {
      /* A constant: its copy holds it for every call of an executable that
       * has seen it do so, and for any call while the allocation is the
       * same one. */
      if (shown_by(x, call->exec)) continue;
      if (constant_holds(cu, call, x)) {
        show(x, call->exec);
        continue;
      }
      constant_learn(cu, call, x);
    }
    call->copies++;
    CUdeviceptr src = (CUdeviceptr)(from && from[i] ? from[i] : x->src);
    CUresult r = in ? cu->cuMemcpyDtoDAsync(x->copy, src, x->bytes, call->stream)
                    : cu->cuMemcpyDtoDAsync((CUdeviceptr)x->src, x->copy, x->bytes, call->stream);
    if (r != CUDA_SUCCESS) {
      if (constant) x->filled = false; /* the fill never happened */
      snprintf(err, errlen, "cannot queue the copy of slot %u's unmappable buffer", b[i].slot);
      return GRAPHD_INTERNAL;
    }
    /* Queued on the stream, the fill comes before anything a later call
     * queues (on another stream, after a wait for this call's event). */
    if (constant) show(x, call->exec);
  }
  return GRAPHD_OK;
}

/* The call's per-binding arrays, from the table's scratch; false when
 * out of memory. */
static bool call_arrays(xla_bounce_table *t, int64_t nb, xla_bounce_call *call) {
  size_t need = (size_t)(nb ? nb : 1) * (sizeof *call->own + sizeof *call->x);
  if (need > t->scratch_bytes) {
    void *m = realloc(t->scratch, need);
    if (!m) return false;
    t->scratch = m;
    t->scratch_bytes = need;
  }
  call->own = t->scratch;
  call->x = (xla_bounce **)(call->own + nb);
  return true;
}

graphd_status xla_bounce_begin(xla_bounce_table *t, const graphd_binding *b, const uint64_t *from,
                               const uint8_t *dir, int64_t nb, CUstream stream, uint64_t exec,
                               xla_bounce_call *call, char *err, size_t errlen) {
  memset(call, 0, sizeof *call);
  call->use = b;
  call->stream = stream;
  call->exec = exec;
  call->stamp = ++t->stamp;
  if (t->n == 0) return GRAPHD_OK;
  const gd_cuda *cu;
  if (gd_cuda_load(&cu, NULL, 0) < 0) return GRAPHD_OK; /* then nothing was added either */
  if (!call_arrays(t, nb, call)) {
    snprintf(err, errlen, "out of memory");
    return GRAPHD_RESOURCE_EXHAUSTED;
  }
  /* Each binding looked up once: by binary search, after a test against
   * the copies' lowest and highest addresses, which most of a call's
   * buffers (in XLA's allocations, away from its modules') fail. */
  uint64_t lo = t->v[0].src, hi = t->v[t->n - 1].src;
  for (int64_t i = 0; i < nb; i++) {
    xla_bounce *x = call->x[i] =
        b[i].ptr < lo || b[i].ptr > hi ? NULL : xla_bounce_find(t, b[i].ptr, b[i].bytes);
    if (!x) continue;
    call->any = true;
    x->last_call = call->stamp;
    /* Module memory bound to be written (a fixed binding) is no constant
     * of this call: its copy is filled afresh when next bound as one. */
    if (x->constant && (dir[i] & XLA_DIR_OUT)) {
      x->filled = false;
      memset(x->shown, 0, sizeof x->shown);
    }
  }
  /* The call goes on with its own bindings when none has a copy. */
  if (!call->any) {
    call->x = NULL;
    return GRAPHD_OK;
  }
  /* A copy used last on another stream: this one waits for that call, so
   * this call's event covers both (and the two never race on the copy). */
  for (int64_t i = 0; i < nb; i++) {
    xla_bounce *x = call->x[i];
    if (x && x->use && x->stream != stream &&
        cu->cuStreamWaitEvent(stream, x->use->ev, 0) != CUDA_SUCCESS) {
      snprintf(err, errlen, "cannot order slot %u's copy after its use on another stream",
               b[i].slot);
      return GRAPHD_INTERNAL;
    }
  }
  memcpy(call->own, b, (size_t)nb * sizeof *call->own);
  for (int64_t i = 0; i < nb; i++)
    if (call->x[i]) call->own[i].ptr = (uint64_t)call->x[i]->copy;
  call->use = call->own;
  return copy_way(cu, call, b, from, dir, nb, true, err, errlen);
}

graphd_status xla_bounce_end(xla_bounce_table *t, xla_bounce_call *call, const graphd_binding *b,
                             const uint8_t *dir, int64_t nb, bool replayed, char *err,
                             size_t errlen) {
  graphd_status st = GRAPHD_OK;
  const gd_cuda *cu;
  if (!call->any || gd_cuda_load(&cu, NULL, 0) < 0) goto exit;
  if (replayed) st = copy_way(cu, call, b, NULL, dir, nb, false, err, errlen);
  /* The call's event, after everything it queued: its copies are free to
   * go once it completes. Without one, the call is waited for here, and
   * its copies are idle at once. */
  xla_bounce_use *u = use_get(cu, t, call->stream);
  if (!u) cu->cuStreamSynchronize(call->stream);
  for (int64_t i = 0; i < nb; i++) {
    xla_bounce *x = call->x[i];
    if (!x || (u && x->use == u)) continue; /* two slots may bind one buffer */
    use_put(cu, t, x->use);
    x->use = u;
    x->stream = call->stream;
    if (u) u->refs++;
  }
exit:
  call->own = NULL;
  call->x = NULL;
  return st;
}
