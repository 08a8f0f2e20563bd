/* libgraphd: the program builder, and module ids.
 *
 * The builder fills a gd_program (graphd/encoding.h) and, at finish, hands it
 * to gd_program_encode(), which runs the same structural validation as the
 * daemon and writes the canonical encoding. Each call also checks what it
 * adds, so that a mistake is reported by the call that made it, in the
 * validator's words ("step 2 (launch scale2): ..."); the validator at finish
 * is the backstop.
 *
 * Until finish, a launch's parameters and patches are kept in the order
 * they were declared, and param_data/param_bytes cover the furthest byte
 * declared so far. Bytes no parameter covers stay zero, which is the
 * canonical padding.
 *
 * DESIGN: no threads and no globals; a builder belongs to its caller's
 * thread (the header says so). Never aborts, never prints. */
#include "graphd/program.h"

#include <assert.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphd/hex.h"
#include "graphd/encoding.h"

/* The public enums are the wire values. */
#define SAME(a, b) ((int)(a) == (int)(b))
static_assert(GD_ID_LEN == 32, "ids are 32 bytes in the public API");
static_assert(SAME(GRAPHD_SLOT_INPUT, GD_ROLE_INPUT) && SAME(GRAPHD_SLOT_OUTPUT, GD_ROLE_OUTPUT) &&
                  SAME(GRAPHD_SLOT_INOUT, GD_ROLE_INOUT) &&
                  SAME(GRAPHD_SLOT_SCRATCH, GD_ROLE_SCRATCH) &&
                  SAME(GRAPHD_SLOT_TEMP, GD_ROLE_TEMP),
              "graphd_slot_role matches gd_slot_role");
static_assert(SAME(GRAPHD_MODE_STAGED, GD_MODE_STAGED) &&
                  SAME(GRAPHD_MODE_STAGED_EX, GD_MODE_STAGED_EX) &&
                  SAME(GRAPHD_MODE_DIRECT, GD_MODE_DIRECT) && SAME(GRAPHD_MODE_AUTO, GD_MODE_AUTO),
              "graphd_mode matches gd_mode");
static_assert(SAME(GRAPHD_MODULE_PTX, GD_MODULE_PTX) &&
                  SAME(GRAPHD_MODULE_CUBIN, GD_MODULE_CUBIN) &&
                  SAME(GRAPHD_MODULE_FATBIN, GD_MODULE_FATBIN) &&
                  SAME(GRAPHD_MODULE_HOST_ELF, GD_MODULE_HOST_ELF),
              "graphd_module_kind matches gd_module_kind");
#undef SAME

#define PROGRAM_ERRMAX 512

struct graphd_program {
  gd_program *prog; /* params and patches unsorted until finish */
  bool finished;
  uint8_t *enc; /* canonical encoding, once finished */
  size_t enc_len;
  graphd_status first_status; /* of the first failed call; finish reports it */
  char first_err[PROGRAM_ERRMAX];
  char err[PROGRAM_ERRMAX]; /* of the last failed call */
};

static graphd_status fail(graphd_program *p, graphd_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static graphd_status fail(graphd_program *p, graphd_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->err, sizeof p->err, fmt, ap);
  va_end(ap);
  if (p->first_status == GRAPHD_OK) {
    p->first_status = st;
    memcpy(p->first_err, p->err, sizeof p->err);
  }
  return st;
}

/* Makes room for element n of *arr, whose capacity is the smallest power of
 * two >= n (1 for n == 0): it is full exactly when n is a power of two. */
static int grow(void **arr, uint32_t n, size_t elem) {
  if (n & (n - 1)) return 0;
  size_t cap = n ? 2 * (size_t)n : 1;
  void *np = realloc(*arr, cap * elem);
  if (!np) return -1;
  *arr = np;
  return 0;
}

/* start + n <= limit, without overflow. */
static bool fits(uint64_t start, uint64_t n, uint64_t limit) {
  return start <= limit && n <= limit - start;
}

static graphd_status check_open(graphd_program *p) {
  if (p->finished)
    return fail(p, GRAPHD_FAILED_PRECONDITION, "the program is finished and can no longer change");
  return GRAPHD_OK;
}

