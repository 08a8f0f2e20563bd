/* libFuzzer harness: the checks that stand between a client's memory and
 * the daemon's, each against an oracle computed here independently:
 * - gd_memfd_check (seals and size of a shared memfd);
 * - the host backend's region import and flag page mapping of a memfd
 *   (accepted exactly when the seals and size allow it; what is accepted is
 *   then touched at both ends, so a mapping shorter than it claims faults);
 * - the region table (region.c): ids never reused, counts and bytes kept,
 *   region_check_range exactly "offset + bytes <= size" without overflow;
 * - exec_bind (execute.c): a replay's bindings against a program's slots
 *   and the table, accepted exactly when every rule holds, and then each
 *   address is the region's plus the offset.
 *
 * The input is a one-byte header (the program's slots, see make_program)
 * and then operations, each an opcode byte and its operands. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/memfd.h"
#include "daemon/backend/backend.h"
#include "daemon/sessions/region.h"
#include "daemon/replay/execute.h"
#include "graphd/status.h"
#include "graphd/encoding.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_REGIONS 16
#define MAX_SLOTS 8
#define MAX_MEMFD (256u << 10)

static gd_backend *be;
static gd_backend_dev *dev;

static void open_backend(void) {
  char err[256];
  if (be) return;
  if (backend_host_new(1, 64u << 20, &be, err, sizeof err) < 0 ||
      be->ops->device_open(be, 0, &dev, err, sizeof err) < 0) {
    fprintf(stderr, "fuzz_region: %s\n", err);
    abort();
  }
}

typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader;

static bool take_u(reader *r, size_t n, uint64_t *v) {
  if (r->n < n) return false;
  *v = 0;
  for (size_t i = 0; i < n; i++) *v |= (uint64_t)r->p[i] << (8 * i);
  r->p += n;
  r->n -= n;
  return true;
}

/* What the harness knows of each region it put in the table. */
typedef struct shadow {
  uint32_t id;
  uint64_t ptr, size, epoch;
  bool real; /* a host import, released at the end */
  gd_region_map map;
} shadow;

typedef struct state {
  gd_region_table t;
  shadow sh[MAX_REGIONS];
  int n;
  uint32_t last_id;
  gd_program prog;
  gd_slot slots[MAX_SLOTS];
} state;

static const int seal_sets[4] = {F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, 0, F_SEAL_SHRINK,
                                 F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL};

static int make_memfd(unsigned seals, uint64_t bytes) {
  int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) abort();
  if (ftruncate(fd, (off_t)bytes) < 0) abort();
  if (seal_sets[seals] && fcntl(fd, F_ADD_SEALS, seal_sets[seals]) < 0) abort();
  return fd;
}

static void check_table(state *st) {
  uint64_t bytes = 0;
  if (st->t.n != (uint64_t)st->n) abort();
  for (int i = 0; i < st->n; i++) {
    gd_region *r = region_find(&st->t, st->sh[i].id);
    if (!r || r->map.ptr != st->sh[i].ptr || r->map.size != st->sh[i].size) abort();
    bytes += st->sh[i].size;
  }
  if (st->t.bytes != bytes) abort();
}

static void add_region(state *st, const gd_region_map *map, bool real) {
  gd_region *r = region_add(&st->t, map, 0);
  if (!r) abort();
  /* A new id, never one given before. */
  if (r->id <= st->last_id) abort();
  st->last_id = r->id;
  shadow *s = &st->sh[st->n++];
  s->id = r->id;
  s->ptr = map->ptr;
  s->size = map->size;
  s->epoch = map->epoch;
  s->real = real;
  s->map = *map;
}

/* opcode 0: a memfd through gd_memfd_check.
 *   u8 seals (2 bits) | need (2 bits: shrink, grow) << 2; u32 memfd bytes; u32 min bytes */
