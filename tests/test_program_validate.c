/* The structural validation stage (proto/program.c, gd_program_validate):
 * every error it reports, with its message, on programs filled in directly.
 * Decoding errors (magic, version, truncation, trailing bytes, caps read
 * from the encoding) are in test_program.c, next to the golden encoding. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "graphd/encoding.h"
#include "graphd/status.h"
#include "harness.h"

#define INVALID GRAPHD_INVALID_ARGUMENT
#define EXHAUSTED GRAPHD_RESOURCE_EXHAUSTED

#define ASSERT_MSG(msg, needle)                                                                    \
  ck_assert_msg(strstr((msg), (needle)) != NULL, "message \"%s\" lacks \"%s\"", (msg), (needle))

/* Three slots (input 256, output 256, scratch 64) and three steps:
 *  0: launch scale2(in *, out *, uint32 n) with params (0,8) (8,8) (16,4);
 *  1: memset of the scratch slot;
 *  2: copy of 128 bytes from slot 0 to slot 1 at 128. */
typedef struct fx {
  gd_program p;
  gd_slot slots[3];
  gd_step steps[3];
  gd_param params[3];
  gd_patch patches[2];
  uint8_t data[64];
  char err[512];
} fx;

static gd_launch *fx_launch(fx *f) { return &f->steps[0].u.launch; }

static void fx_init(fx *f) {
  memset(f, 0, sizeof *f);
  f->slots[0] = (gd_slot){GD_ROLE_INPUT, GD_SLOT_STAGED, 256};
  f->slots[1] = (gd_slot){GD_ROLE_OUTPUT, GD_SLOT_STAGED, 256};
  f->slots[2] = (gd_slot){GD_ROLE_SCRATCH, 0, 64};
  gd_launch *l = fx_launch(f);
  f->steps[0].kind = GD_STEP_LAUNCH;
  memset(l->module_id, 0xab, sizeof l->module_id);
  strcpy(l->name, "scale2");
  l->grid[0] = 4, l->grid[1] = 1, l->grid[2] = 1;
  l->block[0] = 64, l->block[1] = 1, l->block[2] = 1;
  f->params[0] = (gd_param){0, 8};
  f->params[1] = (gd_param){8, 8};
  f->params[2] = (gd_param){16, 4};
  l->nparams = 3;
  l->params = f->params;
  l->param_bytes = 20;
  l->param_data = f->data;
  f->data[16] = 64;
  f->patches[0] = (gd_patch){0, 0, 0};
  f->patches[1] = (gd_patch){8, 1, 0};
  l->npatches = 2;
  l->patches = f->patches;
  f->steps[1].kind = GD_STEP_MEMSET;
  f->steps[1].u.memset =
      (gd_memset){.slot = 2, .element_size = 4, .value = 0, .offset = 0, .bytes = 64};
  f->steps[2].kind = GD_STEP_COPY;
  f->steps[2].u.copy =
      (gd_copy){.dst_slot = 1, .src_slot = 0, .dst_offset = 128, .src_offset = 0, .bytes = 128};
  f->p.mode = GD_MODE_STAGED;
  f->p.nslots = 3;
  f->p.slots = f->slots;
  f->p.nsteps = 3;
  f->p.steps = f->steps;
}

static void fx_expect(fx *f, int status, const char *needle) {
  f->err[0] = '\0';
  int rc = gd_program_validate(&f->p, f->err, sizeof f->err);
  ck_assert_msg(rc == -status, "rc %d (want %d), message \"%s\" (want \"%s\")", rc, -status, f->err,
                needle);
  ASSERT_MSG(f->err, needle);
}

START_TEST(test_validate_accepts_the_fixture) {
  fx f;
  fx_init(&f);
  ck_assert_int_eq(gd_program_validate(&f.p, f.err, sizeof f.err), 0);
  /* Edges that are allowed. */
  f.patches[1].slot_offset = 255;
  f.steps[2].u.copy.dst_offset = 0;
  f.steps[2].u.copy.dst_slot = 0;
  f.steps[2].u.copy.src_offset = 128; /* same slot, touching, not overlapping */
  ck_assert_msg(gd_program_validate(&f.p, f.err, sizeof f.err) == 0, "%s", f.err);
}
END_TEST