/* The launch at index step, with its label "step 2 (launch scale2)". */
static graphd_status get_launch(graphd_program *p, uint32_t step, gd_launch **out, char *lbl,
                                size_t lbllen) {
  graphd_status st = check_open(p);
  if (st != GRAPHD_OK) return st;
  if (step >= p->prog->nsteps)
    return fail(p, GRAPHD_INVALID_ARGUMENT, "step %u does not exist; there are %u steps", step,
                p->prog->nsteps);
  const gd_step *s = &p->prog->steps[step];
  char what[GD_MAX_NAME + 16];
  snprintf(lbl, lbllen, "step %u (%s)", step, gd_step_label(s, what, sizeof what));
  if (s->kind != GD_STEP_LAUNCH)
    return fail(p, GRAPHD_INVALID_ARGUMENT, "%s: only a launch has parameters", lbl);
  *out = &p->prog->steps[step].u.launch;
  return GRAPHD_OK;
}

/* A patch's slot must exist and the pointer must land inside it. */
static graphd_status check_patch_slot(graphd_program *p, const char *lbl, uint32_t offset,
                                      uint32_t slot, uint64_t slot_offset) {
  if (slot >= p->prog->nslots)
    return fail(p, GRAPHD_INVALID_ARGUMENT,
                "%s: patch at offset %u names slot %u; there are %u slots", lbl, offset, slot,
                p->prog->nslots);
  uint64_t size = p->prog->slots[slot].size;
  if (slot_offset >= size)
    return fail(p, GRAPHD_INVALID_ARGUMENT,
                "%s: patch at offset %u points %llu bytes into slot %u, which has %llu", lbl,
                offset, (unsigned long long)slot_offset, slot, (unsigned long long)size);
  return GRAPHD_OK;
}

/* Checks that step i's range [off, off + bytes) lies in slot `slot`. */
static graphd_status check_range(graphd_program *p, uint32_t i, const char *what, uint32_t slot,
                                 uint64_t off, uint64_t bytes) {
  if (slot >= p->prog->nslots)
    return fail(p, GRAPHD_INVALID_ARGUMENT,
                "step %u (%s): slot %u does not exist; there are %u slots", i, what, slot,
                p->prog->nslots);
  uint64_t size = p->prog->slots[slot].size;
  if (!fits(off, bytes, size))
    return fail(p, GRAPHD_INVALID_ARGUMENT,
                "step %u (%s): %llu bytes at offset %llu are outside slot %u, which has %llu", i,
                what, (unsigned long long)bytes, (unsigned long long)off, slot,
                (unsigned long long)size);
  return GRAPHD_OK;
}

/* Appends a step of the given kind, or returns NULL with the error set. */
static gd_step *new_step(graphd_program *p, uint32_t kind, const char *what) {
  gd_program *g = p->prog;
  if (check_open(p) != GRAPHD_OK) return NULL;
  if (g->nsteps >= GD_MAX_STEPS) {
    fail(p, GRAPHD_RESOURCE_EXHAUSTED, "step %u (%s): over the limit of %u steps", g->nsteps, what,
         GD_MAX_STEPS);
    return NULL;
  }
  if (grow((void **)&g->steps, g->nsteps, sizeof *g->steps) < 0) {
    fail(p, GRAPHD_RESOURCE_EXHAUSTED, "out of memory adding step %u", g->nsteps);
    return NULL;
  }
  gd_step *s = &g->steps[g->nsteps];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  return s;
}

/* --- lifetime ------------------------------------------------------------- */

graphd_program *graphd_program_new(graphd_mode mode) {
  graphd_program *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->prog = calloc(1, sizeof *p->prog);
  if (!p->prog) {
    free(p);
    return NULL;
  }
  p->prog->mode = (uint32_t)mode;
  return p;
}

void graphd_program_free(graphd_program *p) {
  if (!p) return;
  gd_program_free(p->prog);
  free(p->enc);
  free(p);
}

const char *graphd_program_error(const graphd_program *p) { return p ? p->err : ""; }

/* --- slots ------------------------------------------------------------------ */