static void op_memfd_check(reader *in) {
  uint64_t b, bytes, min;
  if (!take_u(in, 1, &b) || !take_u(in, 4, &bytes) || !take_u(in, 4, &min)) return;
  bytes %= MAX_MEMFD + 1;
  int fd = make_memfd(b & 3, bytes);
  int need = ((b >> 2) & 1 ? F_SEAL_SHRINK : 0) | ((b >> 3) & 1 ? F_SEAL_GROW : 0);
  char err[256] = "";
  int rc = gd_memfd_check(fd, need, min, "fuzz", err, sizeof err);
  bool want = (seal_sets[b & 3] & need) == need && bytes >= min;
  if ((rc == 0) != want || (rc < 0 && !err[0])) abort();
  close(fd);
  /* Not a memfd at all. */
  int pp[2];
  if (pipe(pp) < 0) abort();
  if (gd_memfd_check(pp[0], 0, 0, "fuzz", err, sizeof err) == 0) abort();
  close(pp[0]);
  close(pp[1]);
}

/* opcode 1: a region import on the host device, then into the table.
 *   u8 seals (2 bits) | kind (2 bits) << 2 | epoch (1 bit) << 4;
 *   u32 memfd bytes; u32 declared bytes */
static void op_import(state *st, reader *in) {
  uint64_t b, bytes, declared;
  if (!take_u(in, 1, &b) || !take_u(in, 4, &bytes) || !take_u(in, 4, &declared)) return;
  bytes %= MAX_MEMFD + 1;
  declared %= MAX_MEMFD + 2;
  unsigned seals = b & 3;
  static const int kinds[4] = {GRAPHD_REGION_HOST_MEMFD, GRAPHD_REGION_VMM_FD,
                               GRAPHD_REGION_LEGACY_IPC, GRAPHD_REGION_HOST_MEMFD};
  int fd = make_memfd(seals, bytes);
  gd_region_import imp = {.kind = kinds[(b >> 2) & 3], .fd = fd, .size = declared};
  gd_region_map map;
  memset(&map, 0, sizeof map);
  char err[256] = "";
  int rc = be->ops->region_import(be, dev, &imp, &map, err, sizeof err);
  int shared = gd_memfd_shared_seals();
  bool want = imp.kind == GRAPHD_REGION_HOST_MEMFD && declared > 0 &&
              (seal_sets[seals] & shared) == shared && bytes >= declared &&
              !(seal_sets[seals] & F_SEAL_WRITE); /* a shared writable mapping is refused */
  close(fd);
  if ((rc == 0) != want || (rc < 0 && !err[0])) abort();
  if (rc < 0) return;
  if (map.size != declared || map.mapped < map.size) abort();
  /* Both ends of what the import claims are there. */
  volatile uint8_t *p = (volatile uint8_t *)(uintptr_t)map.ptr;
  p[0] = 1;
  p[map.size - 1] = 2;
  if (st->n == MAX_REGIONS) {
    be->ops->region_release(be, dev, &map);
    return;
  }
  map.epoch = (b >> 4) & 1;
  add_region(st, &map, true);
}

/* opcode 2: a made-up region into the table (no memory behind it).
 *   u64 ptr; u64 size; u8 epoch */
static void op_fake(state *st, reader *in) {
  uint64_t ptr, size, epoch;
  if (!take_u(in, 8, &ptr) || !take_u(in, 8, &size) || !take_u(in, 1, &epoch)) return;
  if (st->n == MAX_REGIONS) return;
  gd_region_map map;
  memset(&map, 0, sizeof map);
  map.ptr = ptr;
  map.size = size;
  map.epoch = epoch & 1;
  add_region(st, &map, false);
}

static void release(shadow *s) {
  if (s->real) be->ops->region_release(be, dev, &s->map);
}

/* opcode 3: a region out of the table.  u8 which */
static void op_remove(state *st, reader *in) {
  uint64_t w;
  if (!take_u(in, 1, &w) || !st->n) return;
  int i = (int)(w % (uint64_t)st->n);
  gd_region *r = region_find(&st->t, st->sh[i].id);
  if (!r) abort();
  region_remove(&st->t, r);
  if (region_find(&st->t, st->sh[i].id)) abort();
  release(&st->sh[i]);
  st->sh[i] = st->sh[--st->n];
}

