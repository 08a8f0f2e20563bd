/* Writes the seed corpora of fuzz_request, fuzz_region and fuzz_ring
 * (their input formats are described at the top of each harness) into
 * DIR/request, DIR/region and DIR/ring: sessions that do what libgraphd
 * does (Hello, the flag page, regions, programs, replays, the control
 * requests), and the refusals on the way; rings of replays, long entries
 * and entries rewritten while they are read. scripts/fuzz.sh --seeds runs it into tests/fuzz/corpus.
 * Usage: fuzz_seeds DIR */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "graphd.pb-c.h"
#include "graphd/protocol.h"
#include "graphd/encoding.h"

/* --- an input being written ------------------------------------------------- */

typedef struct buf {
  uint8_t *p;
  size_t n, cap;
} buf;

static void put(buf *b, const void *data, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}

static void put_u(buf *b, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint8_t c = (uint8_t)(v >> (8 * i));
    put(b, &c, 1);
  }
}

static void save(const char *dir, const char *name, buf *b) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(b->p, 1, b->n, f) != b->n || fclose(f) != 0) {
    fprintf(stderr, "fuzz_seeds: cannot write %s\n", path);
    exit(1);
  }
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* --- fuzz_request records --------------------------------------------------- */

enum { FD_NONE = 0, FD_MEMFD = 1, FD_TWO = 2, FD_PIPE = 3 };
enum { SEAL_SHARED = 0, SEAL_NONE = 1, SEAL_SHRINK = 2, SEAL_ALL = 3 };
#define KEEP_NFDS 0x40

static uint8_t one_byte[1];

/* One record: the request (packed here), its fds and the memfds' bytes. */
static void rec(buf *b, int conn, unsigned fds, uint32_t memfd_bytes, Graphd__Wire__Request *req,
                const void *payload, size_t plen) {
  size_t n = graphd__wire__request__get_packed_size(req);
  uint8_t *m = malloc(n ? n : 1);
  if (!m) abort();
  graphd__wire__request__pack(req, m);
  put_u(b, (uint64_t)conn, 1);
  put_u(b, fds, 1);
  put_u(b, memfd_bytes, 4);
  put_u(b, n, 2);
  put(b, m, n);
  put_u(b, plen, 2);
  put(b, payload, plen);
  free(m);
}

static void rec_close(buf *b, int conn) {
  put_u(b, 0x80u | (unsigned)conn, 1);
  put_u(b, 0, 1);
  put_u(b, 0, 4);
  put_u(b, 0, 2);
  put_u(b, 0, 2);
}

static void hello(buf *b, int conn, bool data, int dev) {
  Graphd__Wire__Request r = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Hello h = GRAPHD__WIRE__HELLO__INIT;
  static uint8_t devs[2] = {0, 1};
  r.body_case = GRAPHD__WIRE__REQUEST__BODY_HELLO;
  r.hello = &h;
  h.protocol_version = GRAPHD_PROTOCOL_VERSION;
  h.kind = data ? GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_DATA
                : GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_CONTROL;
  h.client_name = "fuzz seed";
  if (data) {
    h.device_uuid.data = &devs[dev]; /* 1 byte: the harness names device dev */
    h.device_uuid.len = 1;
  }
  rec(b, conn, FD_NONE, 0, &r, NULL, 0);
}

static void flags(buf *b, int conn, uint32_t slots) {
  Graphd__Wire__Request r = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterFlags f = GRAPHD__WIRE__REGISTER_FLAGS__INIT;
  r.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_FLAGS;
  r.register_flags = &f;
  f.slots = slots;
  rec(b, conn, FD_MEMFD | SEAL_SHARED << 2, slots * GRAPHD_FLAG_STRIDE, &r, NULL, 0);
}

static void region(buf *b, int conn, uint64_t size, unsigned fds) {
  Graphd__Wire__Request r = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterRegion g = GRAPHD__WIRE__REGISTER_REGION__INIT;
  r.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_REGION;
  r.register_region = &g;
  g.kind = GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD;
  g.size = size;
  g.client_base = 0x7f0000000000ull;
  rec(b, conn, fds, (uint32_t)size, &r, NULL, 0);
}

