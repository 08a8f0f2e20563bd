/* replay_bench: the figures of the request path. It prints timings and
 * never asserts them; it fails (exit 1) only when something does not work,
 * a wrong chain result included.
 *
 *  1. Unix socket echo floor: 64-byte round trips to a forked echo child
 *     over a socketpair.
 *  2. graphd_ping round trips on a control and a data session.
 *  3. Sync replay round trips of a 1-kernel program (scale over 64 Ki floats,
 *     staged input and output), once per mode (staged, staged_ex: two
 *     programs, as the mode is part of the program). Bindings alternate
 *     between a VMM buffer pair and a cuMemAlloc one, so addresses and
 *     memory kinds change on every call.
 *  4. Per mode, a chain of dependent replays, ping-ponging between the two
 *     pairs' inputs, timed from the first call to the final synchronize and
 *     checked bit for bit on the host.
 *  5. The same through graphd_replay_async (the submission ring): the host
 *     cost of a call (p50, with the stream synchronized after each call,
 *     untimed), and the chain of dependent replays, checked the same way.
 *  6. A summary with the ratios the targets use, sync and async side by
 *     side, and whether MPS is on.
 *
 * Exit status: 0 when every step worked, 1 on a failure (one line on
 * stderr), 77 when there is no GPU (after the host-only figures).
 *
 * The echo child is forked before anything starts a thread or calls cuInit:
 * CUDA is unusable in a child forked after cuInit. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/cuda_driver.h"
#include "../common/file.h"
#include "graphd/graphd.h"
#include "bench_util.h"

#ifndef GRAPHD_BENCH_KERNEL_DIR
#define GRAPHD_BENCH_KERNEL_DIR "tests/kernels"
#endif

#define NFLOATS (64u * 1024u) /* per slot: 256 KiB */
#define SLOT_BYTES (NFLOATS * 4u)
#define PAIR_BYTES (2u * SLOT_BYTES) /* x at 0, y at SLOT_BYTES */
#define ECHO_BYTES 64
#define SCALE_A 1.0001f /* stays finite over MAX_CHAIN steps */
#define MAX_ROUNDS 10000000L
#define MAX_CHAIN 100000L /* 1.0001^1e5 is about 2.2e4 */
#define EXIT_SKIP 77

static const char *const mode_names[2] = {"staged", "staged_ex"};

typedef struct bench_opts {
  const char *socket; /* NULL: libgraphd's default */
  const char *uuid;   /* --device-uuid, or NULL */
  int device;         /* --device, or -1 */
  long rounds;
  long chain;
  const char *kernels; /* directory holding test_kernels.cubin */
  int vmm_only;        /* both pairs in the VMM allocation (what JAX gives) */
} bench_opts;

typedef struct stats {
  size_t n;
  double p50, p90, p99, min, max, mean; /* microseconds */
} stats;

typedef struct mode_result {
  stats replay;         /* host time of graphd_replay */
  stats server;         /* the daemon worker's time, from info.server_ns */
  double first_us;      /* host time of the first call */
  double capture_us;    /* info.capture_ns of the first call */
  int captured;         /* the first call built the capture */
  double prepare_us;    /* graphd_prepare_program round trip */
  double chain_us;      /* per dependent replay */
  double chain_call_us; /* mean host time of a chain's graphd_replay */
  int chain_ok;
  float chain_got, chain_want;
  stats async_call;      /* host time of graphd_replay_async */
  double achain_us;      /* per dependent async replay */
  double achain_call_us; /* mean host time of a chain's graphd_replay_async */
  int achain_ok;
} mode_result;

/* Every resource the bench holds; bench_close() releases what is set. */
typedef struct bench {
  bench_opts o;
  char err[GRAPHD_ERRMAX + 256];
  const gd_cuda *cu;
  CUdevice dev;
  int ordinal;
  CUcontext ctx; /* the device's primary context, retained */
  CUstream stream;
  graphd_client *ctl, *data;
  graphd_stream *gs;
  uint8_t uuid[16];
  char uuid_str[48];
  char dev_name[256];
  /* Pair 0 lives in one VMM allocation, pair 1 in one cuMemAlloc
   * allocation; each holds x at offset 0 and y at SLOT_BYTES. */
  CUmemGenericAllocationHandle vmm_h;
  CUdeviceptr vmm_va;
  size_t vmm_size;
  int vmm_created, vmm_reserved, vmm_mapped;
  CUdeviceptr legacy;
  CUdeviceptr x[2], y[2];
  uint64_t import_ns[2];
  uint8_t module_id[32];
  uint8_t prog[2][32];
  float *host_x[2], *host_buf;
  double *samples, *server;
  /* results */
  stats echo, ping_ctl, ping_data;
  int have_ping_ctl;
  int mps_driver, mps_daemon;
  mode_result mode[2];
} bench;

static void set_err(bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(bench *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->err, sizeof b->err, fmt, ap);
  va_end(ap);
}

/* Checks a driver call made through the table; on failure records the
 * call's text, line and the driver's error, then jumps to label. */
#define CU_CHECK_GOTO(b, call, label)                                                              \
  do {                                                                                             \
    CUresult r_ = (b)->cu->call;                                                                   \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      char e_[160];                                                                                \
      set_err(b, "%s failed (%s:%d): %s", #call, __FILE__, __LINE__,                               \
              gd_cuda_strerror((b)->cu, r_, e_, sizeof e_));                                       \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)