/* opcode 4: region_check_range.  u8 which; u64 offset; u64 bytes */
static void op_range(state *st, reader *in) {
  uint64_t w, off, bytes;
  if (!take_u(in, 1, &w) || !take_u(in, 8, &off) || !take_u(in, 8, &bytes) || !st->n) return;
  shadow *s = &st->sh[w % (uint64_t)st->n];
  char err[256] = "";
  int rc = region_check_range(region_find(&st->t, s->id), off, bytes, err, sizeof err);
  bool want = (unsigned __int128)off + bytes <= s->size;
  if ((rc == 0) != want || (rc < 0 && (rc != -GRAPHD_OUT_OF_RANGE || !err[0]))) abort();
}

/* opcode 5: exec_bind.  u8 count (of 9 at most); u8 epoch; each binding:
 *   u8 slot; u8 region (an index into the table, or past it: an id that is
 *   not there); u8 shape; u64 offset; u64 bytes. shape 0 takes the offset
 *   and bytes as they are; 1 binds the slot's size at offset % the
 *   region's size; 2 the slot's size at the end of the region. */
static void op_bind(state *st, reader *in) {
  uint64_t count, epoch;
  if (!take_u(in, 1, &count) || !take_u(in, 1, &epoch)) return;
  count %= MAX_SLOTS + 2;
  epoch &= 1;
  gd_bind_req b[MAX_SLOTS + 1];
  int ridx[MAX_SLOTS + 1];
  for (uint64_t i = 0; i < count; i++) {
    uint64_t slot, reg, shape, off, bytes;
    if (!take_u(in, 1, &slot) || !take_u(in, 1, &reg) || !take_u(in, 1, &shape) ||
        !take_u(in, 8, &off) || !take_u(in, 8, &bytes))
      return;
    memset(&b[i], 0, sizeof b[i]);
    b[i].slot = (uint32_t)slot % (MAX_SLOTS + 1);
    ridx[i] = st->n && reg < 200 ? (int)(reg % (uint64_t)st->n) : -1;
    b[i].region_id = ridx[i] >= 0 ? st->sh[ridx[i]].id : (uint32_t)reg * 7919u;
    uint64_t ssize = b[i].slot < st->prog.nslots ? st->slots[b[i].slot].size : bytes;
    uint64_t rsize = ridx[i] >= 0 ? st->sh[ridx[i]].size : 1;
    b[i].offset = off;
    b[i].bytes = bytes;
    if (shape % 3 == 1) {
      b[i].offset = rsize ? off % rsize : 0;
      b[i].bytes = ssize;
    } else if (shape % 3 == 2) {
      b[i].offset = rsize - ssize; /* may wrap: then out of range */
      b[i].bytes = ssize;
    }
  }
  /* The oracle. */
  const gd_program *p = &st->prog;
  bool want = count <= p->nslots, seen[MAX_SLOTS + 1] = {false};
  for (uint64_t i = 0; want && i < count; i++) {
    uint32_t k = b[i].slot;
    if (k >= p->nslots || p->slots[k].role == GD_ROLE_SCRATCH || seen[k] ||
        b[i].bytes != p->slots[k].size) {
      want = false;
      break;
    }
    seen[k] = true;
    /* An id past the table's may still name a region by chance. */
    gd_region *r = region_find(&st->t, b[i].region_id);
    if (!r || r->map.epoch != epoch || (unsigned __int128)b[i].offset + b[i].bytes > r->map.size)
      want = false;
  }
  for (uint32_t k = 0; want && k < p->nslots; k++)
    if (p->slots[k].role != GD_ROLE_SCRATCH && (p->slots[k].flags & GD_SLOT_STAGED) && !seen[k])
      want = false;
  gd_bound bind[MAX_SLOTS];
  memset(bind, 0, sizeof bind);
  char err[512] = "";
  int rc = exec_bind(p, region_lookup, &st->t, epoch, 0, b, (size_t)count, bind, err, sizeof err);
  if ((rc == 0) != want || (rc < 0 && !err[0])) abort();
  if (rc < 0) return;
  for (uint64_t i = 0; i < count; i++) {
    gd_region *r = region_find(&st->t, b[i].region_id);
    const gd_bound *x = &bind[b[i].slot];
    if (!x->bound || x->addr != r->map.ptr + b[i].offset || x->bytes != b[i].bytes) abort();
  }
  for (uint32_t k = 0; k < p->nslots; k++)
    if (!seen[k] && bind[k].bound) abort();
}

