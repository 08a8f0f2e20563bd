/* What the driver costs the host, per call, in the calls a device's worker
 * makes for each replay: a graph launch by the graph's size, the same
 * launches from several threads of one context at once (each with its own
 * stream and executable graph), and the stream operations around a launch
 * (an event record, a write and a wait of a host-pinned word). With
 * graphd's own kernels in the build, also a graph shaped as graphd builds
 * a loop: a condition kernel, then a while node whose body is a chain of
 * nodes and the condition kernel again (the condition word is 0, so the
 * body never runs: the launch is what is timed).
 *
 * Every call is timed alone on an idle stream: the stream is synchronized
 * after each, untimed, so no call waits for room in a full queue. The
 * graphs are chains of the test kernels' `scale` over 256 floats, so the
 * GPU's part is small. Prints FIGURE lines (p50 and p90 of the calls, and
 * for threads the launches a second over all of them); asserts nothing.
 * Exits 77 without a GPU.
 *
 * Usage: launch_probe [-k KERNEL_DIR] [-r ROUNDS] [-n NODES,...] [-t THREADS,...] */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "common/cuda_driver.h"
#include "common/file.h"

/* graphd's own kernels (the daemon's build embeds them; empty without
 * nvcc). */
extern const unsigned char gd_kernels_fatbin[];
extern const size_t gd_kernels_fatbin_len;

static const gd_cuda *cu;
static CUcontext ctx;
static CUfunction fn, set_fn;      /* scale; graphd_set_condition (NULL: none) */
static CUdeviceptr buf, cond_word; /* cond_word: a condition word, 0 */
static long rounds = 400;

#define FLOATS 256u

static void check(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return;
  char e[160];
  fprintf(stderr, "launch_probe: %s: %s\n", what, gd_cuda_strerror(cu, r, e, sizeof e));
  exit(1);
}
#define CK(call) check(cu->call, #call)

/* Adds a kernel node of f (one block of `threads`) after *prev, if any;
 * *prev becomes it. */
static void add_kernel(CUgraph g, CUgraphNode *prev, CUfunction f, unsigned threads,
                       void **params) {
  CUDA_KERNEL_NODE_PARAMS kp;
  memset(&kp, 0, sizeof kp);
  kp.func = f;
  kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = threads;
  kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = params;
  CUgraphNode node;
  CK(cuGraphAddKernelNode(&node, g, *prev ? prev : NULL, *prev ? 1 : 0, &kp));
  *prev = node;
}

/* Adds a chain of n `scale` nodes over buf to g after *prev. */
static void add_chain(CUgraph g, CUgraphNode *prev, unsigned n) {
  float a = 1.0f;
  unsigned cnt = FLOATS;
  void *params[] = {&buf, &buf, &a, &cnt};
  for (unsigned i = 0; i < n; i++) add_kernel(g, prev, fn, FLOATS, params);
}

/* A chain of n `scale` nodes over buf, or (looped) a loop as graphd
 * builds one around such a chain, instantiated and uploaded on st. */
static CUgraphExec chain(unsigned n, bool looped, CUstream st) {
  CUgraph g;
  CK(cuGraphCreate(&g, 0));
  CUgraphNode prev = NULL;
  if (!looped) {
    add_chain(g, &prev, n);
  } else {
    CUgraphConditionalHandle h;
    CK(cuGraphConditionalHandleCreate(&h, g, ctx, 0, 0));
    void *params[] = {&h, &cond_word};
    add_kernel(g, &prev, set_fn, 1, params);
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.conditional.handle = h;
    p.conditional.type = CU_GRAPH_COND_TYPE_WHILE;
    p.conditional.size = 1;
    p.conditional.ctx = ctx;
    CUgraphNode loop;
    CK(cuGraphAddNode(&loop, g, &prev, NULL, 1, &p));
    CUgraph body = p.conditional.phGraph_out[0];
    CUgraphNode in = NULL;
    add_chain(body, &in, n);
    add_kernel(body, &in, set_fn, 1, params);
  }
  CUgraphExec e;
  CK(cuGraphInstantiateWithFlags(&e, g, 0));
  CK(cuGraphUpload(e, st));
  CK(cuStreamSynchronize(st));
  CK(cuGraphDestroy(g));
  return e;
}