/* The same for cleanup paths: a failure is reported and ignored. */
#define CU_CHECK_IGNORE(b, call)                                                                   \
  do {                                                                                             \
    CUresult r_ = (b)->cu->call;                                                                   \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      char e_[160];                                                                                \
      fprintf(stderr, "replay_bench: warning: %s failed: %s\n", #call,                             \
              gd_cuda_strerror((b)->cu, r_, e_, sizeof e_));                                       \
    }                                                                                              \
  } while (0)

/* Checks a libgraphd call on client c; what names it in the message. */
#define GD_CHECK_GOTO(b, c, what, call, label)                                                     \
  do {                                                                                             \
    graphd_status s_ = (call);                                                                     \
    if (s_ != GRAPHD_OK) {                                                                         \
      set_err(b, "%s: %s: %s", what, graphd_status_name(s_), graphd_last_error(c));                \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)

/* Nearest-rank percentile of a sorted array. */
static double pct(const double *v, size_t n, double q) {
  size_t k = (size_t)ceil(q * (double)n);
  if (k < 1) k = 1;
  if (k > n) k = n;
  return v[k - 1];
}

/* Sorts v and summarises it. */
static stats stats_of(double *v, size_t n) {
  stats s = {.n = n};
  if (n == 0) return s;
  qsort(v, n, sizeof *v, bench_cmp_double);
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += v[i];
  s.p50 = pct(v, n, 0.50);
  s.p90 = pct(v, n, 0.90);
  s.p99 = pct(v, n, 0.99);
  s.min = v[0];
  s.max = v[n - 1];
  s.mean = sum / (double)n;
  return s;
}

static void print_stats(const char *what, const stats *s) {
  printf("%-32s p50 %8.2f  p90 %8.2f  p99 %8.2f  min %8.2f  max %9.2f  mean %8.2f us  (n=%zu)\n",
         what, s->p50, s->p90, s->p99, s->min, s->max, s->mean, s->n);
}

static long warmup_of(long rounds) {
  long w = rounds / 10;
  return w < 10 ? 10 : w > 500 ? 500 : w;
}

/* ---- arguments ----------------------------------------------------------- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: replay_bench [options]\n"
          "  --socket PATH       graphd's socket (default: libgraphd's: $GRAPHD_SOCKET, ...)\n"
          "  --device N          CUDA device N of this process (default 0), named to the\n"
          "                      daemon by its UUID\n"
          "  --device-uuid UUID  the device by UUID (GPU-...), instead of --device\n"
          "  --rounds N          timed rounds for echo, ping and sync replay (default 5000)\n"
          "  --chain N           dependent replays per chain, 1 to %ld (default 1000)\n"
          "  --kernels DIR       where test_kernels.cubin is (default %s)\n"
          "  --vmm-only          both buffer pairs in one VMM allocation (JAX's case);\n"
          "                      by default pair 1 is cuMemAlloc memory, so kinds alternate\n"
          "  --help              this text\n"
          "Exit status: 0 ok, 1 failure, 77 no GPU.\n",
          MAX_CHAIN, GRAPHD_BENCH_KERNEL_DIR);
}

static int parse_long(const char *flag, const char *v, long lo, long hi, long *out, char *err,
                      size_t errlen) {
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (errno || end == v || *end || n < lo || n > hi) {
    snprintf(err, errlen, "%s: '%s' is not a number from %ld to %ld", flag, v, lo, hi);
    return -1;
  }
  *out = n;
  return 0;
}

/* Returns 0, 1 for --help, or -1 with err set. */
static int parse_args(int argc, char **argv, bench_opts *o, char *err, size_t errlen) {
  enum {
    OPT_SOCKET = 1,
    OPT_DEVICE,
    OPT_UUID,
    OPT_ROUNDS,
    OPT_CHAIN,
    OPT_KERNELS,
    OPT_VMM_ONLY,
    OPT_HELP
  };
  static const struct option longopts[] = {
      {"socket", required_argument, NULL, OPT_SOCKET},
      {"device", required_argument, NULL, OPT_DEVICE},
      {"device-uuid", required_argument, NULL, OPT_UUID},
      {"rounds", required_argument, NULL, OPT_ROUNDS},
      {"chain", required_argument, NULL, OPT_CHAIN},
      {"kernels", required_argument, NULL, OPT_KERNELS},
      {"vmm-only", no_argument, NULL, OPT_VMM_ONLY},
      {"help", no_argument, NULL, OPT_HELP},
      {NULL, 0, NULL, 0},
  };
  memset(o, 0, sizeof *o);
  o->device = -1;
  o->rounds = 5000;
  o->chain = 1000;
  o->kernels = GRAPHD_BENCH_KERNEL_DIR;
  opterr = 0;
  int ch;
  long v;
  while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (ch) {
      case OPT_SOCKET: o->socket = optarg; break;
      case OPT_VMM_ONLY: o->vmm_only = 1; break;
      case OPT_DEVICE:
        if (parse_long("--device", optarg, 0, 1023, &v, err, errlen) < 0) return -1;
        o->device = (int)v;
        break;
      case OPT_UUID: o->uuid = optarg; break;
      case OPT_ROUNDS:
        if (parse_long("--rounds", optarg, 1, MAX_ROUNDS, &o->rounds, err, errlen) < 0) return -1;
        break;
      case OPT_CHAIN:
        if (parse_long("--chain", optarg, 1, MAX_CHAIN, &o->chain, err, errlen) < 0) return -1;
        break;
      case OPT_KERNELS: o->kernels = optarg; break;
      case OPT_HELP: return 1;
      default:
        snprintf(err, errlen, "unknown or incomplete option '%s' (see --help)", argv[optind - 1]);
        return -1;
    }
  }
  if (optind < argc) {
    snprintf(err, errlen, "unexpected argument '%s' (see --help)", argv[optind]);
    return -1;
  }
  if (o->uuid && o->device >= 0) {
    snprintf(err, errlen, "--device and --device-uuid name the device twice: give one");
    return -1;
  }
  if (o->uuid) {
    uint8_t u[16];
    if (graphd_uuid_parse(o->uuid, u) != GRAPHD_OK) {
      snprintf(err, errlen, "--device-uuid: '%s' is not a UUID (GPU-xxxxxxxx-...)", o->uuid);
      return -1;
    }
  }
  return 0;
}

