/* Shared by the GPU replay test and its client helper process: CUDA setup,
 * VMM and legacy buffers, and the 3-kernel test program. */
#ifndef GRAPHD_TEST_GPU_COMMON_H
#define GRAPHD_TEST_GPU_COMMON_H

#include <stdint.h>

#include "common/cuda_driver.h"
#include "graphd/graphd.h"

#define GN (64u * 1024u) /* floats per slot */

extern const gd_cuda *gcu;

/* Loads the driver, makes device 0's primary context current. Returns 0 or
 * -1 with a message on stderr. */
int gpu_up(void);

typedef struct gbuf {
  CUdeviceptr ptr;
  size_t size;
  int vmm;
  CUmemGenericAllocationHandle h;
} gbuf;

int gbuf_alloc(gbuf *b, size_t bytes, int vmm);
void gbuf_free(gbuf *b);

/* Registers the CUBIN and the program
 *   t = 2 x;  t += c;  y = t * 2 + 1
 * with x a staged input, c an unstaged input, t scratch, y a staged
 * output. */
/* The same program with t a temp slot (program3_temp_register). */
graphd_status gpu_program_temp(graphd_client *c, const char *kernel_dir, graphd_mode mode,
                               uint8_t pid[32]);
graphd_status gpu_program(graphd_client *c, const char *kernel_dir, graphd_mode mode,
                          uint8_t pid[32]);

/* Registers the CUBIN and a program of one launch, fault(1): a write to
 * an address nothing holds, a sticky CUDA_ERROR_ILLEGAL_ADDRESS. One
 * scratch slot, so nothing is bound. */
graphd_status gpu_fault_program(graphd_client *c, const char *kernel_dir, uint8_t pid[32]);

/* program3.h's wide program of k launches over GN floats a slot, from the
 * CUBIN: y_i = (i + 1) x_i, x_i in slot 2i and y_i in slot 2i + 1. */
graphd_status gpu_wide_program(graphd_client *c, const char *kernel_dir, graphd_mode mode,
                               uint32_t k, uint8_t pid[32]);
/* The fill-copy program (program3.h) over GN floats, in mode, on the test
 * CUBIN. */
graphd_status gpu_fill_copy_program(graphd_client *c, const char *kdir, graphd_mode mode,
                                    uint8_t pid[32]);

/* The same program, put in the client-side registry (module and program)
 * and synced to c from there, so that a reconnect gives it to the new
 * daemon. */
graphd_status gpu_program_in_registry(graphd_client *c, const char *kernel_dir, graphd_mode mode,
                                      uint8_t pid[32]);

/* Registers the CUBIN and the conditional program of program3.h over GN
 * floats. */
graphd_status gpu_cond_program(graphd_client *c, const char *kernel_dir, graphd_mode mode,
                               uint8_t pid[32]);

/* The expected y for input x and constant c, as the GPU computes it. */
void gpu_reference(const float *x, const float *cc, float *y);

/* Fills x on the device from a seed, replays on s with (x, y, c) bound
 * (c only when bind_c), waits for the stream, checks y bit for bit.
 * Returns GRAPHD_OK, the replay's status, or GRAPHD_DATA_LOSS on a wrong
 * element (message on stderr). */
graphd_status gpu_replay_checked(graphd_client *c, graphd_stream *s, CUstream st,
                                 const uint8_t pid[32], gbuf *x, gbuf *y, gbuf *cc, int bind_c,
                                 unsigned seed, graphd_replay_info *info);

/* n async replays of the copy program cp (y = x: gpu_wide_program of one
 * launch) on s, the i-th over x[i % nb] and y[(i + 1) % nb] with that x
 * filled from seed + i just before; then st synchronized and the last
 * output checked bit for bit. Returns GRAPHD_OK, the replay's status,
 * GRAPHD_INTERNAL for a CUDA call that failed, or GRAPHD_DATA_LOSS for a
 * wrong output (message on stderr). */
graphd_status gpu_async_copies_checked(graphd_client *c, graphd_stream *s, CUstream st,
                                       const uint8_t cp[32], gbuf *x, gbuf *y, int nb, int n,
                                       unsigned seed);

/* Holds stream st: queues a wait for a host flag to reach 1 (a mapped,
 * host-registered page); the caller releases it by storing 1 there, and
 * unregisters and unmaps it with gpu_hold_free. NULL on failure. */
volatile uint64_t *gpu_hold_stream(CUstream st);
void gpu_hold_free(volatile uint64_t *flag);

/* A data session on device 0 of this process, named by its UUID. */
graphd_client *gpu_session(const char *socket, char *err, size_t errlen);

#endif