int graphd_program_add_slot(graphd_program *p, graphd_slot_role role, uint64_t bytes, int staged) {
  gd_program *g = p->prog;
  uint32_t s = g->nslots;
  if (check_open(p) != GRAPHD_OK) return -1;
  if (s >= GD_MAX_SLOTS) {
    fail(p, GRAPHD_RESOURCE_EXHAUSTED, "slot %u: over the limit of %u slots", s, GD_MAX_SLOTS);
    return -1;
  }
  if ((unsigned)role > GD_ROLE_TEMP) {
    fail(p, GRAPHD_INVALID_ARGUMENT,
         "slot %u: role %u is not input, output, inout, scratch or temp", s, (unsigned)role);
    return -1;
  }
  if (gd_role_owned((uint32_t)role) && staged) {
    fail(p, GRAPHD_INVALID_ARGUMENT, "slot %u: a %s slot belongs to graphd and cannot be staged", s,
         role == GRAPHD_SLOT_TEMP ? "temp" : "scratch");
    return -1;
  }
  if (bytes == 0) {
    fail(p, GRAPHD_INVALID_ARGUMENT, "slot %u: size 0 is invalid", s);
    return -1;
  }
  if (bytes > GD_MAX_SLOT_BYTES) {
    fail(p, GRAPHD_RESOURCE_EXHAUSTED, "slot %u: %llu bytes is over the limit of %llu", s,
         (unsigned long long)bytes, (unsigned long long)GD_MAX_SLOT_BYTES);
    return -1;
  }
  if (grow((void **)&g->slots, s, sizeof *g->slots) < 0) {
    fail(p, GRAPHD_RESOURCE_EXHAUSTED, "out of memory adding slot %u", s);
    return -1;
  }
  g->slots[s] =
      (gd_slot){.role = (uint32_t)role, .flags = staged ? GD_SLOT_STAGED : 0, .size = bytes};
  g->nslots++;
  return (int)s;
}

/* --- launches ----------------------------------------------------------------- */

int graphd_program_add_launch(graphd_program *p, const uint8_t module_id[32], const char *function,
                              const uint32_t grid[3], const uint32_t block[3],
                              uint32_t shared_bytes) {
  uint32_t i = p->prog->nsteps;
  if (check_open(p) != GRAPHD_OK) return -1;
  if (!module_id || !function || !grid || !block) {
    fail(p, GRAPHD_INVALID_ARGUMENT, "step %u (launch): the %s is NULL", i,
         !module_id  ? "module id"
         : !function ? "function name"
         : !grid     ? "grid"
                     : "block");
    return -1;
  }
  size_t nlen = strnlen(function, GD_MAX_NAME + 1);
  if (nlen == 0) {
    fail(p, GRAPHD_INVALID_ARGUMENT, "step %u (launch): the function name is empty", i);
    return -1;
  }
  if (nlen > GD_MAX_NAME) {
    fail(p, GRAPHD_RESOURCE_EXHAUSTED,
         "step %u (launch): the function name is longer than %u bytes", i, GD_MAX_NAME);
    return -1;
  }
  for (size_t k = 0; k < nlen; k++) {
    unsigned char c = (unsigned char)function[k];
    if (c < 0x21 || c > 0x7e) {
      fail(p, GRAPHD_INVALID_ARGUMENT,
           "step %u (launch): the function name has a byte 0x%02x that is not printable ASCII", i,
           c);
      return -1;
    }
  }
  char lbl[GD_MAX_NAME + 48];
  snprintf(lbl, sizeof lbl, "step %u (launch %s)", i, function);
  static const char *const axis[] = {"x", "y", "z"};
  for (int a = 0; a < 3; a++) {
    uint32_t gmax = a == 0 ? GD_MAX_GRID_X : GD_MAX_GRID_YZ;
    if (grid[a] == 0 || grid[a] > gmax) {
      fail(p, GRAPHD_INVALID_ARGUMENT, "%s: grid.%s is %u; it must be 1 to %u", lbl, axis[a],
           grid[a], gmax);
      return -1;
    }
    uint32_t bmax = a == 2 ? GD_MAX_BLOCK_Z : GD_MAX_BLOCK_THREADS;
    if (block[a] == 0 || block[a] > bmax) {
      fail(p, GRAPHD_INVALID_ARGUMENT, "%s: block.%s is %u; it must be 1 to %u", lbl, axis[a],
           block[a], bmax);
      return -1;
    }
  }
  uint64_t threads = (uint64_t)block[0] * block[1] * block[2];
  if (threads > GD_MAX_BLOCK_THREADS) {
    fail(p, GRAPHD_INVALID_ARGUMENT, "%s: block has %llu threads; the limit is %u", lbl,
         (unsigned long long)threads, GD_MAX_BLOCK_THREADS);
    return -1;
  }
  if (shared_bytes > GD_MAX_SHARED_BYTES) {
    fail(p, GRAPHD_RESOURCE_EXHAUSTED,
         "%s: %u bytes of dynamic shared memory is over the limit of %u", lbl, shared_bytes,
         GD_MAX_SHARED_BYTES);
    return -1;
  }
  gd_step *s = new_step(p, GD_STEP_LAUNCH, "launch");
  if (!s) return -1;
  gd_launch *l = &s->u.launch;
  memcpy(l->module_id, module_id, GD_ID_LEN);
  memcpy(l->name, function, nlen + 1);
  memcpy(l->grid, grid, sizeof l->grid);
  memcpy(l->block, block, sizeof l->block);
  l->shared_bytes = shared_bytes;
  p->prog->nsteps++;
  return (int)i;
}

