/* Copies of memory graphd cannot map, for the XLA handler (graphd_xla.c).
 *
 * XLA may bind memory no other process can map (a compiled module's
 * constants, stream-ordered pool memory). The handler gives each such
 * buffer a copy of its own from cuMemAlloc, which graphd maps, and binds
 * the copy: an operand is copied into it on the call's stream before the
 * replay, a result out of it after. The copies one call makes share one
 * allocation per kind (constants, pool buffers), freed with the last of
 * them: one region for graphd to import instead of one per copy.
 *
 * The table is a soft cap, never a wall: when it holds `cap` copies, a
 * new one first frees the least recently used copy that no queued call
 * still uses; when every copy is still in use, the table grows.
 *
 * A constant's copy is checked against its buffer once per executable, not
 * once per call. XLA runs the handler's instantiate stage once for each
 * call site of the handler in an executable, and the handler keeps an
 * xla_exec there, which each of the site's calls names by its serial
 * (several sites of one executable are several xla_execs; the argument
 * holds for each). XLA loads an executable's constants on a device once,
 * and they keep their address and contents there until the executable is
 * destroyed; no other live memory shares that address meanwhile. (A call
 * is handed module memory only as its own executable's constants:
 * parameters and results come from XLA's allocator, and a fixed binding,
 * which may name other memory, is read and written, never taken for a
 * constant.) So once a call of executable E on a device has filled a copy
 * from its buffer, or seen that the buffer is still the allocation the
 * copy was filled from, the copy holds E's constant for every later call
 * of E on that device (its table): E is alive while it calls, so its
 * constant has neither moved nor changed. The copy notes E's serial
 * (xla_bounce.shown) and later calls of E skip the check. A serial, not
 * the state's address, because XLA may free one executable's state and
 * make another's at the same address: serials come from a process-wide
 * count and are never given twice. An executable freed and another loaded
 * with constants at the same addresses has another serial, so its first
 * call checks the copy (a driver query) and fills it afresh when the
 * allocation there changed. Calls that name no xla_exec (the handler
 * registered without its instantiate stage) check on every call.
 *
 * A copy is "still in use" while the last call that bound it has not
 * finished on the GPU. Each call that binds copies records one event on
 * its stream after everything it queued (the copies in, the replay's wait
 * for the daemon's done, the copies out): the event completes only once
 * the daemon's replay has run and the copies are through, so a copy whose
 * event has completed is read or written by nothing queued, and
 * cuMemFree cannot pull it from under a call. A copy used by a call on
 * another stream first makes that stream wait for its previous call's
 * event, so its latest event covers every earlier use as well.
 *
 * DESIGN: one table per device session. t->lock guards everything in the
 * table; a caller holds it across a whole call (xla_bounce_add,
 * xla_bounce_begin, the replay, xla_bounce_end), so that no other call
 * sees the copies change under it. */
#ifndef GRAPHD_XLA_BOUNCE_H
#define GRAPHD_XLA_BOUNCE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cuda_driver.h"
#include "graphd/graphd.h"

/* Which way a bound buffer's data goes: an operand's in, a result's out. */
enum { XLA_DIR_IN = 1, XLA_DIR_OUT = 2 };

/* Events kept for reuse by a table. */
#define XLA_SPARE_EVENTS 8

/* The event of one call that bound copies, shared by those copies. */
typedef struct xla_bounce_use {
  CUevent ev;
  int refs; /* copies whose last call this is */
} xla_bounce_use;

/* Copies share blocks 256-byte aligned, as cuMemAlloc would align them. */
#define XLA_COPY_ALIGN 256u

/* The handler's state for one executable's call site of the handler (the
 * state of XLA's instantiate stage): a serial that no other xla_exec of
 * this process has had or will have. */
typedef struct xla_exec {
  uint64_t serial;
} xla_exec;

/* A new xla_exec, with the next serial; NULL when out of memory.
 * Thread-safe. */
xla_exec *xla_exec_new(void);

/* Frees an xla_exec (XLA's deleter for the state, called when the
 * executable is destroyed). Thread-safe. */
void xla_exec_free(void *exec);

/* Executables a constant's copy remembers having shown that it holds
 * their constant; more than one when several call sites bind the same
 * constant (MJX's step evaluated twice in one scan). */
#define XLA_SHOWN 4

/* One allocation holding the copies one call made of one kind. */
typedef struct xla_block {
  CUdeviceptr base;
  int live; /* copies in it still in the table */
} xla_block;

