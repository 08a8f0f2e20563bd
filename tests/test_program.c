/* Programs and modules: the builder in libgraphd (client/lib/program.c),
 * the canonical encoding and its ids, a golden encoding, and the errors of
 * decoding (proto/program.c). The validator's errors on programs filled in
 * directly are in test_program_validate.c. */
#include <check.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphd/encoding.h"
#include "graphd/program.h"
#include "harness.h"

/* --- helpers ------------------------------------------------------------- */

static void sha256(const void *data, size_t len, uint8_t out[32]) {
  unsigned int n = 32;
  ck_assert(EVP_Digest(data, len, out, &n, EVP_sha256(), NULL));
}

/* Parses hex, ignoring whitespace, into a malloc'd buffer. */
static uint8_t *from_hex(const char *hex, size_t *len) {
  uint8_t *out = malloc(strlen(hex) / 2 + 1);
  size_t n = 0;
  int half = -1;
  for (const char *c = hex; *c; c++) {
    int v;
    if (*c >= '0' && *c <= '9')
      v = *c - '0';
    else if (*c >= 'a' && *c <= 'f')
      v = *c - 'a' + 10;
    else if (*c == ' ' || *c == '\n')
      continue;
    else
      ck_abort_msg("bad hex digit '%c'", *c);
    if (half < 0) {
      half = v;
    } else {
      out[n++] = (uint8_t)(half << 4 | v);
      half = -1;
    }
  }
  ck_assert_int_eq(half, -1);
  *len = n;
  return out;
}

#define ASSERT_MSG(msg, needle)                                                                    \
  ck_assert_msg(strstr((msg), (needle)) != NULL, "message \"%s\" lacks \"%s\"", (msg), (needle))

/* --- the golden program -------------------------------------------------- */

/* Derived by hand from the layout in docs/protocol.md ("Canonical
 * encodings"), not printed from the encoder. It pins the format for other
 * implementations (the Python builder). */
static const char golden_hex[] =
    /* magic "GDPG", version 1, mode staged, 2 slots, 3 steps */
    "47445047 01000000 00000000 02000000 03000000"
    /* slot 0: input, staged, 256 bytes */
    "00000000 01000000 0001000000000000"
    /* slot 1: scratch, unstaged, 64 bytes */
    "03000000 00000000 4000000000000000"
    /* step 0: launch */
    "01000000"
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f" /* module id */
    "06000000 7363616c6532"                                            /* "scale2" */
    "02000000 01000000 01000000"                                       /* grid 2,1,1 */
    "80000000 01000000 01000000"                                       /* block 128,1,1 */
    "00000000"                                                         /* shared bytes */
    "02000000 00000000 04000000 08000000 08000000"                     /* params (0,4) (8,8) */
    "10000000 44332211 00000000 0000000000000000"                      /* 16 parameter bytes */
    "01000000 08000000 00000000 1000000000000000" /* patch: offset 8 -> slot 0 + 16 */
    /* step 1: memset slot 1, element 4, value 0xdeadbeef, offset 0, 64 bytes */
    "02000000 01000000 04000000 efbeadde 0000000000000000 4000000000000000"
    /* step 2: copy to slot 1 at 8 from slot 0 at 0, 32 bytes */
    "03000000 01000000 00000000 0800000000000000 0000000000000000 2000000000000000";

/* SHA-256 of the bytes above, computed apart from graphd. */
static const char golden_id_hex[] =
    "ae2877ca7e5b3c71da9a23652fe136e43f26b98373b3fb091d2f58bd31494c5d";

/* Byte offsets of fields in the golden encoding. */
enum {
  G_VERSION = 4,
  G_MODE = 8,
  G_NSLOTS = 12,
  G_STEP0 = 52,
  G_NLEN = 88,
  G_NAME = 92,
  G_NPARAMS = 126,
  G_PARAM_BYTES = 146,
  G_NPATCHES = 166,
  G_STEP1 = 186,
  G_STEP2 = 218,
  G_LEN = 254,
};

static graphd_program *build_golden(void) {
  uint8_t module[32];
  for (int i = 0; i < 32; i++) module[i] = (uint8_t)i;
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, 256, 1), 0);
  ck_assert_int_eq(graphd_program_add_slot(p, GRAPHD_SLOT_SCRATCH, 64, 0), 1);
  const uint32_t grid[3] = {2, 1, 1}, block[3] = {128, 1, 1};
  ck_assert_int_eq(graphd_program_add_launch(p, module, "scale2", grid, block, 0), 0);
  /* Declared out of order on purpose: finish sorts. */
  ck_assert_int_eq(graphd_program_param_slot(p, 0, 8, 0, 16), GRAPHD_OK);
  uint32_t v = 0x11223344;
  ck_assert_int_eq(graphd_program_param(p, 0, 0, &v, 4), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_add_memset(p, 1, 0, 64, 4, 0xdeadbeef), 1);
  ck_assert_int_eq(graphd_program_add_copy(p, 1, 8, 0, 0, 32), 2);
  return p;
}

/* The golden encoding as a mutable copy. */
static uint8_t *golden(size_t *len) {
  uint8_t *b = from_hex(golden_hex, len);
  ck_assert_uint_eq(*len, G_LEN);
  return b;
}

static void put_u32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}

START_TEST(test_program_golden_encoding_is_pinned) {
  size_t glen;
  uint8_t *want = golden(&glen);
  graphd_program *p = build_golden();
  uint8_t id[32];
  ck_assert_int_eq(graphd_program_finish(p, id), GRAPHD_OK);
  const uint8_t *enc;
  size_t len;
  ck_assert_int_eq(graphd_program_encoding(p, &enc, &len), GRAPHD_OK);
  ck_assert_uint_eq(len, glen);
  for (size_t i = 0; i < len; i++)
    ck_assert_msg(enc[i] == want[i], "byte %zu is 0x%02x, want 0x%02x", i, enc[i], want[i]);
  char hex[65];
  graphd_id_hex(id, hex);
  ck_assert_str_eq(hex, golden_id_hex);
  graphd_program_free(p);
  free(want);
}
END_TEST

