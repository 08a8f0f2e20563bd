/* The 3-kernel test program the host and GPU replay tests share:
 *   t = 2 x;  t += c;  y = t * 2 + 1   (scale, accumulate, pair_kernel)
 * Slots: 0 x (staged input), 1 c (unstaged input: copied once, at
 * capture), 2 t (scratch), 3 y (staged output), n floats each. The module
 * (host ELF or CUBIN of tests/kernels) is registered already. */
#ifndef GRAPHD_TEST_PROGRAM3_H
#define GRAPHD_TEST_PROGRAM3_H

#include <stdint.h>

#include "graphd/graphd.h"

/* Builds and registers it with c, or with c NULL puts it in the
 * client-side registry; pid gets its id. Returns the first failure's
 * status, with the message on stderr. */
graphd_status program3_register(graphd_client *c, const uint8_t mod[32], graphd_mode mode,
                                uint32_t n, uint8_t pid[32]);

/* The same with t a temp slot (it is written before it is read): a
 * program without state, whose replays from several sessions may share an
 * instance (when the budget has room for one only) instead of each having
 * its own. */
graphd_status program3_temp_register(graphd_client *c, const uint8_t mod[32], graphd_mode mode,
                                     uint32_t n, uint8_t pid[32]);

/* The one-launch staged program of the fault tests: `fault(kind)` from mod
 * (tests/kernels), one block of `block` threads, and one slot (a staged
 * input or a scratch slot of `bytes`, as the test binds it or not).
 * Builds and registers it; pid gets its id. */
graphd_status fault_program_register(graphd_client *c, const uint8_t mod[32], graphd_slot_role slot,
                                     uint32_t bytes, uint32_t block, uint32_t kind,
                                     uint8_t pid[32]);

/* The host-only program of one stamp(out) launch (tests/kernels): slot 0
 * (staged output, 8 bytes) gets the launch's number in the daemon. Builds
 * and registers it; pid gets its id. */
graphd_status stamp_program_register(graphd_client *c, const uint8_t mod[32], uint8_t pid[32]);

/* The conditional test program over x (slot 0, n floats, in-out) and ctl
 * (slot 1, two 4-byte words, in-out):
 *   while (ctl[0]) { x = 2 x; ctl[0] -= 1 }
 *   if (ctl[1]) x = 3 x; else x = 5 x
 * so x comes back times 2^ctl[0] times 3 or 5, and ctl[0] as 0. Builds
 * and registers it; pid gets its id. */
graphd_status cond_program_register(graphd_client *c, const uint8_t mod[32], graphd_mode mode,
                                    uint32_t n, uint8_t pid[32]);

/* A program of many slots: k launches of scale(x_i, y_i, i + 1, n), x_i
 * in slot 2i (staged input) and y_i in slot 2i + 1 (staged output), n
 * floats each, so y_i = (i + 1) x_i. Builds and registers it; pid gets its
 * id. */
graphd_status wide_program_register(graphd_client *c, const uint8_t mod[32], graphd_mode mode,
                                    uint32_t k, uint32_t n, uint8_t pid[32]);

/* What the conditional program makes of x[i] for a count and a flag. */
float cond_program_expect(float x, uint32_t count, uint32_t flag);

/* x (slot 0, n floats, in-out, n a multiple of 64) and y (slot 1, n floats,
 * out): y = 1.0f everywhere (4-byte memset), 13 bytes of y from byte 3 set
 * to 0x7f (1-byte memset), y's second half = x's first half (copy), 37
 * bytes of x from byte 7 copied to y at byte 41, then x = 2 x: memset and
 * copy steps on aligned and unaligned ranges. */
graphd_status fill_copy_program_register(graphd_client *c, const uint8_t mod[32], graphd_mode mode,
                                         uint32_t n, uint8_t pid[32]);

/* What the fill-copy program leaves in x and y (n floats each) for input
 * x0. */
void fill_copy_program_expect(const float *x0, uint32_t n, float *x, float *y);

#endif