static void unregister(buf *b, int conn, uint32_t id) {
  Graphd__Wire__Request r = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__UnregisterRegion u = GRAPHD__WIRE__UNREGISTER_REGION__INIT;
  r.body_case = GRAPHD__WIRE__REQUEST__BODY_UNREGISTER_REGION;
  r.unregister_region = &u;
  u.region_id = id;
  rec(b, conn, FD_NONE, 0, &r, NULL, 0);
}

/* A replay of known program `prog` (0: the harness's own, while the input
 * registered none), slot i bound to region regions[i] (0: unbound). */
static void replay(buf *b, int conn, uint8_t prog, uint32_t slot, uint64_t seq, int nslots,
                   const uint32_t *regions, const uint64_t *sizes) {
  Graphd__Wire__Request r = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Replay p = GRAPHD__WIRE__REPLAY__INIT;
  Graphd__Wire__Binding bind[8], *bp[8];
  uint8_t pick[1] = {prog};
  r.body_case = GRAPHD__WIRE__REQUEST__BODY_REPLAY;
  r.replay = &p;
  p.program_id.data = pick;
  p.program_id.len = 1;
  p.stream_slot = slot;
  p.seq = seq;
  size_t n = 0;
  for (int i = 0; i < nslots; i++) {
    if (!regions[i]) continue;
    graphd__wire__binding__init(&bind[n]);
    bind[n].slot = (uint32_t)i;
    bind[n].region_id = regions[i];
    bind[n].bytes = sizes[i];
    bp[n] = &bind[n];
    n++;
  }
  p.n_bindings = n;
  p.bindings = bp;
  rec(b, conn, FD_NONE, 0, &r, NULL, 0);
}

static void prepare(buf *b, int conn, uint8_t prog) {
  Graphd__Wire__Request r = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__PrepareProgram p = GRAPHD__WIRE__PREPARE_PROGRAM__INIT;
  uint8_t pick[1] = {prog};
  r.body_case = GRAPHD__WIRE__REQUEST__BODY_PREPARE_PROGRAM;
  r.prepare_program = &p;
  p.program_id.data = pick;
  p.program_id.len = 1;
  rec(b, conn, FD_NONE, 0, &r, NULL, 0);
}

static void simple(buf *b, int conn, Graphd__Wire__Request__BodyCase body) {
  Graphd__Wire__Request r = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Ping ping = GRAPHD__WIRE__PING__INIT;
  Graphd__Wire__StatusRequest st = GRAPHD__WIRE__STATUS_REQUEST__INIT;
  Graphd__Wire__ListCaptures lc = GRAPHD__WIRE__LIST_CAPTURES__INIT;
  r.body_case = body;
  if (body == GRAPHD__WIRE__REQUEST__BODY_PING) {
    r.ping = &ping;
    ping.payload.data = (uint8_t *)"ping";
    ping.payload.len = 4;
  } else if (body == GRAPHD__WIRE__REQUEST__BODY_STATUS) {
    r.status = &st;
  } else {
    r.list_captures = &lc;
  }
  rec(b, conn, FD_NONE, 0, &r, NULL, 0);
}

static void evict(buf *b, int conn, bool all, bool dry, const char *program) {
  Graphd__Wire__Request r = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Evict e = GRAPHD__WIRE__EVICT__INIT;
  r.body_case = GRAPHD__WIRE__REQUEST__BODY_EVICT;
  r.evict = &e;
  e.all = all;
  e.dry_run = dry;
  e.program = (char *)program;
  if (!all) {
    e.device_sel_case = GRAPHD__WIRE__EVICT__DEVICE_SEL_DEVICE;
    e.device = 0;
  }
  rec(b, conn, FD_NONE, 0, &r, NULL, 0);
}

/* A program of the fuzz module (a zero module id: the harness fills it in)
 * with two staged slots of `bytes`, a memset, a copy and a launch; with
 * `branch`, an if step on a word of slot 0 around the copy. */
