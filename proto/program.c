/* Canonical encodings, ids and the structural validation stage. */
#include "graphd/encoding.h"

#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphd/status.h"
#include "graphd/hex.h"

/* --- ids -------------------------------------------------------------- */

void gd_sha256(const void *data, size_t len, uint8_t out[GD_ID_LEN]) {
  unsigned int n = GD_ID_LEN;
  EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
}

void gd_id_hex(const uint8_t id[GD_ID_LEN], int short_form, char out[2 * GD_ID_LEN + 1]) {
  gd_hex_encode(id, short_form ? 6 : GD_ID_LEN, out);
}

int gd_id_parse_hex(const char *s, uint8_t id[GD_ID_LEN]) {
  return gd_hex_decode(s, strlen(s), id, GD_ID_LEN, NULL, 0);
}

/* --- byte writer and reader --------------------------------------------- */

typedef struct wbuf {
  uint8_t *p;
  size_t len, cap;
  int oom;
} wbuf;

static void w_bytes(wbuf *w, const void *src, size_t n) {
  /* n == 0 may come with src == NULL (a launch without parameters). */
  if (w->oom || n == 0) return;
  if (w->cap - w->len < n) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap - w->len < n) cap *= 2;
    uint8_t *np = realloc(w->p, cap);
    if (!np) {
      w->oom = 1;
      return;
    }
    w->p = np;
    w->cap = cap;
  }
  memcpy(w->p + w->len, src, n);
  w->len += n;
}

static void w_u32(wbuf *w, uint32_t v) {
  uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  w_bytes(w, b, 4);
}

static void w_u64(wbuf *w, uint64_t v) {
  w_u32(w, (uint32_t)v);
  w_u32(w, (uint32_t)(v >> 32));
}

typedef struct rbuf {
  const uint8_t *p;
  size_t len, off;
  int short_read;
} rbuf;

static const uint8_t *r_take(rbuf *r, size_t n) {
  if (r->short_read || r->len - r->off < n) {
    r->short_read = 1;
    return NULL;
  }
  const uint8_t *p = r->p + r->off;
  r->off += n;
  return p;
}

static uint32_t r_u32(rbuf *r) {
  const uint8_t *b = r_take(r, 4);
  if (!b) return 0;
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint64_t r_u64(rbuf *r) {
  uint64_t lo = r_u32(r);
  uint64_t hi = r_u32(r);
  return lo | hi << 32;
}

/* --- errors --------------------------------------------------------------- */

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -code;
}

const char *gd_step_label(const gd_step *s, char *buf, size_t len) {
  switch (s->kind) {
    case GD_STEP_LAUNCH: snprintf(buf, len, "launch %s", s->u.launch.name); break;
    case GD_STEP_MEMSET: snprintf(buf, len, "memset"); break;
    case GD_STEP_COPY: snprintf(buf, len, "copy"); break;
    case GD_STEP_WHILE: snprintf(buf, len, "while"); break;
    case GD_STEP_IF: snprintf(buf, len, "if"); break;
    default: snprintf(buf, len, "kind %u", s->kind); break;
  }
  return buf;
}

/* --- structural validation ---------------------------------------------- */

/* start + n <= limit, without overflow. */
static int fits(uint64_t start, uint64_t n, uint64_t limit) {
  return start <= limit && n <= limit - start;
}