START_TEST(test_validate_program_level_errors) {
  fx f;
  fx_init(&f);
  f.p.mode = 7;
  fx_expect(&f, INVALID, "mode 7 is not staged (0), staged_ex (1), direct (2) or auto (3)");
  fx_init(&f);
  f.p.nsteps = 0;
  fx_expect(&f, INVALID, "the program has no steps");
  fx_init(&f);
  f.p.nslots = GD_MAX_SLOTS + 1;
  fx_expect(&f, EXHAUSTED,
            td_fmt("%u slots is over the limit of %u", GD_MAX_SLOTS + 1, GD_MAX_SLOTS));
  fx_init(&f);
  f.p.nsteps = GD_MAX_STEPS + 1;
  fx_expect(&f, EXHAUSTED,
            td_fmt("%u steps is over the limit of %u", GD_MAX_STEPS + 1, GD_MAX_STEPS));
  fx_init(&f);
  f.steps[1].kind = 9;
  fx_expect(&f, INVALID, "step 1: kind 9 is not launch, memset, copy, while or if");
}
END_TEST

START_TEST(test_validate_slot_errors) {
  fx f;
  fx_init(&f);
  f.slots[1].role = 5;
  fx_expect(&f, INVALID, "slot 1: role 5 is not input, output, inout, scratch or temp");
  fx_init(&f);
  f.slots[0].flags = 3;
  fx_expect(&f, INVALID, "slot 0: unknown flags 0x3");
  fx_init(&f);
  f.slots[2].flags = GD_SLOT_STAGED;
  fx_expect(&f, INVALID, "slot 2: a scratch slot belongs to graphd and cannot be staged");
  fx_init(&f);
  f.slots[1].size = 0;
  fx_expect(&f, INVALID, "slot 1: size 0 is invalid");
  fx_init(&f);
  f.slots[0].size = GD_MAX_SLOT_BYTES + 1;
  fx_expect(&f, EXHAUSTED, "slot 0: 1099511627777 bytes is over the limit of 1099511627776");
}
END_TEST

START_TEST(test_validate_function_name_errors) {
  fx f;
  fx_init(&f);
  fx_launch(&f)->name[0] = '\0';
  fx_expect(&f, INVALID, "step 0 (launch): the function name is empty");
  fx_init(&f);
  /* All 256 bytes used: no terminator within the cap. */
  memset(fx_launch(&f)->name, 'a', sizeof fx_launch(&f)->name);
  fx_expect(&f, EXHAUSTED, "step 0 (launch): the function name is longer than 255 bytes");
  fx_init(&f);
  strcpy(fx_launch(&f)->name, "scale\t2");
  fx_expect(&f, INVALID,
            "step 0 (launch): the function name has a byte 0x09 that is not printable");
  fx_init(&f);
  strcpy(fx_launch(&f)->name, "sc\x7f");
  fx_expect(&f, INVALID, "byte 0x7f that is not printable");
}
END_TEST

