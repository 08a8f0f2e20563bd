#include "program3.h"

#include <stdio.h>
#include <string.h>

/* One scale(in, out, factor, n) launch over n floats. */
static void add_scale(graphd_program *p, const uint8_t mod[32], uint32_t n, float factor,
                      uint32_t in, uint32_t out) {
  uint32_t grid[3] = {n / 256, 1, 1}, block[3] = {256, 1, 1};
  int s = graphd_program_add_launch(p, mod, "scale", grid, block, 0);
  graphd_program_param_slot(p, (uint32_t)s, 0, in, 0);
  graphd_program_param_slot(p, (uint32_t)s, 8, out, 0);
  graphd_program_param(p, (uint32_t)s, 16, &factor, 4);
  graphd_program_param(p, (uint32_t)s, 20, &n, 4);
}

/* Finishes p (pid gets its id), registers it with c and frees it; the
 * first failure's message goes to stderr under `what`. */
static graphd_status finish_and_register(graphd_client *c, graphd_program *p, uint8_t pid[32],
                                         const char *what) {
  graphd_status st = graphd_program_finish(p, pid);
  if (st != GRAPHD_OK) fprintf(stderr, "%s: %s\n", what, graphd_program_error(p));
  if (st == GRAPHD_OK && (st = graphd_register_program(c, p)) != GRAPHD_OK)
    fprintf(stderr, "%s: %s\n", what, graphd_last_error(c));
  graphd_program_free(p);
  return st;
}

static graphd_status register_with_t(graphd_client *c, const uint8_t mod[32], graphd_mode mode,
                                     uint32_t n, graphd_slot_role t, uint8_t pid[32]) {
  graphd_program *p = graphd_program_new(mode);
  graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, n * 4, 1);  /* 0: x */
  graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, n * 4, 0);  /* 1: c, unstaged */
  graphd_program_add_slot(p, t, n * 4, 0);                  /* 2: t */
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, n * 4, 1); /* 3: y */
  uint32_t grid[3] = {n / 256, 1, 1}, block[3] = {256, 1, 1};
  add_scale(p, mod, n, 2.0f, 0, 2);
  int s1 = graphd_program_add_launch(p, mod, "accumulate", grid, block, 0);
  graphd_program_param_slot(p, (uint32_t)s1, 0, 1, 0);
  graphd_program_param_slot(p, (uint32_t)s1, 8, 2, 0);
  graphd_program_param(p, (uint32_t)s1, 16, &n, 4);
  int s2 = graphd_program_add_launch(p, mod, "pair_kernel", grid, block, 0);
  graphd_program_param(p, (uint32_t)s2, 0, NULL, 16); /* struct pair {in, out} */
  graphd_program_patch(p, (uint32_t)s2, 0, 2, 0);
  graphd_program_patch(p, (uint32_t)s2, 8, 3, 0);
  graphd_program_param(p, (uint32_t)s2, 16, &n, 4);
  /* The builder keeps the first failure, so checking finish is enough. */
  graphd_status st = graphd_program_finish(p, pid);
  if (st != GRAPHD_OK) fprintf(stderr, "program3: %s\n", graphd_program_error(p));
  if (st == GRAPHD_OK && !c) {
    const uint8_t *enc;
    size_t len;
    if ((st = graphd_program_encoding(p, &enc, &len)) == GRAPHD_OK)
      st = graphd_registry_add_program(pid, enc, len);
  } else if (st == GRAPHD_OK && (st = graphd_register_program(c, p)) != GRAPHD_OK) {
    fprintf(stderr, "program3: %s\n", graphd_last_error(c));
  }
  graphd_program_free(p);
  return st;
}

graphd_status program3_register(graphd_client *c, const uint8_t mod[32], graphd_mode mode,
                                uint32_t n, uint8_t pid[32]) {
  return register_with_t(c, mod, mode, n, GRAPHD_SLOT_SCRATCH, pid);
}

graphd_status program3_temp_register(graphd_client *c, const uint8_t mod[32], graphd_mode mode,
                                     uint32_t n, uint8_t pid[32]) {
  return register_with_t(c, mod, mode, n, GRAPHD_SLOT_TEMP, pid);
}

