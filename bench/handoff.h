/* The GPU floor of a dependent hand-off between two processes, measured
 * beside graphd in the same run.
 *
 * One step has the shape of an asynchronous graphd replay: this process's
 * stream writes a ready flag and waits for a done flag; the other side's
 * stream waits for ready, runs a graph (copy 256 KiB in, the `scale` kernel,
 * copy out) and writes done. Both sides enqueue every step before a go flag
 * is set, so the GPU sets the pace and no host round trip is in the figure:
 * what is left is what the hand-off costs the GPU. Each step reads the
 * previous step's output, and the result is checked bit for bit.
 *
 * Variants:
 *   HANDOFF_ONE_STREAM   the same graphs on one stream of this process, no
 *                        hand-off (the in-process anchor);
 *   HANDOFF_HOST_FLAGS   the other side in a child process, the flags in a
 *                        host page both processes map and register;
 *   HANDOFF_DEVICE_FLAGS the same with the flags in device memory this
 *                        process allocates and the child opens by CUDA IPC.
 *
 * The child is forked before this process initializes CUDA (CUDA is
 * unusable in a child forked after cuInit), so handoff_fork comes first. */
#ifndef GRAPHD_BENCH_HANDOFF_H
#define GRAPHD_BENCH_HANDOFF_H

#include <stdint.h>
#include <sys/types.h>

#include "common/cuda_driver.h"

enum { HANDOFF_ONE_STREAM, HANDOFF_HOST_FLAGS, HANDOFF_DEVICE_FLAGS, HANDOFF_NVARIANTS };

/* At most this many steps per run: beyond about 300 a stream's queue is
 * full before the go flag, the enqueueing host blocks, and the figure
 * would include the host. */
#define HANDOFF_MAX_STEPS 256

typedef struct handoff {
  pid_t pid;               /* the child, or 0 */
  int fd;                  /* a socketpair to it */
  volatile uint64_t *page; /* shared with the child: go, ready, done */
  int page_registered;
  CUdeviceptr page_dev;
  uint64_t gen; /* flag values of the next run start above it */
  long go;      /* runs so far */
  char err[512];
} handoff;

extern const char *const handoff_variant_names[HANDOFF_NVARIANTS];

/* Maps the shared page and forks the child. Before cuInit. Returns 0, or
 * -1 with h->err set. */
int handoff_fork(handoff *h);

/* One run of `steps` steps of a variant on device `ordinal` of this
 * process (the child opens the same ordinal), in context ctx on stream st,
 * with `fn` the `scale` kernel of this process and cubin_path the CUBIN
 * the child loads. n floats per buffer, a the factor. Sets *per_step_us.
 * Returns 0, or -1 with h->err set (a wrong result is a failure). */
int handoff_run(handoff *h, const gd_cuda *cu, int ordinal, CUcontext ctx, CUstream st,
                CUfunction fn, const char *cubin_path, uint32_t n, float a, int variant, long steps,
                double *per_step_us);

/* Tells the child to exit and waits for it; unregisters and unmaps the
 * page. Safe on a zeroed handoff. */
void handoff_close(handoff *h, const gd_cuda *cu);

#endif