/* ---- 1. the socket echo floor --------------------------------------------- */

static int write_full(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* 1 when len bytes came, 0 on EOF, -1 on error. */
static int read_full(int fd, void *buf, size_t len) {
  char *p = buf;
  while (len) {
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) return 0;
    p += n;
    len -= (size_t)n;
  }
  return 1;
}

static void echo_child(int fd) {
  char buf[ECHO_BYTES];
  while (read_full(fd, buf, sizeof buf) == 1)
    if (write_full(fd, buf, sizeof buf) < 0) _exit(1);
  _exit(0);
}

/* Blocking 64-byte round trips: the floor under any sync request. */
static int measure_echo(bench *b) {
  int rc = -1, sv[2] = {-1, -1};
  pid_t pid = -1;
  char buf[ECHO_BYTES];
  memset(buf, 0x5a, sizeof buf);
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    set_err(b, "socketpair: %s", strerror(errno));
    goto exit;
  }
  pid = fork();
  if (pid < 0) {
    set_err(b, "fork: %s", strerror(errno));
    goto exit;
  }
  if (pid == 0) {
    close(sv[0]);
    echo_child(sv[1]);
  }
  close(sv[1]);
  sv[1] = -1;
  long warm = warmup_of(b->o.rounds);
  errno = 0;
  for (long i = 0; i < warm + b->o.rounds; i++) {
    double t0 = bench_now_us();
    if (write_full(sv[0], buf, sizeof buf) < 0 || read_full(sv[0], buf, sizeof buf) != 1) {
      set_err(b, "echo round trip %ld failed: %s", i, errno ? strerror(errno) : "EOF");
      goto exit;
    }
    if (i >= warm) b->samples[i - warm] = bench_now_us() - t0;
  }
  b->echo = stats_of(b->samples, (size_t)b->o.rounds);
  rc = 0;
exit:
  if (sv[0] >= 0) close(sv[0]); /* EOF ends the child */
  if (sv[1] >= 0) close(sv[1]);
  if (pid > 0) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  return rc;
}

/* ---- 2. graphd_ping ------------------------------------------------------- */

static int measure_ping(bench *b, graphd_client *c, stats *out) {
  char payload[ECHO_BYTES];
  memset(payload, 0xa5, sizeof payload);
  long warm = warmup_of(b->o.rounds);
  for (long i = 0; i < warm + b->o.rounds; i++) {
    double t0 = bench_now_us();
    GD_CHECK_GOTO(b, c, "graphd_ping", graphd_ping(c, payload, sizeof payload), fail);
    if (i >= warm) b->samples[i - warm] = bench_now_us() - t0;
  }
  *out = stats_of(b->samples, (size_t)b->o.rounds);
  return 0;
fail:
  return -1;
}

static int connect_session(bench *b, graphd_session_kind kind, graphd_client **out) {
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = b->o.socket;
  o.kind = kind;
  o.client_name = "replay_bench";
  if (kind == GRAPHD_SESSION_DATA) memcpy(o.device_uuid, b->uuid, 16);
  char e[GRAPHD_ERRMAX];
  graphd_status st = graphd_connect(&o, out, e, sizeof e);
  if (st != GRAPHD_OK) {
    set_err(b, "cannot open a %s session to graphd at %s: %s: %s",
            kind == GRAPHD_SESSION_DATA ? "data" : "control",
            b->o.socket ? b->o.socket : "the default socket", graphd_status_name(st), e);
    return -1;
  }
  return 0;
}

/* ---- CUDA set-up ------------------------------------------------------------ */

/* Picks the device (by ordinal or UUID), makes its primary context current
 * and creates the bench's stream. */
