/* large_bench: a program of real size through graphd, beside the same work
 * as a CUDA graph in this process. The shape is one step of a MuJoCo Warp
 * humanoid: S in-out slots (250 by default, 16 KiB each) and L launches
 * (185) of the test kernel `scale`, launch i reading slot i mod S and
 * writing slot (i + 1) mod S.
 *
 * Per mode (staged, staged_ex, direct), the time of one replay to stream sync,
 * median of --rounds, for four ways of binding:
 *   fixed      the same buffers every call;
 *   alternate  two sets of buffers in turn (a JAX scan's carry);
 *   rotate     three sets in turn;
 *   fresh      buffers at new addresses on every call.
 * Anchors, in this process on the same GPU: the graph of the same launches
 * on fixed buffers, and the same graph with a copy into and out of every
 * slot around it (what staging costs). Beside each time, the daemon's
 * worker's mean time per replay over the same calls (from Status: checks,
 * binding resolution, queueing). It prints figures and asserts nothing;
 * exit 1 when something fails, 77 without a GPU. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cuda_driver.h"
#include "common/file.h"
#include "graphd/graphd.h"
#include "bench_util.h"

#ifndef GRAPHD_BENCH_KERNEL_DIR
#define GRAPHD_BENCH_KERNEL_DIR "tests/kernels"
#endif

#define FRESH_EXTRA 64 /* slots the fresh window slides over */
#define NMODES 3

static const gd_cuda *cu;
static unsigned S = 250, L = 185, FLOATS = 4096;
static long ROUNDS = 200;

