/* graphd's XLA FFI handler (libgraphd_xla.so), for JAX.
 *
 * Register it as a CUDA custom call target:
 *   jax.ffi.register_ffi_target("graphd_replay",
 *       jax.ffi.pycapsule(ctypes.CDLL("libgraphd_xla.so").graphd_xla_replay),
 *       platform="CUDA")
 * and call it with the attributes `program` (the program id, 64 hex digits)
 * and `slots` (an int64 array: the program slot of each operand, then of
 * each result). The program and its modules must be in the process's
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

#ifdef __cplusplus
}
#endif
#endif