static int cuda_setup(bench *b) {
  int count = 0;
  CU_CHECK_GOTO(b, cuDeviceGetCount(&count), fail);
  if (b->o.uuid) {
    uint8_t want[16];
    graphd_uuid_parse(b->o.uuid, want); /* checked by parse_args */
    b->ordinal = -1;
    for (int i = 0; i < count && b->ordinal < 0; i++) {
      CUdevice d;
      CUuuid u;
      CU_CHECK_GOTO(b, cuDeviceGet(&d, i), fail);
      CU_CHECK_GOTO(b, cuDeviceGetUuid(&u, d), fail);
      if (memcmp(u.bytes, want, 16) == 0) b->ordinal = i;
    }
    if (b->ordinal < 0) {
      set_err(b, "no CUDA device of this process has UUID %s (%d visible)", b->o.uuid, count);
      goto fail;
    }
  } else {
    b->ordinal = b->o.device < 0 ? 0 : b->o.device;
    if (b->ordinal >= count) {
      set_err(b, "--device %d: this process sees %d CUDA device(s)", b->ordinal, count);
      goto fail;
    }
  }
  CUuuid u;
  CU_CHECK_GOTO(b, cuDeviceGet(&b->dev, b->ordinal), fail);
  CU_CHECK_GOTO(b, cuDeviceGetUuid(&u, b->dev), fail);
  memcpy(b->uuid, u.bytes, 16);
  graphd_uuid_format(b->uuid, "GPU-", b->uuid_str);
  CU_CHECK_GOTO(b, cuDeviceGetName(b->dev_name, (int)sizeof b->dev_name, b->dev), fail);
  CU_CHECK_GOTO(b, cuDeviceGetAttribute(&b->mps_driver, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, b->dev),
                fail);
  CUcontext ctx;
  CU_CHECK_GOTO(b, cuDevicePrimaryCtxRetain(&ctx, b->dev), fail);
  b->ctx = ctx;
  CU_CHECK_GOTO(b, cuCtxSetCurrent(b->ctx), fail);
  CU_CHECK_GOTO(b, cuStreamCreate(&b->stream, CU_STREAM_NON_BLOCKING), fail);
  return 0;
fail:
  return -1;
}

/* One VMM allocation as JAX makes them (cuMemCreate with POSIX fd handles,
 * reserve, map, set access) and one cuMemAlloc allocation. */
static int alloc_buffers(bench *b) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = b->ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  CU_CHECK_GOTO(b, cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                fail);
  b->vmm_size = (PAIR_BYTES + gran - 1) / gran * gran;
  CU_CHECK_GOTO(b, cuMemCreate(&b->vmm_h, b->vmm_size, &prop, 0), fail);
  b->vmm_created = 1;
  CU_CHECK_GOTO(b, cuMemAddressReserve(&b->vmm_va, b->vmm_size, 0, 0, 0), fail);
  b->vmm_reserved = 1;
  CU_CHECK_GOTO(b, cuMemMap(b->vmm_va, b->vmm_size, 0, b->vmm_h, 0), fail);
  b->vmm_mapped = 1;
  CUmemAccessDesc ad;
  memset(&ad, 0, sizeof ad);
  ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ad.location.id = b->ordinal;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_CHECK_GOTO(b, cuMemSetAccess(b->vmm_va, b->vmm_size, &ad, 1), fail);
  b->x[0] = b->vmm_va;
  b->y[0] = b->vmm_va + SLOT_BYTES;
  if (b->o.vmm_only && b->vmm_size >= 2 * PAIR_BYTES) {
    /* Both pairs at different addresses of one VMM allocation, as JAX's
     * buffers are: addresses change, the kind of memory does not. */
    b->x[1] = b->vmm_va + PAIR_BYTES;
    b->y[1] = b->vmm_va + PAIR_BYTES + SLOT_BYTES;
  } else {
    CU_CHECK_GOTO(b, cuMemAlloc(&b->legacy, PAIR_BYTES), fail);
    b->x[1] = b->legacy;
    b->y[1] = b->legacy + SLOT_BYTES;
  }
  return 0;
fail:
  return -1;
}

/* Registers the module and the two programs (one per mode):
 * scale(x, y, SCALE_A, NFLOATS) with x a staged input, y a staged output. */
static int register_programs(bench *b) {
  int rc = -1;
  char path[1024];
  size_t len = 0;
  graphd_program *p = NULL;
  void *cubin = NULL;
  if ((size_t)snprintf(path, sizeof path, "%s/test_kernels.cubin", b->o.kernels) >= sizeof path) {
    set_err(b, "--kernels: the path is too long");
    goto exit;
  }
  cubin = gd_read_file(path, &len);
  if (!cubin) {
    set_err(b, "cannot read %s: %s (build the test kernels, or pass --kernels DIR)", path,
            strerror(errno));
    goto exit;
  }
  GD_CHECK_GOTO(b, b->data, "graphd_register_module",
                graphd_register_module(b->data, GRAPHD_MODULE_CUBIN, cubin, len, b->module_id),
                exit);
  for (int m = 0; m < 2; m++) {
    p = graphd_program_new(m == 0 ? GRAPHD_MODE_STAGED : GRAPHD_MODE_STAGED_EX);
    if (!p) {
      set_err(b, "graphd_program_new: out of memory");
      goto exit;
    }
    uint32_t grid[3] = {NFLOATS / 256, 1, 1}, block[3] = {256, 1, 1}, n = NFLOATS;
    float a = SCALE_A;
    int x = graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, SLOT_BYTES, 1);
    int y = graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, SLOT_BYTES, 1);
    int s = graphd_program_add_launch(p, b->module_id, "scale", grid, block, 0);
    if (x >= 0 && y >= 0 && s >= 0) {
      graphd_program_param_slot(p, (uint32_t)s, 0, (uint32_t)x, 0);
      graphd_program_param_slot(p, (uint32_t)s, 8, (uint32_t)y, 0);
      graphd_program_param(p, (uint32_t)s, 16, &a, 4);
      graphd_program_param(p, (uint32_t)s, 20, &n, 4);
    }
    /* finish reports the first failure of the builder calls above. */
    if (graphd_program_finish(p, b->prog[m]) != GRAPHD_OK) {
      set_err(b, "building the %s program: %s", mode_names[m], graphd_program_error(p));
      goto exit;
    }
    GD_CHECK_GOTO(b, b->data, "graphd_register_program", graphd_register_program(b->data, p), exit);
    graphd_program_free(p);
    p = NULL;
    /* Load the module on the daemon's device now, so that the first replay
     * times the capture alone. */
    graphd_prepare_info info;
    double t0 = bench_now_us();
    GD_CHECK_GOTO(b, b->data, "graphd_prepare_program",
                  graphd_prepare_program(b->data, b->prog[m], &info), exit);
    b->mode[m].prepare_us = bench_now_us() - t0;
    printf("[%-9s] prepare: %.1f us round trip; %llu module load(s), %.1f us on the daemon\n",
           mode_names[m], b->mode[m].prepare_us, (unsigned long long)info.modules_loaded,
           (double)info.load_ns / 1e3);
  }
  rc = 0;