START_TEST(test_program_golden_decodes_to_its_fields) {
  size_t len;
  uint8_t *b = golden(&len);
  gd_program *g;
  char err[256] = "";
  ck_assert_msg(gd_program_decode(b, len, &g, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(g->mode, GD_MODE_STAGED);
  ck_assert_uint_eq(g->nslots, 2);
  ck_assert_uint_eq(g->slots[0].size, 256);
  ck_assert_uint_eq(g->slots[1].role, GD_ROLE_SCRATCH);
  ck_assert_uint_eq(g->nsteps, 3);
  const gd_launch *l = &g->steps[0].u.launch;
  ck_assert_str_eq(l->name, "scale2");
  ck_assert_uint_eq(l->nparams, 2);
  ck_assert_uint_eq(l->param_bytes, 16);
  ck_assert_uint_eq(l->npatches, 1);
  ck_assert_uint_eq(l->patches[0].slot_offset, 16);
  ck_assert_uint_eq(g->steps[1].u.memset.value, 0xdeadbeef);
  ck_assert_uint_eq(g->steps[2].u.copy.dst_offset, 8);
  char hex[65];
  gd_id_hex(g->id, 0, hex);
  ck_assert_str_eq(hex, golden_id_hex);
  gd_program_free(g);
  free(b);
}
END_TEST

/* --- identity ------------------------------------------------------------ */

enum change {
  SAME,
  PARAM_ORDER,
  SLOT_SIZE,
  ROLE,
  STAGED,
  MODE,
  GRID,
  BLOCK,
  SHARED,
  PARAM_BYTE,
  PATCH_SLOT_OFFSET,
  PATCH_SLOT,
  FUNCTION,
  MODULE_ID,
  MEMSET_VALUE,
  COPY_BYTES,
  STEP_ORDER,
  NCHANGES,
};

/* A program with a struct parameter holding a pointer, built with one
 * change applied. Returns the encoding (malloc'd) and the id. */
static uint8_t *build_variant(enum change c, uint8_t id[32], size_t *len) {
  uint8_t module[32];
  memset(module, 0x5a, sizeof module);
  if (c == MODULE_ID) module[31] ^= 1;
  graphd_program *p = graphd_program_new(c == MODE ? GRAPHD_MODE_STAGED_EX : GRAPHD_MODE_STAGED);
  ck_assert_ptr_nonnull(p);
  graphd_program_add_slot(p, c == ROLE ? GRAPHD_SLOT_INOUT : GRAPHD_SLOT_INPUT,
                          c == SLOT_SIZE ? 4097 : 4096, c == STAGED ? 0 : 1);
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, 4096, 1);
  uint32_t grid[3] = {c == GRID ? 9 : 8, 1, 1}, block[3] = {256, c == BLOCK ? 2 : 1, 1};
  if (c == STEP_ORDER) graphd_program_add_memset(p, 1, 0, 4096, 4, c == MEMSET_VALUE ? 1 : 0);
  int s = graphd_program_add_launch(p, module, c == FUNCTION ? "scale3" : "scale2", grid, block,
                                    c == SHARED ? 16 : 0);
  ck_assert_int_ge(s, 0);
  float scale = c == PARAM_BYTE ? 2.5f : 2.0f;
  struct {
    uint64_t ptr;
    uint32_t n, pad;
  } args = {0, 1024, 0};
  if (c == PARAM_ORDER) {
    ck_assert_int_eq(graphd_program_param(p, (uint32_t)s, 32, &scale, 4), GRAPHD_OK);
    ck_assert_int_eq(graphd_program_param(p, (uint32_t)s, 8, &args, 16), GRAPHD_OK);
    ck_assert_int_eq(graphd_program_patch(p, (uint32_t)s, 8, 0, 0), GRAPHD_OK);
    ck_assert_int_eq(graphd_program_param_slot(p, (uint32_t)s, 24, c == PATCH_SLOT ? 0 : 1, 0),
                     GRAPHD_OK);
    ck_assert_int_eq(
        graphd_program_param_slot(p, (uint32_t)s, 0, 0, c == PATCH_SLOT_OFFSET ? 8 : 0), GRAPHD_OK);
  } else {
    ck_assert_int_eq(
        graphd_program_param_slot(p, (uint32_t)s, 0, 0, c == PATCH_SLOT_OFFSET ? 8 : 0), GRAPHD_OK);
    ck_assert_int_eq(graphd_program_param(p, (uint32_t)s, 8, &args, 16), GRAPHD_OK);
    ck_assert_int_eq(graphd_program_patch(p, (uint32_t)s, 8, 0, 0), GRAPHD_OK);
    ck_assert_int_eq(graphd_program_param_slot(p, (uint32_t)s, 24, c == PATCH_SLOT ? 0 : 1, 0),
                     GRAPHD_OK);
    ck_assert_int_eq(graphd_program_param(p, (uint32_t)s, 32, &scale, 4), GRAPHD_OK);
  }
  if (c != STEP_ORDER) graphd_program_add_memset(p, 1, 0, 4096, 4, c == MEMSET_VALUE ? 1 : 0);
  graphd_program_add_copy(p, 1, 0, 0, 0, c == COPY_BYTES ? 1024 : 2048);
  ck_assert_msg(graphd_program_finish(p, id) == GRAPHD_OK, "%s", graphd_program_error(p));
  const uint8_t *enc;
  ck_assert_int_eq(graphd_program_encoding(p, &enc, len), GRAPHD_OK);
  uint8_t *copy = malloc(*len);
  memcpy(copy, enc, *len);
  graphd_program_free(p);
  return copy;
}

START_TEST(test_program_same_program_twice_gives_same_bytes_and_id) {
  uint8_t id1[32], id2[32];
  size_t len1, len2;
  uint8_t *a = build_variant(SAME, id1, &len1);
  uint8_t *b = build_variant(SAME, id2, &len2);
  ck_assert_uint_eq(len1, len2);
  ck_assert_mem_eq(a, b, len1);
  ck_assert_mem_eq(id1, id2, 32);
  free(a);
  free(b);
}
END_TEST

START_TEST(test_program_param_order_does_not_change_the_id) {
  uint8_t id1[32], id2[32];
  size_t len1, len2;
  uint8_t *a = build_variant(SAME, id1, &len1);
  uint8_t *b = build_variant(PARAM_ORDER, id2, &len2);
  ck_assert_uint_eq(len1, len2);
  ck_assert_mem_eq(a, b, len1);
  ck_assert_mem_eq(id1, id2, 32);
  free(a);
  free(b);
}
END_TEST

START_TEST(test_program_any_single_change_gives_a_different_id) {
  static const char *const names[NCHANGES] = {"same",
                                              "param order",
                                              "slot size",
                                              "role",
                                              "staged",
                                              "mode",
                                              "grid",
                                              "block",
                                              "shared",
                                              "param byte",
                                              "patch slot offset",
                                              "patch slot",
                                              "function",
                                              "module id",
                                              "memset value",
                                              "copy bytes",
                                              "step order"};
  uint8_t ids[NCHANGES][32];
  for (int c = 0; c < NCHANGES; c++) {
    size_t len;
    free(build_variant((enum change)c, ids[c], &len));
  }
  for (int a = 0; a < NCHANGES; a++)
    for (int b = a + 1; b < NCHANGES; b++) {
      if (a == SAME && b == PARAM_ORDER) continue;
      int a2 = a == PARAM_ORDER ? SAME : a;
      ck_assert_msg(memcmp(ids[a2], ids[b], 32) != 0, "'%s' and '%s' give the same id", names[a],
                    names[b]);
    }
}
END_TEST

START_TEST(test_program_id_is_sha256_of_the_encoding) {
  uint8_t id[32], want[32];
  size_t len;
  uint8_t *enc = build_variant(SAME, id, &len);
  sha256(enc, len, want);
  ck_assert_mem_eq(id, want, 32);
  free(enc);
}
END_TEST

START_TEST(test_program_decode_encode_round_trips) {
  uint8_t id[32];
  size_t len;
  uint8_t *enc = build_variant(SAME, id, &len);
  gd_program *g;
  char err[256] = "";
  ck_assert_msg(gd_program_decode(enc, len, &g, err, sizeof err) == 0, "%s", err);
  ck_assert_mem_eq(g->id, id, 32);
  uint8_t *again;
  size_t len2;
  ck_assert_msg(gd_program_encode(g, &again, &len2, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(len2, len);
  ck_assert_mem_eq(again, enc, len);
  ck_assert_mem_eq(g->id, id, 32);
  free(again);
  gd_program_free(g);
  free(enc);
}
END_TEST

START_TEST(test_program_patch_zeroes_the_bytes_under_it) {
  uint8_t module[32] = {1};
  const uint32_t grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_INOUT, 1024, 1);
  int s = graphd_program_add_launch(p, module, "k", grid, block, 0);
  /* A 4-byte scalar, then a 24-byte struct at 8 whose second and third
   * fields are pointers (absolute offsets 16 and 24). */
  uint32_t n = 7;
  uint8_t st[24];
  memset(st, 0xff, sizeof st);
  ck_assert_int_eq(graphd_program_param(p, (uint32_t)s, 0, &n, 4), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_param(p, (uint32_t)s, 8, st, 24), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_patch(p, (uint32_t)s, 24, 0, 512), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_patch(p, (uint32_t)s, 16, 0, 0), GRAPHD_OK);
  ck_assert_msg(graphd_program_finish(p, NULL) == GRAPHD_OK, "%s", graphd_program_error(p));
  const uint8_t *enc;
  size_t len;
  ck_assert_int_eq(graphd_program_encoding(p, &enc, &len), GRAPHD_OK);
  gd_program *g;
  char err[256];
  ck_assert_int_eq(gd_program_decode(enc, len, &g, err, sizeof err), 0);
  const gd_launch *l = &g->steps[0].u.launch;
  ck_assert_uint_eq(l->param_bytes, 32);
  static const uint8_t want[32] = {7,    0,    0,    0,    0,    0,    0,    0,
                                   0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  ck_assert_mem_eq(l->param_data, want, 32);
  ck_assert_uint_eq(l->npatches, 2);
  ck_assert_uint_eq(l->patches[0].offset, 16);
  ck_assert_uint_eq(l->patches[1].offset, 24);
  ck_assert_uint_eq(l->patches[1].slot_offset, 512);
  gd_program_free(g);
  graphd_program_free(p);
}
END_TEST

/* --- builder errors ------------------------------------------------------ */

static const uint8_t any_module[32] = {0x42};
static const uint32_t grid1[3] = {1, 1, 1}, block32[3] = {32, 1, 1};

/* A builder with an input and an output slot of 256 bytes and one launch
 * "scale2" (step 0) with no parameters. */
static graphd_program *small(void) {
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  ck_assert_int_eq(graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, 256, 1), 0);
  ck_assert_int_eq(graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, 256, 1), 1);
  ck_assert_int_eq(graphd_program_add_launch(p, any_module, "scale2", grid1, block32, 0), 0);
  return p;
}

#define EXPECT_FAIL(p, call, status, needle)                                                       \
  do {                                                                                             \
    ck_assert_int_eq((call), (status));                                                            \
    ASSERT_MSG(graphd_program_error(p), needle);                                                   \
  } while (0)

#define EXPECT_NEG(p, call, needle)                                                                \
  do {                                                                                             \
    ck_assert_int_eq((call), -1);                                                                  \
    ASSERT_MSG(graphd_program_error(p), needle);                                                   \
  } while (0)

START_TEST(test_program_builder_refuses_a_parameter_twice_at_one_offset) {
  graphd_program *p = small();
  uint64_t v = 1;
  ck_assert_int_eq(graphd_program_param(p, 0, 8, &v, 8), GRAPHD_OK);
  EXPECT_FAIL(p, graphd_program_param(p, 0, 8, &v, 8), GRAPHD_INVALID_ARGUMENT,
              "step 0 (launch scale2): parameter at offset 8 (size 8) overlaps the parameter at "
              "offset 8 (size 8)");
  EXPECT_FAIL(p, graphd_program_param(p, 0, 4, &v, 8), GRAPHD_INVALID_ARGUMENT,
              "parameter at offset 4 (size 8) overlaps the parameter at offset 8");
  EXPECT_FAIL(p, graphd_program_param_slot(p, 0, 8, 0, 0), GRAPHD_INVALID_ARGUMENT,
              "parameter at offset 8 (size 8) overlaps");
  /* Adjacent is fine. */
  ck_assert_int_eq(graphd_program_param(p, 0, 4, &v, 4), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_param(p, 0, 16, &v, 8), GRAPHD_OK);
  graphd_program_free(p);
}
END_TEST

START_TEST(test_program_builder_refuses_bad_parameters) {
  graphd_program *p = small();
  static uint8_t big[GD_MAX_PARAM_BYTES];
  EXPECT_FAIL(p, graphd_program_param(p, 0, 0, big, 0), GRAPHD_INVALID_ARGUMENT,
              "step 0 (launch scale2): parameter at offset 0 has size 0");
  EXPECT_FAIL(p, graphd_program_param(p, 0, 8, big, GD_MAX_PARAM_BYTES - 7),
              GRAPHD_RESOURCE_EXHAUSTED,
              td_fmt("parameter at offset 8 (size %u) ends past the limit of %u parameter bytes",
                     GD_MAX_PARAM_BYTES - 7, GD_MAX_PARAM_BYTES));
  EXPECT_FAIL(p, graphd_program_param(p, 0, UINT32_MAX, big, 2), GRAPHD_RESOURCE_EXHAUSTED,
              "ends past the limit");
  ck_assert_int_eq(graphd_program_param(p, 0, 0, big, 4096), GRAPHD_OK);
  EXPECT_FAIL(p, graphd_program_param(p, 3, 0, big, 4), GRAPHD_INVALID_ARGUMENT,
              "step 3 does not exist; there are 1 steps");
  ck_assert_int_eq(graphd_program_add_memset(p, 0, 0, 16, 1, 0), 1);
  EXPECT_FAIL(p, graphd_program_param(p, 1, 0, big, 4), GRAPHD_INVALID_ARGUMENT,
              "step 1 (memset): only a launch has parameters");
  EXPECT_FAIL(p, graphd_program_patch(p, 1, 0, 0, 0), GRAPHD_INVALID_ARGUMENT,
              "step 1 (memset): only a launch has parameters");
  graphd_program_free(p);
}
END_TEST

START_TEST(test_program_builder_caps_parameters_and_patches) {
  graphd_program *p = small();
  uint8_t b = 1;
  for (uint32_t k = 0; k < GD_MAX_PARAMS; k++)
    ck_assert_int_eq(graphd_program_param(p, 0, k, &b, 1), GRAPHD_OK);
  EXPECT_FAIL(p, graphd_program_param(p, 0, GD_MAX_PARAMS + 72, &b, 1), GRAPHD_RESOURCE_EXHAUSTED,
              td_fmt("parameter at offset %u is over the limit of %u parameters",
                     GD_MAX_PARAMS + 72, GD_MAX_PARAMS));
  graphd_program_free(p);

  p = small();
  static uint8_t zeros[8 * (GD_MAX_PATCHES + 1)];
  ck_assert_int_eq(graphd_program_param(p, 0, 0, zeros, sizeof zeros), GRAPHD_OK);
  for (uint32_t k = 0; k < GD_MAX_PATCHES; k++)
    ck_assert_int_eq(graphd_program_patch(p, 0, 8 * k, 0, 0), GRAPHD_OK);
  EXPECT_FAIL(p, graphd_program_patch(p, 0, 8 * GD_MAX_PATCHES, 0, 0), GRAPHD_RESOURCE_EXHAUSTED,
              td_fmt("patch at offset %u is over the limit of %u patches", 8 * GD_MAX_PATCHES,
                     GD_MAX_PATCHES));
  ck_assert_msg(graphd_program_finish(p, NULL) != GRAPHD_OK, "a refused patch must fail finish");
  graphd_program_free(p);
}
END_TEST

START_TEST(test_program_builder_refuses_bad_patches) {
  graphd_program *p = small();
  uint8_t st[16] = {0};
  ck_assert_int_eq(graphd_program_param(p, 0, 16, st, 16), GRAPHD_OK);
  EXPECT_FAIL(p, graphd_program_patch(p, 0, 20, 0, 0), GRAPHD_INVALID_ARGUMENT,
              "step 0 (launch scale2): patch at offset 20 is not 8-byte aligned");
  EXPECT_FAIL(p, graphd_program_patch(p, 0, 32, 0, 0), GRAPHD_INVALID_ARGUMENT,
              "patch at offset 32 does not lie inside one declared parameter");
  EXPECT_FAIL(p, graphd_program_patch(p, 0, 0, 0, 0), GRAPHD_INVALID_ARGUMENT,
              "patch at offset 0 does not lie inside one declared parameter");
  EXPECT_FAIL(p, graphd_program_patch(p, 0, 16, 2, 0), GRAPHD_INVALID_ARGUMENT,
              "patch at offset 16 names slot 2; there are 2 slots");
  EXPECT_FAIL(p, graphd_program_patch(p, 0, 16, 1, 256), GRAPHD_INVALID_ARGUMENT,
              "patch at offset 16 points 256 bytes into slot 1, which has 256");
  ck_assert_int_eq(graphd_program_patch(p, 0, 16, 1, 255), GRAPHD_OK);
  EXPECT_FAIL(p, graphd_program_patch(p, 0, 16, 0, 0), GRAPHD_INVALID_ARGUMENT,
              "there is already a patch at offset 16");
  EXPECT_FAIL(p, graphd_program_param_slot(p, 0, 4, 0, 0), GRAPHD_INVALID_ARGUMENT,
              "patch at offset 4 is not 8-byte aligned");
  EXPECT_FAIL(p, graphd_program_param_slot(p, 0, 40, 7, 0), GRAPHD_INVALID_ARGUMENT,
              "patch at offset 40 names slot 7");
  /* The refused param_slot left no parameter behind at 40. */
  ck_assert_int_eq(graphd_program_param(p, 0, 40, st, 8), GRAPHD_OK);
  /* Two 4-byte parameters side by side are not one parameter. */
  ck_assert_int_eq(graphd_program_param(p, 0, 48, st, 4), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_param(p, 0, 52, st, 4), GRAPHD_OK);
  EXPECT_FAIL(p, graphd_program_patch(p, 0, 48, 0, 0), GRAPHD_INVALID_ARGUMENT,
              "patch at offset 48 does not lie inside one declared parameter");
  graphd_program_free(p);
}
END_TEST

START_TEST(test_program_builder_refuses_bad_slots) {
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  EXPECT_NEG(p, graphd_program_add_slot(p, (graphd_slot_role)5, 16, 1),
             "slot 0: role 5 is not input, output, inout, scratch or temp");
  EXPECT_NEG(p, graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, 0, 1), "slot 0: size 0 is invalid");
  EXPECT_NEG(p, graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, GD_MAX_SLOT_BYTES + 1, 1),
             "slot 0: 1099511627777 bytes is over the limit of 1099511627776");
  EXPECT_NEG(p, graphd_program_add_slot(p, GRAPHD_SLOT_SCRATCH, 16, 1),
             "slot 0: a scratch slot belongs to graphd and cannot be staged");
  EXPECT_NEG(p, graphd_program_add_slot(p, GRAPHD_SLOT_TEMP, 16, 1),
             "slot 0: a temp slot belongs to graphd and cannot be staged");
  ck_assert_int_eq(graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, GD_MAX_SLOT_BYTES, 0), 0);
  for (int s = 1; s < (int)GD_MAX_SLOTS; s++)
    ck_assert_int_eq(graphd_program_add_slot(p, GRAPHD_SLOT_SCRATCH, 8, 0), s);
  EXPECT_NEG(p, graphd_program_add_slot(p, GRAPHD_SLOT_SCRATCH, 8, 0),
             td_fmt("slot %u: over the limit of %u slots", GD_MAX_SLOTS, GD_MAX_SLOTS));
  graphd_program_free(p);
}
END_TEST