static int validate_launch(const gd_program *p, uint32_t i, const gd_launch *l, char *err,
                           size_t errlen) {
  char lbl[GD_MAX_NAME + 48];
  size_t nlen = strnlen(l->name, GD_MAX_NAME + 1);
  if (nlen == 0)
    return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                "step %u (launch): the function name is empty", i);
  if (nlen > GD_MAX_NAME)
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
                "step %u (launch): the function name is longer than %u bytes", i, GD_MAX_NAME);
  for (size_t k = 0; k < nlen; k++)
    if ((unsigned char)l->name[k] < 0x21 || (unsigned char)l->name[k] > 0x7e)
      return fail(
          err, errlen, GRAPHD_INVALID_ARGUMENT,
          "step %u (launch): the function name has a byte 0x%02x that is not printable ASCII", i,
          (unsigned char)l->name[k]);
  /* Only now is the name known to be terminated within its array. */
  snprintf(lbl, sizeof lbl, "step %u (launch %s)", i, l->name);
  static const char *const axis[] = {"x", "y", "z"};
  for (int a = 0; a < 3; a++) {
    uint32_t gmax = a == 0 ? GD_MAX_GRID_X : GD_MAX_GRID_YZ;
    if (l->grid[a] == 0 || l->grid[a] > gmax)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT, "%s: grid.%s is %u; it must be 1 to %u",
                  lbl, axis[a], l->grid[a], gmax);
    uint32_t bmax = a == 2 ? GD_MAX_BLOCK_Z : GD_MAX_BLOCK_THREADS;
    if (l->block[a] == 0 || l->block[a] > bmax)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT, "%s: block.%s is %u; it must be 1 to %u",
                  lbl, axis[a], l->block[a], bmax);
  }
  uint64_t threads = (uint64_t)l->block[0] * l->block[1] * l->block[2];
  if (threads > GD_MAX_BLOCK_THREADS)
    return fail(err, errlen, GRAPHD_INVALID_ARGUMENT, "%s: block has %llu threads; the limit is %u",
                lbl, (unsigned long long)threads, GD_MAX_BLOCK_THREADS);
  if (l->shared_bytes > GD_MAX_SHARED_BYTES)
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
                "%s: %u bytes of dynamic shared memory is over the limit of %u", lbl,
                l->shared_bytes, GD_MAX_SHARED_BYTES);
  if (l->nparams > GD_MAX_PARAMS)
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED, "%s: %u parameters is over the limit of %u",
                lbl, l->nparams, GD_MAX_PARAMS);
  if (l->param_bytes > GD_MAX_PARAM_BYTES)
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
                "%s: %u parameter bytes is over the limit of %u", lbl, l->param_bytes,
                GD_MAX_PARAM_BYTES);
  uint32_t end = 0;
  for (uint32_t k = 0; k < l->nparams; k++) {
    const gd_param *pa = &l->params[k];
    if (pa->size == 0)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT, "%s: parameter %u has size 0", lbl, k);
    if (pa->offset < end)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                  "%s: parameter %u at offset %u overlaps the one before or is out of order", lbl,
                  k, pa->offset);
    if (!fits(pa->offset, pa->size, l->param_bytes))
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                  "%s: parameter %u (offset %u, size %u) ends past the %u parameter bytes", lbl, k,
                  pa->offset, pa->size, l->param_bytes);
    end = pa->offset + pa->size;
  }
  if (end != l->param_bytes)
    return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                "%s: %u parameter bytes, but the parameters end at byte %u", lbl, l->param_bytes,
                end);
  /* Canonical form: gaps between parameters are zero. */
  uint32_t at = 0;
  for (uint32_t k = 0; k <= l->nparams; k++) {
    uint32_t next = k < l->nparams ? l->params[k].offset : l->param_bytes;
    for (uint32_t b = at; b < next; b++)
      if (l->param_data[b])
        return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                    "%s: padding byte %u between parameters must be zero", lbl, b);
    if (k < l->nparams) at = l->params[k].offset + l->params[k].size;
  }
  if (l->npatches > GD_MAX_PATCHES)
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
                "%s: %u pointer patches is over the limit of %u", lbl, l->npatches, GD_MAX_PATCHES);
  for (uint32_t k = 0; k < l->npatches; k++) {
    const gd_patch *pt = &l->patches[k];
    if (pt->offset % 8)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                  "%s: patch at offset %u is not 8-byte aligned", lbl, pt->offset);
    if (k && pt->offset <= l->patches[k - 1].offset)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                  "%s: patch at offset %u repeats or is out of order", lbl, pt->offset);
    int inside = 0;
    for (uint32_t q = 0; q < l->nparams && !inside; q++)
      inside = pt->offset >= l->params[q].offset &&
               fits(pt->offset, 8, (uint64_t)l->params[q].offset + l->params[q].size);
    if (!inside)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                  "%s: patch at offset %u does not lie inside one parameter", lbl, pt->offset);
    if (pt->slot >= p->nslots)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                  "%s: patch at offset %u names slot %u; there are %u slots", lbl, pt->offset,
                  pt->slot, p->nslots);
    if (pt->slot_offset >= p->slots[pt->slot].size)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                  "%s: patch at offset %u points %llu bytes into slot %u, which has %llu", lbl,
                  pt->offset, (unsigned long long)pt->slot_offset, pt->slot,
                  (unsigned long long)p->slots[pt->slot].size);
    for (int b = 0; b < 8; b++)
      if (l->param_data[pt->offset + (uint32_t)b])
        return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                    "%s: the 8 parameter bytes under the patch at offset %u must be zero", lbl,
                    pt->offset);
  }
  return 0;
}

