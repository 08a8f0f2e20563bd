/* replay_bench: the figures of the request path. It prints timings and
 * never asserts them; it fails (exit 1) only when something does not work,
 * a wrong chain result included.
 *
 *  1. Unix socket echo floor: 64-byte round trips to a forked echo child
 *     over a socketpair.
 *  2. graphd_ping round trips on a control and a data session.
 *  3. Sync replay round trips of a 1-kernel program (scale over 64 Ki floats,
 *     staged input and output), once per mode (staged, staged_ex: two
 *     programs, as the mode is part of the program), each timed from the
 *     call to the stream's synchronize. Bindings alternate between a VMM
 *     buffer pair and a cuMemAlloc one, so addresses and memory kinds change
 *     on every call.
 *  4. Per mode, a chain of dependent replays, ping-ponging between the two
 *     pairs' inputs, timed from the first call to the final synchronize and
 *     checked bit for bit on the host.
 *  5. The same through graphd_replay_async (the submission ring): the host
 *     cost of a call (p50, with the stream synchronized after each call,
 *     untimed), and the chain of dependent replays, checked the same way.
 *  6. The anchors: the same kernel from the same CUBIN as a graph this
 *     process captures (inproc.h): staged (copies around a graph captured
 *     once), on fixed buffers, re-captured per call, and the chain.
 *  7. The GPU floor of the async chain's hand-off (handoff.h): the same
 *     step between this process and a child, both queued ahead, with the
 *     flags in host-pinned and in device memory, and on one stream.
 *  8. A client started afresh against a daemon that holds the capture:
 *     connect to first result, against module load plus capture here.
 *  9. Direct mode on --big-mib slots against staging them in this process.
 * 10. A summary and the targets table (each figure beside its anchor from
 *     this run), then RESULT lines of key=value for scripts/bench-report.py.
 *
 * Exit status: 0 when every step worked, 1 on a failure (one line on
 * stderr), 77 when there is no GPU (after the host-only figures).
 *
 * The echo and hand-off children are forked before anything starts a thread
 * or calls cuInit: CUDA is unusable in a child forked after cuInit. */
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

#include "common/cuda_driver.h"
#include "common/file.h"
#include "graphd/graphd.h"
#include "bench_util.h"
#include "handoff.h"
#include "inproc.h"

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
  long big_mib;        /* direct mode's slot size; 0 skips that section */
  long floor_steps;    /* steps per run of the hand-off floor; 0 skips it */
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
  void *cubin;
  size_t cubin_len;
  double region_us[2]; /* register round trip: VMM, legacy */
  graphd_device_counters at_start, at_end;
  /* in this process: the anchors, the hand-off floor */
  inproc ip;
  handoff ho;
  double ip_load_us, ip_first_us, ip_chain_us;
  stats ip_sync, ip_fixed, ip_recapture;
  int ip_chain_ok;
  double floor_us[HANDOFF_NVARIANTS];
  /* a client started afresh against a daemon holding the capture */
  double restart_us, restart_region_us, restart_replay_us;
  /* direct mode on large slots, beside the staged anchor in this process */
  double big_register_us, big_first_us, big_chain_us, big_ip_chain_us;
  stats big_sync, big_ip_sync, big_ip_fixed;
  long big_steps;
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
          "  --big-mib N         slot size of the direct-mode section, 1 to 4096 MiB\n"
          "                      (default 64); 0 skips it\n"
          "  --floor-steps N     steps per run of the hand-off floor, 1 to %d (default\n"
          "                      %d); 0 skips it\n"
          "  --help              this text\n"
          "Exit status: 0 ok, 1 failure, 77 no GPU.\n",
          MAX_CHAIN, GRAPHD_BENCH_KERNEL_DIR, HANDOFF_MAX_STEPS, HANDOFF_MAX_STEPS);
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
    OPT_BIG,
    OPT_FLOOR,
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
      {"big-mib", required_argument, NULL, OPT_BIG},
      {"floor-steps", required_argument, NULL, OPT_FLOOR},
      {"help", no_argument, NULL, OPT_HELP},
      {NULL, 0, NULL, 0},
  };
  memset(o, 0, sizeof *o);
  o->device = -1;
  o->rounds = 5000;
  o->chain = 1000;
  o->kernels = GRAPHD_BENCH_KERNEL_DIR;
  o->big_mib = 64;
  o->floor_steps = HANDOFF_MAX_STEPS;
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
      case OPT_BIG:
        if (parse_long("--big-mib", optarg, 0, 4096, &o->big_mib, err, errlen) < 0) return -1;
        break;
      case OPT_FLOOR:
        if (parse_long("--floor-steps", optarg, 0, HANDOFF_MAX_STEPS, &o->floor_steps, err,
                       errlen) < 0)
          return -1;
        break;
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