/* p50 and p90 of v[0..n), sorted in place. */
static void quantiles(double *v, long n, double *p50, double *p90) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  *p50 = v[n / 2];
  *p90 = v[n * 9 / 10];
}

/* One thread's launches of its own graph on its own stream. */
typedef struct launcher {
  unsigned nodes;
  bool looped; /* the chain inside graphd's shape of loop */
  long rounds;
  pthread_barrier_t *go;
  double *took; /* rounds samples, us */
  double start_us, end_us;
} launcher;

static void *launch_loop(void *arg) {
  launcher *l = arg;
  CK(cuCtxSetCurrent(ctx));
  CUstream st;
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CUgraphExec e = chain(l->nodes, l->looped, st);
  for (int i = 0; i < 20; i++) CK(cuGraphLaunch(e, st));
  CK(cuStreamSynchronize(st));
  pthread_barrier_wait(l->go);
  l->start_us = bench_now_us();
  for (long i = 0; i < l->rounds; i++) {
    double t0 = bench_now_us();
    CK(cuGraphLaunch(e, st));
    l->took[i] = bench_now_us() - t0;
    CK(cuStreamSynchronize(st));
  }
  l->end_us = bench_now_us();
  CK(cuGraphExecDestroy(e));
  CK(cuStreamDestroy(st));
  return NULL;
}

/* threads threads, each launching a chain of `nodes` (looped: inside
 * graphd's shape of loop) rounds times. */
static void launches(unsigned nodes, bool looped, unsigned threads) {
  launcher *l = calloc(threads, sizeof *l);
  pthread_t *t = calloc(threads, sizeof *t);
  double *all = calloc((size_t)threads * (size_t)rounds, sizeof *all);
  pthread_barrier_t go;
  if (!l || !t || !all || pthread_barrier_init(&go, NULL, threads)) {
    fprintf(stderr, "launch_probe: out of memory\n");
    exit(1);
  }
  for (unsigned k = 0; k < threads; k++) {
    l[k] = (launcher){
        .nodes = nodes, .looped = looped, .rounds = rounds, .go = &go, .took = all + k * rounds};
    if (pthread_create(&t[k], NULL, launch_loop, &l[k])) {
      fprintf(stderr, "launch_probe: cannot start a thread\n");
      exit(1);
    }
  }
  double first = 0, last = 0;
  for (unsigned k = 0; k < threads; k++) {
    pthread_join(t[k], NULL);
    if (!k || l[k].start_us < first) first = l[k].start_us;
    if (l[k].end_us > last) last = l[k].end_us;
  }
  double p50, p90;
  quantiles(all, (long)threads * rounds, &p50, &p90);
  printf(
      "FIGURE launch of a graph of %s%u kernel nodes%s, %u thread(s) of one context: p50 %.2f us, "
      "p90 %.2f us a call; %.0f launches a second over all threads (each synchronized)\n",
      looped ? "a condition kernel and a while node over " : "", nodes, looped ? " (not run)" : "",
      threads, p50, p90, (double)threads * (double)rounds / ((last - first) / 1e6));
  fflush(stdout);
  pthread_barrier_destroy(&go);
  free(all);
  free(t);
  free(l);
}

/* Each of the stream operations a replay adds to its launch, timed as
 * launches: an event record, a 64-bit write of a host-pinned word, and a
 * wait on that word for a value it already holds. */
static void stream_ops(void) {
  CUstream st;
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CUevent ev;
  CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  uint64_t *word = aligned_alloc(4096, 4096);
  if (!word) exit(1);
  memset(word, 0, 4096);
  CK(cuMemHostRegister(word, 4096, CU_MEMHOSTREGISTER_DEVICEMAP));
  CUdeviceptr dword;
  CK(cuMemHostGetDevicePointer(&dword, word, 0));
  double *v = calloc((size_t)rounds, sizeof *v);
  if (!v) exit(1);
  static const char *const names[] = {"cuEventRecord", "cuStreamWriteValue64 (host-pinned)",
                                      "cuStreamWaitValue64 (host-pinned, already reached)"};
  for (int op = 0; op < 3; op++) {
    for (long i = -20; i < rounds; i++) {
      double t0 = bench_now_us();
      CUresult r = op == 0   ? cu->cuEventRecord(ev, st)
                   : op == 1 ? cu->cuStreamWriteValue64(st, dword, (cuuint64_t)(i + 100), 0)
                             : cu->cuStreamWaitValue64(st, dword, 1, CU_STREAM_WAIT_VALUE_GEQ);
      double took = bench_now_us() - t0;
      check(r, names[op]);
      if (i >= 0) v[i] = took;
      CK(cuStreamSynchronize(st));
    }
    double p50, p90;
    quantiles(v, rounds, &p50, &p90);
    printf("FIGURE %s: p50 %.2f us, p90 %.2f us a call\n", names[op], p50, p90);
  }
  fflush(stdout);
  free(v);
  CK(cuMemHostUnregister(word));
  free(word);
  CK(cuEventDestroy(ev));
  CK(cuStreamDestroy(st));
}