graphd_status fault_program_register(graphd_client *c, const uint8_t mod[32], graphd_slot_role slot,
                                     uint32_t bytes, uint32_t block, uint32_t kind,
                                     uint8_t pid[32]) {
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  uint32_t g[3] = {1, 1, 1}, b[3] = {block, 1, 1};
  graphd_program_add_slot(p, slot, bytes, slot == GRAPHD_SLOT_INPUT);
  graphd_program_add_launch(p, mod, "fault", g, b, 0);
  graphd_program_param(p, 0, 0, &kind, 4);
  return finish_and_register(c, p, pid, "fault program");
}

graphd_status stamp_program_register(graphd_client *c, const uint8_t mod[32], uint8_t pid[32]) {
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  uint32_t one[3] = {1, 1, 1};
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, 8, 1);
  int s = graphd_program_add_launch(p, mod, "stamp", one, one, 0);
  graphd_program_param_slot(p, (uint32_t)s, 0, 0, 0);
  return finish_and_register(c, p, pid, "stamp program");
}

graphd_status cond_program_register(graphd_client *c, const uint8_t mod[32], graphd_mode mode,
                                    uint32_t n, uint8_t pid[32]) {
  graphd_program *p = graphd_program_new(mode);
  graphd_program_add_slot(p, GRAPHD_SLOT_INOUT, n * 4, 1); /* 0: x */
  graphd_program_add_slot(p, GRAPHD_SLOT_INOUT, 8, 1);     /* 1: ctl */
  int loop = graphd_program_begin_while(p, 1, 0);
  add_scale(p, mod, n, 2.0f, 0, 0);
  uint32_t one[3] = {1, 1, 1};
  int cd = graphd_program_add_launch(p, mod, "count_down", one, one, 0);
  graphd_program_param_slot(p, (uint32_t)cd, 0, 1, 0);
  graphd_program_end(p, (uint32_t)loop);
  int branch = graphd_program_begin_if(p, 1, 4);
  add_scale(p, mod, n, 3.0f, 0, 0);
  graphd_program_else(p, (uint32_t)branch);
  add_scale(p, mod, n, 5.0f, 0, 0);
  graphd_program_end(p, (uint32_t)branch);
  return finish_and_register(c, p, pid, "cond program");
}

graphd_status fill_copy_program_register(graphd_client *c, const uint8_t mod[32], graphd_mode mode,
                                         uint32_t n, uint8_t pid[32]) {
  graphd_program *p = graphd_program_new(mode);
  graphd_program_add_slot(p, GRAPHD_SLOT_INOUT, n * 4, 1);  /* 0: x */
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, n * 4, 1); /* 1: y */
  float one = 1.0f;
  uint32_t bits;
  memcpy(&bits, &one, 4);
  graphd_program_add_memset(p, 1, 0, n * 4, 4, bits);
  graphd_program_add_memset(p, 1, 3, 13, 1, 0x7f);
  graphd_program_add_copy(p, 1, n * 2, 0, 0, n * 2);
  graphd_program_add_copy(p, 1, 41, 0, 7, 37);
  add_scale(p, mod, n, 2.0f, 0, 0);
  return finish_and_register(c, p, pid, "fill-copy program");
}

void fill_copy_program_expect(const float *x0, uint32_t n, float *x, float *y) {
  float one = 1.0f;
  for (uint32_t i = 0; i < n; i++) y[i] = one;
  memset((uint8_t *)y + 3, 0x7f, 13);
  memcpy((uint8_t *)y + n * 2, x0, n * 2);
  memcpy((uint8_t *)y + 41, (const uint8_t *)x0 + 7, 37);
  for (uint32_t i = 0; i < n; i++) {
    volatile float t = 2.0f * x0[i];
    x[i] = t;
  }
}

float cond_program_expect(float x, uint32_t count, uint32_t flag) {
  volatile float v = x;
  for (uint32_t k = 0; k < count; k++) v = 2.0f * v;
  v = (flag ? 3.0f : 5.0f) * v;
  return v;
}

graphd_status wide_program_register(graphd_client *c, const uint8_t mod[32], graphd_mode mode,
                                    uint32_t k, uint32_t n, uint8_t pid[32]) {
  graphd_program *p = graphd_program_new(mode);
  for (uint32_t i = 0; i < k; i++) {
    graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, n * 4, 1);
    graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, n * 4, 1);
  }
  for (uint32_t i = 0; i < k; i++) add_scale(p, mod, n, (float)(i + 1), 2 * i, 2 * i + 1);
  return finish_and_register(c, p, pid, "wide program");
}