/* Declares a parameter without the patch bookkeeping; see
 * graphd_program_param(). */
static graphd_status add_param(graphd_program *p, gd_launch *l, const char *lbl, uint32_t offset,
                               const void *bytes, uint32_t size) {
  if (size == 0)
    return fail(p, GRAPHD_INVALID_ARGUMENT, "%s: parameter at offset %u has size 0", lbl, offset);
  if (!fits(offset, size, GD_MAX_PARAM_BYTES))
    return fail(p, GRAPHD_RESOURCE_EXHAUSTED,
                "%s: parameter at offset %u (size %u) ends past the limit of %u parameter bytes",
                lbl, offset, size, GD_MAX_PARAM_BYTES);
  for (uint32_t q = 0; q < l->nparams; q++) {
    const gd_param *o = &l->params[q];
    if (offset < o->offset + o->size && o->offset < offset + size)
      return fail(
          p, GRAPHD_INVALID_ARGUMENT,
          "%s: parameter at offset %u (size %u) overlaps the parameter at offset %u (size %u)", lbl,
          offset, size, o->offset, o->size);
  }
  if (l->nparams >= GD_MAX_PARAMS)
    return fail(p, GRAPHD_RESOURCE_EXHAUSTED,
                "%s: parameter at offset %u is over the limit of %u parameters", lbl, offset,
                GD_MAX_PARAMS);
  if (grow((void **)&l->params, l->nparams, sizeof *l->params) < 0)
    return fail(p, GRAPHD_RESOURCE_EXHAUSTED, "%s: out of memory", lbl);
  uint32_t end = offset + size;
  if (end > l->param_bytes) {
    uint8_t *nd = realloc(l->param_data, end);
    if (!nd) return fail(p, GRAPHD_RESOURCE_EXHAUSTED, "%s: out of memory", lbl);
    memset(nd + l->param_bytes, 0, end - l->param_bytes);
    l->param_data = nd;
    l->param_bytes = end;
  }
  if (bytes)
    memcpy(l->param_data + offset, bytes, size);
  else
    memset(l->param_data + offset, 0, size);
  l->params[l->nparams++] = (gd_param){.offset = offset, .size = size};
  return GRAPHD_OK;
}

graphd_status graphd_program_param(graphd_program *p, uint32_t step, uint32_t offset,
                                   const void *bytes, uint32_t size) {
  gd_launch *l;
  char lbl[GD_MAX_NAME + 48];
  graphd_status st = get_launch(p, step, &l, lbl, sizeof lbl);
  if (st != GRAPHD_OK) return st;
  return add_param(p, l, lbl, offset, bytes, size);
}

/* Checks a new patch at offset, without the "inside a parameter" rule, and
 * makes room for it. */
static graphd_status prepare_patch(graphd_program *p, gd_launch *l, const char *lbl,
                                   uint32_t offset, uint32_t slot, uint64_t slot_offset) {
  if (offset % 8)
    return fail(p, GRAPHD_INVALID_ARGUMENT, "%s: patch at offset %u is not 8-byte aligned", lbl,
                offset);
  for (uint32_t k = 0; k < l->npatches; k++)
    if (l->patches[k].offset == offset)
      return fail(p, GRAPHD_INVALID_ARGUMENT, "%s: there is already a patch at offset %u", lbl,
                  offset);
  graphd_status st = check_patch_slot(p, lbl, offset, slot, slot_offset);
  if (st != GRAPHD_OK) return st;
  if (l->npatches >= GD_MAX_PATCHES)
    return fail(p, GRAPHD_RESOURCE_EXHAUSTED,
                "%s: patch at offset %u is over the limit of %u patches", lbl, offset,
                GD_MAX_PATCHES);
  if (grow((void **)&l->patches, l->npatches, sizeof *l->patches) < 0)
    return fail(p, GRAPHD_RESOURCE_EXHAUSTED, "%s: out of memory", lbl);
  return GRAPHD_OK;
}