typedef struct xla_bounce {
  uint64_t src, bytes; /* the unmappable buffer */
  CUdeviceptr copy;
  CUdeviceptr block; /* the allocation the copy lies in */
  /* Module memory (not pool memory): under XLA only a compiled module's
   * constants, which nothing writes. Copied in once, and again only when
   * the allocation at src is another one (its buffer id, src_id). */
  bool constant, filled;
  unsigned long long src_id;
  /* The allocation that held src when src_id was taken (the driver's
   * range; src alone where it gives none). Its id is asked at its base,
   * once a call for every constant that lies in it, by calls of an
   * executable not in shown. */
  CUdeviceptr alloc;
  /* Serials of executables whose calls filled the copy or saw src_id
   * still at alloc; 0 for none. Emptied when the copy is filled again or
   * bound as anything but an input. */
  uint64_t shown[XLA_SHOWN];
  uint64_t last_call;  /* the stamp of the last call that bound it */
  CUstream stream;     /* ... and its stream */
  xla_bounce_use *use; /* ... and its event; NULL: no call queued yet */
} xla_bounce;

typedef struct xla_bounce_table {
  pthread_mutex_t lock;
  xla_bounce *v;     /* n copies, in order of src then bytes; guarded by lock */
  int n, alloc;      /* guarded by lock */
  int cap;           /* above it, copies no queued call uses are freed, LRU first */
  xla_block *blocks; /* the allocations of the copies; guarded by lock */
  int nblocks, blocks_alloc;
  uint64_t stamp; /* of the latest call; guarded by lock */
  uint64_t freed; /* copies freed to make room, for tests; guarded by lock */
  /* A call's per-binding arrays (xla_bounce_call's x and own), kept from
   * call to call instead of allocated for each; guarded by lock. */
  void *scratch;
  size_t scratch_bytes;
  /* Events no copy names any more, kept to record again rather than made
   * anew each call (re-recording an event still pending is allowed: a
   * query then asks about the new record); guarded by lock. */
  xla_bounce_use *spare[XLA_SPARE_EVENTS];
  int nspare;
} xla_bounce_table;

/* Allocations whose buffer id one call has asked already. */
#define XLA_CALL_IDS 16

/* One call's copies, between xla_bounce_begin and xla_bounce_end. */
typedef struct xla_bounce_call {
  xla_bounce **x;            /* per binding: its copy, or NULL; NULL when none has one */
  graphd_binding *own;       /* the bindings with the copies in (the table's scratch) */
  const graphd_binding *use; /* what to replay: own, or the caller's */
  CUstream stream;
  uint64_t stamp;
  uint64_t exec;       /* the serial of the call's executable; 0: none */
  uint64_t copies;     /* device-to-device copies queued */
  uint64_t id_queries; /* buffer ids asked of the driver */
  struct {
    CUdeviceptr base;
    unsigned long long id;
  } ids[XLA_CALL_IDS];
  int nids;
  bool any;
} xla_bounce_call;

/* An empty table whose soft cap is cap copies. */
void xla_bounce_init(xla_bounce_table *t, int cap);

/* Frees every copy once its last call is done, and the table. No call may
 * use t any more. */
void xla_bounce_close(xla_bounce_table *t);

/* Gives every binding graphd cannot map a copy of its own. Returns how
 * many were added; -1, with err saying why, when one could not be made
 * (the driver refused the memory even with the idle copies freed). Lock
 * held. */
int xla_bounce_add(xla_bounce_table *t, const graphd_binding *b, int64_t nb, char *err,
                   size_t errlen);

/* Starts a call on stream by the executable whose serial is exec (0: one
 * with no xla_exec): looks up each binding's copy and queues the copies of
 * operands into them. An operand comes from from[i] where that is nonzero
 * (an in-out operand XLA did not alias to its result, whose buffer b[i]
 * is: the copy takes the operand straight, and the result gets the copy's
 * contents after the replay), else from b[i]; from may be NULL.
 * call->use is the bindings to replay (the caller's b when none has a
 * copy). Lock held; xla_bounce_end must follow whatever this returns. */
graphd_status xla_bounce_begin(xla_bounce_table *t, const graphd_binding *b, const uint64_t *from,
                               const uint8_t *dir, int64_t nb, CUstream stream, uint64_t exec,
                               xla_bounce_call *call, char *err, size_t errlen);

/* Ends the call: when replayed, queues the copies of results out of their
 * copies; then records the call's event for its copies. Returns the first
 * failure (err says why), else GRAPHD_OK. Lock held. */
graphd_status xla_bounce_end(xla_bounce_table *t, xla_bounce_call *call, const graphd_binding *b,
                             const uint8_t *dir, int64_t nb, bool replayed, char *err,
                             size_t errlen);

/* The copy of (src, bytes), or NULL. Lock held. */
xla_bounce *xla_bounce_find(xla_bounce_table *t, uint64_t src, uint64_t bytes);

#endif
