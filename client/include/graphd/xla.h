/* graphd's XLA FFI handler (libgraphd_xla.so), for JAX.
 *
 * Register it as a CUDA custom call target:
 *   jax.ffi.register_ffi_target("graphd_replay",
 *       jax.ffi.pycapsule(ctypes.CDLL("libgraphd_xla.so").graphd_xla_replay),
 *       platform="CUDA")
 * and call it with the attributes `program` (the program id, 64 hex digits),
 * `slots` (an int64 array: the program slot of each operand, then of
 * each result) and optionally `sync` (a bool: replay with a round trip
 * instead of asynchronously) and `fixed` (an int64 array of (slot, address,
 * bytes) triples: slots bound to memory made before the call, read and
 * written). The program and its modules must be in the process's
 * client-side registry (graphd_registry_add_*), from which each device's
 * session gets them on first use. docs/jax.md describes the flow.
 *
 * Thread-safe: XLA calls it from a thread per device at once. */
#ifndef GRAPHD_XLA_H
#define GRAPHD_XLA_H

#include "xla/ffi/api/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

__attribute__((visibility("default"))) XLA_FFI_Error *graphd_xla_replay(XLA_FFI_CallFrame *cf);

/* Waits until the last asynchronous replay of every stream the handler has
 * used has finished with its buffers, then returns the first failure not
 * reported yet (a graphd_status; 0 when none) with its message in err.
 * Replays run asynchronously unless the call's `sync` attribute is set or
 * $GRAPHD_XLA_SYNC=1, and a failed one is otherwise reported only by the
 * next call on its device: call this at the end of a program (graphd.jax.
 * collect() does) so that no failure goes unseen. Thread-safe. */
__attribute__((visibility("default"))) int graphd_xla_collect(char *err, size_t errlen);

/* The daemon the handler's sessions connect to: path, or NULL for
 * libgraphd's default ($GRAPHD_SOCKET, ...). Once the handler has a session
 * open, another path is refused (FAILED_PRECONDITION: one daemon a
 * process). Returns 0 or a graphd_status with its message in err. This is
 * how graphd.jax and graphd.warp take a socket_path without writing
 * $GRAPHD_SOCKET. Thread-safe. */
__attribute__((visibility("default"))) int graphd_xla_set_socket_path(const char *path, char *err,
                                                                      size_t errlen);

/* For each of n program ids (32 bytes each, back to back), the number of
 * the last call of this process that got the program to the daemon to
 * replay it, from a sequence that grows with every such call; 0 when none
 * did. Thread-safe. */
__attribute__((visibility("default"))) void graphd_xla_last_replays(const uint8_t *ids, size_t n,
                                                                    uint64_t *seq);

/* What this process's calls of the handler did, counted since it started
 * when $GRAPHD_XLA_STATS=1 was in the environment at its first call (and
 * printed to stderr at exit). A benchmark reads it before and after what it
 * times and takes the difference. */
typedef struct graphd_xla_stats {
  uint64_t calls;         /* executed calls, refused ones included */
  uint64_t sync_calls;    /* of them, replayed with a round trip */
  uint64_t buffers;       /* bindings the calls made, fixed ones included */
  uint64_t unaliased;     /* in-out operands copied into results XLA did not alias */
  uint64_t bounced;       /* calls that bound copies of buffers graphd cannot map */
  uint64_t bounce_copies; /* the copies those calls queued */
  uint64_t id_queries;    /* driver queries that checked the constants' copies: a constant's
                             first call by each executable, or every call by one without
                             the handler's state (stateless) */
  uint64_t handler_ns;    /* host time in the handler */
  uint64_t replay_ns;     /* of it, in libgraphd's replay call */
  uint64_t wait_ns;       /* of that, waiting for room in the submission ring */
  uint64_t bounce_ns;     /* of handler_ns, on the copies of buffers graphd cannot map
                             (finding them, checking constants, queueing the copies) and
                             of in-out operands XLA did not alias */
  uint64_t executables;   /* executables' call sites given the handler's state at XLA's
                             instantiate stage */
  uint64_t stateless;     /* executed calls whose executable has no such state (the
                             handler registered without the instantiate stage) */
} graphd_xla_stats;

/* Copies the counts into *out (size: sizeof *out, for the fields the
 * caller knows of) and returns 1; returns 0 with *out zeroed when the
 * process does not count. Thread-safe. */
__attribute__((visibility("default"))) int graphd_xla_stats_read(graphd_xla_stats *out,
                                                                 size_t size);

#ifdef __cplusplus
}
#endif
#endif