exit:
  graphd_program_free(p);
  free(cubin);
  return rc;
}

/* Registers both pairs' allocations before any replay, so that the
 * first replay times the capture and not the imports. */
static int register_regions(bench *b) {
  static const char *const kinds[2] = {"VMM (cuMemCreate, POSIX fd)", "legacy (cuMemAlloc)"};
  for (int i = 0; i < (b->legacy ? 2 : 1); i++) {
    graphd_region_ref r;
    double t0 = bench_now_us();
    GD_CHECK_GOTO(b, b->data, "graphd_region_register",
                  graphd_region_register(b->data, b->x[i], PAIR_BYTES, &r), fail);
    printf("region %d, %-28s %8llu bytes: register %.1f us round trip, daemon import %.1f us\n", i,
           kinds[i], (unsigned long long)r.size, bench_now_us() - t0, (double)r.import_ns / 1e3);
  }
  return 0;
fail:
  return -1;
}

/* ---- 3. sync replay round trips -------------------------------------------- */

/* Fills x of both pairs with known values. */
static int fill_inputs(bench *b) {
  for (int p = 0; p < 2; p++) {
    for (uint32_t k = 0; k < NFLOATS; k++)
      b->host_x[p][k] = (float)((k * 7u + (uint32_t)p * 13u) % 1000u) * 0.25f - 100.0f;
    CU_CHECK_GOTO(b, cuMemcpyHtoDAsync(b->x[p], b->host_x[p], SLOT_BYTES, b->stream), fail);
  }
  CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
  return 0;
fail:
  return -1;
}

/* y of each pair must hold SCALE_A * x, bit for bit. */
static int check_outputs(bench *b, int m) {
  for (int p = 0; p < 2; p++) {
    CU_CHECK_GOTO(b, cuMemcpyDtoHAsync(b->host_buf, b->y[p], SLOT_BYTES, b->stream), fail);
    CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
    for (uint32_t k = 0; k < NFLOATS; k++) {
      float want = SCALE_A * b->host_x[p][k];
      if (memcmp(&b->host_buf[k], &want, 4) != 0) {
        set_err(b, "[%s] wrong result: pair %d y[%u] = %.9g, want %.9g", mode_names[m], p, k,
                (double)b->host_buf[k], (double)want);
        goto fail;
      }
    }
  }
  return 0;
fail:
  return -1;
}

static void bind_pair(graphd_binding bd[2], CUdeviceptr in, CUdeviceptr out) {
  bd[0] = (graphd_binding){.slot = 0, .ptr = in, .bytes = SLOT_BYTES};
  bd[1] = (graphd_binding){.slot = 1, .ptr = out, .bytes = SLOT_BYTES};
}

static int measure_replay(bench *b, int m) {
  mode_result *r = &b->mode[m];
  long warm = warmup_of(b->o.rounds);
  graphd_binding bd[2];
  graphd_replay_info info;
  if (fill_inputs(b) < 0) goto fail;
  for (long i = -1; i < warm + b->o.rounds; i++) {
    int p = (int)((i + 2) % 2); /* the first call uses pair 1: legacy */
    bind_pair(bd, b->x[p], b->y[p]);
    memset(&info, 0, sizeof info);
    double t0 = bench_now_us();
    GD_CHECK_GOTO(b, b->data, mode_names[m],
                  graphd_replay(b->data, b->gs, b->prog[m], bd, 2, &info), fail);
    double dt = bench_now_us() - t0;
    CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
    if (i < 0) {
      r->first_us = dt;
      r->captured = info.captured;
      r->capture_us = (double)info.capture_ns / 1e3;
    } else if (i >= warm) {
      b->samples[i - warm] = dt;
      b->server[i - warm] = (double)info.server_ns / 1e3;
    }
  }
  r->replay = stats_of(b->samples, (size_t)b->o.rounds);
  r->server = stats_of(b->server, (size_t)b->o.rounds);
  if (r->captured)
    printf("[%-9s] first replay (capture): %.1f us host; capture_ns %.1f us\n", mode_names[m],
           r->first_us, r->capture_us);
  else
    printf(
        "[%-9s] first replay: %.1f us host; the daemon already held this capture (an "
        "earlier run?), so this is not a capture figure\n",
        mode_names[m], r->first_us);
  char what[64];
  snprintf(what, sizeof what, "[%-9s] replay round trip", mode_names[m]);
  print_stats(what, &r->replay);
  snprintf(what, sizeof what, "[%-9s] daemon server_ns", mode_names[m]);
  print_stats(what, &r->server);
  if (check_outputs(b, m) < 0) goto fail;
  printf("[%-9s] outputs of both pairs bit-exact: PASS\n", mode_names[m]);
  return 0;
fail:
  return -1;
}