START_TEST(test_program_builder_refuses_bad_launches) {
  graphd_program *p = small();
  char longname[300];
  memset(longname, 'a', sizeof longname);
  longname[256] = '\0';
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "", grid1, block32, 0),
             "step 1 (launch): the function name is empty");
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, longname, grid1, block32, 0),
             "step 1 (launch): the function name is longer than 255 bytes");
  longname[255] = '\0';
  ck_assert_int_eq(graphd_program_add_launch(p, any_module, longname, grid1, block32, 0), 1);
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "bad name", grid1, block32, 0),
             "step 2 (launch): the function name has a byte 0x20 that is not printable ASCII");
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "bad\x80", grid1, block32, 0),
             "byte 0x80 that is not printable ASCII");
  EXPECT_NEG(p, graphd_program_add_launch(p, NULL, "k", grid1, block32, 0),
             "step 2 (launch): the module id is NULL");
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, NULL, grid1, block32, 0),
             "the function name is NULL");

  const uint32_t g0[3] = {0, 1, 1}, gx[3] = {0x80000000u, 1, 1}, gy[3] = {1, 65536, 1},
                 gz[3] = {1, 1, 0}, bx[3] = {1025, 1, 1}, by[3] = {1, 0, 1}, bz[3] = {1, 1, 65},
                 bt[3] = {32, 32, 2}, ok[3] = {0x7fffffffu, 65535, 65535}, bok[3] = {16, 1, 64};
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "k", g0, block32, 0),
             "step 2 (launch k): grid.x is 0; it must be 1 to 2147483647");
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "k", gx, block32, 0),
             "grid.x is 2147483648; it must be 1 to 2147483647");
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "k", gy, block32, 0),
             "grid.y is 65536; it must be 1 to 65535");
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "k", gz, block32, 0),
             "grid.z is 0; it must be 1 to 65535");
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "k", grid1, bx, 0),
             "block.x is 1025; it must be 1 to 1024");
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "k", grid1, by, 0),
             "block.y is 0; it must be 1 to 1024");
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "k", grid1, bz, 0),
             "block.z is 65; it must be 1 to 64");
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "k", grid1, bt, 0),
             "step 2 (launch k): block has 2048 threads; the limit is 1024");
  EXPECT_NEG(p,
             graphd_program_add_launch(p, any_module, "k", grid1, block32, GD_MAX_SHARED_BYTES + 1),
             "232449 bytes of dynamic shared memory is over the limit of 232448");
  ck_assert_int_eq(graphd_program_add_launch(p, any_module, "k", ok, bok, GD_MAX_SHARED_BYTES), 2);
  graphd_program_free(p);
}
END_TEST

