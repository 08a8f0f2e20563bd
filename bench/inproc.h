/* The in-process anchors the benchmarks put beside graphd: the same
 * `scale` kernel from the same CUBIN, run by this process as users of
 * in-process graph capture run it.
 *
 *  staged     a graph captured once on static buffers of its own, with a
 *             copy into and out of them around each launch (what Warp's and
 *             JAX's in-process capture do when the caller's buffers move);
 *  fixed      the same graph launched on its static buffers alone (no
 *             copies: the best a graph on fixed buffers can do);
 *  recapture  a capture, instantiation and launch on the caller's buffers,
 *             per call (what capture keyed by addresses does when they
 *             change), the graph destroyed after each.
 *
 * Every call enqueues on the caller's stream and returns; the caller
 * synchronizes. Calls return a CUresult and leave a line naming the failed
 * driver call in ip->err. */
#ifndef GRAPHD_BENCH_INPROC_H
#define GRAPHD_BENCH_INPROC_H

#include <stddef.h>
#include <stdint.h>

#include "common/cuda_driver.h"

typedef struct inproc {
  const gd_cuda *cu;
  CUstream st;
  CUmodule mod;
  CUfunction fn;
  CUdeviceptr xs, ys; /* the static buffers the graph reads and writes */
  uint32_t n;         /* floats per buffer */
  float a;
  CUgraphExec exec; /* scale(xs, ys, a, n) */
  char err[256];
} inproc;

/* Loads the module, allocates the static buffers and captures the graph.
 * load_us, when set, gets the time of the module load alone, and
 * first_us the time from before the load to the end of the first launch of
 * the graph (load, capture, instantiate, launch, synchronize): what a
 * process that starts afresh pays before its first step. */
CUresult inproc_open(inproc *ip, const gd_cuda *cu, CUstream st, const void *cubin, uint32_t n,
                     float a, double *load_us, double *first_us);

/* Staged: copy `in` to the static input, launch, copy the static output to
 * `out`. */
CUresult inproc_staged(inproc *ip, CUdeviceptr in, CUdeviceptr out);

/* Fixed: the graph on its static buffers, nothing copied. */
CUresult inproc_fixed(inproc *ip);

/* Recapture: capture scale(in, out) on the stream, instantiate, launch,
 * destroy. */
CUresult inproc_recapture(inproc *ip, CUdeviceptr in, CUdeviceptr out);

/* Synchronizes the stream, destroys the graph, frees the buffers and
 * unloads the module. Safe on a zeroed or partly opened inproc. */
void inproc_close(inproc *ip);

#endif