/* opcode 6: the host device's flag page mapping.
 *   u8 seals (2 bits); u32 memfd bytes; u16 slots */
static void op_flags(reader *in) {
  uint64_t b, bytes, slots;
  if (!take_u(in, 1, &b) || !take_u(in, 4, &bytes) || !take_u(in, 2, &slots)) return;
  bytes %= MAX_MEMFD + 1;
  slots = slots % GRAPHD_MAX_FLAG_SLOTS + 1;
  uint64_t need = slots * GRAPHD_FLAG_STRIDE;
  int fd = make_memfd(b & 3, bytes);
  gd_flags_map m;
  char err[256] = "";
  int rc = be->ops->flags_map(be, dev, fd, need, &m, err, sizeof err);
  int shared = gd_memfd_shared_seals();
  bool want =
      (seal_sets[b & 3] & shared) == shared && bytes >= need && !(seal_sets[b & 3] & F_SEAL_WRITE);
  close(fd);
  if ((rc == 0) != want || (rc < 0 && !err[0])) abort();
  if (rc < 0) return;
  /* Every slot's words are there. */
  m.host[0] = 1;
  m.host[need / 8 - 1] = 2;
  be->ops->flags_unmap(be, dev, &m);
}

/* The program's slots: header bits 0-2 give 1 to 8 slots, whose roles,
 * staging and sizes come from the next bytes (role 2 bits, staged 1 bit,
 * size class 5 bits: a size of 2^(class % 20) + class). */
static void make_program(state *st, uint8_t header, reader *in) {
  uint32_t n = (header & 7u) + 1;
  for (uint32_t k = 0; k < n; k++) {
    uint64_t b = 0;
    (void)take_u(in, 1, &b);
    st->slots[k].role = (uint32_t)(b & 3);
    st->slots[k].flags = (b >> 2) & 1 ? GD_SLOT_STAGED : 0;
    uint32_t cls = (uint32_t)(b >> 3);
    st->slots[k].size = (1ull << (cls % 20)) + cls;
  }
  st->prog.nslots = n;
  st->prog.slots = st->slots;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  open_backend();
  state *st = calloc(1, sizeof *st);
  if (!st) abort();
  reader in = {data + 1, size - 1};
  make_program(st, data[0], &in);
  uint64_t op;
  while (take_u(&in, 1, &op)) {
    switch (op % 7) {
      case 0: op_memfd_check(&in); break;
      case 1: op_import(st, &in); break;
      case 2: op_fake(st, &in); break;
      case 3: op_remove(st, &in); break;
      case 4: op_range(st, &in); break;
      case 5: op_bind(st, &in); break;
      case 6: op_flags(&in); break;
    }
    check_table(st);
  }
  /* Everything out at once, as a session's end takes it. */
  gd_region_map *maps;
  size_t n;
  if (region_take_all(&st->t, &maps, &n) < 0 || n != (size_t)st->n || st->t.n || st->t.bytes)
    abort();
  for (size_t i = 0; i < n; i++) {
    bool found = false;
    for (int j = 0; j < st->n && !found; j++)
      found = st->sh[j].ptr == maps[i].ptr && st->sh[j].size == maps[i].size;
    if (!found) abort();
  }
  for (int j = 0; j < st->n; j++) release(&st->sh[j]);
  free(maps);
  free(st);
  return 0;
}