START_TEST(test_program_builder_refuses_bad_memsets_and_copies) {
  graphd_program *p = small();
  EXPECT_NEG(p, graphd_program_add_memset(p, 0, 0, 16, 3, 0),
             "step 1 (memset): element_size 3 is not 1, 2 or 4");
  EXPECT_NEG(p, graphd_program_add_memset(p, 0, 2, 16, 4, 0),
             "step 1 (memset): offset 2 and bytes 16 must be multiples of the element size 4");
  EXPECT_NEG(p, graphd_program_add_memset(p, 0, 0, 6, 4, 0),
             "offset 0 and bytes 6 must be multiples");
  EXPECT_NEG(p, graphd_program_add_memset(p, 0, 0, 0, 1, 0), "bytes non-zero");
  EXPECT_NEG(p, graphd_program_add_memset(p, 0, 0, 16, 1, 0x100),
             "step 1 (memset): value 0x100 does not fit in 1 byte(s)");
  EXPECT_NEG(p, graphd_program_add_memset(p, 0, 0, 16, 2, 0x10000),
             "value 0x10000 does not fit in 2");
  EXPECT_NEG(p, graphd_program_add_memset(p, 2, 0, 16, 1, 0),
             "step 1 (memset): slot 2 does not exist; there are 2 slots");
  EXPECT_NEG(p, graphd_program_add_memset(p, 1, 128, 132, 4, 0),
             "step 1 (memset): 132 bytes at offset 128 are outside slot 1, which has 256");
  EXPECT_NEG(p, graphd_program_add_memset(p, 1, UINT64_MAX - 3, 4, 4, 0), "are outside slot 1");
  ck_assert_int_eq(graphd_program_add_memset(p, 1, 128, 128, 4, 0xffffffffu), 1);

  EXPECT_NEG(p, graphd_program_add_copy(p, 1, 0, 0, 0, 0), "step 2 (copy): bytes is 0");
  EXPECT_NEG(p, graphd_program_add_copy(p, 1, 200, 0, 0, 57),
             "step 2 (copy): 57 bytes at offset 200 are outside slot 1, which has 256");
  EXPECT_NEG(p, graphd_program_add_copy(p, 1, 0, 0, 255, 2),
             "2 bytes at offset 255 are outside slot 0");
  EXPECT_NEG(p, graphd_program_add_copy(p, 1, 0, 9, 0, 2),
             "step 2 (copy): slot 9 does not exist; there are 2 slots");
  EXPECT_NEG(p, graphd_program_add_copy(p, 0, 64, 0, 0, 65),
             "step 2 (copy): source and destination overlap in slot 0");
  EXPECT_NEG(p, graphd_program_add_copy(p, 0, 0, 0, 64, 65), "overlap in slot 0");
  ck_assert_int_eq(graphd_program_add_copy(p, 0, 64, 0, 0, 64), 2);
  graphd_program_free(p);
}
END_TEST