static int check_range(uint32_t i, const char *what, const gd_program *p, uint32_t slot,
                       uint64_t off, uint64_t bytes, char *err, size_t errlen) {
  if (slot >= p->nslots)
    return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                "step %u (%s): slot %u does not exist; there are %u slots", i, what, slot,
                p->nslots);
  if (!fits(off, bytes, p->slots[slot].size))
    return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                "step %u (%s): bytes %llu..%llu are outside slot %u, which has %llu", i, what,
                (unsigned long long)off, (unsigned long long)off + bytes, slot,
                (unsigned long long)p->slots[slot].size);
  return 0;
}

/* Steps [first, first + count) as a block: every conditional step's
 * branches lie inside the block, nested at most GD_MAX_COND_DEPTH deep. */
static int check_nesting(const gd_program *p, uint32_t first, uint32_t count, uint32_t depth,
                         char *err, size_t errlen) {
  uint64_t end = (uint64_t)first + count;
  for (uint64_t i = first; i < end;) {
    const gd_step *st = &p->steps[i];
    if (st->kind != GD_STEP_WHILE && st->kind != GD_STEP_IF) {
      i++;
      continue;
    }
    const gd_cond *cd = &st->u.cond;
    uint64_t span = (uint64_t)cd->body + cd->orelse;
    if (i + 1 + span > end)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                  "step %llu (%s): its %llu steps run past the end of the %s",
                  (unsigned long long)i, st->kind == GD_STEP_WHILE ? "while" : "if",
                  (unsigned long long)span, depth ? "enclosing branch" : "program");
    if (depth + 1 > GD_MAX_COND_DEPTH)
      return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
                  "step %llu: conditional steps nest more than %u deep", (unsigned long long)i,
                  GD_MAX_COND_DEPTH);
    int rc = check_nesting(p, (uint32_t)i + 1, cd->body, depth + 1, err, errlen);
    if (rc == 0)
      rc = check_nesting(p, (uint32_t)(i + 1 + cd->body), cd->orelse, depth + 1, err, errlen);
    if (rc < 0) return rc;
    i += 1 + span;
  }
  return 0;
}

