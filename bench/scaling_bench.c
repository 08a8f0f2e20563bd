/* scaling_bench: replays per second when one process
 * drives every GPU the daemon serves (a thread per device and client), against
 * one process per device and client, side by side in one run.
 *
 * Each client: a data session on its device, the 1-kernel scale program
 * (staged input and output over 64 Ki floats; every client registers the
 * same program, so each device holds one capture that all its clients
 * share), a cuMemAlloc input/output pair and a stream. After a warm-up (the
 * first replay on a device captures), all clients start together and replay
 * for --seconds, synchronising their stream every 32 replays; the outputs
 * are then checked bit for bit. The figure is the sum of replays over the
 * longest client's time.
 *
 * The process layout runs first: its children are forked before this
 * process touches CUDA (CUDA is unusable in a child forked after cuInit).
 * The devices are the daemon's CUDA devices, from its status, matched to
 * this process's devices by UUID. With each figure, the daemon's worker of
 * each device: its mean time per replay in the replay path over the timed
 * run, the share of the run it spent there, and the share it was busy at
 * all (its busy time over its time served; from Status, read as the
 * clients start and after they end): a worker busy near 100% bounds the
 * rate; a rate that stays low with the worker mostly idle is bound
 * elsewhere (the GPU, the hand-offs).
 *
 * Exit status: 0 when every client worked, 1 on a failure (one line on
 * stderr), 77 when the daemon serves no CUDA device. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/cuda_driver.h"
#include "common/file.h"
#include "graphd/graphd.h"

#ifndef GRAPHD_BENCH_KERNEL_DIR
#define GRAPHD_BENCH_KERNEL_DIR "tests/kernels"
#endif

#define NF (64u * 1024u)
#define NB (NF * 4u)
#define SYNC_EVERY 32
#define MAX_CLIENTS 256
#define A 1.5f
#define MAX_DEVICES 64

typedef struct opts {
  const char *socket, *kernels;
  double seconds;
  int per_device;
  int async;    /* graphd_replay_async: no round trip per replay */
  int blocking; /* clients' contexts sleep in stream syncs instead of spinning */
  int direct;   /* the program in direct mode: the kernel on the clients' buffers, no copies */
  int layouts;  /* LAYOUT_PROCESSES | LAYOUT_THREADS */
} opts;

enum { LAYOUT_PROCESSES = 1, LAYOUT_THREADS = 2 };

/* The workers' time in the replay path and their replays, and their busy
 * time and time served, by the daemon's device index (Status). */
typedef struct work {
  uint64_t ns[MAX_DEVICES], n[MAX_DEVICES];
  uint64_t busy_ns[MAX_DEVICES], clock_ns[MAX_DEVICES];
} work;

/* Reads the workers' totals over a control session; 0, or -1 with a line on
 * stderr. Touches no CUDA (the process layout forks after it). */
static int read_work(const opts *o, work *w) {
  graphd_connect_options co;
  graphd_connect_options_init(&co);
  co.socket_path = o->socket;
  co.client_name = "scaling_bench";
  graphd_client *c;
  char e[GRAPHD_ERRMAX];
  graphd_daemon_status *s;
  memset(w, 0, sizeof *w);
  if (graphd_connect(&co, &c, e, sizeof e) != GRAPHD_OK) {
    fprintf(stderr, "scaling_bench: status: %s\n", e);
    return -1;
  }
  if (graphd_get_status(c, &s) != GRAPHD_OK) {
    fprintf(stderr, "scaling_bench: status: %s\n", graphd_last_error(c));
    graphd_close(c);
    return -1;
  }
  for (uint32_t i = 0; i < s->ndevices && i < MAX_DEVICES; i++) {
    w->ns[i] = s->work[i].replay_ns;
    w->n[i] = s->work[i].replays;
    graphd_device_record r;
    if (graphd_daemon_status_device(s, i, &r, sizeof r) == GRAPHD_OK) {
      w->busy_ns[i] = r.worker_busy_ns;
      w->clock_ns[i] = r.worker_clock_ns;
    }
  }
  graphd_daemon_status_free(s);
  graphd_close(c);
  return 0;
}