START_TEST(test_program_builder_caps_steps) {
  graphd_program *p = small();
  for (uint32_t i = 1; i < GD_MAX_STEPS; i++)
    ck_assert_int_eq(graphd_program_add_memset(p, 0, 0, 4, 4, i), (int)i);
  EXPECT_NEG(p, graphd_program_add_memset(p, 0, 0, 4, 4, 0),
             td_fmt("step %u (memset): over the limit of %u steps", GD_MAX_STEPS, GD_MAX_STEPS));
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "k", grid1, block32, 0),
             td_fmt("over the limit of %u steps", GD_MAX_STEPS));
  graphd_program_free(p);
}
END_TEST

START_TEST(test_program_finish_reports_the_first_failed_call) {
  graphd_program *p = small();
  uint32_t v = 0;
  ck_assert_int_eq(graphd_program_param(p, 0, 0, &v, 4), GRAPHD_OK);
  EXPECT_FAIL(p, graphd_program_param(p, 0, 0, &v, 4), GRAPHD_INVALID_ARGUMENT, "overlaps");
  EXPECT_NEG(p, graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, 0, 1), "size 0 is invalid");
  /* The program is complete and valid as it stands, but a call failed. */
  EXPECT_FAIL(p, graphd_program_finish(p, NULL), GRAPHD_INVALID_ARGUMENT,
              "an earlier call failed: step 0 (launch scale2): parameter at offset 0 (size 4) "
              "overlaps");
  const uint8_t *enc;
  size_t len;
  EXPECT_FAIL(p, graphd_program_encoding(p, &enc, &len), GRAPHD_FAILED_PRECONDITION,
              "no encoding until graphd_program_finish() succeeds");
  graphd_program_free(p);
}
END_TEST

START_TEST(test_program_finish_runs_the_validator) {
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  ck_assert_str_eq(graphd_program_error(p), "");
  EXPECT_FAIL(p, graphd_program_finish(p, NULL), GRAPHD_INVALID_ARGUMENT,
              "the program has no steps");
  graphd_program_free(p);

  p = graphd_program_new((graphd_mode)5);
  graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, 16, 1);
  graphd_program_add_memset(p, 0, 0, 16, 1, 0);
  EXPECT_FAIL(p, graphd_program_finish(p, NULL), GRAPHD_INVALID_ARGUMENT,
              "mode 5 is not staged (0), staged_ex (1), direct (2) or auto (3)");
  graphd_program_free(p);
}
END_TEST