graphd_status graphd_program_param_slot(graphd_program *p, uint32_t step, uint32_t offset,
                                        uint32_t slot, uint64_t slot_offset) {
  gd_launch *l;
  char lbl[GD_MAX_NAME + 48];
  graphd_status st = get_launch(p, step, &l, lbl, sizeof lbl);
  if (st != GRAPHD_OK) return st;
  /* Everything that can fail happens before the parameter is added, so a
   * failure leaves the launch as it was. */
  if ((st = prepare_patch(p, l, lbl, offset, slot, slot_offset)) != GRAPHD_OK) return st;
  if ((st = add_param(p, l, lbl, offset, NULL, 8)) != GRAPHD_OK) return st;
  l->patches[l->npatches++] =
      (gd_patch){.offset = offset, .slot = slot, .slot_offset = slot_offset};
  return GRAPHD_OK;
}

graphd_status graphd_program_patch(graphd_program *p, uint32_t step, uint32_t offset, uint32_t slot,
                                   uint64_t slot_offset) {
  gd_launch *l;
  char lbl[GD_MAX_NAME + 48];
  graphd_status st = get_launch(p, step, &l, lbl, sizeof lbl);
  if (st != GRAPHD_OK) return st;
  if (offset % 8)
    return fail(p, GRAPHD_INVALID_ARGUMENT, "%s: patch at offset %u is not 8-byte aligned", lbl,
                offset);
  bool inside = false;
  for (uint32_t q = 0; q < l->nparams && !inside; q++)
    inside = offset >= l->params[q].offset &&
             fits(offset, 8, (uint64_t)l->params[q].offset + l->params[q].size);
  if (!inside)
    return fail(p, GRAPHD_INVALID_ARGUMENT,
                "%s: patch at offset %u does not lie inside one declared parameter; declare the "
                "parameter that holds it first",
                lbl, offset);
  if ((st = prepare_patch(p, l, lbl, offset, slot, slot_offset)) != GRAPHD_OK) return st;
  memset(l->param_data + offset, 0, 8);
  l->patches[l->npatches++] =
      (gd_patch){.offset = offset, .slot = slot, .slot_offset = slot_offset};
  return GRAPHD_OK;
}

/* --- memset and copy ------------------------------------------------------ */

int graphd_program_add_memset(graphd_program *p, uint32_t slot, uint64_t offset, uint64_t bytes,
                              uint32_t element_size, uint32_t value) {
  uint32_t i = p->prog->nsteps;
  uint32_t es = element_size;
  if (check_open(p) != GRAPHD_OK) return -1;
  if (es != 1 && es != 2 && es != 4) {
    fail(p, GRAPHD_INVALID_ARGUMENT, "step %u (memset): element_size %u is not 1, 2 or 4", i, es);
    return -1;
  }
  if (bytes == 0 || bytes % es || offset % es) {
    fail(p, GRAPHD_INVALID_ARGUMENT,
         "step %u (memset): offset %llu and bytes %llu must be multiples of the element size %u, "
         "and bytes non-zero",
         i, (unsigned long long)offset, (unsigned long long)bytes, es);
    return -1;
  }
  if (es < 4 && value >> (8 * es)) {
    fail(p, GRAPHD_INVALID_ARGUMENT, "step %u (memset): value 0x%x does not fit in %u byte(s)", i,
         value, es);
    return -1;
  }
  if (check_range(p, i, "memset", slot, offset, bytes) != GRAPHD_OK) return -1;
  gd_step *s = new_step(p, GD_STEP_MEMSET, "memset");
  if (!s) return -1;
  s->u.memset = (gd_memset){
      .slot = slot, .element_size = es, .value = value, .offset = offset, .bytes = bytes};
  p->prog->nsteps++;
  return (int)i;
}