static uint8_t *program(uint64_t bytes, bool branch, size_t *len) {
  gd_slot slots[3] = {{GD_ROLE_INPUT, GD_SLOT_STAGED, bytes},
                      {GD_ROLE_INOUT, GD_SLOT_STAGED, bytes},
                      {GD_ROLE_SCRATCH, 0, 64}};
  gd_param params[1] = {{0, 4}};
  uint8_t pdata[4] = {0};
  gd_step steps[5];
  memset(steps, 0, sizeof steps);
  uint32_t n = 0;
  steps[n].kind = GD_STEP_MEMSET;
  steps[n++].u.memset = (gd_memset){.slot = 2, .element_size = 4, .value = 3, .bytes = 64};
  if (branch) {
    steps[n].kind = GD_STEP_IF;
    steps[n++].u.cond = (gd_cond){.slot = 0, .offset = 0, .body = 1, .orelse = 1};
  }
  steps[n].kind = GD_STEP_COPY;
  steps[n++].u.copy = (gd_copy){.dst_slot = 1, .src_slot = 0, .bytes = bytes};
  if (branch) {
    steps[n].kind = GD_STEP_MEMSET;
    steps[n++].u.memset = (gd_memset){.slot = 1, .element_size = 1, .value = 9, .bytes = bytes};
  }
  steps[n].kind = GD_STEP_LAUNCH;
  gd_launch *l = &steps[n++].u.launch;
  snprintf(l->name, sizeof l->name, "fuzz_fault");
  l->grid[0] = l->grid[1] = l->grid[2] = 1;
  l->block[0] = 32;
  l->block[1] = l->block[2] = 1;
  l->nparams = 1;
  l->params = params;
  l->param_bytes = sizeof pdata;
  l->param_data = pdata;
  gd_program p = {.mode = GD_MODE_STAGED, .nslots = 3, .slots = slots, .nsteps = n, .steps = steps};
  uint8_t *enc;
  char err[256];
  if (gd_program_encode(&p, &enc, len, err, sizeof err) < 0) {
    fprintf(stderr, "fuzz_seeds: %s\n", err);
    exit(1);
  }
  return enc;
}

static void register_program(buf *b, int conn, const uint8_t *enc, size_t len, bool by_memfd) {
  Graphd__Wire__Request r = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterProgram p = GRAPHD__WIRE__REGISTER_PROGRAM__INIT;
  r.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_PROGRAM;
  r.register_program = &p;
  p.program_id.data = one_byte; /* 1 byte: the harness puts the hash */
  p.program_id.len = 1;
  if (by_memfd) {
    p.size = len;
    rec(b, conn, FD_MEMFD | SEAL_ALL << 2, (uint32_t)len, &r, enc, len);
  } else {
    p.encoding.data = (uint8_t *)enc;
    p.encoding.len = len;
    rec(b, conn, FD_NONE, 0, &r, NULL, 0);
  }
}

static void register_module(buf *b, int conn, uint32_t kind, const char *text, bool by_memfd) {
  Graphd__Wire__Request r = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterModule m = GRAPHD__WIRE__REGISTER_MODULE__INIT;
  r.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_MODULE;
  r.register_module = &m;
  m.module_id.data = one_byte;
  m.module_id.len = 1;
  m.kind = kind;
  size_t len = strlen(text);
  if (by_memfd) {
    m.size = len;
    rec(b, conn, FD_MEMFD | SEAL_ALL << 2, (uint32_t)len, &r, text, len);
  } else {
    m.inline_bytes.data = (uint8_t *)text;
    m.inline_bytes.len = len;
    rec(b, conn, FD_NONE, 0, &r, NULL, 0);
  }
}