START_TEST(test_program_finish_refuses_an_encoding_over_the_cap) {
  /* Enough launches with the most parameter bytes encode to over the cap. */
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  static uint8_t params[GD_MAX_PARAM_BYTES];
  for (uint32_t i = 0; i < GD_MAX_PROGRAM_BYTES / GD_MAX_PARAM_BYTES + 16; i++) {
    ck_assert_int_eq(graphd_program_add_launch(p, any_module, "k", grid1, block32, 0), (int)i);
    ck_assert_int_eq(graphd_program_param(p, i, 0, params, sizeof params), GRAPHD_OK);
  }
  EXPECT_FAIL(p, graphd_program_finish(p, NULL), GRAPHD_RESOURCE_EXHAUSTED,
              td_fmt("over the limit of %u", GD_MAX_PROGRAM_BYTES));
  graphd_program_free(p);
}
END_TEST

START_TEST(test_program_finished_program_is_frozen) {
  graphd_program *p = small();
  uint8_t id1[32], id2[32];
  ck_assert_int_eq(graphd_program_finish(p, id1), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_finish(p, id2), GRAPHD_OK);
  ck_assert_mem_eq(id1, id2, 32);
  const uint8_t *enc;
  size_t len;
  ck_assert_int_eq(graphd_program_encoding(p, &enc, &len), GRAPHD_OK);
  uint8_t want[32];
  sha256(enc, len, want);
  ck_assert_mem_eq(id1, want, 32);
  EXPECT_NEG(p, graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, 16, 1),
             "the program is finished and can no longer change");
  EXPECT_NEG(p, graphd_program_add_memset(p, 0, 0, 16, 1, 0), "finished");
  EXPECT_NEG(p, graphd_program_add_copy(p, 1, 0, 0, 0, 16), "finished");
  EXPECT_NEG(p, graphd_program_add_launch(p, any_module, "k", grid1, block32, 0), "finished");
  uint32_t v = 0;
  EXPECT_FAIL(p, graphd_program_param(p, 0, 0, &v, 4), GRAPHD_FAILED_PRECONDITION, "finished");
  EXPECT_FAIL(p, graphd_program_param_slot(p, 0, 0, 0, 0), GRAPHD_FAILED_PRECONDITION, "finished");
  /* Still the same program. */
  ck_assert_int_eq(graphd_program_finish(p, id2), GRAPHD_OK);
  ck_assert_mem_eq(id1, id2, 32);
  graphd_program_free(p);
  graphd_program_free(NULL);
}
END_TEST

/* --- decoding errors ----------------------------------------------------- */

#define INVALID GRAPHD_INVALID_ARGUMENT
#define EXHAUSTED GRAPHD_RESOURCE_EXHAUSTED

static void decode_expect(const uint8_t *b, size_t len, int status, const char *needle) {
  gd_program *g = (gd_program *)1;
  char err[512] = "";
  int rc = gd_program_decode(b, len, &g, err, sizeof err);
  ck_assert_msg(rc == -status, "rc %d (want %d), message \"%s\" (want \"%s\")", rc, -status, err,
                needle);
  ck_assert_ptr_null(g);
  ASSERT_MSG(err, needle);
}

START_TEST(test_decode_header_errors) {
  size_t len;
  uint8_t *b = golden(&len);
  b[0] ^= 1;
  decode_expect(b, len, INVALID, "not a graphd program encoding (bad magic)");
  b[0] ^= 1;
  b[G_VERSION] = 2;
  decode_expect(b, len, INVALID, "program encoding version 2 is not supported (want 1)");
  b[G_VERSION] = 1;
  put_u32(b + G_NSLOTS, GD_MAX_SLOTS + 1);
  decode_expect(b, len, EXHAUSTED,
                td_fmt("%u slots and 3 steps exceed the limits of %u and %u", GD_MAX_SLOTS + 1,
                       GD_MAX_SLOTS, GD_MAX_STEPS));
  put_u32(b + G_NSLOTS, 2);
  b[G_MODE] = 4;
  decode_expect(b, len, INVALID, "mode 4 is not staged (0), staged_ex (1), direct (2) or auto (3)");
  b[G_MODE] = 0;
  uint8_t *big = calloc(1, GD_MAX_PROGRAM_BYTES + 1);
  memcpy(big, b, len);
  decode_expect(big, GD_MAX_PROGRAM_BYTES + 1, EXHAUSTED,
                td_fmt("the program encoding is %u bytes, over the limit of %u",
                       GD_MAX_PROGRAM_BYTES + 1, GD_MAX_PROGRAM_BYTES));
  free(big);
  free(b);
}
END_TEST

START_TEST(test_decode_refuses_every_truncation) {
  size_t len;
  uint8_t *b = golden(&len);
  /* Each proper prefix fails; those that keep the magic and version say
   * "truncated". Points of interest: inside the header, the slots, the
   * module id, the name, the params, the parameter bytes, the patches, the
   * memset and the copy. */
  for (size_t n = 0; n < len; n++) {
    gd_program *g;
    char err[512] = "";
    ck_assert_msg(gd_program_decode(b, n, &g, err, sizeof err) < 0, "prefix of %zu accepted", n);
    if (n >= 8) ck_assert_msg(strstr(err, "truncated"), "prefix of %zu: %s", n, err);
  }
  size_t points[] = {8,
                     19,
                     30,
                     51,
                     60,
                     G_NLEN + 2,
                     G_NAME + 3,
                     G_NPARAMS + 5,
                     G_PARAM_BYTES + 9,
                     G_NPATCHES + 10,
                     G_STEP1 + 1,
                     G_STEP1 + 20,
                     G_STEP2 + 4,
                     G_LEN - 1};
  for (size_t k = 0; k < sizeof points / sizeof points[0]; k++)
    decode_expect(b, points[k], INVALID, "the program encoding is truncated");
  free(b);
}
END_TEST

START_TEST(test_decode_refuses_trailing_bytes) {
  size_t len;
  uint8_t *b = golden(&len);
  uint8_t *more = calloc(1, len + 3);
  memcpy(more, b, len);
  decode_expect(more, len + 1, INVALID, "1 unexpected bytes after the last step");
  decode_expect(more, len + 3, INVALID, "3 unexpected bytes after the last step");
  free(more);
  free(b);
}
END_TEST