/* A VMM allocation of at least `bytes` as JAX makes them (cuMemCreate with
 * POSIX fd handles, reserve, map, set access). On failure what was made is
 * undone. */
static int alloc_vmm(bench *b, size_t bytes, CUmemGenericAllocationHandle *h, CUdeviceptr *va,
                     size_t *size) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = b->ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  int created = 0, reserved = 0;
  CU_CHECK_GOTO(b, cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                fail);
  *size = (bytes + gran - 1) / gran * gran;
  CU_CHECK_GOTO(b, cuMemCreate(h, *size, &prop, 0), fail);
  created = 1;
  CU_CHECK_GOTO(b, cuMemAddressReserve(va, *size, 0, 0, 0), fail);
  reserved = 1;
  CU_CHECK_GOTO(b, cuMemMap(*va, *size, 0, *h, 0), fail);
  CUmemAccessDesc ad;
  memset(&ad, 0, sizeof ad);
  ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ad.location.id = b->ordinal;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_CHECK_GOTO(b, cuMemSetAccess(*va, *size, &ad, 1), fail_mapped);
  return 0;
fail_mapped:
  CU_CHECK_IGNORE(b, cuMemUnmap(*va, *size));
fail:
  if (reserved) CU_CHECK_IGNORE(b, cuMemAddressFree(*va, *size));
  if (created) CU_CHECK_IGNORE(b, cuMemRelease(*h));
  return -1;
}

static void free_vmm(bench *b, CUmemGenericAllocationHandle h, CUdeviceptr va, size_t size) {
  CU_CHECK_IGNORE(b, cuMemUnmap(va, size));
  CU_CHECK_IGNORE(b, cuMemAddressFree(va, size));
  CU_CHECK_IGNORE(b, cuMemRelease(h));
}

/* One VMM allocation (JAX's kind of memory) and one cuMemAlloc allocation. */
static int alloc_buffers(bench *b) {
  if (alloc_vmm(b, PAIR_BYTES * (b->o.vmm_only ? 2 : 1), &b->vmm_h, &b->vmm_va, &b->vmm_size) < 0)
    goto fail;
  b->vmm_created = b->vmm_reserved = b->vmm_mapped = 1;
  b->x[0] = b->vmm_va;
  b->y[0] = b->vmm_va + SLOT_BYTES;
  if (b->o.vmm_only) {
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

/* Builds scale(x, y, SCALE_A, n) with x a `slot_bytes` input and y an
 * output, n = slot_bytes / 4, on the registered module; its id into id.
 * NULL with b->err set on failure. */
static graphd_program *scale_program(bench *b, graphd_mode mode, size_t slot_bytes,
                                     uint8_t id[32]) {
  graphd_program *p = graphd_program_new(mode);
  if (!p) {
    set_err(b, "graphd_program_new: out of memory");
    return NULL;
  }
  uint32_t n = (uint32_t)(slot_bytes / 4);
  uint32_t grid[3] = {(n + 255) / 256, 1, 1}, block[3] = {256, 1, 1};
  float a = SCALE_A;
  int x = graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, slot_bytes, 1);
  int y = graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, slot_bytes, 1);
  int s = graphd_program_add_launch(p, b->module_id, "scale", grid, block, 0);
  if (x >= 0 && y >= 0 && s >= 0) {
    graphd_program_param_slot(p, (uint32_t)s, 0, (uint32_t)x, 0);
    graphd_program_param_slot(p, (uint32_t)s, 8, (uint32_t)y, 0);
    graphd_program_param(p, (uint32_t)s, 16, &a, 4);
    graphd_program_param(p, (uint32_t)s, 20, &n, 4);
  }
  /* finish reports the first failure of the builder calls above. */
  if (graphd_program_finish(p, id) != GRAPHD_OK) {
    set_err(b, "building a scale program: %s", graphd_program_error(p));
    graphd_program_free(p);
    return NULL;
  }
  return p;
}

/* Registers the module and the two programs (one per mode) on client c,
 * and loads the module on the daemon's device. */