START_TEST(test_validate_grid_block_and_shared_limits) {
  fx f;
  struct {
    int grid, axis;
    uint32_t value;
    const char *msg;
  } cases[] = {
      {1, 0, 0, "step 0 (launch scale2): grid.x is 0; it must be 1 to 2147483647"},
      {1, 0, 0x80000000u, "grid.x is 2147483648; it must be 1 to 2147483647"},
      {1, 1, 0, "grid.y is 0; it must be 1 to 65535"},
      {1, 1, 65536, "grid.y is 65536; it must be 1 to 65535"},
      {1, 2, 0, "grid.z is 0; it must be 1 to 65535"},
      {1, 2, 65536, "grid.z is 65536; it must be 1 to 65535"},
      {0, 0, 0, "block.x is 0; it must be 1 to 1024"},
      {0, 0, 1025, "block.x is 1025; it must be 1 to 1024"},
      {0, 1, 0, "block.y is 0; it must be 1 to 1024"},
      {0, 1, 1025, "block.y is 1025; it must be 1 to 1024"},
      {0, 2, 0, "block.z is 0; it must be 1 to 64"},
      {0, 2, 65, "block.z is 65; it must be 1 to 64"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    fx_init(&f);
    (cases[k].grid ? fx_launch(&f)->grid : fx_launch(&f)->block)[cases[k].axis] = cases[k].value;
    fx_expect(&f, INVALID, cases[k].msg);
  }
  fx_init(&f);
  uint32_t *b = fx_launch(&f)->block;
  b[0] = 64, b[1] = 16, b[2] = 2;
  fx_expect(&f, INVALID, "step 0 (launch scale2): block has 2048 threads; the limit is 1024");
  b[0] = 32, b[1] = 32, b[2] = 1;
  ck_assert_int_eq(gd_program_validate(&f.p, f.err, sizeof f.err), 0);
  fx_init(&f);
  fx_launch(&f)->shared_bytes = GD_MAX_SHARED_BYTES + 1;
  fx_expect(&f, EXHAUSTED, "232449 bytes of dynamic shared memory is over the limit of 232448");
  fx_launch(&f)->shared_bytes = GD_MAX_SHARED_BYTES;
  ck_assert_int_eq(gd_program_validate(&f.p, f.err, sizeof f.err), 0);
}
END_TEST

START_TEST(test_validate_parameter_errors) {
  fx f;
  fx_init(&f);
  fx_launch(&f)->nparams = GD_MAX_PARAMS + 1;
  fx_expect(&f, EXHAUSTED,
            td_fmt("step 0 (launch scale2): %u parameters is over the limit of %u",
                   GD_MAX_PARAMS + 1, GD_MAX_PARAMS));
  fx_init(&f);
  fx_launch(&f)->param_bytes = GD_MAX_PARAM_BYTES + 1;
  fx_expect(&f, EXHAUSTED,
            td_fmt("%u parameter bytes is over the limit of %u", GD_MAX_PARAM_BYTES + 1,
                   GD_MAX_PARAM_BYTES));
  fx_init(&f);
  f.params[1].offset = 4; /* overlaps (0,8) */
  fx_expect(&f, INVALID, "step 0 (launch scale2): parameter 1 at offset 4 overlaps the one before");
  fx_init(&f);
  f.params[0] = (gd_param){8, 8};
  f.params[1] = (gd_param){0, 8};
  fx_expect(&f, INVALID, "parameter 1 at offset 0 overlaps the one before or is out of order");
  fx_init(&f);
  f.params[2].size = 0;
  fx_expect(&f, INVALID, "parameter 2 has size 0");
  fx_init(&f);
  f.params[2].size = 8;
  fx_expect(&f, INVALID, "parameter 2 (offset 16, size 8) ends past the 20 parameter bytes");
  fx_init(&f);
  f.params[2].offset = UINT32_MAX - 1;
  fx_expect(&f, INVALID, "ends past the 20 parameter bytes");
  fx_init(&f);
  fx_launch(&f)->param_bytes = 24;
  fx_expect(&f, INVALID, "24 parameter bytes, but the parameters end at byte 20");
  fx_init(&f);
  /* n as a u16 at 18, leaving a gap at 16..17 that must be zero. */
  f.params[2] = (gd_param){18, 2};
  f.data[16] = 0;
  f.data[18] = 64;
  ck_assert_int_eq(gd_program_validate(&f.p, f.err, sizeof f.err), 0);
  f.data[17] = 1;
  fx_expect(&f, INVALID, "padding byte 17 between parameters must be zero");
  fx_init(&f);
  fx_launch(&f)->param_bytes = 24;
  f.params[2].size = 8;
  f.data[22] = 0;
  ck_assert_int_eq(gd_program_validate(&f.p, f.err, sizeof f.err), 0);
}
END_TEST

START_TEST(test_validate_patch_errors) {
  fx f;
  fx_init(&f);
  fx_launch(&f)->npatches = GD_MAX_PATCHES + 1;
  fx_expect(&f, EXHAUSTED,
            td_fmt("step 0 (launch scale2): %u pointer patches is over the limit of %u",
                   GD_MAX_PATCHES + 1, GD_MAX_PATCHES));
  fx_init(&f);
  f.patches[1].offset = 12;
  fx_expect(&f, INVALID, "step 0 (launch scale2): patch at offset 12 is not 8-byte aligned");
  fx_init(&f);
  f.patches[1].offset = 0;
  fx_expect(&f, INVALID, "patch at offset 0 repeats or is out of order");
  fx_init(&f);
  f.patches[0] = (gd_patch){8, 1, 0};
  f.patches[1] = (gd_patch){0, 0, 0};
  fx_expect(&f, INVALID, "patch at offset 0 repeats or is out of order");
  fx_init(&f);
  f.patches[1].offset = 16; /* the 4-byte n: too small */
  fx_expect(&f, INVALID, "patch at offset 16 does not lie inside one parameter");
  fx_init(&f);
  f.params[0] = (gd_param){0, 4}; /* two halves of one pointer are not one parameter */
  f.params[1] = (gd_param){4, 12};
  f.patches[1].offset = 24;
  fx_expect(&f, INVALID, "patch at offset 0 does not lie inside one parameter");
  fx_init(&f);
  f.patches[1].slot = 3;
  fx_expect(&f, INVALID, "patch at offset 8 names slot 3; there are 3 slots");
  fx_init(&f);
  f.patches[1].slot_offset = 256;
  fx_expect(&f, INVALID, "patch at offset 8 points 256 bytes into slot 1, which has 256");
  fx_init(&f);
  f.data[15] = 1;
  fx_expect(&f, INVALID, "the 8 parameter bytes under the patch at offset 8 must be zero");
}
END_TEST

START_TEST(test_validate_memset_errors) {
  fx f;
  gd_memset *m = &f.steps[1].u.memset;
  uint32_t sizes[] = {0, 3, 8};
  for (int k = 0; k < 3; k++) {
    fx_init(&f);
    m->element_size = sizes[k];
    char want[64];
    snprintf(want, sizeof want, "step 1 (memset): element_size %u is not 1, 2 or 4", sizes[k]);
    fx_expect(&f, INVALID, want);
  }
  fx_init(&f);
  m->offset = 2;
  fx_expect(&f, INVALID, "step 1 (memset): offset 2 and bytes 64 must be");
  fx_init(&f);
  m->bytes = 62;
  fx_expect(&f, INVALID, "offset 0 and bytes 62 must be");
  fx_init(&f);
  m->bytes = 0;
  fx_expect(&f, INVALID, "offset 0 and bytes 0 must be");
  fx_init(&f);
  m->element_size = 1;
  m->value = 0x100;
  fx_expect(&f, INVALID, "step 1 (memset): value 0x100 does not fit in 1 byte(s)");
  m->element_size = 2;
  ck_assert_int_eq(gd_program_validate(&f.p, f.err, sizeof f.err), 0);
  m->value = 0x10000;
  fx_expect(&f, INVALID, "value 0x10000 does not fit in 2 byte(s)");
  fx_init(&f);
  m->offset = 4;
  fx_expect(&f, INVALID, "step 1 (memset): bytes 4..68 are outside slot 2, which has 64");
  fx_init(&f);
  m->slot = 3;
  fx_expect(&f, INVALID, "step 1 (memset): slot 3 does not exist; there are 3 slots");
  fx_init(&f);
  m->offset = UINT64_MAX - 3;
  m->bytes = 4;
  fx_expect(&f, INVALID, "are outside slot 2");
}
END_TEST

START_TEST(test_validate_copy_errors) {
  fx f;
  gd_copy *c = &f.steps[2].u.copy;
  fx_init(&f);
  c->bytes = 0;
  fx_expect(&f, INVALID, "step 2 (copy): bytes is 0");
  fx_init(&f);
  c->dst_offset = 129;
  fx_expect(&f, INVALID, "step 2 (copy): bytes 129..257 are outside slot 1, which has 256");
  fx_init(&f);
  c->src_offset = 200;
  fx_expect(&f, INVALID, "bytes 200..328 are outside slot 0");
  fx_init(&f);
  c->src_slot = 5;
  fx_expect(&f, INVALID, "step 2 (copy): slot 5 does not exist; there are 3 slots");
  fx_init(&f);
  c->dst_slot = 0;
  c->dst_offset = 64;
  fx_expect(&f, INVALID, "step 2 (copy): source and destination overlap in slot 0");
  c->dst_offset = 0;
  c->src_offset = 127;
  fx_expect(&f, INVALID, "source and destination overlap in slot 0");
}
END_TEST

/* Conditional steps over the fixture's three steps: while (word) { ... }. */
START_TEST(test_validate_conditional_steps) {
  fx f;
  gd_step steps[6];
  /* 0: while (slot 2 @ 0) { 1: memset; 2: if (slot 2 @ 4) { 3: copy } else { 4: memset } }
   * 5: copy */
  fx_init(&f);
  steps[0] = (gd_step){.kind = GD_STEP_WHILE, .u.cond = {.slot = 2, .offset = 0, .body = 4}};
  steps[1] = f.steps[1];
  steps[2] =
      (gd_step){.kind = GD_STEP_IF, .u.cond = {.slot = 2, .offset = 4, .body = 1, .orelse = 1}};
  steps[3] = f.steps[2];
  steps[4] = f.steps[1];
  steps[5] = f.steps[2];
  f.p.steps = steps;
  f.p.nsteps = 6;
  ck_assert_int_eq(gd_program_validate(&f.p, f.err, sizeof f.err), 0);
  /* It survives encoding and decoding. */
  uint8_t *enc;
  size_t len;
  ck_assert_int_eq(gd_program_encode(&f.p, &enc, &len, f.err, sizeof f.err), 0);
  gd_program *back;
  ck_assert_msg(gd_program_decode(enc, len, &back, f.err, sizeof f.err) == 0, "%s", f.err);
  ck_assert_uint_eq(back->nsteps, 6);
  ck_assert_uint_eq(back->steps[0].kind, GD_STEP_WHILE);
  ck_assert_uint_eq(back->steps[0].u.cond.body, 4);
  ck_assert_uint_eq(back->steps[2].u.cond.offset, 4);
  ck_assert_uint_eq(back->steps[2].u.cond.orelse, 1);
  ck_assert_mem_eq(back->id, f.p.id, GD_ID_LEN);
  gd_program_free(back);
  free(enc);

  steps[2].u.cond.offset = 6;
  fx_expect(&f, INVALID, "step 2 (if): the condition word at offset 6 is not 4-byte aligned");
  steps[2].u.cond.offset = 64;
  fx_expect(&f, INVALID, "step 2 (if): bytes 64..68 are outside slot 2, which has 64");
  steps[2].u.cond.offset = 4;
  steps[2].u.cond.slot = 9;
  fx_expect(&f, INVALID, "step 2 (if): slot 9 does not exist");
  steps[2].u.cond.slot = 2;
  /* A branch that runs past the loop's body around it. */
  steps[2].u.cond.orelse = 2;
  fx_expect(&f, INVALID, "step 2 (if): its 3 steps run past the end of the enclosing branch");
  steps[2].u.cond.orelse = 1;
  steps[0].u.cond.body = 5;
  ck_assert_int_eq(gd_program_validate(&f.p, f.err, sizeof f.err), 0); /* step 5 in the loop */
  steps[0].u.cond.body = 6;
  fx_expect(&f, INVALID, "step 0 (while): its 6 steps run past the end of the program");
  steps[0].u.cond.body = 0;
  fx_expect(&f, INVALID, "step 0 (while): the body must have at least one step");
  steps[0].u.cond.body = 4;
  steps[2].u.cond.body = 0;
  steps[2].u.cond.orelse = 0;
  fx_expect(&f, INVALID, "step 2 (if): both branches are empty");
}
END_TEST

START_TEST(test_validate_caps_conditional_nesting) {
  fx f;
  gd_step steps[GD_MAX_COND_DEPTH + 2];
  fx_init(&f);
  uint32_t n = GD_MAX_COND_DEPTH + 2;
  for (uint32_t i = 0; i + 1 < n; i++)
    steps[i] =
        (gd_step){.kind = GD_STEP_WHILE, .u.cond = {.slot = 2, .offset = 0, .body = n - 1 - i}};
  steps[n - 1] = f.steps[1];
  f.p.steps = steps;
  f.p.nsteps = n;
  fx_expect(&f, EXHAUSTED, td_fmt("conditional steps nest more than %u deep", GD_MAX_COND_DEPTH));
  f.p.steps = steps + 1; /* one level less: allowed */
  f.p.nsteps = n - 1;
  ck_assert_int_eq(gd_program_validate(&f.p, f.err, sizeof f.err), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("program_validate");
  TCase *tc = tcase_create("validate");
  tcase_add_test(tc, test_validate_accepts_the_fixture);
  tcase_add_test(tc, test_validate_program_level_errors);
  tcase_add_test(tc, test_validate_slot_errors);
  tcase_add_test(tc, test_validate_function_name_errors);
  tcase_add_test(tc, test_validate_grid_block_and_shared_limits);
  tcase_add_test(tc, test_validate_parameter_errors);
  tcase_add_test(tc, test_validate_patch_errors);
  tcase_add_test(tc, test_validate_memset_errors);
  tcase_add_test(tc, test_validate_copy_errors);
  tcase_add_test(tc, test_validate_conditional_steps);
  tcase_add_test(tc, test_validate_caps_conditional_nesting);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
