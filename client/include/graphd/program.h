/* libgraphd: building programs, and the ids of programs and modules.
 *
 * A program is what graphd captures into a CUDA graph: an ordered list of
 * steps (kernel launches, memsets, slot-to-slot copies) over numbered slots,
 * the buffers that the client binds at each replay. A graphd_program is a
 * builder for one: add slots, then steps, then call graphd_program_finish(),
 * which validates the program, lays it out in its canonical encoding and
 * computes its id, the SHA-256 of that encoding. The encoding is what a
 * client registers with the daemon; the daemon decodes it, validates it
 * again and recomputes the id. docs/protocol.md ("Canonical encodings")
 * specifies it byte by byte.
 *
 * Nothing here talks to the daemon or to CUDA: a program can be named with
 * no daemon running.
 *
 * Parameters of a launch are laid out at the kernel's byte offsets (from
 * cuFuncGetParamInfo, or the kernel's C signature). A pointer to slot
 * memory is a patch: the daemon writes the slot's address plus an
 * offset into the 8 bytes at that parameter offset when it captures the
 * program. graphd_program_param_slot() declares a pointer parameter;
 * graphd_program_patch() puts a pointer inside a struct parameter.
 *
 * Errors: every call that can fail returns a graphd_status (or -1 for the
 * calls that return an index) and leaves a message for
 * graphd_program_error() that names the step, the field and the limit, for
 * example "step 2 (launch scale2): parameter at offset 8 (size 4) overlaps
 * the parameter at offset 8 (size 8)". A failed call changes nothing in the
 * program, but the builder remembers the first failure: graphd_program_finish()
 * then fails with that status, so a caller may check only the result of
 * finish. Slots must be added before a step refers to them.
 *
 * For scale2(const float *in, float *out, uint32_t n):
 *
 *   graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
 *   int in = graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, 4 * n, 1);
 *   int out = graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, 4 * n, 1);
 *   int s = graphd_program_add_launch(p, module_id, "scale2", grid, block, 0);
 *   graphd_program_param_slot(p, s, 0, in, 0);
 *   graphd_program_param_slot(p, s, 8, out, 0);
 *   graphd_program_param(p, s, 16, &n, sizeof n);
 *   if (graphd_program_finish(p, id) != GRAPHD_OK)
 *     fprintf(stderr, "%s\n", graphd_program_error(p));
 *
 * Threads: a builder is not thread-safe; use one from one thread at a time.
 * Different builders are independent. graphd_module_id() and
 * graphd_id_hex() are thread-safe. */
#ifndef GRAPHD_GRAPHD_PROGRAM_H
#define GRAPHD_GRAPHD_PROGRAM_H

#include <stddef.h>
#include <stdint.h>

#include "graphd/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct graphd_program graphd_program;

/* Limits of a program, as the builder here and the daemon check them. */
#define GRAPHD_MAX_SLOTS 4096                /* slots of a program */
#define GRAPHD_MAX_STEPS 65536               /* steps, inside loops and branches too */
#define GRAPHD_MAX_SLOT_BYTES (1ull << 40)   /* bytes of one slot */
#define GRAPHD_MAX_PARAM_BYTES 32764         /* a launch's parameters end by this byte */
#define GRAPHD_MAX_PARAMS 1024               /* parameters of one launch */
#define GRAPHD_MAX_PATCHES 1024              /* slot pointers in one launch's parameters */
#define GRAPHD_MAX_NESTING 8                 /* loops and branches inside each other */
#define GRAPHD_MAX_NAME 255                  /* bytes of a function's name */
#define GRAPHD_MAX_SHARED_BYTES (227u << 10) /* dynamic shared memory of a launch */
#define GRAPHD_MAX_MODULE_BYTES (512u << 20) /* bytes of a module */
#define GRAPHD_MAX_PROGRAM_BYTES (64u << 20) /* bytes of a program's encoding */

/* What a slot is for. input, output and inout slots are bound to client
 * memory at each replay. The daemon owns the others, and never lets one
 * session (or user) see another's: scratch is state, which a session's
 * next replay of the program reads as its last one left it (zero at its
 * first); temp holds temporaries, whose contents are undefined when a
 * replay starts, so that sessions replaying the program at once may run
 * on instances of their own. */
typedef enum graphd_slot_role {
  GRAPHD_SLOT_INPUT = 0,
  GRAPHD_SLOT_OUTPUT = 1,
  GRAPHD_SLOT_INOUT = 2,
  GRAPHD_SLOT_SCRATCH = 3,
  GRAPHD_SLOT_TEMP = 4,
} graphd_slot_role;