/* One client's work and result. */
typedef struct client {
  const opts *o;
  const void *cubin;
  size_t cubin_len;
  uint8_t uuid[16];
  int ordinal;                /* the daemon's device index */
  int go_fd;                  /* process layout: read one byte to start; -1 in threads */
  pthread_barrier_t *barrier; /* threads layout */
  long replays;
  double seconds;
  char err[GRAPHD_ERRMAX + 256];
} client;

static const gd_cuda *cu;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define CU(call)                                                                                   \
  do {                                                                                             \
    CUresult r_ = cu->call;                                                                        \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      const char *n_ = "?";                                                                        \
      cu->cuGetErrorName(r_, &n_);                                                                 \
      snprintf(k->err, sizeof k->err, "device %d: %s: %s", k->ordinal, #call, n_);                 \
      goto out;                                                                                    \
    }                                                                                              \
  } while (0)

#define GD(c, call)                                                                                \
  do {                                                                                             \
    graphd_status s_ = (call);                                                                     \
    if (s_ != GRAPHD_OK) {                                                                         \
      snprintf(k->err, sizeof k->err, "device %d: %s: %s: %s", k->ordinal, #call,                  \
               graphd_status_name(s_), (c) ? graphd_last_error(c) : "");                           \
      goto out;                                                                                    \
    }                                                                                              \
  } while (0)

/* One replay of the client's program, sync or async as asked. */
static graphd_status replay_once(const client *k, graphd_client *c, graphd_stream *gs,
                                 const uint8_t pid[32], const graphd_binding bd[2]) {
  return k->o->async ? graphd_replay_async(c, gs, pid, bd, 2, NULL)
                     : graphd_replay(c, gs, pid, bd, 2, NULL);
}

/* Sets up one client, waits for the start, replays for the set time and
 * checks the output. k->err is empty on success. */