int graphd_program_add_copy(graphd_program *p, uint32_t dst_slot, uint64_t dst_offset,
                            uint32_t src_slot, uint64_t src_offset, uint64_t bytes) {
  uint32_t i = p->prog->nsteps;
  if (check_open(p) != GRAPHD_OK) return -1;
  if (bytes == 0) {
    fail(p, GRAPHD_INVALID_ARGUMENT, "step %u (copy): bytes is 0", i);
    return -1;
  }
  if (check_range(p, i, "copy", dst_slot, dst_offset, bytes) != GRAPHD_OK ||
      check_range(p, i, "copy", src_slot, src_offset, bytes) != GRAPHD_OK)
    return -1;
  /* Both ranges lie in slots of at most 2^40 bytes: the sums cannot wrap. */
  if (dst_slot == src_slot && dst_offset < src_offset + bytes && src_offset < dst_offset + bytes) {
    fail(p, GRAPHD_INVALID_ARGUMENT, "step %u (copy): source and destination overlap in slot %u", i,
         dst_slot);
    return -1;
  }
  gd_step *s = new_step(p, GD_STEP_COPY, "copy");
  if (!s) return -1;
  s->u.copy = (gd_copy){.dst_slot = dst_slot,
                        .src_slot = src_slot,
                        .dst_offset = dst_offset,
                        .src_offset = src_offset,
                        .bytes = bytes};
  p->prog->nsteps++;
  return (int)i;
}

/* --- loops and branches ----------------------------------------------------- */

/* While a conditional step is open its counts hold OPEN; an if's body
 * count is fixed at graphd_program_else(). */
#define OPEN UINT32_MAX

static int begin_cond(graphd_program *p, uint32_t kind, uint32_t slot, uint64_t offset) {
  uint32_t i = p->prog->nsteps;
  const char *what = kind == GD_STEP_WHILE ? "while" : "if";
  if (check_open(p) != GRAPHD_OK) return -1;
  if (offset % 4) {
    fail(p, GRAPHD_INVALID_ARGUMENT,
         "step %u (%s): the condition word at offset %llu is not 4-byte aligned", i, what,
         (unsigned long long)offset);
    return -1;
  }
  if (check_range(p, i, what, slot, offset, 4) != GRAPHD_OK) return -1;
  gd_step *s = new_step(p, kind, what);
  if (!s) return -1;
  s->u.cond = (gd_cond){.slot = slot, .offset = offset, .body = OPEN, .orelse = OPEN};
  p->prog->nsteps++;
  return (int)i;
}

int graphd_program_begin_while(graphd_program *p, uint32_t slot, uint64_t offset) {
  return begin_cond(p, GD_STEP_WHILE, slot, offset);
}

int graphd_program_begin_if(graphd_program *p, uint32_t slot, uint64_t offset) {
  return begin_cond(p, GD_STEP_IF, slot, offset);
}

/* The open conditional step `step` in *out, checked to be the innermost
 * one. */
static graphd_status open_cond(graphd_program *p, uint32_t step, const char *call, gd_cond **out) {
  graphd_status st = check_open(p);
  if (st != GRAPHD_OK) return st;
  gd_program *g = p->prog;
  if (step >= g->nsteps ||
      (g->steps[step].kind != GD_STEP_WHILE && g->steps[step].kind != GD_STEP_IF))
    return fail(p, GRAPHD_INVALID_ARGUMENT, "%s: step %u is not a loop or a branch", call, step);
  gd_cond *cd = &g->steps[step].u.cond;
  if (cd->orelse != OPEN)
    return fail(p, GRAPHD_FAILED_PRECONDITION, "%s: step %u is ended already", call, step);
  for (uint32_t k = step + 1; k < g->nsteps; k++) {
    const gd_step *s = &g->steps[k];
    if ((s->kind == GD_STEP_WHILE || s->kind == GD_STEP_IF) && s->u.cond.orelse == OPEN)
      return fail(p, GRAPHD_FAILED_PRECONDITION,
                  "%s: step %u is inside step %u, which is not ended yet", call, step, k);
  }
  *out = cd;
  return GRAPHD_OK;
}