/* How replays move data: staged copies inside the graph, or outside it
 * (staged_ex); no copies, the graph's kernels re-pointed at the bound
 * buffers (direct); or the daemon's choice of staged or direct by the bytes
 * against the nodes to re-point (auto). */
typedef enum graphd_mode {
  GRAPHD_MODE_STAGED = 0,
  GRAPHD_MODE_STAGED_EX = 1,
  GRAPHD_MODE_DIRECT = 2,
  GRAPHD_MODE_AUTO = 3,
} graphd_mode;

/* The kind of code in a module. */
typedef enum graphd_module_kind {
  GRAPHD_MODULE_PTX = 1,
  GRAPHD_MODULE_CUBIN = 2,
  GRAPHD_MODULE_FATBIN = 3,
  GRAPHD_MODULE_HOST_ELF = 4, /* an ELF shared object, for host devices */
} graphd_module_kind;

/* Creates an empty program builder in the given mode. An invalid mode is
 * reported by graphd_program_finish(). Returns NULL only when out of
 * memory. Free with graphd_program_free(). */
GRAPHD_EXPORT graphd_program *graphd_program_new(graphd_mode mode);

/* Frees the builder, its encoding included. NULL is a no-op. */
GRAPHD_EXPORT void graphd_program_free(graphd_program *p);

/* Message of the last failed call on p ("" if none). The pointer stays
 * valid until the next call on p. */
GRAPHD_EXPORT const char *graphd_program_error(const graphd_program *p);

/* Adds a slot of the given role and size in bytes (1 to
 * GRAPHD_MAX_SLOT_BYTES). staged is
 * non-zero for a staged slot (the usual case for input, output and inout)
 * and must be 0 for scratch and temp. Returns the slot's index (0, 1, ...)
 * or -1 with the message in graphd_program_error(): a bad role, a size of
 * 0 or over the cap, a staged scratch or temp slot, or too many slots
 * (GRAPHD_MAX_SLOTS). */
GRAPHD_EXPORT int graphd_program_add_slot(graphd_program *p, graphd_slot_role role, uint64_t bytes,
                                          int staged);

/* Adds a kernel launch of function (the mangled or extern "C" name, 1 to
 * GRAPHD_MAX_NAME printable ASCII bytes) in the module with id module_id (from
 * graphd_module_id()), with the given grid, block and dynamic shared
 * memory. grid.x is 1 to 2^31-1, grid.y and grid.z 1 to 65535, block.x and
 * block.y 1 to 1024, block.z 1 to 64, at most 1024 threads per block, and
 * shared_bytes at most GRAPHD_MAX_SHARED_BYTES (227 KiB). Its parameters come from
 * graphd_program_param(), graphd_program_param_slot() and
 * graphd_program_patch(). Returns the step's index or -1. */
GRAPHD_EXPORT int graphd_program_add_launch(graphd_program *p, const uint8_t module_id[32],
                                            const char *function, const uint32_t grid[3],
                                            const uint32_t block[3], uint32_t shared_bytes);

/* Declares a parameter of launch step `step`: size bytes (1 or more) at the
 * kernel's parameter byte offset, copied from bytes (NULL means zeros).
 * Parameters may be declared in any order but must not overlap; gaps
 * between them are zero. Parameters end by byte GRAPHD_MAX_PARAM_BYTES; at
 * most GRAPHD_MAX_PARAMS per
 * launch. Returns GRAPHD_OK, or INVALID_ARGUMENT / RESOURCE_EXHAUSTED /
 * FAILED_PRECONDITION (after finish) with a message. */
GRAPHD_EXPORT graphd_status graphd_program_param(graphd_program *p, uint32_t step, uint32_t offset,
                                                 const void *bytes, uint32_t size);

/* Declares an 8-byte pointer parameter at offset (a multiple of 8) whose
 * value the daemon sets to the address of slot `slot` plus slot_offset
 * (less than the slot's size). Equivalent to an 8-byte zero
 * graphd_program_param() followed by graphd_program_patch(). At most
 * GRAPHD_MAX_PATCHES
 * patches per launch. Returns GRAPHD_OK or an error as above. */
GRAPHD_EXPORT graphd_status graphd_program_param_slot(graphd_program *p, uint32_t step,
                                                      uint32_t offset, uint32_t slot,
                                                      uint64_t slot_offset);