int gd_program_validate(const gd_program *p, char *err, size_t errlen) {
  if (p->mode > GD_MODE_AUTO)
    return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                "mode %u is not staged (0), staged_ex (1), direct (2) or auto (3)", p->mode);
  if (p->nslots > GD_MAX_SLOTS)
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED, "%u slots is over the limit of %u",
                p->nslots, GD_MAX_SLOTS);
  if (p->nsteps == 0) return fail(err, errlen, GRAPHD_INVALID_ARGUMENT, "the program has no steps");
  if (p->nsteps > GD_MAX_STEPS)
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED, "%u steps is over the limit of %u",
                p->nsteps, GD_MAX_STEPS);
  for (uint32_t s = 0; s < p->nslots; s++) {
    const gd_slot *sl = &p->slots[s];
    if (sl->role > GD_ROLE_TEMP)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                  "slot %u: role %u is not input, output, inout, scratch or temp", s, sl->role);
    if (sl->flags & ~GD_SLOT_STAGED)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT, "slot %u: unknown flags 0x%x", s,
                  sl->flags);
    if (gd_role_owned(sl->role) && sl->flags)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                  "slot %u: a %s slot belongs to graphd and cannot be staged", s,
                  sl->role == GD_ROLE_TEMP ? "temp" : "scratch");
    if (sl->size == 0)
      return fail(err, errlen, GRAPHD_INVALID_ARGUMENT, "slot %u: size 0 is invalid", s);
    if (sl->size > GD_MAX_SLOT_BYTES)
      return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
                  "slot %u: %llu bytes is over the limit of %llu", s, (unsigned long long)sl->size,
                  (unsigned long long)GD_MAX_SLOT_BYTES);
  }
  for (uint32_t i = 0; i < p->nsteps; i++) {
    const gd_step *st = &p->steps[i];
    int rc;
    switch (st->kind) {
      case GD_STEP_LAUNCH:
        if ((rc = validate_launch(p, i, &st->u.launch, err, errlen)) < 0) return rc;
        break;
      case GD_STEP_MEMSET: {
        const gd_memset *m = &st->u.memset;
        uint32_t es = m->element_size;
        if (es != 1 && es != 2 && es != 4)
          return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                      "step %u (memset): element_size %u is not 1, 2 or 4", i, es);
        if (m->bytes == 0 || m->bytes % es || m->offset % es)
          return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                      "step %u (memset): offset %llu and bytes %llu must be non-zero multiples of "
                      "the element size %u",
                      i, (unsigned long long)m->offset, (unsigned long long)m->bytes, es);
        if (es < 4 && m->value >> (8 * es))
          return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                      "step %u (memset): value 0x%x does not fit in %u byte(s)", i, m->value, es);
        if ((rc = check_range(i, "memset", p, m->slot, m->offset, m->bytes, err, errlen)) < 0)
          return rc;
        break;
      }
      case GD_STEP_COPY: {
        const gd_copy *c = &st->u.copy;
        if (c->bytes == 0)
          return fail(err, errlen, GRAPHD_INVALID_ARGUMENT, "step %u (copy): bytes is 0", i);
        if ((rc = check_range(i, "copy", p, c->dst_slot, c->dst_offset, c->bytes, err, errlen)) < 0)
          return rc;
        if ((rc = check_range(i, "copy", p, c->src_slot, c->src_offset, c->bytes, err, errlen)) < 0)
          return rc;
        if (c->dst_slot == c->src_slot && c->dst_offset < c->src_offset + c->bytes &&
            c->src_offset < c->dst_offset + c->bytes)
          return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                      "step %u (copy): source and destination overlap in slot %u", i, c->dst_slot);
        break;
      }
      case GD_STEP_WHILE:
      case GD_STEP_IF: {
        const gd_cond *cd = &st->u.cond;
        const char *what = st->kind == GD_STEP_WHILE ? "while" : "if";
        if (cd->offset % 4)
          return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                      "step %u (%s): the condition word at offset %llu is not 4-byte aligned", i,
                      what, (unsigned long long)cd->offset);
        if ((rc = check_range(i, what, p, cd->slot, cd->offset, 4, err, errlen)) < 0) return rc;
        if (st->kind == GD_STEP_WHILE && (cd->body == 0 || cd->orelse))
          return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                      "step %u (while): the body must have at least one step and there is no else",
                      i);
        if (st->kind == GD_STEP_IF && (uint64_t)cd->body + cd->orelse == 0)
          return fail(err, errlen, GRAPHD_INVALID_ARGUMENT, "step %u (if): both branches are empty",
                      i);
        break;
      }
      default:
        return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                    "step %u: kind %u is not launch, memset, copy, while or if", i, st->kind);
    }
  }
  return check_nesting(p, 0, p->nsteps, 0, err, errlen);
}

/* --- encode --------------------------------------------------------------- */