graphd_status graphd_program_else(graphd_program *p, uint32_t step) {
  gd_cond *cd;
  graphd_status st = open_cond(p, step, "else", &cd);
  if (st != GRAPHD_OK) return st;
  if (p->prog->steps[step].kind != GD_STEP_IF || cd->body != OPEN)
    return fail(p, GRAPHD_FAILED_PRECONDITION, "else: step %u is not a branch before its else",
                step);
  cd->body = p->prog->nsteps - step - 1;
  return GRAPHD_OK;
}

graphd_status graphd_program_end(graphd_program *p, uint32_t step) {
  gd_cond *cd;
  graphd_status st = open_cond(p, step, "end", &cd);
  if (st != GRAPHD_OK) return st;
  uint32_t after = p->prog->nsteps - step - 1;
  if (cd->body == OPEN) {
    cd->body = after;
    cd->orelse = 0;
  } else {
    cd->orelse = after - cd->body;
  }
  return GRAPHD_OK;
}

/* --- finish ------------------------------------------------------------------ */

static int cmp_param(const void *a, const void *b) {
  uint32_t x = ((const gd_param *)a)->offset, y = ((const gd_param *)b)->offset;
  return (x > y) - (x < y);
}

static int cmp_patch(const void *a, const void *b) {
  uint32_t x = ((const gd_patch *)a)->offset, y = ((const gd_patch *)b)->offset;
  return (x > y) - (x < y);
}

graphd_status graphd_program_finish(graphd_program *p, uint8_t id_out[32]) {
  if (p->finished) {
    if (id_out) memcpy(id_out, p->prog->id, GD_ID_LEN);
    return GRAPHD_OK;
  }
  for (uint32_t k = 0; p->first_status == GRAPHD_OK && k < p->prog->nsteps; k++) {
    const gd_step *s = &p->prog->steps[k];
    if ((s->kind == GD_STEP_WHILE || s->kind == GD_STEP_IF) && s->u.cond.orelse == OPEN)
      return fail(p, GRAPHD_INVALID_ARGUMENT, "step %u (%s) is not ended", k,
                  s->kind == GD_STEP_WHILE ? "while" : "if");
  }
  if (p->first_status != GRAPHD_OK) {
    /* Keep first_err intact while fail() formats from it. */
    char first[PROGRAM_ERRMAX];
    memcpy(first, p->first_err, sizeof first);
    return fail(p, p->first_status, "an earlier call failed: %s", first);
  }
  gd_program *g = p->prog;
  for (uint32_t i = 0; i < g->nsteps; i++) {
    if (g->steps[i].kind != GD_STEP_LAUNCH) continue;
    gd_launch *l = &g->steps[i].u.launch;
    /* Offsets are distinct (the calls refuse overlaps and repeats), so the
     * order is total and the encoding does not depend on the call order.
     * param_bytes is already the end of the furthest parameter. */
    if (l->nparams) qsort(l->params, l->nparams, sizeof *l->params, cmp_param);
    if (l->npatches) qsort(l->patches, l->npatches, sizeof *l->patches, cmp_patch);
  }
  char err[PROGRAM_ERRMAX];
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = gd_program_encode(g, &buf, &len, err, sizeof err);
  if (rc < 0) return fail(p, (graphd_status)-rc, "%s", err);
  p->enc = buf;
  p->enc_len = len;
  p->finished = true;
  if (id_out) memcpy(id_out, g->id, GD_ID_LEN);
  return GRAPHD_OK;
}

graphd_status graphd_program_encoding(graphd_program *p, const uint8_t **bytes, size_t *len) {
  if (!p->finished)
    return fail(p, GRAPHD_FAILED_PRECONDITION,
                "the program has no encoding until graphd_program_finish() succeeds");
  *bytes = p->enc;
  *len = p->enc_len;
  return GRAPHD_OK;
}

/* --- ids ---------------------------------------------------------------------- */

graphd_status graphd_module_id(graphd_module_kind kind, const void *bytes, size_t len,
                               uint8_t id_out[32]) {
  if (!bytes && len) return GRAPHD_INVALID_ARGUMENT;
  int rc = gd_module_id((uint32_t)kind, bytes, len, id_out);
  return rc < 0 ? (graphd_status)-rc : GRAPHD_OK;
}

void graphd_id_hex(const uint8_t id[32], char out[65]) { gd_hex_encode(id, GD_ID_LEN, out); }
