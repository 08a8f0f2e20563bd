/* Programs and modules: the canonical encodings, their SHA-256 ids, and the
 * structural validation stage (docs/design.md, "Identity" and "Validation").
 *
 * The canonical encoding is also the wire form: a client sends the exact
 * bytes it hashed, and the daemon decodes, validates and re-hashes them.
 * Every field is fixed-width little-endian in a fixed order; the layout is
 * specified in docs/protocol.md ("Canonical encodings").
 *
 * Leaf module: no CUDA, no libuv, no logging. Thread-safe (no globals). */
#ifndef GRAPHD_ENCODING_H
#define GRAPHD_ENCODING_H

#include <stddef.h>
#include <stdint.h>

#define GD_ID_LEN 32
#define GD_PROGRAM_MAGIC 0x47504447u /* bytes "GDPG" */
#define GD_MODULE_MAGIC 0x444d4447u  /* bytes "GDMD" */
#define GD_ENCODING_VERSION 1u

/* Caps checked at registration. */
#define GD_MAX_SLOTS 4096u
#define GD_MAX_STEPS 65536u
#define GD_MAX_PARAM_BYTES 32764u /* what CUDA 12.1 and later take on Volta and newer */
#define GD_MAX_PARAMS 1024u
#define GD_MAX_PATCHES 1024u
#define GD_MAX_COND_DEPTH 8u /* conditional steps nested in each other */
#define GD_MAX_NAME 255u
#define GD_MAX_SLOT_BYTES (1ull << 40)
#define GD_MAX_GRID_X 0x7fffffffu
#define GD_MAX_GRID_YZ 65535u
#define GD_MAX_BLOCK_THREADS 1024u
#define GD_MAX_BLOCK_Z 64u
#define GD_MAX_SHARED_BYTES (227u << 10)
#define GD_MAX_MODULE_BYTES (512u << 20)
#define GD_MAX_PROGRAM_BYTES (64u << 20)

/* input, output and inout slots are bound to client memory by each replay;
 * the daemon owns the others: scratch is state (what a replay leaves there
 * the next replay of the same session reads), temp holds temporaries
 * (undefined when a replay starts). */
enum gd_slot_role {
  GD_ROLE_INPUT = 0,
  GD_ROLE_OUTPUT = 1,
  GD_ROLE_INOUT = 2,
  GD_ROLE_SCRATCH = 3,
  GD_ROLE_TEMP = 4,
};
/* Whether a slot of this role belongs to the daemon (never bound). */
static inline int gd_role_owned(uint32_t role) {
  return role == GD_ROLE_SCRATCH || role == GD_ROLE_TEMP;
}
#define GD_SLOT_STAGED 1u

enum gd_step_kind {
  GD_STEP_LAUNCH = 1,
  GD_STEP_MEMSET = 2,
  GD_STEP_COPY = 3,
  GD_STEP_WHILE = 4, /* the next `body` steps run while the condition word is non-zero */
  GD_STEP_IF = 5, /* the next `body` steps run if it is non-zero, the `orelse` after them if not */
};

/* How replays move data (docs/design.md, "Modes"): staged copies in the
 * graph, staged copies outside it, the client's buffers themselves
 * (direct), or the daemon's choice between staged and direct (auto). */
enum gd_mode { GD_MODE_STAGED = 0, GD_MODE_STAGED_EX = 1, GD_MODE_DIRECT = 2, GD_MODE_AUTO = 3 };

enum gd_module_kind {
  GD_MODULE_PTX = 1,
  GD_MODULE_CUBIN = 2,
  GD_MODULE_FATBIN = 3,
  GD_MODULE_HOST_ELF = 4,
};

typedef struct gd_slot {
  uint32_t role;  /* enum gd_slot_role */
  uint32_t flags; /* GD_SLOT_STAGED */
  uint64_t size;  /* bytes, > 0 */
} gd_slot;

typedef struct gd_param {
  uint32_t offset; /* in the parameter buffer */
  uint32_t size;
} gd_param;

