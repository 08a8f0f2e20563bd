/* The in-process anchors (inproc.h). */
#include "inproc.h"

#include <stdio.h>
#include <string.h>

#include "bench_util.h"

/* Names a failed driver call in ip->err; returns its result. */
static CUresult failed(inproc *ip, const char *what, CUresult r) {
  char e[160];
  snprintf(ip->err, sizeof ip->err, "%s: %s", what, gd_cuda_strerror(ip->cu, r, e, sizeof e));
  return r;
}

/* Runs a driver call; on failure returns from the enclosing function. */
#define IP_CALL(ip, call)                                                                          \
  do {                                                                                             \
    CUresult r_ = (ip)->cu->call;                                                                  \
    if (r_ != CUDA_SUCCESS) return failed(ip, #call, r_);                                          \
  } while (0)

/* Captures scale(in, out, a, n) on the stream and instantiates it. */
static CUresult capture(inproc *ip, CUdeviceptr in, CUdeviceptr out, CUgraphExec *exec) {
  void *params[] = {&in, &out, &ip->a, &ip->n};
  CUgraph g = NULL;
  IP_CALL(ip, cuStreamBeginCapture(ip->st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CUresult r =
      ip->cu->cuLaunchKernel(ip->fn, (ip->n + 255) / 256, 1, 1, 256, 1, 1, 0, ip->st, params, NULL);
  /* The capture ends whatever the launch did, so the stream stays usable. */
  CUresult re = ip->cu->cuStreamEndCapture(ip->st, &g);
  if (r == CUDA_SUCCESS && re == CUDA_SUCCESS) r = ip->cu->cuGraphInstantiateWithFlags(exec, g, 0);
  if (g) ip->cu->cuGraphDestroy(g);
  if (r != CUDA_SUCCESS) return failed(ip, "capturing scale", r);
  if (re != CUDA_SUCCESS) return failed(ip, "cuStreamEndCapture", re);
  return CUDA_SUCCESS;
}

CUresult inproc_open(inproc *ip, const gd_cuda *cu, CUstream st, const void *cubin, uint32_t n,
                     float a, double *load_us, double *first_us) {
  memset(ip, 0, sizeof *ip);
  ip->cu = cu;
  ip->st = st;
  ip->n = n;
  ip->a = a;
  IP_CALL(ip, cuMemAlloc(&ip->xs, (size_t)n * 4));
  IP_CALL(ip, cuMemAlloc(&ip->ys, (size_t)n * 4));
  IP_CALL(ip, cuMemsetD32Async(ip->xs, 0, n, st));
  IP_CALL(ip, cuStreamSynchronize(st));
  double t0 = bench_now_us();
  IP_CALL(ip, cuModuleLoadData(&ip->mod, cubin));
  IP_CALL(ip, cuModuleGetFunction(&ip->fn, ip->mod, "scale"));
  double t1 = bench_now_us();
  CUresult r = capture(ip, ip->xs, ip->ys, &ip->exec);
  if (r != CUDA_SUCCESS) return r;
  IP_CALL(ip, cuGraphLaunch(ip->exec, st));
  IP_CALL(ip, cuStreamSynchronize(st));
  double t2 = bench_now_us();
  if (load_us) *load_us = t1 - t0;
  if (first_us) *first_us = t2 - t0;
  return CUDA_SUCCESS;
}

CUresult inproc_staged(inproc *ip, CUdeviceptr in, CUdeviceptr out) {
  IP_CALL(ip, cuMemcpyDtoDAsync(ip->xs, in, (size_t)ip->n * 4, ip->st));
  IP_CALL(ip, cuGraphLaunch(ip->exec, ip->st));
  IP_CALL(ip, cuMemcpyDtoDAsync(out, ip->ys, (size_t)ip->n * 4, ip->st));
  return CUDA_SUCCESS;
}

CUresult inproc_fixed(inproc *ip) {
  IP_CALL(ip, cuGraphLaunch(ip->exec, ip->st));
  return CUDA_SUCCESS;
}

CUresult inproc_recapture(inproc *ip, CUdeviceptr in, CUdeviceptr out) {
  CUgraphExec e = NULL;
  CUresult r = capture(ip, in, out, &e);
  if (r != CUDA_SUCCESS) return r;
  r = ip->cu->cuGraphLaunch(e, ip->st);
  ip->cu->cuGraphExecDestroy(e);
  return r == CUDA_SUCCESS ? r : failed(ip, "cuGraphLaunch", r);
}

void inproc_close(inproc *ip) {
  if (!ip->cu) return;
  if (ip->st) ip->cu->cuStreamSynchronize(ip->st);
  if (ip->exec) ip->cu->cuGraphExecDestroy(ip->exec);
  if (ip->ys) ip->cu->cuMemFree(ip->ys);
  if (ip->xs) ip->cu->cuMemFree(ip->xs);
  if (ip->mod) ip->cu->cuModuleUnload(ip->mod);
  memset(ip, 0, sizeof *ip);
}