static void run_client(client *k) {
  graphd_client *c = NULL;
  graphd_stream *gs = NULL;
  graphd_program *p = NULL;
  CUstream st = NULL;
  CUdeviceptr x = 0, y = 0;
  float *host = malloc(2 * NB);
  int count = 0;
  CUdevice dev = -1;
  int started = 0; /* passed the start (threads: the barrier) */
  if (!host) {
    snprintf(k->err, sizeof k->err, "out of memory");
    goto out;
  }
  CU(cuDeviceGetCount(&count));
  for (int i = 0; i < count && dev < 0; i++) {
    CUdevice d;
    CUuuid u;
    CU(cuDeviceGet(&d, i));
    CU(cuDeviceGetUuid(&u, d));
    if (memcmp(u.bytes, k->uuid, 16) == 0) dev = d;
  }
  if (dev < 0) {
    snprintf(k->err, sizeof k->err, "device %d: this process cannot see it (CUDA_VISIBLE_DEVICES?)",
             k->ordinal);
    goto out;
  }
  CUcontext ctx;
  if (k->o->blocking) CU(cuDevicePrimaryCtxSetFlags(dev, CU_CTX_SCHED_BLOCKING_SYNC));
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  CU(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CU(cuMemAlloc(&x, NB));
  CU(cuMemAlloc(&y, NB));
  for (uint32_t i = 0; i < NF; i++) host[i] = (float)(i % 4096u) - 2048.0f;
  CU(cuMemcpyHtoD(x, host, NB));

  graphd_connect_options co;
  graphd_connect_options_init(&co);
  co.socket_path = k->o->socket;
  co.kind = GRAPHD_SESSION_DATA;
  co.client_name = "scaling_bench";
  memcpy(co.device_uuid, k->uuid, 16);
  char e[GRAPHD_ERRMAX];
  if (graphd_connect(&co, &c, e, sizeof e) != GRAPHD_OK) {
    snprintf(k->err, sizeof k->err, "device %d: connect: %s", k->ordinal, e);
    goto out;
  }
  uint8_t mod[32], pid[32];
  GD(c, graphd_register_module(c, GRAPHD_MODULE_CUBIN, k->cubin, k->cubin_len, mod));
  p = graphd_program_new(k->o->direct ? GRAPHD_MODE_DIRECT : GRAPHD_MODE_STAGED);
  uint32_t grid[3] = {NF / 256, 1, 1}, block[3] = {256, 1, 1}, n = NF;
  float a = A;
  graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, NB, 1);
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, NB, 1);
  graphd_program_add_launch(p, mod, "scale", grid, block, 0);
  graphd_program_param_slot(p, 0, 0, 0, 0);
  graphd_program_param_slot(p, 0, 8, 1, 0);
  graphd_program_param(p, 0, 16, &a, 4);
  graphd_program_param(p, 0, 20, &n, 4);
  if (graphd_program_finish(p, pid) != GRAPHD_OK) {
    snprintf(k->err, sizeof k->err, "program: %s", graphd_program_error(p));
    goto out;
  }
  GD(c, graphd_register_program(c, p));
  GD(c, graphd_stream_attach(c, st, &gs));
  graphd_binding bd[2] = {{.slot = 0, .ptr = x, .bytes = NB}, {.slot = 1, .ptr = y, .bytes = NB}};
  for (int i = 0; i < 20; i++) GD(c, replay_once(k, c, gs, pid, bd));
  CU(cuStreamSynchronize(st));

  started = 1;
  if (k->barrier) {
    pthread_barrier_wait(k->barrier);
  } else {
    char go;
    if (read(k->go_fd, &go, 1) != 1) {
      snprintf(k->err, sizeof k->err, "the parent went away before the start");
      goto out;
    }
  }
  double t0 = now_s(), end = t0 + k->o->seconds;
  long r = 0;
  do {
    for (int i = 0; i < SYNC_EVERY; i++, r++) GD(c, replay_once(k, c, gs, pid, bd));
    CU(cuStreamSynchronize(st));
  } while (now_s() < end);
  k->seconds = now_s() - t0;
  k->replays = r;
  if (k->o->async) GD(c, graphd_replay_collect(c, NULL));
  CU(cuMemcpyDtoH(host + NF, y, NB));
  for (uint32_t i = 0; i < NF; i++) {
    float want = A * host[i];
    if (memcmp(&want, &host[NF + i], 4) != 0) {
      snprintf(k->err, sizeof k->err, "device %d: y[%u] = %g, want %g", k->ordinal, i,
               (double)host[NF + i], (double)want);
      goto out;
    }
  }
out:
  /* A client that failed its set-up still meets the others at the start. */
  if (k->barrier && !started) pthread_barrier_wait(k->barrier);
  if (gs) graphd_stream_detach(gs);
  graphd_close(c);
  graphd_program_free(p);
  if (y) cu->cuMemFree(y);
  if (x) cu->cuMemFree(x);
  if (st) cu->cuStreamDestroy(st);
  free(host);
}

static void *client_thread(void *arg) {
  run_client(arg);
  return NULL;
}

static int load_driver(char *err, size_t len) { return gd_cuda_load(&cu, err, len); }

/* The client processes' CPU time (user and system) over the last run. */
static double children_cpu_s;

static double rusage_s(void) {
  struct rusage u;
  getrusage(RUSAGE_CHILDREN, &u);
  return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 + (double)u.ru_stime.tv_sec +
         (double)u.ru_stime.tv_usec / 1e6;
}