static void gen_request(const char *dir) {
  buf b = {0};
  const uint32_t two[2] = {1, 2};
  const uint64_t base[2] = {256, 256};

  /* A data session as libgraphd runs one: flags, regions, replays of the
   * harness's program (and a refused one), its end. */
  put_u(&b, 0, 1);
  hello(&b, 0, true, 0);
  flags(&b, 0, 4);
  region(&b, 0, 4096, FD_MEMFD | SEAL_SHARED << 2);
  region(&b, 0, 4096, FD_MEMFD | SEAL_SHARED << 2);
  prepare(&b, 0, 0);
  replay(&b, 0, 0, 0, 1, 2, two, base);
  replay(&b, 0, 0, 1, 1, 2, two, base);
  replay(&b, 0, 0, 0, 2, 2, two, base);
  replay(&b, 0, 0, 0, 2, 2, two, base); /* seq not above the last */
  unregister(&b, 0, 2);
  replay(&b, 0, 0, 0, 3, 2, two, base); /* region 2 is gone */
  simple(&b, 0, GRAPHD__WIRE__REQUEST__BODY_STATUS);
  save(dir, "data_session", &b);

  /* A control session: ping, status, list, evict, registrations. */
  put_u(&b, 0, 1);
  hello(&b, 1, false, 0);
  simple(&b, 1, GRAPHD__WIRE__REQUEST__BODY_PING);
  simple(&b, 1, GRAPHD__WIRE__REQUEST__BODY_STATUS);
  simple(&b, 1, GRAPHD__WIRE__REQUEST__BODY_LIST_CAPTURES);
  evict(&b, 1, true, true, NULL);
  evict(&b, 1, false, false, "0123456789ab");
  register_module(&b, 1, 1, ".version 8.0\n.target sm_90\n.address_size 64\n", false);
  register_module(&b, 1, 1, ".version 8.0\n.target sm_90\n", true);
  save(dir, "control_session", &b);

  /* Programs registered inline and by memfd, prepared and replayed on
   * both devices, captures listed and evicted; with the budget. */
  size_t len1, len2;
  uint8_t *p1 = program(512, false, &len1), *p2 = program(1024, true, &len2);
  const uint64_t s1[2] = {512, 512}, s2[2] = {1024, 1024};
  put_u(&b, 1, 1);
  hello(&b, 0, true, 0);
  hello(&b, 1, true, 1);
  hello(&b, 2, false, 0);
  register_program(&b, 0, p1, len1, false);
  register_program(&b, 1, p2, len2, true);
  flags(&b, 0, 2);
  flags(&b, 1, 1);
  region(&b, 0, 512, FD_MEMFD | SEAL_SHARED << 2);
  region(&b, 0, 512, FD_MEMFD | SEAL_SHARED << 2);
  region(&b, 1, 1024, FD_MEMFD | SEAL_SHARED << 2);
  region(&b, 1, 1024, FD_MEMFD | SEAL_SHARED << 2);
  prepare(&b, 1, 1);
  replay(&b, 0, 0, 0, 1, 2, two, s1);
  replay(&b, 1, 1, 0, 1, 2, two, s2);
  replay(&b, 0, 0, 1, 1, 2, two, s1);
  simple(&b, 2, GRAPHD__WIRE__REQUEST__BODY_LIST_CAPTURES);
  evict(&b, 2, true, false, NULL);
  replay(&b, 1, 1, 0, 2, 2, two, s2);
  rec_close(&b, 0);
  simple(&b, 2, GRAPHD__WIRE__REQUEST__BODY_STATUS);
  save(dir, "programs_two_devices", &b);

  /* Refusals: a request before Hello, fds where none belong, bad memfds,
   * flags twice, a region over the per-uid cap, Hello twice, an fd the
   * request does not declare. */
  put_u(&b, 2, 1);
  simple(&b, 0, GRAPHD__WIRE__REQUEST__BODY_PING);
  hello(&b, 1, true, 1);
  region(&b, 1, 4096, FD_MEMFD | SEAL_NONE << 2);
  region(&b, 1, 4096, FD_MEMFD | SEAL_SHRINK << 2);
  region(&b, 1, 4096, FD_MEMFD | SEAL_ALL << 2);
  region(&b, 1, 4096, FD_PIPE);
  region(&b, 1, 4096, FD_TWO);
  region(&b, 1, 4096, FD_NONE | KEEP_NFDS);
  region(&b, 1, 1u << 20, FD_MEMFD | SEAL_SHARED << 2);
  region(&b, 1, 1u << 20, FD_MEMFD | SEAL_SHARED << 2);
  flags(&b, 1, 2);
  flags(&b, 1, 2);
  hello(&b, 1, true, 0);
  region(&b, 1, 4096, FD_MEMFD | KEEP_NFDS); /* declares no fd, sends one: the session closes */
  simple(&b, 1, GRAPHD__WIRE__REQUEST__BODY_PING);
  save(dir, "refusals", &b);

  free(p1);
  free(p2);
}

/* --- fuzz_region operations ------------------------------------------------- */