static int register_programs(bench *b, graphd_client *c, int quiet) {
  GD_CHECK_GOTO(
      b, c, "graphd_register_module",
      graphd_register_module(c, GRAPHD_MODULE_CUBIN, b->cubin, b->cubin_len, b->module_id), fail);
  for (int m = 0; m < 2; m++) {
    graphd_program *p = scale_program(b, m == 0 ? GRAPHD_MODE_STAGED : GRAPHD_MODE_STAGED_EX,
                                      SLOT_BYTES, b->prog[m]);
    if (!p) goto fail;
    graphd_status st = graphd_register_program(c, p);
    graphd_program_free(p);
    GD_CHECK_GOTO(b, c, "graphd_register_program", st, fail);
    if (quiet) continue;
    /* Load the module on the daemon's device now, so that the first replay
     * times the capture alone. */
    graphd_prepare_info info;
    double t0 = bench_now_us();
    GD_CHECK_GOTO(b, c, "graphd_prepare_program", graphd_prepare_program(c, b->prog[m], &info),
                  fail);
    b->mode[m].prepare_us = bench_now_us() - t0;
    printf("[%-9s] prepare: %.1f us round trip; %llu module load(s), %.1f us on the daemon\n",
           mode_names[m], b->mode[m].prepare_us, (unsigned long long)info.modules_loaded,
           (double)info.load_ns / 1e3);
  }
  return 0;
fail:
  return -1;
}

