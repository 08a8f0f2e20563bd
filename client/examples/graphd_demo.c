/* graphd-demo: one program, registered and replayed a few times on the
 * daemon's first device, with the results checked and the daemon's
 * counters shown. On a host device it uses the host test kernels; on a GPU,
 * the CUBIN the build made with nvcc.
 *   graphd-demo [--socket PATH] KERNEL_DIR
 *   graphd-demo --version | --help */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda_driver.h"
#include "common/file.h"
#include "common/usage.h"
#include "graphd/graphd.h"

#define N 4096u

static int fail(const char *what, graphd_client *c) {
  fprintf(stderr, "graphd-demo: %s: %s\n", what, c ? graphd_last_error(c) : "");
  return 1;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: graphd-demo [--socket PATH] KERNEL_DIR\n"
          "       graphd-demo --version | --help\n"
          "Registers y = 3 x as a program on the daemon's first device, replays it three\n"
          "times on new buffers, checks the results and shows the daemon's counters.\n"
          "KERNEL_DIR holds host_kernels.so (host devices) or test_kernels.cubin (GPUs):\n"
          "build/tests/kernels in a build tree.\n"
          "  --socket PATH  the daemon's socket (default: $GRAPHD_SOCKET, else the\n"
          "                 default one)\n");
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"socket", required_argument, NULL, 's'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0},
  };
  const char *sock = NULL, *kdir = NULL;
  int opt;
  opterr = 0;
  while ((opt = getopt_long(argc, argv, "s:hV", opts, NULL)) != -1) {
    switch (opt) {
      case 's': sock = optarg; break;
      case 'h': usage(stdout); return 0;
      case 'V': printf("graphd-demo %s\n", graphd_version()); return 0;
      default: gd_getopt_error(stderr, "graphd-demo", argv, opts); return 2;
    }
  }
  if (optind < argc) kdir = argv[optind++];
  if (!kdir) {
    gd_usage_error(stderr, "graphd-demo", "no KERNEL_DIR given");
    return 2;
  }
  if (optind < argc) {
    gd_usage_error(stderr, "graphd-demo", "unexpected argument '%s'", argv[optind]);
    return 2;
  }
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = sock;
  o.client_name = "graphd-demo";
  char err[GRAPHD_ERRMAX];
  graphd_client *ctl;
  if (graphd_connect(&o, &ctl, err, sizeof err) != GRAPHD_OK) {
    fprintf(stderr, "graphd-demo: %s\n", err);
    return 1;
  }
  graphd_daemon_status *st;
  if (graphd_get_status(ctl, &st) != GRAPHD_OK) return fail("status", ctl);
  graphd_device_info dev = st->devices[0];
  graphd_daemon_status_free(st);
  bool gpu = strcmp(dev.backend, "cuda") == 0;
  printf("demo: device 0 is %s (%s, backend %s)\n", dev.name, dev.uuid_str, dev.backend);

  o.kind = GRAPHD_SESSION_DATA;
  memcpy(o.device_uuid, dev.uuid, 16);
  graphd_client *c;
  if (graphd_connect(&o, &c, err, sizeof err) != GRAPHD_OK) {
    fprintf(stderr, "graphd-demo: %s\n", err);
    return 1;
  }
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", kdir, gpu ? "test_kernels.cubin" : "host_kernels.so");
  size_t len;
  void *bytes = gd_read_file(path, &len);
  if (!bytes) {
    fprintf(stderr, "graphd-demo: cannot read %s (build the tests, and nvcc for GPUs)\n", path);
    return 1;
  }
  uint8_t mod[32], pid[32];
  if (graphd_register_module(c, gpu ? GRAPHD_MODULE_CUBIN : GRAPHD_MODULE_HOST_ELF, bytes, len,
                             mod) != GRAPHD_OK)
    return fail("register module", c);
  free(bytes);

  /* y = a * x over N floats: one kernel, a staged input and a staged output. */
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  int x = graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, N * 4, 1);
  int y = graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, N * 4, 1);
  uint32_t grid[3] = {N / 256, 1, 1}, block[3] = {256, 1, 1}, n = N;
  float a = 3.0f;
  int s = graphd_program_add_launch(p, mod, "scale", grid, block, 0);
  graphd_program_param_slot(p, (uint32_t)s, 0, (uint32_t)x, 0);
  graphd_program_param_slot(p, (uint32_t)s, 8, (uint32_t)y, 0);
  graphd_program_param(p, (uint32_t)s, 16, &a, 4);
  graphd_program_param(p, (uint32_t)s, 20, &n, 4);
  if (graphd_program_finish(p, pid) != GRAPHD_OK || graphd_register_program(c, p) != GRAPHD_OK)
    return fail("register program", c);
  graphd_program_free(p);
  char hex[65];
  graphd_id_hex(pid, hex);
  printf("demo: program %.12s registered (y = 3 x over %u floats)\n", hex, N);

  const gd_cuda *cu = NULL;
  CUstream cs = NULL;
  if (gpu) {
    CUdevice d;
    CUcontext cx;
    if (gd_cuda_load(&cu, err, sizeof err) < 0 || cu->cuDeviceGet(&d, 0) ||
        cu->cuDevicePrimaryCtxRetain(&cx, d) || cu->cuCtxSetCurrent(cx) ||
        cu->cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING))
      return fail("CUDA setup", NULL);
  }
  graphd_stream *gs;
  if (graphd_stream_attach(c, cs, &gs) != GRAPHD_OK) return fail("stream", c);
  static float hx[N], hy[N];
  int bad = 0;
  for (int round = 0; round < 3; round++) {
    for (uint32_t i = 0; i < N; i++) hx[i] = (float)(i + round);
    uint64_t dx, dy;
    void *px = NULL, *py = NULL;
    if (gpu) {
      CUdeviceptr a1, a2;
      if (cu->cuMemAlloc(&a1, N * 4) || cu->cuMemAlloc(&a2, N * 4) ||
          cu->cuMemcpyHtoD(a1, hx, N * 4))
        return fail("CUDA buffers", NULL);
      dx = a1;
      dy = a2;
    } else {
      if (graphd_host_alloc(c, N * 4, &px) || graphd_host_alloc(c, N * 4, &py))
        return fail("host buffers", c);
      memcpy(px, hx, N * 4);
      dx = (uint64_t)(uintptr_t)px;
      dy = (uint64_t)(uintptr_t)py;
    }
    graphd_binding b[2] = {{(uint32_t)x, dx, N * 4}, {(uint32_t)y, dy, N * 4}};
    graphd_replay_info info;
    if (graphd_replay(c, gs, pid, b, 2, &info) != GRAPHD_OK) return fail("replay", c);
    if (gpu) {
      cu->cuStreamSynchronize(cs);
      cu->cuMemcpyDtoH(hy, dy, N * 4);
      graphd_region_forget(c, dx); /* legacy memory: unregister, then free */
      graphd_region_forget(c, dy);
      cu->cuMemFree(dx);
      cu->cuMemFree(dy);
    } else {
      memcpy(hy, py, N * 4);
      graphd_host_free(c, px);
      graphd_host_free(c, py);
    }
    for (uint32_t i = 0; i < N; i++) bad += hy[i] != 3.0f * hx[i];
    printf("demo: replay %d on new buffers: y[0..2] = %g %g %g%s (%s)\n", round + 1, (double)hy[0],
           (double)hy[1], (double)hy[2], info.captured ? ", captured" : "",
           bad ? "WRONG" : "correct");
  }
  graphd_stream_detach(gs);
  if (graphd_get_status(ctl, &st) != GRAPHD_OK) return fail("status", ctl);
  graphd_device_counters k = st->devices[0].counters;
  printf("demo: device 0 now holds %llu capture(s), %llu replay(s) done, %llu error(s)\n",
         (unsigned long long)k.captures, (unsigned long long)k.replays,
         (unsigned long long)k.errors);
  graphd_daemon_status_free(st);
  graphd_close(c);
  graphd_close(ctl);
  return bad ? 1 : 0;
}