/* The host cost of an asynchronous replay: the call alone (the ready
 * write, the ring entry, the wait for done), the stream synchronized
 * after each, untimed. */
static int measure_async_call(bench *b, int m) {
  mode_result *r = &b->mode[m];
  long warm = warmup_of(b->o.rounds);
  graphd_binding bd[2];
  if (fill_inputs(b) < 0) goto fail;
  for (long i = 0; i < warm + b->o.rounds; i++) {
    int p = (int)(i % 2);
    bind_pair(bd, b->x[p], b->y[p]);
    double t0 = bench_now_us();
    GD_CHECK_GOTO(b, b->data, mode_names[m],
                  graphd_replay_async(b->data, b->gs, b->prog[m], bd, 2, NULL), fail);
    double dt = bench_now_us() - t0;
    CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
    if (i >= warm) b->samples[i - warm] = dt;
  }
  GD_CHECK_GOTO(b, b->data, "graphd_replay_collect", graphd_replay_collect(b->data, NULL), fail);
  r->async_call = stats_of(b->samples, (size_t)b->o.rounds);
  char what[64];
  snprintf(what, sizeof what, "[%-9s] async call, host", mode_names[m]);
  print_stats(what, &r->async_call);
  if (check_outputs(b, m) < 0) goto fail;
  printf("[%-9s] async outputs of both pairs bit-exact: PASS\n", mode_names[m]);
  return 0;
fail:
  return -1;
}

/* ---- 4. a chain of dependent replays ---------------------------------------- */

/* Replay i reads x[i % 2] and writes x[(i + 1) % 2]: VMM and legacy memory
 * in turn, each replay's input the previous one's output. Only the final
 * synchronize waits for the GPU. */
static int measure_chain(bench *b, int m, int async) {
  mode_result *r = &b->mode[m];
  long n = b->o.chain;
  graphd_binding bd[2];
  graphd_replay_info info;
  float one = 1.0f;
  unsigned int one_bits;
  memcpy(&one_bits, &one, 4);
  CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
  CU_CHECK_GOTO(b, cuMemsetD32Async(b->x[0], one_bits, NFLOATS, b->stream), fail);
  double calls = 0, t0 = bench_now_us();
  for (long i = 0; i < n; i++) {
    bind_pair(bd, b->x[i % 2], b->x[(i + 1) % 2]);
    double c0 = bench_now_us();
    GD_CHECK_GOTO(b, b->data, mode_names[m],
                  async ? graphd_replay_async(b->data, b->gs, b->prog[m], bd, 2, NULL)
                        : graphd_replay(b->data, b->gs, b->prog[m], bd, 2, &info),
                  fail);
    calls += bench_now_us() - c0;
  }
  CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
  double total = bench_now_us() - t0;
  if (async)
    GD_CHECK_GOTO(b, b->data, "graphd_replay_collect", graphd_replay_collect(b->data, NULL), fail);
  double per = total / (double)n, per_call = calls / (double)n;
  /* One IEEE single multiply per step, as the kernel does (no FMA to
   * contract), so the host's value is bit-exact. */
  float want = 1.0f;
  for (long i = 0; i < n; i++) want = SCALE_A * want;
  r->chain_want = want;
  CU_CHECK_GOTO(b, cuMemcpyDtoHAsync(b->host_buf, b->x[n % 2], SLOT_BYTES, b->stream), fail);
  CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
  int ok = 1;
  float got = b->host_buf[0];
  uint32_t bad = 0;
  for (uint32_t k = 0; k < NFLOATS; k++) {
    if (memcmp(&b->host_buf[k], &want, 4) != 0) {
      if (!bad++) got = b->host_buf[k];
      ok = 0;
    }
  }
  if (async) {
    r->achain_us = per;
    r->achain_call_us = per_call;
    r->achain_ok = ok;
  } else {
    r->chain_us = per;
    r->chain_call_us = per_call;
    r->chain_ok = ok;
    r->chain_got = got;
  }
  printf(
      "[%-9s] %s chain of %ld: %.2f us per dependent replay (%.2f ms total; %.2f us host per "
      "call); result %.9g, want %.9g: %s",
      mode_names[m], async ? "async" : "sync", n, per, total / 1e3, per_call, (double)got,
      (double)want, ok ? "PASS" : "FAIL");
  if (bad) printf(" (%u of %u elements wrong)", bad, NFLOATS);
  printf("\n");
  return 0;
fail:
  return -1;
}

/* ---- the daemon's view ----------------------------------------------------- */

/* Finds our device in the daemon's status; prints its MPS flag and counters. */
static int daemon_device(bench *b, const char *when, int *mps) {
  graphd_daemon_status *s = NULL;
  GD_CHECK_GOTO(b, b->ctl, "graphd_get_status", graphd_get_status(b->ctl, &s), fail);
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_info *d = &s->devices[i];
    if (memcmp(d->uuid, b->uuid, 16) != 0) continue;
    const graphd_device_counters *k = &d->counters;
    if (mps) *mps = d->mps_enabled;
    printf(
        "daemon %s: graphd %s, device %u (%s, %s) mps_enabled %d, state %s; captures %llu "
        "(built %llu, recaptures %llu), replays %llu, errors %llu, regions %llu\n",
        when, s->version, d->ordinal, d->name, d->backend, d->mps_enabled, d->state,
        (unsigned long long)k->captures, (unsigned long long)k->captures_built,
        (unsigned long long)k->recaptures, (unsigned long long)k->replays,
        (unsigned long long)k->errors, (unsigned long long)k->regions);
    graphd_daemon_status_free(s);
    return 0;
  }
  set_err(b, "the daemon serves no device with UUID %s (%u device(s))", b->uuid_str, s->ndevices);
  graphd_daemon_status_free(s);