START_TEST(test_decode_step_errors) {
  size_t len;
  uint8_t *b = golden(&len);
  put_u32(b + G_STEP1, 9);
  decode_expect(b, len, INVALID, "step 1: kind 9 is not launch, memset, copy, while or if");
  put_u32(b + G_STEP1, 0);
  decode_expect(b, len, INVALID, "step 1: kind 0 is not launch, memset, copy, while or if");
  put_u32(b + G_STEP1, GD_STEP_MEMSET);
  put_u32(b + G_NLEN, GD_MAX_NAME + 1);
  decode_expect(b, len, EXHAUSTED,
                "step 0 (launch): the function name is 256 bytes, over the limit of 255");
  put_u32(b + G_NLEN, 6);
  b[G_NAME + 2] = 0;
  decode_expect(b, len, INVALID, "step 0 (launch): the function name contains a NUL byte");
  b[G_NAME + 2] = ' ';
  decode_expect(b, len, INVALID, "the function name has a byte 0x20 that is not printable ASCII");
  b[G_NAME + 2] = 'a';
  put_u32(b + G_NPARAMS, GD_MAX_PARAMS + 1);
  decode_expect(b, len, EXHAUSTED,
                td_fmt("step 0 (launch scale2): %u parameters is over the limit of %u",
                       GD_MAX_PARAMS + 1, GD_MAX_PARAMS));
  put_u32(b + G_NPARAMS, 2);
  put_u32(b + G_PARAM_BYTES, GD_MAX_PARAM_BYTES + 1);
  decode_expect(b, len, EXHAUSTED,
                td_fmt("step 0 (launch scale2): %u parameter bytes is over the limit of %u",
                       GD_MAX_PARAM_BYTES + 1, GD_MAX_PARAM_BYTES));
  put_u32(b + G_PARAM_BYTES, 16);
  put_u32(b + G_NPATCHES, GD_MAX_PATCHES + 1);
  decode_expect(b, len, EXHAUSTED,
                td_fmt("step 0 (launch scale2): %u pointer patches is over the limit of %u",
                       GD_MAX_PATCHES + 1, GD_MAX_PATCHES));
  put_u32(b + G_NPATCHES, 1);
  /* Restored: it decodes again. */
  gd_program *g;
  char err[512];
  ck_assert_msg(gd_program_decode(b, len, &g, err, sizeof err) == 0, "%s", err);
  gd_program_free(g);
  /* A non-zero byte under the patch (parameter bytes 8..15). */
  b[G_PARAM_BYTES + 4 + 9] = 1;
  decode_expect(b, len, INVALID, "the 8 parameter bytes under the patch at offset 8 must be zero");
  free(b);
}
END_TEST

/* --- modules and hex ------------------------------------------------------ */

START_TEST(test_module_id_depends_on_kind_and_bytes) {
  uint8_t a[32], b[32], c[32], d[32];
  ck_assert_int_eq(graphd_module_id(GRAPHD_MODULE_PTX, "abc", 3, a), GRAPHD_OK);
  ck_assert_int_eq(graphd_module_id(GRAPHD_MODULE_CUBIN, "abc", 3, b), GRAPHD_OK);
  ck_assert_int_eq(graphd_module_id(GRAPHD_MODULE_PTX, "abd", 3, c), GRAPHD_OK);
  ck_assert_int_eq(graphd_module_id(GRAPHD_MODULE_PTX, "abcd", 4, d), GRAPHD_OK);
  ck_assert_mem_ne(a, b, 32);
  ck_assert_mem_ne(a, c, 32);
  ck_assert_mem_ne(a, d, 32);
  /* Pinned: SHA-256 of "GDMD", version 1, kind 1, length 3 (u64), "abc",
   * computed apart from graphd. */
  char hex[65];
  graphd_id_hex(a, hex);
  ck_assert_str_eq(hex, "5eedc206cb058a60cb9ca9ead53131a2db6e68af89951d7b6be1792e8ec7411e");
  uint8_t again[32];
  ck_assert_int_eq(graphd_module_id(GRAPHD_MODULE_PTX, "abc", 3, again), GRAPHD_OK);
  ck_assert_mem_eq(a, again, 32);
}
END_TEST

