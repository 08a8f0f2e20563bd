/* graphd-demo: one program, registered and replayed a few times on the
 * daemon's first device, with the results checked and the daemon's
 * counters shown. On a host device it uses the host test kernels; on a GPU,
 * the CUBIN the build made with nvcc.
 *   graphd-demo [--socket PATH] KERNEL_DIR
 *   graphd-demo --version | --help
 * It needs libgraphd's public API alone, so it builds against an installed
 * libgraphd as any client does:
 *   cc graphd_demo.c $(pkg-config --cflags --libs libgraphd) -o graphd-demo
 * (and -ldl before glibc 2.34). On a GPU it takes its buffers from the CUDA
 * driver, which it loads at run time as graphd does: building it needs no
 * CUDA toolkit. */
#include <dlfcn.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <graphd/graphd.h>

#define N 4096u

static int fail(const char *what, graphd_client *c) {
  fprintf(stderr, "graphd-demo: %s: %s\n", what, c ? graphd_last_error(c) : "");
  return 1;
}

/* A usage error is one line on stderr and exit status 2. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("graphd-demo: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs("; try 'graphd-demo --help'\n", stderr);
  va_end(ap);
  return 2;
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

/* The whole file at path, malloc'd, or NULL. */
static void *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  void *buf = NULL;
  long n;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) <= 0 || fseek(f, 0, SEEK_SET) != 0) goto exit;
  buf = malloc((size_t)n);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  *len = (size_t)n;
exit:
  fclose(f);
  return buf;
}

/* The CUDA driver calls the GPU path makes, taken from libcuda.so.1 at run
 * time. Their types are those of cuda.h (CUresult, CUdevice, CUdeviceptr,
 * and handles for contexts and streams), spelled here so that no CUDA
 * header is needed; the names are the driver's exported ones (cuda.h maps
 * cuMemAlloc to cuMemAlloc_v2, and so on). */
typedef unsigned long long cu_ptr;
struct cuda {
  int (*init)(unsigned flags);
  int (*device_get)(int *dev, int ordinal);
  int (*primary_ctx_retain)(void **ctx, int dev);
  int (*ctx_set_current)(void *ctx);
  int (*stream_create)(void **stream, unsigned flags);
  int (*stream_synchronize)(void *stream);
  int (*mem_alloc)(cu_ptr *ptr, size_t bytes);
  int (*mem_free)(cu_ptr ptr);
  int (*memcpy_htod)(cu_ptr dst, const void *src, size_t bytes);
  int (*memcpy_dtoh)(void *dst, cu_ptr src, size_t bytes);
};
#define CUDA_STREAM_NON_BLOCKING 1u

/* Loads the driver and initializes it; 0 or -1. */
static int cuda_load(struct cuda *cu) {
  const struct {
    const char *name;
    void *fn;
  } syms[] = {
      {"cuInit", &cu->init},
      {"cuDeviceGet", &cu->device_get},
      {"cuDevicePrimaryCtxRetain", &cu->primary_ctx_retain},
      {"cuCtxSetCurrent", &cu->ctx_set_current},
      {"cuStreamCreate", &cu->stream_create},
      {"cuStreamSynchronize", &cu->stream_synchronize},
      {"cuMemAlloc_v2", &cu->mem_alloc},
      {"cuMemFree_v2", &cu->mem_free},
      {"cuMemcpyHtoD_v2", &cu->memcpy_htod},
      {"cuMemcpyDtoH_v2", &cu->memcpy_dtoh},
  };
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return -1;
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    void *p = dlsym(lib, syms[i].name);
    if (!p) return -1;
    memcpy(syms[i].fn, &p, sizeof p);
  }
  return cu->init(0) == 0 ? 0 : -1;
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
      default:
        if (optopt == 's') return usage_error("option --socket needs a value");
        return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) kdir = argv[optind++];
  if (!kdir) return usage_error("no KERNEL_DIR given");
  if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
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
  void *bytes = read_file(path, &len);
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

  struct cuda cu = {0};
  void *cs = NULL; /* a CUstream */
  if (gpu) {
    int d;
    void *cx;
    if (cuda_load(&cu) < 0 || cu.device_get(&d, 0) || cu.primary_ctx_retain(&cx, d) ||
        cu.ctx_set_current(cx) || cu.stream_create(&cs, CUDA_STREAM_NON_BLOCKING))
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
      cu_ptr a1, a2;
      if (cu.mem_alloc(&a1, N * 4) || cu.mem_alloc(&a2, N * 4) || cu.memcpy_htod(a1, hx, N * 4))
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
      cu.stream_synchronize(cs);
      cu.memcpy_dtoh(hy, dy, N * 4);
      graphd_region_forget(c, dx); /* legacy memory: unregister, then free */
      graphd_region_forget(c, dy);
      cu.mem_free(dx);
      cu.mem_free(dy);
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