#define CK(call)                                                                                   \
  do {                                                                                             \
    CUresult r_ = (call);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      const char *s_ = "?";                                                                        \
      cu->cuGetErrorName(r_, &s_);                                                                 \
      fprintf(stderr, "large_bench: %s failed: %s (line %d)\n", #call, s_, __LINE__);              \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static double median(double *v, long n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return v[n / 2];
}

static size_t slot_bytes(void) { return (size_t)FLOATS * 4; }

/* The worker's time in the replay path on the device with this UUID, and
 * how many replays it covers (Status). */
static void worker_time(graphd_client *c, const uint8_t uuid[16], uint64_t *ns, uint64_t *n) {
  graphd_daemon_status *s;
  *ns = *n = 0;
  if (graphd_get_status(c, &s) != GRAPHD_OK) {
    fprintf(stderr, "large_bench: status: %s\n", graphd_last_error(c));
    exit(1);
  }
  for (uint32_t i = 0; i < s->ndevices; i++)
    if (memcmp(s->devices[i].uuid, uuid, 16) == 0) {
      *ns = s->work[i].replay_ns;
      *n = s->work[i].replays;
    }
  graphd_daemon_status_free(s);
}

/* The in-process graph of the L launches over slots at base + k * slot,
 * with copies from and to `client` around it when staged. */
static CUgraphExec anchor_graph(CUfunction fn, CUdeviceptr base, CUdeviceptr client, int staged,
                                CUcontext ctx) {
  CUgraph g;
  CK(cu->cuGraphCreate(&g, 0));
  CUgraphNode *in = calloc(S, sizeof *in), prev = NULL;
  size_t nin = 0;
  if (staged)
    for (unsigned k = 0; k < S; k++) {
      CUDA_MEMCPY3D c;
      memset(&c, 0, sizeof c);
      c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
      c.srcDevice = client + k * slot_bytes();
      c.dstDevice = base + k * slot_bytes();
      c.WidthInBytes = slot_bytes();
      c.Height = c.Depth = 1;
      CK(cu->cuGraphAddMemcpyNode(&in[nin++], g, NULL, 0, &c, ctx));
    }
  for (unsigned i = 0; i < L; i++) {
    CUdeviceptr x = base + (i % S) * slot_bytes(), y = base + ((i + 1) % S) * slot_bytes();
    float a = 1.0f;
    unsigned n = FLOATS;
    void *params[] = {&x, &y, &a, &n};
    CUDA_KERNEL_NODE_PARAMS k;
    memset(&k, 0, sizeof k);
    k.func = fn;
    k.gridDimX = FLOATS / 256, k.gridDimY = k.gridDimZ = 1;
    k.blockDimX = 256, k.blockDimY = k.blockDimZ = 1;
    k.kernelParams = params;
    CUgraphNode node;
    CK(cu->cuGraphAddKernelNode(&node, g, prev ? &prev : in, prev ? 1 : nin, &k));
    prev = node;
  }
  if (staged)
    for (unsigned k = 0; k < S; k++) {
      CUDA_MEMCPY3D c;
      memset(&c, 0, sizeof c);
      c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
      c.srcDevice = base + k * slot_bytes();
      c.dstDevice = client + k * slot_bytes();
      c.WidthInBytes = slot_bytes();
      c.Height = c.Depth = 1;
      CUgraphNode out;
      CK(cu->cuGraphAddMemcpyNode(&out, g, &prev, 1, &c, ctx));
    }
  CUgraphExec e;
  CK(cu->cuGraphInstantiateWithFlags(&e, g, 0));
  CK(cu->cuGraphDestroy(g));
  free(in);
  return e;
}

static double time_anchor(CUgraphExec e, CUstream st) {
  double *t = calloc((size_t)ROUNDS, sizeof *t);
  for (long r = -10; r < ROUNDS; r++) {
    double t0 = bench_now_us();
    CK(cu->cuGraphLaunch(e, st));
    CK(cu->cuStreamSynchronize(st));
    if (r >= 0) t[r] = bench_now_us() - t0;
  }
  double m = median(t, ROUNDS);
  free(t);
  return m;
}

static void usage(void) {
  fprintf(stderr,
          "usage: large_bench [--socket PATH] [--kernels DIR] [--slots S] [--launches L]\n"
          "                   [--floats N] [--rounds R]\n");
}

int main(int argc, char **argv) {
  const char *socket = NULL, *kdir = GRAPHD_BENCH_KERNEL_DIR;
  static const struct option opts[] = {
      {"socket", 1, 0, 's'}, {"kernels", 1, 0, 'k'}, {"slots", 1, 0, 'S'}, {"launches", 1, 0, 'L'},
      {"floats", 1, 0, 'f'}, {"rounds", 1, 0, 'r'},  {"help", 0, 0, 'h'},  {0, 0, 0, 0}};
  for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
    switch (c) {
      case 's': socket = optarg; break;
      case 'k': kdir = optarg; break;
      case 'S': S = (unsigned)strtoul(optarg, NULL, 10); break;
      case 'L': L = (unsigned)strtoul(optarg, NULL, 10); break;
      case 'f': FLOATS = (unsigned)strtoul(optarg, NULL, 10); break;
      case 'r': ROUNDS = strtol(optarg, NULL, 10); break;
      default: usage(); return c == 'h' ? 0 : 2;
    }
  }
  if (S < 2 || L < 1 || FLOATS < 256 || FLOATS % 256 || ROUNDS < 3) {
    usage();
    return 2;
  }
  char err[GRAPHD_ERRMAX];
  if (gd_cuda_load(&cu, err, sizeof err) < 0) {
    fprintf(stderr, "large_bench: no GPU: %s\n", err);
    return 77;
  }
  CUdevice dev;
  CUcontext ctx;
  CUuuid uuid;
  CK(cu->cuDeviceGet(&dev, 0));
  CK(cu->cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cu->cuCtxSetCurrent(ctx));
  CK(cu->cuDeviceGetUuid(&uuid, dev));
  char path[1024];
  snprintf(path, sizeof path, "%s/test_kernels.cubin", kdir);
  size_t mlen;
  void *mod_bytes = gd_read_file(path, &mlen);
  if (!mod_bytes) {
    fprintf(stderr, "large_bench: cannot read %s\n", path);
    return 1;
  }
  CUmodule mod;
  CUfunction fn;
  CK(cu->cuModuleLoadDataEx(&mod, mod_bytes, 0, NULL, NULL));
  CK(cu->cuModuleGetFunction(&fn, mod, "scale"));
  CUstream st;
  CK(cu->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));

  /* Three sets of S slots, and a window of S + FRESH_EXTRA slots. */
  size_t set_bytes = S * slot_bytes();
  CUdeviceptr set[3], window, staging;
  for (int k = 0; k < 3; k++) CK(cu->cuMemAlloc(&set[k], set_bytes));
  CK(cu->cuMemAlloc(&window, set_bytes + FRESH_EXTRA * slot_bytes()));
  CK(cu->cuMemAlloc(&staging, set_bytes));
  CK(cu->cuMemsetD32Async(set[0], 0x3f800000u, set_bytes / 4, st)); /* 1.0f */
  for (int k = 1; k < 3; k++) CK(cu->cuMemsetD32Async(set[k], 0x3f800000u, set_bytes / 4, st));
  CK(cu->cuMemsetD32Async(window, 0x3f800000u, (set_bytes + FRESH_EXTRA * slot_bytes()) / 4, st));
  CK(cu->cuStreamSynchronize(st));

  double fixed_us = time_anchor(anchor_graph(fn, staging, set[0], 0, ctx), st);
  double copies_us = time_anchor(anchor_graph(fn, staging, set[0], 1, ctx), st);

  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = socket;
  o.kind = GRAPHD_SESSION_DATA;
  memcpy(o.device_uuid, uuid.bytes, 16);
  o.timeout_ms = 120000;
  o.client_name = "large_bench";
  graphd_client *c;
  if (graphd_connect(&o, &c, err, sizeof err) != GRAPHD_OK) {
    fprintf(stderr, "large_bench: %s\n", err);
    return 1;
  }
  static const graphd_mode modes[NMODES] = {GRAPHD_MODE_STAGED, GRAPHD_MODE_STAGED_EX,
                                            GRAPHD_MODE_DIRECT};
  static const char *const mode_names[NMODES] = {"staged", "staged_ex", "direct"};
  uint8_t mid[32], pid[NMODES][32];
  if (graphd_register_module(c, GRAPHD_MODULE_CUBIN, mod_bytes, mlen, mid) != GRAPHD_OK) {
    fprintf(stderr, "large_bench: %s\n", graphd_last_error(c));
    return 1;
  }
  for (int m = 0; m < NMODES; m++) {
    graphd_program *p = graphd_program_new(modes[m]);
    for (unsigned k = 0; k < S; k++) graphd_program_add_slot(p, GRAPHD_SLOT_INOUT, slot_bytes(), 1);
    uint32_t grid[3] = {FLOATS / 256, 1, 1}, block[3] = {256, 1, 1};
    float a = 1.0f;
    for (unsigned i = 0; i < L; i++) {
      int s = graphd_program_add_launch(p, mid, "scale", grid, block, 0);
      graphd_program_param_slot(p, (uint32_t)s, 0, i % S, 0);
      graphd_program_param_slot(p, (uint32_t)s, 8, (i + 1) % S, 0);
      graphd_program_param(p, (uint32_t)s, 16, &a, 4);
      graphd_program_param(p, (uint32_t)s, 20, &FLOATS, 4);
    }
    if (graphd_program_finish(p, pid[m]) != GRAPHD_OK ||
        graphd_register_program(c, p) != GRAPHD_OK) {
      fprintf(stderr, "large_bench: %s / %s\n", graphd_program_error(p), graphd_last_error(c));
      return 1;
    }
    graphd_program_free(p);
  }
  graphd_stream *gs;
  if (graphd_stream_attach(c, st, &gs) != GRAPHD_OK) {
    fprintf(stderr, "large_bench: %s\n", graphd_last_error(c));
    return 1;
  }
  graphd_binding *bd = calloc(S, sizeof *bd);
  double *t = calloc((size_t)ROUNDS, sizeof *t);
  static const char *const ways[4] = {"fixed", "alternate", "rotate", "fresh"};
  double res[NMODES][4], first[NMODES], work[NMODES][4];
  for (int m = 0; m < NMODES; m++) {
    for (int w = -1; w < 4; w++) {
      uint64_t ns0, n0, ns1, n1;
      worker_time(c, (const uint8_t *)uuid.bytes, &ns0, &n0);
      for (long r = -10; r < ROUNDS; r++) {
        long i = r + 10;
        CUdeviceptr base = w <= 0   ? set[0]
                           : w == 1 ? set[i % 2]
                           : w == 2 ? set[i % 3]
                                    : window + (size_t)(i % FRESH_EXTRA) * slot_bytes();
        for (unsigned k = 0; k < S; k++)
          bd[k] =
              (graphd_binding){.slot = k, .ptr = base + k * slot_bytes(), .bytes = slot_bytes()};
        double t0 = bench_now_us();
        if (graphd_replay(c, gs, pid[m], bd, S, NULL) != GRAPHD_OK) {
          fprintf(stderr, "large_bench: replay: %s\n", graphd_last_error(c));
          return 1;
        }
        CK(cu->cuStreamSynchronize(st));
        double dt = bench_now_us() - t0;
        if (w < 0) { /* the first call captures; time it, then warm up */
          first[m] = dt;
          break;
        }
        if (r >= 0) t[r] = dt;
      }
      worker_time(c, (const uint8_t *)uuid.bytes, &ns1, &n1);
      if (w >= 0) {
        res[m][w] = median(t, ROUNDS);
        work[m][w] = n1 > n0 ? (double)(ns1 - ns0) / (double)(n1 - n0) / 1e3 : 0;
      }
    }
  }
  printf(
      "large_bench: %u slots of %zu bytes, %u launches, median of %ld, per call to stream sync\n",
      S, slot_bytes(), L, ROUNDS);
  printf("in-process graph on fixed buffers            %9.1f us\n", fixed_us);
  printf("in-process graph with a copy in/out per slot %9.1f us\n", copies_us);
  printf("%-12s %12s %12s %12s\n", "bindings", "staged", "staged_ex", "direct");
  for (int w = 0; w < 4; w++)
    printf("%-12s %9.1f us %9.1f us %9.1f us\n", ways[w], res[0][w], res[1][w], res[2][w]);
  printf("first call (capture) %9.1f us %9.1f us %9.1f us\n", first[0], first[1], first[2]);
  printf("the daemon's worker, mean time per replay (checks, bindings, queueing):\n");
  for (int w = 0; w < 4; w++)
    printf("%-12s %9.1f us %9.1f us %9.1f us\n", ways[w], work[0][w], work[1][w], work[2][w]);
  printf("direct, fixed buffers, against the in-process graph with copies: %.2fx faster\n",
         copies_us / res[2][0]);
  printf("RESULT slots=%u launches=%u inproc_fixed_us=%.1f inproc_copies_us=%.1f", S, L, fixed_us,
         copies_us);
  for (int m = 0; m < NMODES; m++)
    for (int w = 0; w < 4; w++)
      printf(" %s_%s_us=%.1f %s_%s_worker_us=%.1f", mode_names[m], ways[w], res[m][w],
             mode_names[m], ways[w], work[m][w]);
  printf("\n");
  graphd_close(c);
  return 0;
}