static void encode(const gd_program *p, wbuf *w) {
  w_u32(w, GD_PROGRAM_MAGIC);
  w_u32(w, GD_ENCODING_VERSION);
  w_u32(w, p->mode);
  w_u32(w, p->nslots);
  w_u32(w, p->nsteps);
  for (uint32_t s = 0; s < p->nslots; s++) {
    w_u32(w, p->slots[s].role);
    w_u32(w, p->slots[s].flags);
    w_u64(w, p->slots[s].size);
  }
  for (uint32_t i = 0; i < p->nsteps; i++) {
    const gd_step *st = &p->steps[i];
    w_u32(w, st->kind);
    if (st->kind == GD_STEP_LAUNCH) {
      const gd_launch *l = &st->u.launch;
      uint32_t nlen = (uint32_t)strlen(l->name);
      w_bytes(w, l->module_id, GD_ID_LEN);
      w_u32(w, nlen);
      w_bytes(w, l->name, nlen);
      for (int a = 0; a < 3; a++) w_u32(w, l->grid[a]);
      for (int a = 0; a < 3; a++) w_u32(w, l->block[a]);
      w_u32(w, l->shared_bytes);
      w_u32(w, l->nparams);
      for (uint32_t k = 0; k < l->nparams; k++) {
        w_u32(w, l->params[k].offset);
        w_u32(w, l->params[k].size);
      }
      w_u32(w, l->param_bytes);
      w_bytes(w, l->param_data, l->param_bytes);
      w_u32(w, l->npatches);
      for (uint32_t k = 0; k < l->npatches; k++) {
        w_u32(w, l->patches[k].offset);
        w_u32(w, l->patches[k].slot);
        w_u64(w, l->patches[k].slot_offset);
      }
    } else if (st->kind == GD_STEP_MEMSET) {
      const gd_memset *m = &st->u.memset;
      w_u32(w, m->slot);
      w_u32(w, m->element_size);
      w_u32(w, m->value);
      w_u64(w, m->offset);
      w_u64(w, m->bytes);
    } else if (st->kind == GD_STEP_COPY) {
      const gd_copy *c = &st->u.copy;
      w_u32(w, c->dst_slot);
      w_u32(w, c->src_slot);
      w_u64(w, c->dst_offset);
      w_u64(w, c->src_offset);
      w_u64(w, c->bytes);
    } else {
      const gd_cond *cd = &st->u.cond;
      w_u32(w, cd->slot);
      w_u64(w, cd->offset);
      w_u32(w, cd->body);
      if (st->kind == GD_STEP_IF) w_u32(w, cd->orelse);
    }
  }
}

int gd_program_encode(gd_program *p, uint8_t **buf, size_t *len, char *err, size_t errlen) {
  int rc = gd_program_validate(p, err, errlen);
  if (rc < 0) return rc;
  wbuf w = {0};
  encode(p, &w);
  if (w.oom) {
    free(w.p);
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED, "out of memory encoding the program");
  }
  if (w.len > GD_MAX_PROGRAM_BYTES) {
    free(w.p);
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
                "the program encodes to %zu bytes, over the limit of %u", w.len,
                GD_MAX_PROGRAM_BYTES);
  }
  gd_sha256(w.p, w.len, p->id);
  *buf = w.p;
  *len = w.len;
  return 0;
}

/* --- decode --------------------------------------------------------------- */

void gd_program_free(gd_program *p) {
  if (!p) return;
  for (uint32_t i = 0; p->steps && i < p->nsteps; i++) {
    if (p->steps[i].kind != GD_STEP_LAUNCH) continue;
    free(p->steps[i].u.launch.params);
    free(p->steps[i].u.launch.param_data);
    free(p->steps[i].u.launch.patches);
  }
  free(p->steps);
  free(p->slots);
  free(p);
}

#define TRUNC() fail(err, errlen, GRAPHD_INVALID_ARGUMENT, "the program encoding is truncated")