static void gen_region(const char *dir) {
  buf b = {0};
  /* Four slots: input staged 4 KiB, output staged 4 KiB, scratch, inout
   * unstaged (size class 12: 2^12 + 12). */
  put_u(&b, 3, 1);
  put_u(&b, 0 | 1 << 2 | 12 << 3, 1);
  put_u(&b, 1 | 1 << 2 | 12 << 3, 1);
  put_u(&b, 3 | 0 << 2 | 6 << 3, 1);
  put_u(&b, 2 | 0 << 2 | 12 << 3, 1);
  /* Imports: a good one, then the refusals (seals, kind, size). */
  uint64_t sz = (1u << 12) + 12;
  for (unsigned v = 0; v < 6; v++) {
    unsigned seals = v < 4 ? v : 0, kind = v == 4 ? 1 : 0;
    put_u(&b, 1, 1);
    put_u(&b, seals | kind << 2, 1);
    put_u(&b, 3 * sz, 4);
    put_u(&b, v == 5 ? 4 * sz : 2 * sz, 4);
  }
  put_u(&b, 1, 1); /* a second good import */
  put_u(&b, 0, 1);
  put_u(&b, 2 * sz, 4);
  put_u(&b, 2 * sz, 4);
  /* Ranges at the edges. */
  uint64_t ranges[][2] = {{0, 2 * sz}, {1, 2 * sz}, {2 * sz, 0}, {~0ull, 2}, {sz, ~0ull - 3}};
  for (unsigned i = 0; i < 5; i++) {
    put_u(&b, 4, 1);
    put_u(&b, i & 1, 1);
    put_u(&b, ranges[i][0], 8);
    put_u(&b, ranges[i][1], 8);
  }
  /* Bindings: slots 0 and 1 at the start and end of the two regions, then
   * the same with slot 3 too, then scratch bound, twice bound. */
  for (unsigned v = 0; v < 4; v++) {
    unsigned count = v == 1 ? 3 : 2;
    put_u(&b, 5, 1);
    put_u(&b, count, 1);
    put_u(&b, 0, 1); /* epoch */
    for (unsigned i = 0; i < count; i++) {
      unsigned slot = v == 2 && i == 1 ? 2 : v == 3 && i == 1 ? 0 : i == 2 ? 3 : i;
      put_u(&b, slot, 1);
      put_u(&b, i & 1, 1); /* region index */
      put_u(&b, 1 + i, 1); /* shape: offset % size, or the end */
      put_u(&b, 12345, 8); /* offset */
      put_u(&b, 0, 8);     /* bytes (the shape sets them) */
    }
  }
  /* Made-up regions near the top of the address space. */
  put_u(&b, 2, 1);
  put_u(&b, ~0ull - 100, 8);
  put_u(&b, 4096, 8);
  put_u(&b, 0, 1);
  put_u(&b, 4, 1);
  put_u(&b, 2, 1);
  put_u(&b, 4000, 8);
  put_u(&b, 96, 8);
  /* Flag pages: good, too small, unsealed, write-sealed. */
  for (unsigned v = 0; v < 4; v++) {
    put_u(&b, 6, 1);
    put_u(&b, v == 2 ? 1 : v == 3 ? 3 : 0, 1);
    put_u(&b, v == 1 ? 16 * 32 - 1 : 16 * 32, 4);
    put_u(&b, 15, 2); /* 16 slots */
  }
  /* memfd checks, out and the end. */
  put_u(&b, 0, 1);
  put_u(&b, 0 | 3 << 2, 1);
  put_u(&b, 4096, 4);
  put_u(&b, 4097, 4);
  put_u(&b, 3, 1);
  put_u(&b, 0, 1);
  save(dir, "imports_bindings", &b);
}

/* --- fuzz_ring inputs ---------------------------------------------------------
 * Byte 0: the ring's size (2 << (b % 6) entries) and, with 0x80, an order
 * group; byte 1: the tail; the entries; then the mutator's records. The
 * session has flag slots 0-3, programs 0 (slots 0 and 1 of 256 bytes) and
 * 1 (64 bytes), and regions 1-3 of 4 KiB. */

static void ring_entry(graphd_ring_sqe *e, uint64_t seq, uint32_t prog, uint32_t slot, uint32_t nb,
                       uint32_t region, uint64_t offset) {
  memset(e, 0, sizeof *e);
  e->seq = seq;
  e->program = prog;
  e->stream_slot = slot;
  e->nbindings = nb;
  e->order = (uint32_t)seq;
  uint64_t bytes = prog ? 64 : 256;
  for (uint32_t i = 0; i < nb && i < GRAPHD_RING_MAX_BINDINGS; i++)
    e->bindings[i] =
        (graphd_ring_binding){.slot = i, .region_id = region + i, .offset = offset, .bytes = bytes};
}