/* A comma-separated list of positive numbers into v (at most max). */
static int parse_list(const char *s, unsigned *v, int max) {
  int n = 0;
  for (char *end; *s && n < max; s = *end ? end + 1 : end) {
    unsigned long x = strtoul(s, &end, 10);
    if (end == s || x == 0 || x > 4096 || (*end && *end != ',')) return -1;
    v[n++] = (unsigned)x;
  }
  return *s ? -1 : n;
}

static void usage(void) {
  fprintf(stderr,
          "usage: launch_probe [-k KERNEL_DIR] [-r ROUNDS] [-n NODES,...] "
          "[-t THREADS,...]\n");
}

int main(int argc, char **argv) {
  const char *kdir = GRAPHD_BENCH_KERNEL_DIR;
  unsigned nodes[8] = {1, 32, 100, 300}, threads[8] = {1, 2, 4, 8};
  int nn = 4, nt = 4, c;
  while ((c = getopt(argc, argv, "k:r:n:t:h")) != -1) {
    switch (c) {
      case 'k': kdir = optarg; break;
      case 'r': rounds = strtol(optarg, NULL, 10); break;
      case 'n': nn = parse_list(optarg, nodes, 8); break;
      case 't': nt = parse_list(optarg, threads, 8); break;
      default: usage(); return c == 'h' ? 0 : 2;
    }
  }
  if (optind < argc || rounds < 10 || rounds > 1000000 || nn < 1 || nt < 1) {
    usage();
    return 2;
  }
  char err[512];
  if (gd_cuda_load(&cu, err, sizeof err) < 0) {
    fprintf(stderr, "launch_probe: no GPU: %s\n", err);
    return 77;
  }
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  char path[1024];
  snprintf(path, sizeof path, "%s/test_kernels.cubin", kdir);
  size_t len;
  void *bytes = gd_read_file(path, &len);
  if (!bytes) {
    fprintf(stderr, "launch_probe: cannot read %s\n", path);
    return 1;
  }
  CUmodule mod;
  CK(cuModuleLoadDataEx(&mod, bytes, 0, NULL, NULL));
  free(bytes);
  CK(cuModuleGetFunction(&fn, mod, "scale"));
  CK(cuMemAlloc(&buf, FLOATS * 4));
  CK(cuMemAlloc(&cond_word, 4));
  CK(cuMemsetD32Async(cond_word, 0, 1, NULL));
  CK(cuCtxSynchronize());
  CUmodule own = NULL;
  if (gd_kernels_fatbin_len) {
    CK(cuModuleLoadData(&own, gd_kernels_fatbin));
    CK(cuModuleGetFunction(&set_fn, own, "graphd_set_condition"));
  }
  printf("launch_probe: %ld calls a figure, MPS %s\n", rounds,
         getenv("CUDA_MPS_PIPE_DIRECTORY") ? "asked for" : "not asked for");
  stream_ops();
  for (int i = 0; i < nn; i++) launches(nodes[i], false, 1);
  for (int i = 0; i < nn && set_fn; i++) launches(nodes[i], true, 1);
  if (!set_fn) printf("launch_probe: no graphd kernels in this build (no nvcc): no loop figures\n");
  for (int i = 0; i < nt; i++)
    if (threads[i] > 1) launches(100, false, threads[i]);
  if (own) CK(cuModuleUnload(own));
  CK(cuMemFree(cond_word));
  CK(cuMemFree(buf));
  CK(cuModuleUnload(mod));
  CK(cuDevicePrimaryCtxRelease(dev));
  return 0;
}