START_TEST(test_module_id_refuses_empty_bytes_and_unknown_kinds) {
  uint8_t id[32];
  ck_assert_int_eq(graphd_module_id(GRAPHD_MODULE_PTX, "", 0, id), GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(graphd_module_id(GRAPHD_MODULE_PTX, NULL, 0, id), GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(graphd_module_id(GRAPHD_MODULE_PTX, NULL, 4, id), GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(graphd_module_id((graphd_module_kind)0, "abc", 3, id), GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(graphd_module_id((graphd_module_kind)5, "abc", 3, id), GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(graphd_module_id(GRAPHD_MODULE_HOST_ELF, "abc", 3, id), GRAPHD_OK);
  ck_assert_int_eq(graphd_module_id(GRAPHD_MODULE_FATBIN, "abc", 3, id), GRAPHD_OK);
}
END_TEST

START_TEST(test_id_hex_and_parse) {
  uint8_t id[32], back[32];
  for (int i = 0; i < 32; i++) id[i] = (uint8_t)(i * 37 + 5);
  char hex[65];
  graphd_id_hex(id, hex);
  ck_assert_uint_eq(strlen(hex), 64);
  ck_assert_str_eq(hex, "052a4f7499bee3082d52779cc1e60b30557a9fc4e90e33587da2c7ec11365b80");
  ck_assert_int_eq(gd_id_parse_hex(hex, back), 0);
  ck_assert_mem_eq(id, back, 32);
  char sh[65];
  gd_id_hex(id, 1, sh);
  ck_assert_str_eq(sh, "052a4f7499be");
  /* Not 64 hex digits. */
  ck_assert_int_eq(gd_id_parse_hex("abc", back), -1);
  /* Upper case is accepted. */
  char up[65];
  for (int i = 0; i < 65; i++) up[i] = hex[i] >= 'a' ? (char)(hex[i] - 32) : hex[i];
  ck_assert_int_eq(gd_id_parse_hex(up, back), 0);
  ck_assert_mem_eq(id, back, 32);
  /* Anything but a hex digit, at either digit of a byte, is refused (sscanf
   * "%2x" took " f", "-1", "+f", "0x" and "1g"). */
  static const char *const bad_pairs[] = {"g0", "1g", " f", "f ", "-1", "+f", "0x"};
  for (size_t k = 0; k < sizeof bad_pairs / sizeof bad_pairs[0]; k++) {
    char bad[65];
    memcpy(bad, hex, sizeof bad);
    memcpy(bad + 10, bad_pairs[k], 2);
    ck_assert_msg(gd_id_parse_hex(bad, back) == -1, "\"%s\" accepted", bad_pairs[k]);
  }
}
END_TEST

START_TEST(test_program_builder_nests_loops_and_branches) {
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_INOUT, 64, 1);
  ck_assert_int_eq(graphd_program_begin_while(p, 0, 0), 0);
  ck_assert_int_eq(graphd_program_add_memset(p, 0, 8, 8, 4, 0), 1);
  ck_assert_int_eq(graphd_program_begin_if(p, 0, 4), 2);
  ck_assert_int_eq(graphd_program_add_memset(p, 0, 16, 8, 4, 1), 3);
  EXPECT_FAIL(p, graphd_program_end(p, 0), GRAPHD_FAILED_PRECONDITION,
              "end: step 0 is inside step 2, which is not ended yet");
  EXPECT_FAIL(p, graphd_program_else(p, 0), GRAPHD_FAILED_PRECONDITION,
              "else: step 0 is inside step 2, which is not ended yet");
  graphd_program_free(p);

  p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_INOUT, 64, 1);
  EXPECT_NEG(p, graphd_program_begin_while(p, 0, 6),
             "step 0 (while): the condition word at offset 6 is not 4-byte aligned");
  EXPECT_NEG(p, graphd_program_begin_if(p, 0, 64),
             "step 0 (if): 4 bytes at offset 64 are outside slot 0");
  graphd_program_free(p);

  p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_INOUT, 64, 1);
  int w = graphd_program_begin_while(p, 0, 0);
  graphd_program_add_memset(p, 0, 8, 8, 4, 0);
  int b = graphd_program_begin_if(p, 0, 4);
  graphd_program_add_memset(p, 0, 16, 8, 4, 1);
  EXPECT_FAIL(p, graphd_program_else(p, (uint32_t)w), GRAPHD_FAILED_PRECONDITION, "inside step 2");
  ck_assert_int_eq(graphd_program_else(p, (uint32_t)b), GRAPHD_OK);
  EXPECT_FAIL(p, graphd_program_else(p, (uint32_t)b), GRAPHD_FAILED_PRECONDITION,
              "else: step 2 is not a branch before its else");
  graphd_program_add_memset(p, 0, 24, 8, 4, 2);
  graphd_program_add_memset(p, 0, 32, 8, 4, 3);
  ck_assert_int_eq(graphd_program_end(p, (uint32_t)b), GRAPHD_OK);
  EXPECT_FAIL(p, graphd_program_end(p, (uint32_t)b), GRAPHD_FAILED_PRECONDITION,
              "end: step 2 is ended already");
  EXPECT_FAIL(p, graphd_program_end(p, 1), GRAPHD_INVALID_ARGUMENT,
              "end: step 1 is not a loop or a branch");
  graphd_program_free(p);

  /* A well-formed one: the counts land where the validator wants them. */
  p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_INOUT, 64, 1);
  w = graphd_program_begin_while(p, 0, 0);
  graphd_program_add_memset(p, 0, 8, 8, 4, 0);
  b = graphd_program_begin_if(p, 0, 4);
  graphd_program_add_memset(p, 0, 16, 8, 4, 1);
  graphd_program_else(p, (uint32_t)b);
  graphd_program_add_memset(p, 0, 24, 8, 4, 2);
  graphd_program_add_memset(p, 0, 32, 8, 4, 3);
  graphd_program_end(p, (uint32_t)b);
  EXPECT_FAIL(p, graphd_program_finish(p, NULL), GRAPHD_INVALID_ARGUMENT,
              "step 0 (while) is not ended");
  graphd_program_free(p);
  p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_INOUT, 64, 1);
  w = graphd_program_begin_while(p, 0, 0);
  graphd_program_add_memset(p, 0, 8, 8, 4, 0);
  b = graphd_program_begin_if(p, 0, 4);
  graphd_program_add_memset(p, 0, 16, 8, 4, 1);
  graphd_program_else(p, (uint32_t)b);
  graphd_program_add_memset(p, 0, 24, 8, 4, 2);
  graphd_program_add_memset(p, 0, 32, 8, 4, 3);
  graphd_program_end(p, (uint32_t)b);
  graphd_program_end(p, (uint32_t)w);
  graphd_program_add_memset(p, 0, 40, 8, 4, 4);
  ck_assert_msg(graphd_program_finish(p, NULL) == GRAPHD_OK, "%s", graphd_program_error(p));
  const uint8_t *enc;
  size_t len;
  ck_assert_int_eq(graphd_program_encoding(p, &enc, &len), GRAPHD_OK);
  gd_program *g;
  char err[256];
  ck_assert_int_eq(gd_program_decode(enc, len, &g, err, sizeof err), 0);
  ck_assert_uint_eq(g->steps[0].u.cond.body, 5);
  ck_assert_uint_eq(g->steps[0].u.cond.orelse, 0);
  ck_assert_uint_eq(g->steps[2].u.cond.body, 1);
  ck_assert_uint_eq(g->steps[2].u.cond.orelse, 2);
  ck_assert_uint_eq(g->nsteps, 7);
  gd_program_free(g);
  graphd_program_free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("program");
  TCase *tc = tcase_create("builder");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_program_golden_encoding_is_pinned);
  tcase_add_test(tc, test_program_golden_decodes_to_its_fields);
  tcase_add_test(tc, test_program_same_program_twice_gives_same_bytes_and_id);
  tcase_add_test(tc, test_program_param_order_does_not_change_the_id);
  tcase_add_test(tc, test_program_any_single_change_gives_a_different_id);
  tcase_add_test(tc, test_program_id_is_sha256_of_the_encoding);
  tcase_add_test(tc, test_program_decode_encode_round_trips);
  tcase_add_test(tc, test_program_patch_zeroes_the_bytes_under_it);
  tcase_add_test(tc, test_program_builder_refuses_a_parameter_twice_at_one_offset);
  tcase_add_test(tc, test_program_builder_refuses_bad_parameters);
  tcase_add_test(tc, test_program_builder_caps_parameters_and_patches);
  tcase_add_test(tc, test_program_builder_refuses_bad_patches);
  tcase_add_test(tc, test_program_builder_refuses_bad_slots);
  tcase_add_test(tc, test_program_builder_refuses_bad_launches);
  tcase_add_test(tc, test_program_builder_refuses_bad_memsets_and_copies);
  tcase_add_test(tc, test_program_builder_caps_steps);
  tcase_add_test(tc, test_program_finish_reports_the_first_failed_call);
  tcase_add_test(tc, test_program_finish_runs_the_validator);
  tcase_add_test(tc, test_program_finish_refuses_an_encoding_over_the_cap);
  tcase_add_test(tc, test_program_finished_program_is_frozen);
  suite_add_tcase(s, tc);

  TCase *tv = tcase_create("decode");
  tcase_add_test(tv, test_decode_header_errors);
  tcase_add_test(tv, test_decode_refuses_every_truncation);
  tcase_add_test(tv, test_decode_refuses_trailing_bytes);
  tcase_add_test(tv, test_decode_step_errors);
  suite_add_tcase(s, tv);

  TCase *tm = tcase_create("ids");
  tcase_add_test(tm, test_module_id_depends_on_kind_and_bytes);
  tcase_add_test(tm, test_module_id_refuses_empty_bytes_and_unknown_kinds);
  tcase_add_test(tm, test_id_hex_and_parse);
  tcase_add_test(tm, test_program_builder_nests_loops_and_branches);
  suite_add_tcase(s, tm);
  return td_run_suite(s);
}