/* Reads test_kernels.cubin into b->cubin. */
static int read_cubin(bench *b) {
  char path[1024];
  if ((size_t)snprintf(path, sizeof path, "%s/test_kernels.cubin", b->o.kernels) >= sizeof path) {
    set_err(b, "--kernels: the path is too long");
    return -1;
  }
  b->cubin = gd_read_file(path, &b->cubin_len);
  if (!b->cubin) {
    set_err(b, "cannot read %s: %s (build the test kernels, or pass --kernels DIR)", path,
            strerror(errno));
    return -1;
  }
  return 0;
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
    b->region_us[i] = bench_now_us() - t0;
    printf("region %d, %-28s %8llu bytes: register %.1f us round trip, daemon import %.1f us\n", i,
           kinds[i], (unsigned long long)r.size, b->region_us[i], (double)r.import_ns / 1e3);
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

/* y of each pair must hold SCALE_A * x, bit for bit; `what` names the
 * figure in the error. */
static int check_outputs(bench *b, const char *what) {
  for (int p = 0; p < 2; p++) {
    CU_CHECK_GOTO(b, cuMemcpyDtoHAsync(b->host_buf, b->y[p], SLOT_BYTES, b->stream), fail);
    CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
    for (uint32_t k = 0; k < NFLOATS; k++) {
      float want = SCALE_A * b->host_x[p][k];
      if (memcmp(&b->host_buf[k], &want, 4) != 0) {
        set_err(b, "[%s] wrong result: pair %d y[%u] = %.9g, want %.9g", what, p, k,
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
    CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
    double dt = bench_now_us() - t0;
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
  if (check_outputs(b, mode_names[m]) < 0) goto fail;
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
  if (check_outputs(b, mode_names[m]) < 0) goto fail;
  printf("[%-9s] async outputs of both pairs bit-exact: PASS\n", mode_names[m]);
  return 0;
fail:
  return -1;
}

/* ---- 4. a chain of dependent replays ---------------------------------------- */

/* Replay i reads x[i % 2] and writes x[(i + 1) % 2]: VMM and legacy memory
 * in turn, each replay's input the previous one's output. Only the final
 * synchronize waits for the GPU. */
#define ONE_BITS 0x3f800000u /* 1.0f */

/* After a chain of n steps over `floats` floats from 1.0: whether every
 * element of out is SCALE_A^n, one IEEE single multiply per step as the
 * kernel does (no FMA to contract), so the host's value is bit-exact.
 * *got is the first wrong element (or the first), *bad the count wrong. */
static int chain_check(bench *b, CUdeviceptr out, size_t floats, long n, float *got, float *want,
                       uint32_t *bad) {
  float w = 1.0f;
  for (long i = 0; i < n; i++) w = SCALE_A * w;
  *want = w;
  *bad = 0;
  for (size_t off = 0; off < floats; off += NFLOATS) {
    size_t k = floats - off < NFLOATS ? floats - off : NFLOATS;
    CU_CHECK_GOTO(b, cuMemcpyDtoHAsync(b->host_buf, out + off * 4, k * 4, b->stream), fail);
    CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
    if (off == 0) *got = b->host_buf[0];
    for (size_t j = 0; j < k; j++)
      if (memcmp(&b->host_buf[j], &w, 4) != 0 && !(*bad)++) *got = b->host_buf[j];
  }
  return *bad == 0;
fail:
  return -1;
}

static int measure_chain(bench *b, int m, int async) {
  mode_result *r = &b->mode[m];
  long n = b->o.chain;
  graphd_binding bd[2];
  graphd_replay_info info;
  CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
  CU_CHECK_GOTO(b, cuMemsetD32Async(b->x[0], ONE_BITS, NFLOATS, b->stream), fail);
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
  float got, want;
  uint32_t bad;
  int ok = chain_check(b, b->x[n % 2], NFLOATS, n, &got, &want, &bad);
  if (ok < 0) goto fail;
  r->chain_want = want;
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

/* ---- 6. the anchors in this process ------------------------------------------ */

/* Runs `op` (0 staged, 1 fixed, 2 recapture) of ip over pairs of buffers
 * x and y, alternating, warm-up then `rounds` timed calls, each to the
 * stream's synchronize. */
static int time_inproc(bench *b, inproc *ip, int op, const CUdeviceptr x[2], const CUdeviceptr y[2],
                       long rounds, stats *out) {
  long warm = warmup_of(rounds);
  for (long i = 0; i < warm + rounds; i++) {
    int p = (int)(i % 2);
    double t0 = bench_now_us();
    CUresult r = op == 0   ? inproc_staged(ip, x[p], y[p])
                 : op == 1 ? inproc_fixed(ip)
                           : inproc_recapture(ip, x[p], y[p]);
    if (r != CUDA_SUCCESS) {
      set_err(b, "in-process anchor: %s", ip->err);
      return -1;
    }
    CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
    if (i >= warm) b->samples[i - warm] = bench_now_us() - t0;
  }
  *out = stats_of(b->samples, (size_t)rounds);
  return 0;
fail:
  return -1;
}

/* A chain of n in-process staged steps ping-ponging between x[0] and x[1]
 * from 1.0, timed from the first call to the final synchronize; per step
 * into *per_us, and whether the result is bit-exact. */
static int inproc_chain(bench *b, inproc *ip, const CUdeviceptr x[2], long n, double *per_us) {
  CU_CHECK_GOTO(b, cuMemsetD32Async(x[0], ONE_BITS, ip->n, b->stream), fail);
  CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
  double t0 = bench_now_us();
  for (long i = 0; i < n; i++)
    if (inproc_staged(ip, x[i % 2], x[(i + 1) % 2]) != CUDA_SUCCESS) {
      set_err(b, "in-process chain: %s", ip->err);
      return -1;
    }
  CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), fail);
  *per_us = (bench_now_us() - t0) / (double)n;
  float got, want;
  uint32_t bad;
  return chain_check(b, x[n % 2], ip->n, n, &got, &want, &bad);
fail:
  return -1;
}

/* The same program as a graph this process captures: staged (copies around
 * a graph captured once), fixed buffers, re-captured per call, a chain, and
 * the module load plus capture a process starting afresh pays. */
static int measure_inproc(bench *b) {
  inproc *ip = &b->ip;
  if (inproc_open(ip, b->cu, b->stream, b->cubin, NFLOATS, SCALE_A, &b->ip_load_us,
                  &b->ip_first_us) != CUDA_SUCCESS) {
    set_err(b, "in-process anchor: %s", ip->err);
    return -1;
  }
  printf("[in-process] module load %.1f us; load + capture + instantiate + first launch %.1f us\n",
         b->ip_load_us, b->ip_first_us);
  static const char *const ops[3] = {"staged (copies around a graph)", "graph on fixed buffers",
                                     "re-capture per call"};
  stats *out[3] = {&b->ip_sync, &b->ip_fixed, &b->ip_recapture};
  for (int op = 0; op < 3; op++) {
    if (fill_inputs(b) < 0 || time_inproc(b, ip, op, b->x, b->y, b->o.rounds, out[op]) < 0)
      return -1;
    char what[64];
    snprintf(what, sizeof what, "[in-process] %s", ops[op]);
    print_stats(what, out[op]);
    if (op != 1 && check_outputs(b, ops[op]) < 0) return -1;
  }
  b->ip_chain_ok = inproc_chain(b, ip, b->x, b->o.chain, &b->ip_chain_us);
  if (b->ip_chain_ok < 0) return -1;
  printf("[in-process] staged chain of %ld: %.2f us per dependent step: %s\n", b->o.chain,
         b->ip_chain_us, b->ip_chain_ok ? "PASS" : "FAIL");
  return 0;
}

/* ---- 7. the GPU floor of a hand-off between two processes --------------------- */

static int measure_floor(bench *b) {
  enum { REPS = 5 };
  char path[1024];
  snprintf(path, sizeof path, "%s/test_kernels.cubin", b->o.kernels);
  for (int v = 0; v < HANDOFF_NVARIANTS; v++) {
    double t[REPS];
    for (int k = 0; k < REPS; k++)
      if (handoff_run(&b->ho, b->cu, b->ordinal, b->ctx, b->stream, b->ip.fn, path, NFLOATS,
                      SCALE_A, v, b->o.floor_steps, &t[k]) < 0) {
        set_err(b, "%s", b->ho.err);
        return -1;
      }
    qsort(t, REPS, sizeof t[0], bench_cmp_double);
    b->floor_us[v] = t[REPS / 2];
    printf("[floor] %-36s %8.2f us per step (median of %d runs of %ld, min %.2f, max %.2f): PASS\n",
           handoff_variant_names[v], b->floor_us[v], REPS, b->o.floor_steps, t[0], t[REPS - 1]);
  }
  return 0;
}

/* ---- 8. a client started afresh ------------------------------------------------ */

/* What a restarted client pays before its first result when the daemon
 * already holds the capture: connect, register the module and programs,
 * attach a stream, register its memory, replay, synchronize. The in-process
 * anchor is the module load plus capture (measure_inproc). */
static int measure_restart(bench *b) {
  graphd_client *c = NULL;
  graphd_stream *gs = NULL;
  CUstream st = NULL;
  int rc = -1;
  CU_CHECK_GOTO(b, cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), exit);
  if (fill_inputs(b) < 0) goto exit;
  double t0 = bench_now_us();
  if (connect_session(b, GRAPHD_SESSION_DATA, &c) < 0) goto exit;
  if (register_programs(b, c, 1) < 0) goto exit;
  GD_CHECK_GOTO(b, c, "graphd_stream_attach", graphd_stream_attach(c, st, &gs), exit);
  double t1 = bench_now_us();
  graphd_region_ref ref;
  GD_CHECK_GOTO(b, c, "graphd_region_register",
                graphd_region_register(c, b->x[0], PAIR_BYTES, &ref), exit);
  double t2 = bench_now_us();
  graphd_binding bd[2];
  graphd_replay_info info;
  memset(&info, 0, sizeof info);
  bind_pair(bd, b->x[0], b->y[0]);
  GD_CHECK_GOTO(b, c, "restarted client's replay", graphd_replay(c, gs, b->prog[0], bd, 2, &info),
                exit);
  CU_CHECK_GOTO(b, cuStreamSynchronize(st), exit);
  double t3 = bench_now_us();
  b->restart_us = t3 - t0;
  b->restart_region_us = t2 - t1;
  b->restart_replay_us = t3 - t2;
  printf(
      "[restart] a new client's first result: %.1f us (connect, module, programs, stream "
      "%.1f; region %.1f; replay %.1f%s)\n",
      b->restart_us, t1 - t0, b->restart_region_us, b->restart_replay_us,
      info.captured ? ", and it CAPTURED: not the restart case" : ", no capture");
  rc = check_outputs(b, "restart");
exit:
  if (gs) graphd_stream_detach(gs);
  graphd_close(c);
  if (st) CU_CHECK_IGNORE(b, cuStreamDestroy(st));
  return rc;
}

/* ---- 9. direct mode on large slots ------------------------------------------------ */

/* A direct-mode program over two --big-mib buffers of one VMM allocation,
 * against the staged anchor of the same size in this process: the sync
 * time per step (call to synchronize) and a chain of dependent steps (async
 * for graphd), each checked. */
static int measure_big(bench *b) {
  size_t nb = (size_t)b->o.big_mib << 20, size = 0;
  uint32_t n = (uint32_t)(nb / 4);
  long rounds = b->o.rounds < 200 ? b->o.rounds : 200;
  long steps = b->o.chain < 200 ? b->o.chain : 200;
  CUmemGenericAllocationHandle h;
  CUdeviceptr va = 0;
  inproc ip;
  memset(&ip, 0, sizeof ip);
  graphd_program *p = NULL;
  uint8_t id[32];
  int rc = -1, have_vmm = 0;
  if (alloc_vmm(b, 2 * nb, &h, &va, &size) < 0) goto exit;
  have_vmm = 1;
  CUdeviceptr x[2] = {va, va + nb};
  CU_CHECK_GOTO(b, cuMemsetD32Async(va, ONE_BITS, 2 * nb / 4, b->stream), exit);
  graphd_region_ref ref;
  double t0 = bench_now_us();
  GD_CHECK_GOTO(b, b->data, "graphd_region_register",
                graphd_region_register(b->data, va, 2 * nb, &ref), exit);
  b->big_register_us = bench_now_us() - t0;
  if (!(p = scale_program(b, GRAPHD_MODE_DIRECT, nb, id))) goto exit;
  GD_CHECK_GOTO(b, b->data, "graphd_register_program", graphd_register_program(b->data, p), exit);
  graphd_binding bd[2];
  long warm = warmup_of(rounds);
  for (long i = -1; i < warm + rounds; i++) {
    int k = (int)((i + 2) % 2);
    bd[0] = (graphd_binding){.slot = 0, .ptr = x[k], .bytes = nb};
    bd[1] = (graphd_binding){.slot = 1, .ptr = x[1 - k], .bytes = nb};
    t0 = bench_now_us();
    GD_CHECK_GOTO(b, b->data, "direct", graphd_replay(b->data, b->gs, id, bd, 2, NULL), exit);
    CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), exit);
    double dt = bench_now_us() - t0;
    if (i < 0) b->big_first_us = dt;
    if (i >= warm) b->samples[i - warm] = dt;
  }
  b->big_sync = stats_of(b->samples, (size_t)rounds);
  CU_CHECK_GOTO(b, cuMemsetD32Async(x[0], ONE_BITS, n, b->stream), exit);
  t0 = bench_now_us();
  for (long i = 0; i < steps; i++) {
    bd[0] = (graphd_binding){.slot = 0, .ptr = x[i % 2], .bytes = nb};
    bd[1] = (graphd_binding){.slot = 1, .ptr = x[(i + 1) % 2], .bytes = nb};
    GD_CHECK_GOTO(b, b->data, "direct, async", graphd_replay_async(b->data, b->gs, id, bd, 2, NULL),
                  exit);
  }
  CU_CHECK_GOTO(b, cuStreamSynchronize(b->stream), exit);
  b->big_chain_us = (bench_now_us() - t0) / (double)steps;
  GD_CHECK_GOTO(b, b->data, "graphd_replay_collect", graphd_replay_collect(b->data, NULL), exit);
  float got, want;
  uint32_t bad;
  int ok = chain_check(b, x[steps % 2], n, steps, &got, &want, &bad);
  if (ok <= 0) {
    if (ok == 0)
      set_err(b, "direct chain: %u of %u elements wrong (%.9g, want %.9g)", bad, n, (double)got,
              (double)want);
    goto exit;
  }
  b->big_steps = steps;
  /* The staged anchor of the same size in this process. */
  if (inproc_open(&ip, b->cu, b->stream, b->cubin, n, SCALE_A, NULL, NULL) != CUDA_SUCCESS) {
    set_err(b, "in-process anchor (%ld MiB): %s", b->o.big_mib, ip.err);
    goto exit;
  }
  CUdeviceptr y[2] = {x[1], x[0]};
  if (time_inproc(b, &ip, 0, x, y, rounds, &b->big_ip_sync) < 0 ||
      time_inproc(b, &ip, 1, x, y, rounds, &b->big_ip_fixed) < 0)
    goto exit;
  ok = inproc_chain(b, &ip, x, steps, &b->big_ip_chain_us);
  if (ok <= 0) {
    if (ok == 0) set_err(b, "in-process chain of %ld MiB slots: wrong result", b->o.big_mib);
    goto exit;
  }
  printf("[direct %ld MiB] register %.1f us; first replay %.1f us (capture)\n", b->o.big_mib,
         b->big_register_us, b->big_first_us);
  print_stats("[direct] replay to sync", &b->big_sync);
  print_stats("[in-process] staged to sync", &b->big_ip_sync);
  print_stats("[in-process] fixed buffers to sync", &b->big_ip_fixed);
  printf("[direct] async chain of %ld: %.2f us per step; in-process staged chain %.2f us: PASS\n",
         steps, b->big_chain_us, b->big_ip_chain_us);
  rc = 0;
exit:
  inproc_close(&ip);
  graphd_program_free(p);
  if (have_vmm) {
    CU_CHECK_IGNORE(b, cuStreamSynchronize(b->stream));
    graphd_region_forget(b->data, va);
    free_vmm(b, h, va, size);
  }
  return rc;
}

/* ---- the daemon's view ----------------------------------------------------- */

/* Finds our device in the daemon's status; prints its MPS flag and counters. */
static int daemon_device(bench *b, const char *when, int *mps, graphd_device_counters *out) {
  graphd_daemon_status *s = NULL;
  GD_CHECK_GOTO(b, b->ctl, "graphd_get_status", graphd_get_status(b->ctl, &s), fail);
  for (uint32_t i = 0; i < s->ndevices; i++) {
    const graphd_device_info *d = &s->devices[i];
    if (memcmp(d->uuid, b->uuid, 16) != 0) continue;
    const graphd_device_counters *k = &d->counters;
    if (mps) *mps = d->mps_enabled;
    if (out) *out = *k;
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

/* ---- 10. summary ------------------------------------------------------------- */

/* One line of the targets table: the figure, its anchor, their ratio. */
static void target_row(const char *figure, double value, const char *anchor_name, double anchor,
                       const char *target, int met) {
  printf("%-46s %9.2f  %-34s %9.2f %7.2fx  %-22s %s\n", figure, value, anchor_name, anchor,
         anchor > 0 ? value / anchor : 0.0, target, met ? "met" : "MISSED");
}

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
  printf("%-46s %9s %9s %12s\n", "figure (us)", mode_names[0], mode_names[1], "in-process");
  printf("%-46s %9.2f %9.2f %12.2f\n", "sync replay p50, call to stream sync", r[0].replay.p50,
         r[1].replay.p50, b->ip_sync.p50);
  printf("%-46s %9.2f %9.2f %12.2f\n", "chain per dependent replay, sync", r[0].chain_us,
         r[1].chain_us, b->ip_chain_us);
  printf("%-46s %9.2f %9.2f %12.2f\n", "chain per dependent replay, async", r[0].achain_us,
         r[1].achain_us, b->ip_chain_us);
  printf("%-46s %9.2f %9.2f\n", "async call p50, host", r[0].async_call.p50, r[1].async_call.p50);
  printf("%-46s %9.2f %9.2f\n", "async chain host per call", r[0].achain_call_us,
         r[1].achain_call_us);
  printf("%-46s %9s %9s %12s\n", "chains correct (sync, async)",
         r[0].chain_ok && r[0].achain_ok ? "PASS" : "FAIL",
         r[1].chain_ok && r[1].achain_ok ? "PASS" : "FAIL", b->ip_chain_ok ? "PASS" : "FAIL");
  printf("%-46s %9.1f %9.1f   %s\n", "first replay (capture), host", r[0].first_us, r[1].first_us,
         r[0].captured && r[1].captured ? "" : "(not captured by this run)");
  printf("in-process: graph on fixed buffers p50 %.2f us; re-capture per call p50 %.2f us\n",
         b->ip_fixed.p50, b->ip_recapture.p50);
  uint64_t recaptures = b->at_end.recaptures - b->at_start.recaptures;
  uint64_t built = b->at_end.captures_built - b->at_start.captures_built;
  printf("captures built in this run %llu; re-captures %llu (addresses changed on every call)\n",
         (unsigned long long)built, (unsigned long long)recaptures);

  printf("\n== targets (staged mode; every anchor measured in this run)\n");
  printf("%-46s %9s  %-34s %9s %8s  %-22s\n", "figure", "us", "anchor", "us", "ratio", "target");
  double floor_host = b->floor_us[HANDOFF_HOST_FLAGS];
  double floor_dev = b->floor_us[HANDOFF_DEVICE_FLAGS];
  target_row("async chain per dependent replay", r[0].achain_us, "in-process staged chain",
             b->ip_chain_us, "<= 1.2x", r[0].achain_us <= 1.2 * b->ip_chain_us);
  if (b->o.floor_steps) {
    target_row("async chain per dependent replay", r[0].achain_us, "hand-off floor, host flags",
               floor_host, "<= 1.1x", r[0].achain_us <= 1.1 * floor_host);
    target_row("async chain per dependent replay", r[0].achain_us, "hand-off floor, device flags",
               floor_dev, "(report)", 1);
    target_row("hand-off floor, host flags", floor_host, "one stream, in-process",
               b->floor_us[HANDOFF_ONE_STREAM], "(report)", 1);
    target_row("hand-off floor, device flags", floor_dev, "one stream, in-process",
               b->floor_us[HANDOFF_ONE_STREAM], "(report)", 1);
  }
  target_row("async call p50, host", r[0].async_call.p50, "(absolute)", 2.0, "<= 2 us",
             r[0].async_call.p50 <= 2.0);
  target_row("sync replay p50", r[0].replay.p50, "in-process sync p50 + echo p50",
             b->ip_sync.p50 + b->echo.p50, "<= 1.0x",
             r[0].replay.p50 <= b->ip_sync.p50 + b->echo.p50);
  if (b->o.big_mib) {
    char f[64];
    snprintf(f, sizeof f, "direct, %ld MiB slots, to sync", b->o.big_mib);
    target_row(f, b->big_sync.p50, "in-process staged, to sync", b->big_ip_sync.p50, "<= 0.5x",
               2.0 * b->big_sync.p50 <= b->big_ip_sync.p50);
    snprintf(f, sizeof f, "direct, %ld MiB slots, async chain", b->o.big_mib);
    target_row(f, b->big_chain_us, "in-process staged chain", b->big_ip_chain_us, "<= 0.5x",
               2.0 * b->big_chain_us <= b->big_ip_chain_us);
    target_row("direct, to sync", b->big_sync.p50, "in-process graph, fixed buffers",
               b->big_ip_fixed.p50, "(report)", 1);
  }
  target_row("first register of a VMM region", b->region_us[0], "(absolute)", 300.0, "<= 300 us",
             b->region_us[0] <= 300.0);
  target_row("restarted client, first result", b->restart_us, "in-process load + capture",
             b->ip_first_us, "<= 0.01x", 100.0 * b->restart_us <= b->ip_first_us);
  printf("%-46s %9llu  %-34s %9s %8s  %-22s %s\n", "re-captures while addresses change",
         (unsigned long long)recaptures, "", "", "", "0", recaptures == 0 ? "met" : "MISSED");

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
  printf(
      "RESULT inproc_sync_p50_us=%.2f inproc_fixed_p50_us=%.2f inproc_recapture_p50_us=%.2f "
      "inproc_chain_us=%.2f inproc_load_us=%.1f inproc_first_us=%.1f region_vmm_us=%.1f "
      "region_legacy_us=%.1f restart_us=%.1f restart_region_us=%.1f restart_replay_us=%.1f "
      "recaptures=%llu captures_built=%llu chain=%ld\n",
      b->ip_sync.p50, b->ip_fixed.p50, b->ip_recapture.p50, b->ip_chain_us, b->ip_load_us,
      b->ip_first_us, b->region_us[0], b->region_us[1], b->restart_us, b->restart_region_us,
      b->restart_replay_us, (unsigned long long)recaptures, (unsigned long long)built, b->o.chain);
  if (b->o.floor_steps)
    printf(
        "RESULT floor_steps=%ld floor_one_stream_us=%.2f floor_host_us=%.2f floor_device_us=%.2f\n",
        b->o.floor_steps, b->floor_us[HANDOFF_ONE_STREAM], floor_host, floor_dev);
  if (b->o.big_mib)
    printf(
        "RESULT big_mib=%ld direct_big_p50_us=%.2f direct_big_chain_us=%.2f "
        "inproc_big_staged_p50_us=%.2f inproc_big_fixed_p50_us=%.2f inproc_big_chain_us=%.2f "
        "big_register_us=%.1f big_steps=%ld\n",
        b->o.big_mib, b->big_sync.p50, b->big_chain_us, b->big_ip_sync.p50, b->big_ip_fixed.p50,
        b->big_ip_chain_us, b->big_register_us, b->big_steps);
}

/* ---- main ---------------------------------------------------------------- */

static void bench_close(bench *b) {
  /* Nothing may still wait on the flag page or use the buffers. */
  if (b->stream) CU_CHECK_IGNORE(b, cuStreamSynchronize(b->stream));
  inproc_close(&b->ip);
  handoff_close(&b->ho, b->cu);
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
  free(b->cubin);
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
  if (b->o.floor_steps && handoff_fork(&b->ho) < 0) {
    set_err(b, "%s", b->ho.err);
    goto fail;
  }

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
  if (daemon_device(b, "at start", &b->mps_daemon, &b->at_start) < 0) goto fail;
  if (connect_session(b, GRAPHD_SESSION_DATA, &b->data) < 0) goto fail;
  if (measure_ping(b, b->data, &b->ping_data) < 0) goto fail;
  print_stats("ping, data session", &b->ping_data);

  if (alloc_buffers(b) < 0) goto fail;
  GD_CHECK_GOTO(b, b->data, "graphd_stream_attach",
                graphd_stream_attach(b->data, b->stream, &b->gs), fail);
  if (register_regions(b) < 0) goto fail;
  if (read_cubin(b) < 0 || register_programs(b, b->data, 0) < 0) goto fail;

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

  printf("== 6. the same program captured in this process (the anchors)\n");
  if (measure_inproc(b) < 0) goto fail;
  if (b->o.floor_steps) {
    printf("== 7. the GPU floor of a hand-off: the async chain's step, both sides queued ahead\n");
    if (measure_floor(b) < 0) goto fail;
  }
  printf("== 8. a client started afresh against a daemon holding the capture\n");
  if (measure_restart(b) < 0) goto fail;
  if (b->o.big_mib) {
    printf("== 9. direct mode, %ld MiB slots, against staging in this process\n", b->o.big_mib);
    if (measure_big(b) < 0) goto fail;
  }

  if (daemon_device(b, "at end", NULL, &b->at_end) < 0) goto fail;
  print_summary(b);
  if (!b->mode[0].chain_ok || !b->mode[1].chain_ok || !b->mode[0].achain_ok ||
      !b->mode[1].achain_ok || !b->ip_chain_ok) {
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