fail:
  return -1;
}

/* ---- 6. summary ------------------------------------------------------------- */

static void print_summary(const bench *b) {
  const mode_result *r = b->mode;
  printf("\n== summary (1-kernel program, %u floats; %s)\n", NFLOATS, b->dev_name);
  printf("MPS: driver (CU_DEVICE_ATTRIBUTE_MPS_ENABLED) %s; daemon status mps_enabled %s\n",
         b->mps_driver ? "on" : "off", b->mps_daemon ? "on" : "off");
  if (b->mps_driver != b->mps_daemon)
    printf(
        "WARNING: the bench and the daemon disagree about MPS: run both with the same "
        "CUDA_MPS_PIPE_DIRECTORY\n");
  printf("socket echo p50 %.2f us; graphd_ping p50 %.2f us (data session)\n", b->echo.p50,
         b->ping_data.p50);
  printf("%-44s %9s %9s   %s\n", "figure", mode_names[0], mode_names[1], "target");
  printf("%-44s %9.2f %9.2f   %s\n", "sync replay p50 (us)", r[0].replay.p50, r[1].replay.p50, "");
  printf("%-44s %8.2fx %8.2fx   %s\n", "sync replay p50 / socket echo p50",
         r[0].replay.p50 / b->echo.p50, r[1].replay.p50 / b->echo.p50, "<= 2.5 under MPS");
  printf("%-44s %9.2f %9.2f   %s\n", "chain per dependent replay (us)", r[0].chain_us,
         r[1].chain_us, b->mps_driver ? "<= 30 under MPS" : "report (~300 expected without MPS)");
  printf("%-44s %9s %9s\n", "chain correctness", r[0].chain_ok ? "PASS" : "FAIL",
         r[1].chain_ok ? "PASS" : "FAIL");
  printf("%-44s %9.2f %9.2f\n", "async call p50, host (us)", r[0].async_call.p50,
         r[1].async_call.p50);
  printf("%-44s %9.2f %9.2f\n", "async chain per dependent replay (us)", r[0].achain_us,
         r[1].achain_us);
  printf("%-44s %9.2f %9.2f\n", "async chain host per call (us)", r[0].achain_call_us,
         r[1].achain_call_us);
  printf("%-44s %9s %9s\n", "async chain correctness", r[0].achain_ok ? "PASS" : "FAIL",
         r[1].achain_ok ? "PASS" : "FAIL");
  printf("%-44s %9.1f %9.1f\n", "first replay, host (us)", r[0].first_us, r[1].first_us);
  printf("%-44s %9.1f %9.1f%s\n", "first replay, capture_ns (us)", r[0].capture_us, r[1].capture_us,
         r[0].captured && r[1].captured ? "" : "   (not captured by this run)");
  printf("RESULT mps=%d echo_p50_us=%.2f ping_p50_us=%.2f", b->mps_driver, b->echo.p50,
         b->ping_data.p50);
  for (int m = 0; m < 2; m++)
    printf(
        " %s_p50_us=%.2f %s_ratio=%.3f %s_chain_us=%.2f %s_chain=%s %s_first_us=%.1f "
        "%s_capture_us=%.1f %s_async_call_p50_us=%.2f %s_async_chain_us=%.2f %s_async_chain=%s",
        mode_names[m], r[m].replay.p50, mode_names[m], r[m].replay.p50 / b->echo.p50, mode_names[m],
        r[m].chain_us, mode_names[m], r[m].chain_ok ? "PASS" : "FAIL", mode_names[m], r[m].first_us,
        mode_names[m], r[m].capture_us, mode_names[m], r[m].async_call.p50, mode_names[m],
        r[m].achain_us, mode_names[m], r[m].achain_ok ? "PASS" : "FAIL");
  printf("\n");
}

/* ---- main ---------------------------------------------------------------- */

static void bench_close(bench *b) {
  /* Nothing may still wait on the flag page or use the buffers. */
  if (b->stream) CU_CHECK_IGNORE(b, cuStreamSynchronize(b->stream));
  if (b->gs) graphd_stream_detach(b->gs);
  /* Legacy IPC memory: unregister before freeing (graphd.h). */
  if (b->data && b->legacy) graphd_region_forget(b->data, b->legacy);
  graphd_close(b->data);
  graphd_close(b->ctl);
  if (b->cu) {
    if (b->legacy) CU_CHECK_IGNORE(b, cuMemFree(b->legacy));
    if (b->vmm_mapped) CU_CHECK_IGNORE(b, cuMemUnmap(b->vmm_va, b->vmm_size));
    if (b->vmm_reserved) CU_CHECK_IGNORE(b, cuMemAddressFree(b->vmm_va, b->vmm_size));
    if (b->vmm_created) CU_CHECK_IGNORE(b, cuMemRelease(b->vmm_h));
    if (b->stream) CU_CHECK_IGNORE(b, cuStreamDestroy(b->stream));
    if (b->ctx) CU_CHECK_IGNORE(b, cuDevicePrimaryCtxRelease(b->dev));
  }
  free(b->host_x[0]);
  free(b->host_x[1]);
  free(b->host_buf);
  free(b->samples);
  free(b->server);
}

