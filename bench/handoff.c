/* The hand-off floor (handoff.h). */
#define _GNU_SOURCE
#include "handoff.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/file.h"
#include "bench_util.h"

/* Where the flags sit, in 64-bit words: a cache line each. */
#define GO 0
#define READY 8
#define DONE 16
#define PAGE 4096
#define DEV_FLAG_BYTES 256 /* ready at 0, done at 64 */

const char *const handoff_variant_names[HANDOFF_NVARIANTS] = {"one stream, in-process",
                                                              "two processes, host-pinned flags",
                                                              "two processes, device-memory flags"};

/* What the parent asks of the child: one run of its side. */
typedef struct request {
  int quit;
  int ordinal;
  int dev_flags;
  long steps;
  uint64_t base; /* step i waits for ready > base + i and writes done = base + i + 1 */
  uint32_t n;
  float a;
  CUipcMemHandle buf; /* x0 at 0, x1 at n * 4 */
  CUipcMemHandle flags;
  char cubin[1024];
} request;

/* The child's answer: once queued (phase 1), once finished (phase 2). */
typedef struct reply {
  int phase;
  int rc;
  char err[400];
} reply;

static int xfer(int fd, void *p, size_t len, int out) {
  char *c = p;
  while (len) {
    ssize_t k = out ? send(fd, c, len, MSG_NOSIGNAL) : recv(fd, c, len, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    len -= (size_t)k;
  }
  return 0;
}

static void set_err(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
}

#define HO_CALL(cu, call, err, label)                                                              \
  do {                                                                                             \
    CUresult r_ = (cu)->call;                                                                      \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      char e_[160];                                                                                \
      set_err(err, sizeof err, "%s: %s", #call, gd_cuda_strerror(cu, r_, e_, sizeof e_));          \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)

/* The same for step_graph, which is not a driver call. */
#define HO_GRAPH(cu, expr, err, label)                                                             \
  do {                                                                                             \
    CUresult r_ = (expr);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      char e_[160];                                                                                \
      set_err(err, sizeof err, "building the step's graph: %s",                                    \
              gd_cuda_strerror(cu, r_, e_, sizeof e_));                                            \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)

/* The step's graph: copy `from` into xs, scale(xs, ys), copy ys to `to`. */
static CUresult step_graph(const gd_cuda *cu, CUcontext ctx, CUfunction fn, CUdeviceptr from,
                           CUdeviceptr to, CUdeviceptr xs, CUdeviceptr ys, uint32_t n, float a,
                           CUgraphExec *out) {
  CUgraph g;
  CUresult r = cu->cuGraphCreate(&g, 0);
  if (r != CUDA_SUCCESS) return r;
  CUDA_MEMCPY3D c;
  memset(&c, 0, sizeof c);
  c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.WidthInBytes = (size_t)n * 4;
  c.Height = c.Depth = 1;
  c.srcDevice = from;
  c.dstDevice = xs;
  CUgraphNode in, k, o;
  void *params[] = {&xs, &ys, &a, &n};
  CUDA_KERNEL_NODE_PARAMS kp;
  memset(&kp, 0, sizeof kp);
  kp.func = fn;
  kp.gridDimX = (n + 255) / 256, kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = 256, kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = params;
  r = cu->cuGraphAddMemcpyNode(&in, g, NULL, 0, &c, ctx);
  if (r == CUDA_SUCCESS) r = cu->cuGraphAddKernelNode(&k, g, &in, 1, &kp);
  c.srcDevice = ys;
  c.dstDevice = to;
  if (r == CUDA_SUCCESS) r = cu->cuGraphAddMemcpyNode(&o, g, &k, 1, &c, ctx);
  if (r == CUDA_SUCCESS) r = cu->cuGraphInstantiateWithFlags(out, g, 0);
  cu->cuGraphDestroy(g);
  return r;
}

/* ---- the child ---------------------------------------------------------- */

typedef struct child_state {
  const gd_cuda *cu;
  CUdevice dev;
  CUcontext ctx;
  CUstream st;
  CUdeviceptr page_dev;
  int ordinal;
} child_state;

/* One run of the child's side; answers phase 1 once queued. */
static int child_run(child_state *cs, volatile uint64_t *page, const request *rq, int fd, char *err,
                     size_t errlen) {
  const gd_cuda *cu = cs->cu;
  char e[400] = "";
  int rc = -1;
  void *cubin = NULL;
  size_t len;
  CUmodule mod = NULL;
  CUfunction fn;
  CUdeviceptr buf = 0, fl = 0, xs = 0, ys = 0;
  CUgraphExec g[2] = {NULL, NULL};
  if (!cs->ctx || cs->ordinal != rq->ordinal) {
    HO_CALL(cu, cuDeviceGet(&cs->dev, rq->ordinal), e, out);
    HO_CALL(cu, cuDevicePrimaryCtxRetain(&cs->ctx, cs->dev), e, out);
    HO_CALL(cu, cuCtxSetCurrent(cs->ctx), e, out);
    HO_CALL(cu, cuStreamCreate(&cs->st, CU_STREAM_NON_BLOCKING), e, out);
    cs->ordinal = rq->ordinal;
  }
  if (!rq->dev_flags && !cs->page_dev) {
    HO_CALL(cu, cuMemHostRegister((void *)page, PAGE, CU_MEMHOSTREGISTER_DEVICEMAP), e, out);
    HO_CALL(cu, cuMemHostGetDevicePointer(&cs->page_dev, (void *)page, 0), e, out);
  }
  cubin = gd_read_file(rq->cubin, &len);
  if (!cubin) {
    set_err(e, sizeof e, "cannot read %s: %s", rq->cubin, strerror(errno));
    goto out;
  }
  HO_CALL(cu, cuModuleLoadData(&mod, cubin), e, out);
  HO_CALL(cu, cuModuleGetFunction(&fn, mod, "scale"), e, out);
  HO_CALL(cu, cuIpcOpenMemHandle(&buf, rq->buf, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), e, out);
  if (rq->dev_flags)
    HO_CALL(cu, cuIpcOpenMemHandle(&fl, rq->flags, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), e, out);
  CUdeviceptr ready = rq->dev_flags ? fl : cs->page_dev + READY * 8;
  CUdeviceptr done = rq->dev_flags ? fl + 64 : cs->page_dev + DONE * 8;
  HO_CALL(cu, cuMemAlloc(&xs, (size_t)rq->n * 4), e, out);
  HO_CALL(cu, cuMemAlloc(&ys, (size_t)rq->n * 4), e, out);
  CUdeviceptr x[2] = {buf, buf + (size_t)rq->n * 4};
  for (int k = 0; k < 2; k++)
    HO_GRAPH(cu, step_graph(cu, cs->ctx, fn, x[k], x[1 - k], xs, ys, rq->n, rq->a, &g[k]), e, out);
  for (long i = 0; i < rq->steps; i++) {
    HO_CALL(
        cu,
        cuStreamWaitValue64(cs->st, ready, rq->base + (uint64_t)i + 1, CU_STREAM_WAIT_VALUE_GEQ), e,
        out);
    HO_CALL(cu, cuGraphLaunch(g[i % 2], cs->st), e, out);
    HO_CALL(cu, cuStreamWriteValue64(cs->st, done, rq->base + (uint64_t)i + 1, 0), e, out);
  }
  reply q = {.phase = 1, .rc = 0};
  if (xfer(fd, &q, sizeof q, 1) < 0) _exit(1); /* the parent is gone */
  HO_CALL(cu, cuStreamSynchronize(cs->st), e, out);
  rc = 0;
out:
  if (cs->st) cu->cuStreamSynchronize(cs->st);
  for (int k = 0; k < 2; k++)
    if (g[k]) cu->cuGraphExecDestroy(g[k]);
  if (ys) cu->cuMemFree(ys);
  if (xs) cu->cuMemFree(xs);
  if (fl) cu->cuIpcCloseMemHandle(fl);
  if (buf) cu->cuIpcCloseMemHandle(buf);
  if (mod) cu->cuModuleUnload(mod);
  free(cubin);
  if (rc < 0) snprintf(err, errlen, "%s", e);
  return rc;
}

static void child_main(int fd, volatile uint64_t *page) {
  child_state cs;
  memset(&cs, 0, sizeof cs);
  cs.ordinal = -1;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  for (;;) {
    request rq;
    if (xfer(fd, &rq, sizeof rq, 0) < 0 || rq.quit) _exit(0);
    reply q = {.phase = 2, .rc = 0};
    char e[256];
    if (!cs.cu && gd_cuda_load(&cs.cu, e, sizeof e) < 0) {
      cs.cu = NULL;
      q.rc = -1;
      snprintf(q.err, sizeof q.err, "the child cannot load CUDA: %s", e);
    } else if (child_run(&cs, page, &rq, fd, q.err, sizeof q.err) < 0) {
      q.rc = -1;
    }
    if (xfer(fd, &q, sizeof q, 1) < 0) _exit(1);
  }
}

/* ---- the parent ----------------------------------------------------------- */

int handoff_fork(handoff *h) {
  memset(h, 0, sizeof *h);
  h->fd = -1;
  void *p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    set_err(h->err, sizeof h->err, "mmap of the flag page: %s", strerror(errno));
    return -1;
  }
  h->page = p;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    set_err(h->err, sizeof h->err, "socketpair: %s", strerror(errno));
    return -1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    set_err(h->err, sizeof h->err, "fork: %s", strerror(errno));
    close(sv[0]);
    close(sv[1]);
    return -1;
  }
  if (pid == 0) {
    close(sv[0]);
    child_main(sv[1], h->page);
  }
  close(sv[1]);
  h->pid = pid;
  h->fd = sv[0];
  return 0;
}

/* Sends rq when given, then waits for the child's next answer: queued
 * (after a request) or finished. */
static int child_answer(handoff *h, const request *rq) {
  reply q;
  if ((rq && xfer(h->fd, (void *)rq, sizeof *rq, 1) < 0) || xfer(h->fd, &q, sizeof q, 0) < 0) {
    set_err(h->err, sizeof h->err, "the hand-off child went away");
    return -1;
  }
  if (q.rc != 0) {
    set_err(h->err, sizeof h->err, "the hand-off child: %s", q.err);
    return -1;
  }
  return 0;
}

int handoff_run(handoff *h, const gd_cuda *cu, int ordinal, CUcontext ctx, CUstream st,
                CUfunction fn, const char *cubin_path, uint32_t n, float a, int variant, long steps,
                double *per_step_us) {
  int rc = -1, queued = 0;
  long go = 0;
  CUdeviceptr buf = 0, fl = 0, xs = 0, ys = 0;
  CUgraphExec g[2] = {NULL, NULL};
  float *host = NULL;
  request rq;
  memset(&rq, 0, sizeof rq);
  if (steps < 1 || steps > HANDOFF_MAX_STEPS || variant < 0 || variant >= HANDOFF_NVARIANTS) {
    set_err(h->err, sizeof h->err, "hand-off: %ld steps, variant %d: out of range", steps, variant);
    return -1;
  }
  if (!h->page_registered) {
    HO_CALL(cu, cuMemHostRegister((void *)h->page, PAGE, CU_MEMHOSTREGISTER_DEVICEMAP), h->err,
            out);
    h->page_registered = 1;
    HO_CALL(cu, cuMemHostGetDevicePointer(&h->page_dev, (void *)h->page, 0), h->err, out);
  }
  size_t nb = (size_t)n * 4;
  HO_CALL(cu, cuMemAlloc(&buf, 2 * nb), h->err, out);
  CUdeviceptr x[2] = {buf, buf + nb};
  HO_CALL(cu, cuMemsetD32Async(x[0], 0x3f800000u, n, st), h->err, out); /* 1.0f */
  uint64_t base = h->gen;
  h->gen += (uint64_t)steps + 1;
  go = ++h->go;
  CUdeviceptr ready = h->page_dev + READY * 8, done = h->page_dev + DONE * 8;
  if (variant == HANDOFF_DEVICE_FLAGS) {
    HO_CALL(cu, cuMemAlloc(&fl, DEV_FLAG_BYTES), h->err, out);
    HO_CALL(cu, cuMemsetD32Async(fl, 0, DEV_FLAG_BYTES / 4, st), h->err, out);
    ready = fl;
    done = fl + 64;
    HO_CALL(cu, cuIpcGetMemHandle(&rq.flags, fl), h->err, out);
  }
  HO_CALL(cu, cuStreamSynchronize(st), h->err, out);
  if (variant == HANDOFF_ONE_STREAM) {
    HO_CALL(cu, cuMemAlloc(&xs, nb), h->err, out);
    HO_CALL(cu, cuMemAlloc(&ys, nb), h->err, out);
    for (int k = 0; k < 2; k++)
      HO_GRAPH(cu, step_graph(cu, ctx, fn, x[k], x[1 - k], xs, ys, n, a, &g[k]), h->err, out);
  } else {
    rq.ordinal = ordinal;
    rq.dev_flags = variant == HANDOFF_DEVICE_FLAGS;
    rq.steps = steps;
    rq.base = base;
    rq.n = n;
    rq.a = a;
    HO_CALL(cu, cuIpcGetMemHandle(&rq.buf, buf), h->err, out);
    snprintf(rq.cubin, sizeof rq.cubin, "%s", cubin_path);
    if (child_answer(h, &rq) < 0) goto out;
    queued = 1;
  }
  /* This side, behind the go flag. */
  HO_CALL(cu, cuStreamWaitValue64(st, h->page_dev + GO * 8, (uint64_t)go, CU_STREAM_WAIT_VALUE_GEQ),
          h->err, out);
  for (long i = 0; i < steps; i++) {
    if (variant == HANDOFF_ONE_STREAM) {
      HO_CALL(cu, cuGraphLaunch(g[i % 2], st), h->err, out);
      continue;
    }
    HO_CALL(cu, cuStreamWriteValue64(st, ready, base + (uint64_t)i + 1, 0), h->err, out);
    HO_CALL(cu, cuStreamWaitValue64(st, done, base + (uint64_t)i + 1, CU_STREAM_WAIT_VALUE_GEQ),
            h->err, out);
  }
  double t0 = bench_now_us();
  __atomic_store_n(&h->page[GO], (uint64_t)go, __ATOMIC_RELEASE);
  HO_CALL(cu, cuStreamSynchronize(st), h->err, out);
  *per_step_us = (bench_now_us() - t0) / (double)steps;
  if (queued) {
    queued = 0;
    if (child_answer(h, NULL) < 0) goto out;
  }
  /* x[steps % 2] holds a^steps, one single multiply per step. */
  host = malloc(nb);
  if (!host) {
    set_err(h->err, sizeof h->err, "out of memory");
    goto out;
  }
  HO_CALL(cu, cuMemcpyDtoH(host, x[steps % 2], nb), h->err, out);
  float want = 1.0f;
  for (long i = 0; i < steps; i++) want = a * want;
  for (uint32_t k = 0; k < n; k++)
    if (memcmp(&host[k], &want, 4) != 0) {
      set_err(h->err, sizeof h->err, "hand-off (%s): x[%u] = %.9g after %ld steps, want %.9g",
              handoff_variant_names[variant], k, (double)host[k], steps, (double)want);
      goto out;
    }
  rc = 0;
out:
  if (rc < 0 && go && h->page) /* let anything queued behind the go flag run out */
    __atomic_store_n(&h->page[GO], (uint64_t)go, __ATOMIC_RELEASE);
  if (queued) child_answer(h, NULL);
  cu->cuStreamSynchronize(st);
  for (int k = 0; k < 2; k++)
    if (g[k]) cu->cuGraphExecDestroy(g[k]);
  if (ys) cu->cuMemFree(ys);
  if (xs) cu->cuMemFree(xs);
  if (fl) cu->cuMemFree(fl);
  if (buf) cu->cuMemFree(buf);
  free(host);
  return rc;
}

void handoff_close(handoff *h, const gd_cuda *cu) {
  if (h->pid > 0) {
    request rq;
    memset(&rq, 0, sizeof rq);
    rq.quit = 1;
    xfer(h->fd, &rq, sizeof rq, 1);
    waitpid(h->pid, NULL, 0);
  }
  if (h->fd >= 0) close(h->fd);
  if (h->page_registered && cu) cu->cuMemHostUnregister((void *)h->page);
  if (h->page) munmap((void *)h->page, PAGE);
  memset(h, 0, sizeof *h);
  h->fd = -1;
}