static int decode_launch(rbuf *r, uint32_t i, gd_launch *l, char *err, size_t errlen) {
  const uint8_t *id = r_take(r, GD_ID_LEN);
  if (!id) return TRUNC();
  memcpy(l->module_id, id, GD_ID_LEN);
  uint32_t nlen = r_u32(r);
  if (nlen > GD_MAX_NAME)
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
                "step %u (launch): the function name is %u bytes, over the limit of %u", i, nlen,
                GD_MAX_NAME);
  const uint8_t *name = r_take(r, nlen);
  if (!name) return TRUNC();
  if (memchr(name, 0, nlen))
    return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                "step %u (launch): the function name contains a NUL byte", i);
  memcpy(l->name, name, nlen);
  l->name[nlen] = '\0';
  for (int a = 0; a < 3; a++) l->grid[a] = r_u32(r);
  for (int a = 0; a < 3; a++) l->block[a] = r_u32(r);
  l->shared_bytes = r_u32(r);
  l->nparams = r_u32(r);
  if (r->short_read) return TRUNC();
  if (l->nparams > GD_MAX_PARAMS)
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
                "step %u (launch %s): %u parameters is over the limit of %u", i, l->name,
                l->nparams, GD_MAX_PARAMS);
  if (l->nparams && !(l->params = calloc(l->nparams, sizeof *l->params)))
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
  for (uint32_t k = 0; k < l->nparams; k++) {
    l->params[k].offset = r_u32(r);
    l->params[k].size = r_u32(r);
  }
  l->param_bytes = r_u32(r);
  if (r->short_read) return TRUNC();
  if (l->param_bytes > GD_MAX_PARAM_BYTES)
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
                "step %u (launch %s): %u parameter bytes is over the limit of %u", i, l->name,
                l->param_bytes, GD_MAX_PARAM_BYTES);
  const uint8_t *pd = r_take(r, l->param_bytes);
  if (!pd) return TRUNC();
  if (!(l->param_data = malloc(l->param_bytes ? l->param_bytes : 1)))
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
  memcpy(l->param_data, pd, l->param_bytes);
  l->npatches = r_u32(r);
  if (r->short_read) return TRUNC();
  if (l->npatches > GD_MAX_PATCHES)
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
                "step %u (launch %s): %u pointer patches is over the limit of %u", i, l->name,
                l->npatches, GD_MAX_PATCHES);
  if (l->npatches && !(l->patches = calloc(l->npatches, sizeof *l->patches)))
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
  for (uint32_t k = 0; k < l->npatches; k++) {
    l->patches[k].offset = r_u32(r);
    l->patches[k].slot = r_u32(r);
    l->patches[k].slot_offset = r_u64(r);
  }
  return r->short_read ? TRUNC() : 0;
}