/* Makes the 8 bytes at parameter offset `offset` (a multiple of 8, counted
 * from the start of the parameter buffer, not of the struct) a pointer to
 * slot `slot` plus slot_offset. The 8 bytes must lie inside one parameter
 * that is already declared (typically a struct passed by value); the
 * builder zeroes them, since the daemon writes the address there. Returns
 * GRAPHD_OK or an error as above (misaligned, outside every parameter, a
 * second patch at the same offset, no such slot, slot_offset past the
 * slot). */
GRAPHD_EXPORT graphd_status graphd_program_patch(graphd_program *p, uint32_t step, uint32_t offset,
                                                 uint32_t slot, uint64_t slot_offset);

/* Adds a memset of bytes bytes at offset in slot `slot`, with elements of
 * element_size bytes (1, 2 or 4) set to value. bytes is a non-zero
 * multiple of element_size and offset a multiple of it, the range lies in
 * the slot, and value fits in element_size bytes. Returns the step's index
 * or -1. */
GRAPHD_EXPORT int graphd_program_add_memset(graphd_program *p, uint32_t slot, uint64_t offset,
                                            uint64_t bytes, uint32_t element_size, uint32_t value);

/* Adds a copy of bytes bytes (1 or more) from src_slot at src_offset to
 * dst_slot at dst_offset. Both ranges lie in their slots; within one slot
 * they do not overlap. Returns the step's index or -1. */
GRAPHD_EXPORT int graphd_program_add_copy(graphd_program *p, uint32_t dst_slot, uint64_t dst_offset,
                                          uint32_t src_slot, uint64_t src_offset, uint64_t bytes);

/* Conditional steps. A loop or a branch reads a 4-byte word at `offset`
 * (a multiple of 4) of `slot` on the device; non-zero is true.
 * graphd_program_begin_while() begins a loop: the steps added until
 * graphd_program_end(p, step) run while the word is non-zero. It is read
 * before each pass, so the body must change it (a body that never does
 * never ends). graphd_program_begin_if() begins a branch: the steps added
 * until graphd_program_else() run when the word is non-zero, those added
 * after it until graphd_program_end() when it is zero. Loops and branches
 * nest (at most GRAPHD_MAX_NESTING deep) and must be ended innermost first. The begin calls
 * return the step's index or -1; the others GRAPHD_OK or an error. */
GRAPHD_EXPORT int graphd_program_begin_while(graphd_program *p, uint32_t slot, uint64_t offset);
GRAPHD_EXPORT int graphd_program_begin_if(graphd_program *p, uint32_t slot, uint64_t offset);
GRAPHD_EXPORT graphd_status graphd_program_else(graphd_program *p, uint32_t step);
GRAPHD_EXPORT graphd_status graphd_program_end(graphd_program *p, uint32_t step);

/* Completes the program: sorts each launch's parameters and patches by
 * offset, runs the structural validation that the daemon runs at
 * registration, lays the program out in its canonical encoding and writes
 * its id (SHA-256 of the encoding) to id_out (may be NULL). After success
 * the program can no longer change; calling finish again gives the same id.
 * Returns GRAPHD_OK, the status of the first earlier call that failed
 * (with "an earlier call failed: " and its message), or the validation
 * error: INVALID_ARGUMENT (for example a program with no steps, or an
 * invalid mode, or a loop or branch never ended) or RESOURCE_EXHAUSTED for
 * a cap (an encoding over GRAPHD_MAX_PROGRAM_BYTES, 64 MiB). */
GRAPHD_EXPORT graphd_status graphd_program_finish(graphd_program *p, uint8_t id_out[32]);

/* The canonical encoding of a finished program: *bytes points to *len
 * bytes owned by p, valid until graphd_program_free(). Returns GRAPHD_OK,
 * or FAILED_PRECONDITION before a successful graphd_program_finish(). */
GRAPHD_EXPORT graphd_status graphd_program_encoding(graphd_program *p, const uint8_t **bytes,
                                                    size_t *len);

/* The id of a module: SHA-256 over a 20-byte header (magic, version, kind,
 * length) followed by the module's bytes, as docs/protocol.md specifies.
 * Returns GRAPHD_OK, or INVALID_ARGUMENT for an unknown kind or a length of
 * 0 or over GRAPHD_MAX_MODULE_BYTES (512 MiB). Thread-safe. */
GRAPHD_EXPORT graphd_status graphd_module_id(graphd_module_kind kind, const void *bytes, size_t len,
                                             uint8_t id_out[32]);

/* Writes the 64 lower-case hex digits of an id and a NUL to out.
 * Thread-safe. */
GRAPHD_EXPORT void graphd_id_hex(const uint8_t id[32], char out[65]);

#ifdef __cplusplus
}
#endif
#endif