/* One forked child per client; results come back over a pipe. */
static int run_processes(client *ks, int n, work *before, work *after) {
  double cpu0 = rusage_s();
  int go[2];
  pid_t kid[MAX_CLIENTS];
  int res[MAX_CLIENTS][2];
  if (pipe(go) < 0) return -1;
  for (int i = 0; i < n; i++) {
    if (pipe(res[i]) < 0) return -1;
    kid[i] = fork();
    if (kid[i] < 0) return -1;
    if (kid[i] == 0) {
      close(go[1]);
      close(res[i][0]);
      client *k = &ks[i];
      k->go_fd = go[0];
      if (load_driver(k->err, sizeof k->err) == 0) run_client(k);
      ssize_t w = write(res[i][1], k, sizeof *k);
      _exit(w == (ssize_t)sizeof *k ? 0 : 1);
    }
    close(res[i][1]);
  }
  close(go[0]);
  /* Every child warms up before it reads its start byte; a child that
   * failed its set-up exits without reading, which is fine. */
  usleep(200000);
  char bytes[MAX_CLIENTS];
  memset(bytes, 'g', sizeof bytes);
  int rc = read_work(ks[0].o, before);
  if (write(go[1], bytes, (size_t)n) != n) rc = -1;
  close(go[1]);
  for (int i = 0; i < n; i++) {
    if (read(res[i][0], &ks[i], sizeof ks[i]) != (ssize_t)sizeof ks[i]) {
      snprintf(ks[i].err, sizeof ks[i].err, "client process %d died", (int)kid[i]);
      rc = -1;
    }
    close(res[i][0]);
    waitpid(kid[i], NULL, 0);
  }
  children_cpu_s = rusage_s() - cpu0;
  if (read_work(ks[0].o, after) < 0) rc = -1;
  return rc;
}

/* One thread per client; this thread meets them at the start (a client
 * that failed its set-up still comes to it) to read the workers' totals. */
static int run_threads(client *ks, int n, work *before, work *after) {
  pthread_t t[MAX_CLIENTS];
  pthread_barrier_t b;
  int rc = 0;
  pthread_barrier_init(&b, NULL, (unsigned)n + 1);
  for (int i = 0; i < n; i++) {
    ks[i].barrier = &b;
    ks[i].go_fd = -1;
    if (pthread_create(&t[i], NULL, client_thread, &ks[i]) != 0) return -1;
  }
  pthread_barrier_wait(&b);
  if (read_work(ks[0].o, before) < 0) rc = -1;
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&b);
  if (read_work(ks[0].o, after) < 0) rc = -1;
  return rc;
}

/* Prints the layout's figure; returns replays/s, or -1 when a client
 * failed. */