int gd_program_decode(const uint8_t *buf, size_t len, gd_program **out, char *err, size_t errlen) {
  rbuf r = {.p = buf, .len = len};
  gd_program *p = NULL;
  int rc;
  *out = NULL;
  if (len > GD_MAX_PROGRAM_BYTES) {
    return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
                "the program encoding is %zu bytes, over the limit of %u", len,
                GD_MAX_PROGRAM_BYTES);
  }
  uint32_t magic = r_u32(&r), version = r_u32(&r);
  if (r.short_read || magic != GD_PROGRAM_MAGIC)
    return fail(err, errlen, GRAPHD_INVALID_ARGUMENT, "not a graphd program encoding (bad magic)");
  if (version != GD_ENCODING_VERSION)
    return fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                "program encoding version %u is not supported (want %u)", version,
                GD_ENCODING_VERSION);
  p = calloc(1, sizeof *p);
  if (!p) return fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
  p->mode = r_u32(&r);
  p->nslots = r_u32(&r);
  p->nsteps = r_u32(&r);
  if (r.short_read) {
    rc = TRUNC();
    goto fail;
  }
  if (p->nslots > GD_MAX_SLOTS || p->nsteps > GD_MAX_STEPS) {
    rc = fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED,
              "%u slots and %u steps exceed the limits of %u and %u", p->nslots, p->nsteps,
              GD_MAX_SLOTS, GD_MAX_STEPS);
    goto fail;
  }
  p->slots = calloc(p->nslots ? p->nslots : 1, sizeof *p->slots);
  p->steps = calloc(p->nsteps ? p->nsteps : 1, sizeof *p->steps);
  if (!p->slots || !p->steps) {
    rc = fail(err, errlen, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    goto fail;
  }
  for (uint32_t s = 0; s < p->nslots; s++) {
    p->slots[s].role = r_u32(&r);
    p->slots[s].flags = r_u32(&r);
    p->slots[s].size = r_u64(&r);
  }
  for (uint32_t i = 0; i < p->nsteps; i++) {
    gd_step *st = &p->steps[i];
    st->kind = r_u32(&r);
    if (r.short_read) {
      rc = TRUNC();
      goto fail;
    }
    if (st->kind == GD_STEP_LAUNCH) {
      if ((rc = decode_launch(&r, i, &st->u.launch, err, errlen)) < 0) goto fail;
    } else if (st->kind == GD_STEP_MEMSET) {
      gd_memset *m = &st->u.memset;
      m->slot = r_u32(&r);
      m->element_size = r_u32(&r);
      m->value = r_u32(&r);
      m->offset = r_u64(&r);
      m->bytes = r_u64(&r);
    } else if (st->kind == GD_STEP_COPY) {
      gd_copy *c = &st->u.copy;
      c->dst_slot = r_u32(&r);
      c->src_slot = r_u32(&r);
      c->dst_offset = r_u64(&r);
      c->src_offset = r_u64(&r);
      c->bytes = r_u64(&r);
    } else if (st->kind == GD_STEP_WHILE || st->kind == GD_STEP_IF) {
      gd_cond *cd = &st->u.cond;
      cd->slot = r_u32(&r);
      cd->offset = r_u64(&r);
      cd->body = r_u32(&r);
      if (st->kind == GD_STEP_IF) cd->orelse = r_u32(&r);
    } else {
      /* Unknown kinds cannot be skipped: their length is unknown. */
      p->nsteps = i; /* free only what was decoded */
      rc = fail(err, errlen, GRAPHD_INVALID_ARGUMENT,
                "step %u: kind %u is not launch, memset, copy, while or if", i, st->kind);
      goto fail;
    }
  }
  if (r.short_read) {
    rc = TRUNC();
    goto fail;
  }
  if (r.off != len) {
    rc = fail(err, errlen, GRAPHD_INVALID_ARGUMENT, "%zu unexpected bytes after the last step",
              len - r.off);
    goto fail;
  }
  if ((rc = gd_program_validate(p, err, errlen)) < 0) goto fail;
  gd_sha256(buf, len, p->id);
  *out = p;
  return 0;
fail:
  gd_program_free(p);
  return rc;
}

/* --- modules ------------------------------------------------------------ */

int gd_module_id(uint32_t kind, const void *bytes, size_t len, uint8_t id[GD_ID_LEN]) {
  if (kind < GD_MODULE_PTX || kind > GD_MODULE_HOST_ELF || len == 0 || len > GD_MAX_MODULE_BYTES)
    return -GRAPHD_INVALID_ARGUMENT;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  if (!ctx) return -GRAPHD_RESOURCE_EXHAUSTED;
  wbuf w = {0};
  w_u32(&w, GD_MODULE_MAGIC);
  w_u32(&w, GD_ENCODING_VERSION);
  w_u32(&w, kind);
  w_u64(&w, (uint64_t)len);
  unsigned int n = GD_ID_LEN;
  int ok = !w.oom && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
           EVP_DigestUpdate(ctx, w.p, w.len) && EVP_DigestUpdate(ctx, bytes, len) &&
           EVP_DigestFinal_ex(ctx, id, &n);
  EVP_MD_CTX_free(ctx);
  free(w.p);
  return ok ? 0 : -GRAPHD_INTERNAL;
}

uint32_t gd_program_modules(const gd_program *p, uint8_t (*ids)[GD_ID_LEN], uint32_t cap) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < p->nsteps; i++) {
    if (p->steps[i].kind != GD_STEP_LAUNCH) continue;
    const uint8_t *id = p->steps[i].u.launch.module_id;
    uint32_t k = 0;
    while (k < n && memcmp(ids[k], id, GD_ID_LEN)) k++;
    if (k == n && n < cap) memcpy(ids[n++], id, GD_ID_LEN);
  }
  return n;
}
