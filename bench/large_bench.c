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
 * binding resolution, queueing).
 *
 * Then, per mode, the asynchronous rate on fixed buffers: --rounds
 * graphd_replay_async calls back to back and one stream sync, the time
 * per replay, beside --rounds launches of the in-process graph on fixed
 * buffers the same way; with the daemon's sampled GPU time per replay
 * (Status) beside the in-process graph's own, timed with events. It prints
 * figures and asserts nothing; exit 1 when something fails, 77 without a
 * GPU. */
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

/* The worker's record of the device with this UUID (Status): its time in
 * the replay path over the replays it took, and the sampled GPU time. */
static graphd_device_work worker_time(graphd_client *c, const uint8_t uuid[16]) {
  graphd_daemon_status *s;
  graphd_device_work w = {0};
  if (graphd_get_status(c, &s) != GRAPHD_OK) {
    fprintf(stderr, "large_bench: status: %s\n", graphd_last_error(c));
    exit(1);
  }
  for (uint32_t i = 0; i < s->ndevices; i++)
    if (memcmp(s->devices[i].uuid, uuid, 16) == 0) w = s->work[i];
  graphd_daemon_status_free(s);
  return w;
}

/* Mean microseconds per replay (or of the GPU per sampled replay) between
 * two records; 0 with none. */
static double per_replay_us(graphd_device_work a, graphd_device_work b) {
  return b.replays > a.replays
             ? (double)(b.replay_ns - a.replay_ns) / 1e3 / (double)(b.replays - a.replays)
             : 0;
}
static double gpu_us(graphd_device_work a, graphd_device_work b) {
  return b.gpu_replays > a.gpu_replays
             ? (double)(b.gpu_ns - a.gpu_ns) / 1e3 / (double)(b.gpu_replays - a.gpu_replays)
             : 0;
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

/* ROUNDS launches back to back, then one sync: microseconds per launch;
 * *gpu_us gets one launch's time on the GPU (events, median). */
static double stream_anchor(CUgraphExec e, CUstream st, double *gpu_us) {
  CUevent a, b;
  CK(cu->cuEventCreate(&a, CU_EVENT_DEFAULT));
  CK(cu->cuEventCreate(&b, CU_EVENT_DEFAULT));
  double *g = calloc((size_t)ROUNDS, sizeof *g);
  for (long r = 0; r < ROUNDS; r++) {
    float ms = 0;
    CK(cu->cuEventRecord(a, st));
    CK(cu->cuGraphLaunch(e, st));
    CK(cu->cuEventRecord(b, st));
    CK(cu->cuEventSynchronize(b));
    CK(cu->cuEventElapsedTime(&ms, a, b));
    g[r] = ms * 1e3;
  }
  *gpu_us = median(g, ROUNDS);
  free(g);
  CK(cu->cuEventDestroy(a));
  CK(cu->cuEventDestroy(b));
  double t0 = bench_now_us();
  for (long r = 0; r < ROUNDS; r++) CK(cu->cuGraphLaunch(e, st));
  CK(cu->cuStreamSynchronize(st));
  return (bench_now_us() - t0) / (double)ROUNDS;
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
      graphd_device_work w0 = worker_time(c, (const uint8_t *)uuid.bytes);
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
      graphd_device_work w1 = worker_time(c, (const uint8_t *)uuid.bytes);
      if (w >= 0) {
        res[m][w] = median(t, ROUNDS);
        work[m][w] = per_replay_us(w0, w1);
      }
    }
  }
  /* Asynchronous, fixed buffers: back to back, one sync. */
  double anchor_gpu_us,
      anchor_async_us = stream_anchor(anchor_graph(fn, set[0], set[0], 0, ctx), st, &anchor_gpu_us);
  double async_us[NMODES], async_work[NMODES], async_gpu[NMODES];
  for (unsigned k = 0; k < S; k++)
    bd[k] = (graphd_binding){.slot = k, .ptr = set[0] + k * slot_bytes(), .bytes = slot_bytes()};
  for (int m = 0; m < NMODES; m++) {
    for (int k = 0; k < 10; k++)
      if (graphd_replay_async(c, gs, pid[m], bd, S, NULL) != GRAPHD_OK) {
        fprintf(stderr, "large_bench: async replay: %s\n", graphd_last_error(c));
        return 1;
      }
    CK(cu->cuStreamSynchronize(st));
    graphd_device_work w0 = worker_time(c, (const uint8_t *)uuid.bytes);
    double t0 = bench_now_us();
    for (long r = 0; r < ROUNDS; r++)
      if (graphd_replay_async(c, gs, pid[m], bd, S, NULL) != GRAPHD_OK) {
        fprintf(stderr, "large_bench: async replay: %s\n", graphd_last_error(c));
        return 1;
      }
    CK(cu->cuStreamSynchronize(st));
    async_us[m] = (bench_now_us() - t0) / (double)ROUNDS;
    if (graphd_replay_collect(c, NULL) != GRAPHD_OK) {
      fprintf(stderr, "large_bench: async replay: %s\n", graphd_last_error(c));
      return 1;
    }
    graphd_device_work w1 = worker_time(c, (const uint8_t *)uuid.bytes);
    async_work[m] = per_replay_us(w0, w1);
    async_gpu[m] = gpu_us(w0, w1);
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
  printf("asynchronous, fixed buffers, %ld back to back then one sync, per replay:\n", ROUNDS);
  printf("in-process graph on fixed buffers            %9.1f us (GPU %.1f us a launch)\n",
         anchor_async_us, anchor_gpu_us);
  for (int m = 0; m < NMODES; m++)
    printf("%-12s %9.1f us (%.2fx the in-process graph); worker %.1f us, GPU %.1f us (%.2fx)\n",
           mode_names[m], async_us[m], async_us[m] / anchor_async_us, async_work[m], async_gpu[m],
           async_gpu[m] / anchor_gpu_us);
  printf("RESULT slots=%u launches=%u inproc_fixed_us=%.1f inproc_copies_us=%.1f", S, L, fixed_us,
         copies_us);
  for (int m = 0; m < NMODES; m++)
    for (int w = 0; w < 4; w++)
      printf(" %s_%s_us=%.1f %s_%s_worker_us=%.1f", mode_names[m], ways[w], res[m][w],
             mode_names[m], ways[w], work[m][w]);
  printf(" inproc_async_us=%.1f inproc_gpu_us=%.1f", anchor_async_us, anchor_gpu_us);
  for (int m = 0; m < NMODES; m++)
    printf(" %s_async_us=%.1f %s_async_worker_us=%.1f %s_async_gpu_us=%.1f", mode_names[m],
           async_us[m], mode_names[m], async_work[m], mode_names[m], async_gpu[m]);
  printf("\n");
  graphd_close(c);
  return 0;
}