int main(int argc, char **argv) {
  static bench bench_state;
  bench *b = &bench_state;
  int rc = 1, no_gpu = 0;
  char e[512], gpu_err[256] = "";
  int pr = parse_args(argc, argv, &b->o, e, sizeof e);
  if (pr != 0) {
    if (pr > 0)
      usage(stdout);
    else
      fprintf(stderr, "replay_bench: %s\n", e);
    return pr > 0 ? 0 : 1;
  }
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  b->samples = malloc((size_t)b->o.rounds * sizeof *b->samples);
  b->server = malloc((size_t)b->o.rounds * sizeof *b->server);
  b->host_x[0] = malloc(SLOT_BYTES);
  b->host_x[1] = malloc(SLOT_BYTES);
  b->host_buf = malloc(SLOT_BYTES);
  if (!b->samples || !b->server || !b->host_x[0] || !b->host_x[1] || !b->host_buf) {
    set_err(b, "out of memory");
    goto fail;
  }
  printf("replay_bench (libgraphd %s): socket %s, rounds %ld, chain %ld, kernels %s\n",
         graphd_version(), b->o.socket ? b->o.socket : "(libgraphd default)", b->o.rounds,
         b->o.chain, b->o.kernels);

  /* 1. Before cuInit and before libgraphd starts any thread. */
  printf("== 1. Unix socket echo, %d B, blocking (forked child over a socketpair)\n", ECHO_BYTES);
  if (measure_echo(b) < 0) goto fail;
  print_stats("echo round trip", &b->echo);

  /* No GPU is a skip, but the daemon's ping is still measured when one
   * answers (a host backend daemon, say). */
  int lr = gd_cuda_load(&b->cu, gpu_err, sizeof gpu_err);
  if (lr == -GRAPHD_UNAVAILABLE) {
    no_gpu = 1;
    b->cu = NULL;
  } else if (lr < 0) {
    set_err(b, "%s", gpu_err);
    goto fail;
  }

  printf("== 2. graphd_ping, %d B payload\n", ECHO_BYTES);
  if (connect_session(b, GRAPHD_SESSION_CONTROL, &b->ctl) < 0) {
    if (!no_gpu) goto fail;
    printf("ping: skipped: %s\n", b->err);
  } else {
    if (measure_ping(b, b->ctl, &b->ping_ctl) < 0) goto fail;
    b->have_ping_ctl = 1;
    print_stats("ping, control session", &b->ping_ctl);
  }
  if (no_gpu) {
    printf("no GPU: %s; skipping the GPU sections\n", gpu_err);
    fprintf(stderr, "replay_bench: skipped: no GPU (%s)\n", gpu_err);
    rc = EXIT_SKIP;
    goto exit;
  }

  if (cuda_setup(b) < 0) goto fail;
  printf("== device: CUDA device %d of this process, %s, %s; MPS (driver attribute) %s\n",
         b->ordinal, b->dev_name, b->uuid_str, b->mps_driver ? "on" : "off");
  if (daemon_device(b, "at start", &b->mps_daemon) < 0) goto fail;
  if (connect_session(b, GRAPHD_SESSION_DATA, &b->data) < 0) goto fail;
  if (measure_ping(b, b->data, &b->ping_data) < 0) goto fail;
  print_stats("ping, data session", &b->ping_data);

  if (alloc_buffers(b) < 0) goto fail;
  GD_CHECK_GOTO(b, b->data, "graphd_stream_attach",
                graphd_stream_attach(b->data, b->stream, &b->gs), fail);
  if (register_regions(b) < 0) goto fail;
  if (register_programs(b) < 0) goto fail;

  const char *pairs = b->legacy ? "VMM / legacy" : "two addresses of one VMM allocation";
  printf(
      "== 3. sync replay: scale over %u floats (%u KiB staged in, %u KiB staged out), "
      "bindings alternate %s, cuStreamSynchronize after each call (untimed)\n",
      NFLOATS, SLOT_BYTES >> 10, SLOT_BYTES >> 10, pairs);
  for (int m = 0; m < 2; m++)
    if (measure_replay(b, m) < 0) goto fail;

  printf("== 4. chain of %ld dependent replays, ping-pong between %s, a = %.4f\n", b->o.chain,
         pairs, (double)SCALE_A);
  for (int m = 0; m < 2; m++)
    if (measure_chain(b, m, 0) < 0) goto fail;

  printf("== 5. async replay (submission ring): host cost per call, then the chain of %ld\n",
         b->o.chain);
  for (int m = 0; m < 2; m++)
    if (measure_async_call(b, m) < 0 || measure_chain(b, m, 1) < 0) goto fail;

  if (daemon_device(b, "at end", NULL) < 0) goto fail;
  print_summary(b);
  if (!b->mode[0].chain_ok || !b->mode[1].chain_ok || !b->mode[0].achain_ok ||
      !b->mode[1].achain_ok) {
    set_err(b, "a chain of dependent replays gave a wrong result (see above)");
    goto fail;
  }
  rc = 0;
  goto exit;
fail:
  fprintf(stderr, "replay_bench: FAIL: %s\n", b->err);
  rc = 1;
exit:
  bench_close(b);
  return rc;
}