typedef struct gd_patch {
  uint32_t offset; /* of the 8-byte pointer in the parameter buffer */
  uint32_t slot;
  uint64_t slot_offset; /* added to the slot's address */
} gd_patch;

typedef struct gd_launch {
  uint8_t module_id[GD_ID_LEN];
  char name[GD_MAX_NAME + 1];
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_bytes;
  uint32_t nparams;
  gd_param *params; /* sorted by offset, non-overlapping */
  uint32_t param_bytes;
  uint8_t *param_data; /* param_bytes */
  uint32_t npatches;
  gd_patch *patches;
} gd_launch;

typedef struct gd_memset {
  uint32_t slot;
  uint32_t element_size; /* 1, 2 or 4 */
  uint32_t value;
  uint64_t offset;
  uint64_t bytes; /* multiple of element_size */
} gd_memset;

typedef struct gd_copy {
  uint32_t dst_slot;
  uint32_t src_slot;
  uint64_t dst_offset;
  uint64_t src_offset;
  uint64_t bytes;
} gd_copy;

/* A loop or branch over a condition word: the 4 bytes at offset (4-byte
 * aligned) of slot, read on the device; non-zero is true. A loop reads it
 * before each pass, so its body must change it. */
typedef struct gd_cond {
  uint32_t slot;
  uint64_t offset;
  uint32_t body;   /* steps right after this one: the loop body, or the then-steps */
  uint32_t orelse; /* if: steps after the then-steps, run when the word is zero */
} gd_cond;

typedef struct gd_step {
  uint32_t kind; /* enum gd_step_kind */
  union {
    gd_launch launch;
    gd_memset memset;
    gd_copy copy;
    gd_cond cond; /* while, if */
  } u;
} gd_step;

typedef struct gd_program {
  uint32_t mode; /* enum gd_mode */
  uint32_t nslots;
  gd_slot *slots;
  uint32_t nsteps;
  gd_step *steps;
  uint8_t id[GD_ID_LEN];
} gd_program;

/* SHA-256 of bytes. */
void gd_sha256(const void *data, size_t len, uint8_t out[GD_ID_LEN]);

/* Lower-case hex of an id into out (65 bytes); short form of 12 chars when
 * short_form is non-zero. */
void gd_id_hex(const uint8_t id[GD_ID_LEN], int short_form, char out[2 * GD_ID_LEN + 1]);
int gd_id_parse_hex(const char *hex, uint8_t id[GD_ID_LEN]);

/* Decodes a canonical program encoding and runs the structural stage.
 * Returns 0 with *out (free with gd_program_free) and its id set, or
 * -GRAPHD_INVALID_ARGUMENT / -GRAPHD_RESOURCE_EXHAUSTED (a cap) with err
 * naming the step, field and limit, e.g. "step 3 (launch scale2): patch at
 * offset 12 is not 8-byte aligned". */
int gd_program_decode(const uint8_t *buf, size_t len, gd_program **out, char *err, size_t errlen);
void gd_program_free(gd_program *p);

/* Runs the structural stage on a program built in memory (the builder uses
 * it before encoding). Same errors as gd_program_decode. */
int gd_program_validate(const gd_program *p, char *err, size_t errlen);

/* Encodes p canonically into a malloc'd buffer and computes its id into
 * p->id. Validates first. Returns 0 or the validation error. */
int gd_program_encode(gd_program *p, uint8_t **buf, size_t *len, char *err, size_t errlen);

/* The module encoding header is hashed together with the bytes: id =
 * SHA-256(magic, version, kind, length, bytes). */
int gd_module_id(uint32_t kind, const void *bytes, size_t len, uint8_t id[GD_ID_LEN]);

/* Human name of a step for error messages: "launch scale2", "memset",
 * "copy". */
const char *gd_step_label(const gd_step *s, char *buf, size_t len);

/* Every distinct module id the program's launches use, in first-use
 * order. Returns the count (at most nsteps). */
uint32_t gd_program_modules(const gd_program *p, uint8_t (*ids)[GD_ID_LEN], uint32_t cap);

#endif