/* One mutator record: `n` bytes at `off` in slot `slot`. */
static void ring_record(buf *b, uint8_t slot, uint16_t off, const void *bytes, uint8_t n) {
  put_u(b, slot, 1);
  put_u(b, off, 2);
  put_u(b, n, 1);
  if (n) put(b, bytes, n);
}

static void gen_ring(const char *dir) {
  buf b = {0};
  graphd_ring_sqe e[8];
  /* Replays as libgraphd publishes them, then refusals: a range past the
   * region's end, an unknown region, an unknown handle, an old seq. */
  ring_entry(&e[0], 1, 0, 0, 2, 1, 0);
  ring_entry(&e[1], 1, 1, 1, 2, 2, 512);
  ring_entry(&e[2], 2, 0, 0, 2, 1, 4096 - 256);
  ring_entry(&e[3], 3, 0, 0, 2, 1, 4000);
  ring_entry(&e[4], 2, 1, 1, 2, 9, 0);
  ring_entry(&e[5], 4, 5, 0, 2, 1, 0);
  ring_entry(&e[6], 3, 0, 2, 2, 2, 0);
  ring_entry(&e[7], 1, 0, 0, 2, 1, 0);
  put_u(&b, 2, 1);
  put_u(&b, 8, 1);
  put(&b, e, sizeof e);
  save(dir, "replays", &b);

  /* The same in an order group, with the tail short of the entries. */
  put_u(&b, 0x82, 1);
  put_u(&b, 5, 1);
  put(&b, e, sizeof e);
  save(dir, "group", &b);

  /* A tail out of range: the ring is not read. */
  put_u(&b, 2, 1);
  put_u(&b, 200, 1);
  put(&b, e, sizeof e);
  save(dir, "tail_out_of_range", &b);

  /* An entry of 30 bindings: 20 here, 10 in the slot after it; and one
   * whose continuation slot is not published. */
  graphd_ring_sqe l[4];
  ring_entry(&l[0], 1, 0, 0, 2, 1, 0);
  ring_entry(&l[1], 2, 0, 0, 30, 1, 0);
  graphd_ring_cont *c = (graphd_ring_cont *)&l[2];
  memset(c, 0, sizeof *c);
  for (uint32_t i = 0; i < 10; i++)
    c->bindings[i] = (graphd_ring_binding){.slot = 20 + i, .region_id = 3, .bytes = 256};
  ring_entry(&l[3], 3, 0, 0, 25, 1, 0);
  put_u(&b, 1, 1); /* 4 entries */
  put_u(&b, 4, 1);
  put(&b, l, sizeof l);
  save(dir, "long_entries", &b);

  /* Replays while the mutator rewrites their fields: the binding count of
   * entry 0, the region and offset of entry 1's first binding, the handle
   * of entry 2, a continuation's worth of bindings over entry 3, and the
   * tail moved back and forth. */
  put_u(&b, 2, 1);
  put_u(&b, 8, 1);
  put(&b, e, sizeof e);
  uint32_t many = 4000, none = 0, region = 3, handle = 1;
  uint64_t far = 4090;
  ring_record(&b, 0, 16, &many, 4);
  ring_record(&b, 0, 16, &none, 4);
  ring_record(&b, 1, 32 + 4, &region, 4);
  ring_record(&b, 1, 32 + 8, &far, 8);
  ring_record(&b, 2, 8, &handle, 4);
  ring_record(&b, 3, 0, c, 200);
  ring_record(&b, 0xff, 0x00ff, NULL, 0); /* the tail back by one */
  ring_record(&b, 0xff, 0x0002, NULL, 0); /* ... on by two */
  save(dir, "racing", &b);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  char sub[512];
  snprintf(sub, sizeof sub, "%s/request", argv[1]);
  if (mkdir(sub, 0755) < 0 && errno != EEXIST) return 1;
  gen_request(sub);
  snprintf(sub, sizeof sub, "%s/region", argv[1]);
  if (mkdir(sub, 0755) < 0 && errno != EEXIST) return 1;
  gen_region(sub);
  snprintf(sub, sizeof sub, "%s/ring", argv[1]);
  if (mkdir(sub, 0755) < 0 && errno != EEXIST) return 1;
  gen_ring(sub);
  return 0;
}