static double report(const char *layout, const client *ks, int n, int ndev, const work *w0,
                     const work *w1) {
  long total = 0;
  double longest = 0;
  for (int i = 0; i < n; i++) {
    if (ks[i].err[0]) {
      fprintf(stderr, "scaling_bench: %s: %s\n", layout, ks[i].err);
      return -1;
    }
    total += ks[i].replays;
    if (ks[i].seconds > longest) longest = ks[i].seconds;
  }
  double rate = (double)total / longest;
  printf("FIGURE %-34s %d device(s) x %d client(s): %9.0f replays/s (%ld in %.2f s)\n", layout,
         ndev, n / ndev, rate, total, longest);
  if (children_cpu_s > 0) {
    /* Set-up and warm-up included: an upper bound on the run's share. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf(
        "    client processes: %.2f us of CPU a replay, set-up included; %.0f%% of %ld cores "
        "over the run\n",
        children_cpu_s * 1e6 / (double)(total ? total : 1),
        100.0 * children_cpu_s / longest / (double)(cores > 0 ? cores : 1), cores);
    children_cpu_s = 0;
  }
  for (int d = 0; d < ndev; d++) {
    long r = 0;
    for (int i = 0; i < n; i++)
      if (ks[i].ordinal == d) r += ks[i].replays;
    uint64_t ns = w1->ns[d] - w0->ns[d], reps = w1->n[d] - w0->n[d];
    uint64_t served = w1->clock_ns[d] - w0->clock_ns[d];
    printf(
        "    device %d: %.0f replays/s; worker %.2f us a replay, in the replay path %.0f%% of "
        "the run, busy %.0f%%\n",
        d, (double)r / longest, reps ? (double)ns / 1e3 / (double)reps : 0.0,
        100.0 * (double)ns / 1e9 / longest,
        served ? 100.0 * (double)(w1->busy_ns[d] - w0->busy_ns[d]) / (double)served : 0.0);
  }
  return rate;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: scaling_bench [--socket PATH] [--kernels DIR] [--seconds S] "
          "[--clients-per-device K] [--async] [--blocking-sync]\n"
          "       [--layout both|processes|threads] [--mode staged|direct]\n"
          "  Replays/s with one process driving every GPU the daemon serves (a thread\n"
          "  per device and client) against one process per device and client.\n"
          "  --seconds S (default 3, 0.1 to 600), --clients-per-device K (default 1, 1 to 32)\n"
          "  --async: replays through the submission ring (graphd_replay_async), no round\n"
          "  trip each; the stream is synchronized every %d replays either way\n"
          "  --layout: run one of the two layouts only (default both)\n"
          "  --mode: the program staged (default: a copy in, the kernel, a copy out) or\n"
          "  direct (the kernel alone, on the client's buffers)\n"
          "  --blocking-sync: the clients' contexts block in stream syncs\n"
          "  (CU_CTX_SCHED_BLOCKING_SYNC) instead of spinning; for more clients than\n"
          "  cores, where spinning clients take the CPU the daemon needs\n",
          SYNC_EVERY);
}

int main(int argc, char **argv) {
  opts o = {.kernels = GRAPHD_BENCH_KERNEL_DIR,
            .seconds = 3.0,
            .per_device = 1,
            .layouts = LAYOUT_PROCESSES | LAYOUT_THREADS};
  static const struct option longopts[] = {{"socket", required_argument, NULL, 's'},
                                           {"kernels", required_argument, NULL, 'k'},
                                           {"seconds", required_argument, NULL, 't'},
                                           {"clients-per-device", required_argument, NULL, 'c'},
                                           {"async", no_argument, NULL, 'a'},
                                           {"blocking-sync", no_argument, NULL, 'b'},
                                           {"layout", required_argument, NULL, 'l'},
                                           {"mode", required_argument, NULL, 'm'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  setvbuf(stdout, NULL, _IOLBF, 0);
  int ch;
  char *end;
  while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (ch) {
      case 's': o.socket = optarg; break;
      case 'k': o.kernels = optarg; break;
      case 't':
        errno = 0;
        o.seconds = strtod(optarg, &end);
        if (errno || *end || !(o.seconds >= 0.1 && o.seconds <= 600)) {
          fprintf(stderr, "scaling_bench: --seconds %s: want a number from 0.1 to 600\n", optarg);
          return 2;
        }
        break;
      case 'c':
        errno = 0;
        o.per_device = (int)strtol(optarg, &end, 10);
        if (errno || *end || o.per_device < 1 || o.per_device > 32) {
          fprintf(stderr, "scaling_bench: --clients-per-device %s: want 1 to 32\n", optarg);
          return 2;
        }
        break;
      case 'a': o.async = 1; break;
      case 'b': o.blocking = 1; break;
      case 'l':
        if (strcmp(optarg, "both") == 0)
          o.layouts = LAYOUT_PROCESSES | LAYOUT_THREADS;
        else if (strcmp(optarg, "processes") == 0)
          o.layouts = LAYOUT_PROCESSES;
        else if (strcmp(optarg, "threads") == 0)
          o.layouts = LAYOUT_THREADS;
        else {
          fprintf(stderr, "scaling_bench: --layout %s: want both, processes or threads\n", optarg);
          return 2;
        }
        break;
      case 'm':
        if (strcmp(optarg, "staged") == 0 || strcmp(optarg, "direct") == 0) {
          o.direct = optarg[0] == 'd';
        } else {
          fprintf(stderr, "scaling_bench: --mode %s: want staged or direct\n", optarg);
          return 2;
        }
        break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "scaling_bench: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/test_kernels.cubin", o.kernels);
  size_t cubin_len = 0;
  void *cubin = gd_read_file(path, &cubin_len);
  if (!cubin) {
    fprintf(stderr, "scaling_bench: cannot read %s: %s (pass --kernels DIR)\n", path,
            strerror(errno));
    return 1;
  }

  /* The daemon's CUDA devices, from a control session (no CUDA here yet). */
  graphd_connect_options co;
  graphd_connect_options_init(&co);
  co.socket_path = o.socket;
  co.client_name = "scaling_bench";
  graphd_client *ctl;
  char e[GRAPHD_ERRMAX];
  if (graphd_connect(&co, &ctl, e, sizeof e) != GRAPHD_OK) {
    fprintf(stderr, "scaling_bench: %s\n", e);
    return 1;
  }
  graphd_daemon_status *ds;
  if (graphd_get_status(ctl, &ds) != GRAPHD_OK) {
    fprintf(stderr, "scaling_bench: status: %s\n", graphd_last_error(ctl));
    return 1;
  }
  static client ks[MAX_CLIENTS];
  int n = 0, ndev = 0;
  for (uint32_t d = 0; d < ds->ndevices && d < MAX_DEVICES; d++) {
    if (strcmp(ds->devices[d].backend, "cuda") != 0) continue;
    printf("device %u: %s %s, MPS %s\n", d, ds->devices[d].name, ds->devices[d].uuid_str,
           ds->devices[d].mps_enabled ? "on" : "off");
    for (int i = 0; i < o.per_device && n < MAX_CLIENTS; i++, n++) {
      ks[n] = (client){.o = &o, .cubin = cubin, .cubin_len = cubin_len, .ordinal = (int)d};
      memcpy(ks[n].uuid, ds->devices[d].uuid, 16);
    }
    ndev++;
  }
  graphd_daemon_status_free(ds);
  graphd_close(ctl);
  if (ndev == 0) {
    printf("scaling_bench: the daemon serves no CUDA device: skipped\n");
    return 77;
  }
  printf("replays: %s, %s, %d client(s) per device, %.1f s\n",
         o.async ? "async (graphd_replay_async)" : "sync (graphd_replay)",
         o.direct ? "direct" : "staged", o.per_device, o.seconds);
  client saved[MAX_CLIENTS];
  memcpy(saved, ks, sizeof(client) * (size_t)n);

  int rc = 0;
  double procs = 0, threads = 0;
  static work w0, w1;
  if (o.layouts & LAYOUT_PROCESSES) {
    rc = run_processes(ks, n, &w0, &w1);
    procs = report("one process per device and client:", ks, n, ndev, &w0, &w1);
    memcpy(ks, saved, sizeof(client) * (size_t)n);
  }
  if (o.layouts & LAYOUT_THREADS) {
    if (load_driver(e, sizeof e) < 0) {
      fprintf(stderr, "scaling_bench: %s\n", e);
      return 1;
    }
    if (run_threads(ks, n, &w0, &w1) < 0) rc = -1;
    threads = report("one process driving all (threads):", ks, n, ndev, &w0, &w1);
  }
  free(cubin);
  if (rc < 0 || procs < 0 || threads < 0) return 1;
  const char *how =
      o.direct ? (o.async ? "async_direct" : "sync_direct") : (o.async ? "async" : "sync");
  printf("RESULT scaling_%s_devices=%d scaling_%s_clients=%d", how, ndev, how, n);
  if (procs > 0) printf(" scaling_%s_procs_rps=%.0f", how, procs);
  if (threads > 0) printf(" scaling_%s_threads_rps=%.0f", how, threads);
  printf("\n");
  if (procs > 0 && threads > 0)
    printf("FIGURE one process / process per client: %.2fx\n", threads / procs);
  return 0;
}
