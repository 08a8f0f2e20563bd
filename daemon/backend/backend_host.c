/* Host backend: devices that live in this process's memory, for CI and for
 * machines without a GPU (docs/design.md, "The host backend"). It is not a CUDA
 * simulator.
 *
 * DESIGN: the facts are built at start on the main thread; each device's
 * state is touched only by its worker. The used-bytes counter is atomic so
 * status can read it from any worker. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/uuid.h"
#include "backend.h"
#include "daemon/base/clock.h"
#include "graphd/encoding.h"
#include "graphd/host_kernel.h"
#include "common/memfd.h"
#include "graphd/status.h"
#include <openssl/sha.h>

struct gd_backend_dev {
  int index;
  uint64_t total;
  _Atomic uint64_t used;
  _Atomic uint64_t mapped; /* bytes of client regions mapped (at most total) */
  int fault;               /* a kernel reported a fault: sticky until the reset (2: past it too) */
};

static int host_open(gd_backend *be, int i, gd_backend_dev **out, char *err, size_t errlen) {
  gd_backend_dev *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of memory opening host device %d", i);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  d->index = i;
  d->total = be->devices[i].total_memory;
  *out = d;
  return 0;
}

static void host_close(gd_backend *be, gd_backend_dev *d) {
  (void)be;
  free(d);
}

static int host_sync(gd_backend *be, gd_backend_dev *d, char *err, size_t errlen) {
  (void)be, (void)d, (void)err, (void)errlen;
  return 0; /* the worker is the stream: nothing runs after its job */
}

static int host_health(gd_backend *be, gd_backend_dev *d, char *err, size_t errlen) {
  (void)be;
  if (!d->fault) return 0;
  snprintf(err, errlen, "host device %d: a kernel reported a fault", d->index);
  return -GRAPHD_UNAVAILABLE;
}

static int host_reset(gd_backend *be, gd_backend_dev *d, char *err, size_t errlen) {
  (void)be;
  if (d->fault >= 2) {
    snprintf(err, errlen, "host device %d: a kernel reported a fault no reset clears", d->index);
    return -GRAPHD_UNAVAILABLE;
  }
  d->fault = 0;
  return 0;
}

static int host_mem_info(gd_backend *be, gd_backend_dev *d, uint64_t *free_b, uint64_t *total_b,
                         char *err, size_t errlen) {
  (void)be, (void)err, (void)errlen;
  uint64_t used = atomic_load(&d->used);
  *total_b = d->total;
  *free_b = used > d->total ? 0 : d->total - used;
  return 0;
}

/* Modules are ELF shared objects: the bytes go into a memfd that dlopen
 * loads through /proc/self/fd, so nothing touches the file system. */
static int host_module_load(gd_backend *be, gd_backend_dev *d, uint32_t kind, const void *bytes,
                            size_t len, void **mod, char *err, size_t errlen) {
  (void)be;
  if (kind != GD_MODULE_HOST_ELF) {
    snprintf(err, errlen, "host devices run host ELF modules only (this module is kind %u)", kind);
    return -GRAPHD_FAILED_PRECONDITION;
  }
  char name[32];
  snprintf(name, sizeof name, "graphd-host%d-module", d->index);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) {
    snprintf(err, errlen, "memfd_create: %s", strerror(errno));
    return -GRAPHD_INTERNAL;
  }
  size_t off = 0;
  while (off < len) {
    ssize_t n = write(fd, (const char *)bytes + off, len - off);
    if (n <= 0) {
      snprintf(err, errlen, "writing the module to a memfd: %s", strerror(errno));
      close(fd);
      return -GRAPHD_INTERNAL;
    }
    off += (size_t)n;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  dlerror();
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  close(fd);
  if (!h) {
    const char *e = dlerror();
    snprintf(err, errlen, "cannot load the host module: %s", e ? e : "unknown dlopen error");
    return -GRAPHD_INVALID_ARGUMENT;
  }
  *mod = h;
  return 0;
}

static void host_module_unload(gd_backend *be, gd_backend_dev *d, void *mod) {
  (void)be, (void)d;
  dlclose(mod);
}

static int host_function_get(gd_backend *be, gd_backend_dev *d, void *mod, const char *name,
                             void **fn, gd_func_info *info, char *err, size_t errlen) {
  (void)be, (void)d;
  void *f = dlsym(mod, name);
  if (!f) {
    snprintf(err, errlen, "the module has no function '%s'", name);
    return -GRAPHD_NOT_FOUND;
  }
  memset(info, 0, sizeof *info);
  char pname[GD_MAX_NAME + 32];
  snprintf(pname, sizeof pname, "graphd_params_%s", name);
  const uint32_t *desc = dlsym(mod, pname);
  if (desc && desc[0] <= GD_FUNC_MAX_PARAMS) {
    info->params_known = 1;
    info->nparams = desc[0];
    for (uint32_t i = 0; i < desc[0]; i++) {
      info->param_offset[i] = desc[1 + 2 * i];
      info->param_size[i] = desc[2 + 2 * i];
    }
  }
  info->max_threads_per_block = GD_MAX_BLOCK_THREADS;
  info->max_shared_optin = GD_MAX_SHARED_BYTES;
  info->default_shared_limit = 48u << 10;
  memcpy(fn, &f, sizeof f);
  return 0;
}

static int host_function_set_shared(gd_backend *be, gd_backend_dev *d, void *fn, uint32_t bytes,
                                    char *err, size_t errlen) {
  (void)be, (void)d, (void)fn, (void)bytes, (void)err, (void)errlen;
  return 0; /* shared memory is a heap buffer the worker provides */
}

/* Host regions are memfds from graphd_host_alloc, mapped shared. */
static int host_region_import(gd_backend *be, gd_backend_dev *d, const gd_region_import *in,
                              gd_region_map *out, char *err, size_t errlen) {
  (void)be, (void)d;
  if (in->kind != GRAPHD_REGION_HOST_MEMFD) {
    snprintf(err, errlen, "host devices take memory from graphd_host_alloc only");
    return -GRAPHD_FAILED_PRECONDITION;
  }
  if (in->size == 0 ||
      gd_memfd_check(in->fd, gd_memfd_shared_seals(), in->size, "region", err, errlen) < 0) {
    if (in->size == 0) snprintf(err, errlen, "the region declares 0 bytes");
    return -GRAPHD_INVALID_ARGUMENT;
  }
  /* Like a GPU's memory, a host device's holds at most --host-memory of
   * client regions: a sparse memfd cannot fill the daemon's address space. */
  uint64_t mapped = atomic_fetch_add(&d->mapped, in->size);
  if (in->size > d->total || mapped > d->total - in->size) {
    atomic_fetch_sub(&d->mapped, in->size);
    snprintf(err, errlen,
             "a region of %llu bytes does not fit on host device %d: %llu of its %llu bytes "
             "(--host-memory) hold regions already",
             (unsigned long long)in->size, d->index, (unsigned long long)mapped,
             (unsigned long long)d->total);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  void *p = mmap(NULL, in->size, PROT_READ | PROT_WRITE, MAP_SHARED, in->fd, 0);
  if (p == MAP_FAILED) {
    atomic_fetch_sub(&d->mapped, in->size);
    snprintf(err, errlen, "mmap of the region: %s", strerror(errno));
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  out->ptr = (uint64_t)(uintptr_t)p;
  out->size = in->size;
  out->mapped = in->size;
  out->kind = in->kind;
  out->handle = p;
  return 0;
}

static void host_region_release(gd_backend *be, gd_backend_dev *d, gd_region_map *m) {
  (void)be;
  munmap(m->handle, m->mapped);
  atomic_fetch_sub(&d->mapped, m->mapped);
}

/* --- captures and replay ------------------------------------------------
 * The session stream is the worker's in-order execution: every "enqueued"
 * operation runs at once, on the worker, in order. A graph is its nodes in
 * insertion order, which the shared capture code makes topological. */

#define HOST_GRANULARITY (64u << 10)

enum { HN_KERNEL = 1, HN_MEMSET, HN_MEMCPY, HN_COND };

typedef struct host_node {
  int kind;
  graphd_host_kernel fn;
  uint32_t grid[3], block[3], shared;
  void **params; /* owned by the capture, alive as long as the graph */
  uint64_t dst, src, bytes;
  uint32_t es, value;
  int cond_kind;              /* HN_COND: enum gd_cond_kind */
  struct host_graph *body[2]; /* HN_COND: the loop body, or then and else */
  size_t idx;                 /* its place in its graph (and in an executable copy) */
  struct host_graph *owner;   /* the graph it was added to (a body, for a node inside one) */
  bool copy;                  /* in an executable copy: the bodies belong to the graph */
} host_node;

typedef struct host_graph {
  host_node **nodes;
  size_t n, cap;
  /* As CUDA does, a graph with a conditional node has one executable
   * instance at a time: instances counts a graph's, from is an instance's
   * graph. */
  int instances;
  struct host_graph *from;
} host_graph;

static int host_staging_alloc(gd_backend *be, gd_backend_dev *d, uint64_t bytes, gd_staging *out,
                              char *err, size_t errlen) {
  (void)be;
  uint64_t sz = (bytes + HOST_GRANULARITY - 1) / HOST_GRANULARITY * HOST_GRANULARITY;
  uint64_t used = atomic_load(&d->used);
  if (used + sz > d->total) {
    snprintf(err, errlen, "staging of %llu bytes does not fit: %llu of %llu bytes are in use",
             (unsigned long long)sz, (unsigned long long)used, (unsigned long long)d->total);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  void *p = NULL;
  if (posix_memalign(&p, 4096, sz) != 0) {
    snprintf(err, errlen, "out of memory allocating %llu bytes of staging", (unsigned long long)sz);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  memset(p, 0, sz);
  atomic_fetch_add(&d->used, sz);
  out->ptr = (uint64_t)(uintptr_t)p;
  out->bytes = sz;
  out->handle = p;
  return 0;
}

static void host_staging_free(gd_backend *be, gd_backend_dev *d, gd_staging *s) {
  (void)be;
  free(s->handle);
  atomic_fetch_sub(&d->used, s->bytes);
  s->bytes = 0;
}

/* The worker is every stream; a stream is a token only, a number never
 * used as a pointer (nothing to free, after a reset included), so that
 * the captures tell one session's stream from another's (the instance a
 * stream used last). */
static int host_stream_create(gd_backend *be, gd_backend_dev *d, gd_stream *out, char *err,
                              size_t errlen) {
  static _Atomic uintptr_t streams;
  (void)be, (void)d, (void)err, (void)errlen;
  *out = (gd_stream)(atomic_fetch_add(&streams, 1) + 1);
  return 0;
}

static void host_stream_destroy(gd_backend *be, gd_backend_dev *d, gd_stream s) {
  (void)be, (void)d, (void)s;
}

static int host_stream_sync(gd_backend *be, gd_backend_dev *d, gd_stream s, char *err,
                            size_t errlen) {
  (void)be, (void)d, (void)s, (void)err, (void)errlen;
  return 0; /* everything ran when it was enqueued */
}

static int host_flags_map(gd_backend *be, gd_backend_dev *d, int fd, uint64_t bytes,
                          gd_flags_map *out, char *err, size_t errlen) {
  (void)be, (void)d;
  if (gd_memfd_check(fd, gd_memfd_shared_seals(), bytes, "flag page", err, errlen) < 0)
    return -GRAPHD_INVALID_ARGUMENT;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    snprintf(err, errlen, "cannot map the flag page: %s", strerror(errno));
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  out->host = p;
  out->dev = (uint64_t)(uintptr_t)p;
  out->bytes = bytes;
  return 0;
}

static void host_flags_unmap(gd_backend *be, gd_backend_dev *d, gd_flags_map *m) {
  (void)be, (void)d;
  munmap((void *)m->host, m->bytes);
}

static int host_wait_value(gd_backend *be, gd_backend_dev *d, gd_stream s, volatile uint64_t *w,
                           uint64_t dev_addr, uint64_t value, int (*give_up)(void *), void *arg,
                           char *err, size_t errlen) {
  (void)be, (void)d, (void)s, (void)dev_addr;
  uint64_t spins = 0;
  while (!graphd_seq_reached(__atomic_load_n(w, __ATOMIC_ACQUIRE), value)) {
    if (++spins < 2000) continue;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
    int why = spins % 20 == 0 ? give_up(arg) : 0;
    if (why) {
      uint64_t now = __atomic_load_n(w, __ATOMIC_ACQUIRE);
      if (why == GD_GIVE_UP_STOPPING) {
        snprintf(err, errlen,
                 "graphd is stopping and the client's ready flag had not reached %llu (it is "
                 "%llu): the replay was not started",
                 (unsigned long long)value, (unsigned long long)now);
        return -GRAPHD_UNAVAILABLE;
      }
      if (why == GD_GIVE_UP_GONE)
        snprintf(err, errlen,
                 "the wait for the client's ready flag (%llu, it is %llu) ended: the client "
                 "has gone or graphd is stopping",
                 (unsigned long long)value, (unsigned long long)now);
      else
        snprintf(err, errlen,
                 "the client's ready flag did not reach %llu (it is %llu) within the ready "
                 "timeout while other work waited behind it",
                 (unsigned long long)value, (unsigned long long)now);
      return -GRAPHD_DEADLINE_EXCEEDED;
    }
  }
  return 0;
}

static int host_write_value(gd_backend *be, gd_backend_dev *d, gd_stream s, volatile uint64_t *w,
                            uint64_t dev_addr, uint64_t value, char *err, size_t errlen) {
  (void)be, (void)d, (void)s, (void)dev_addr, (void)err, (void)errlen;
  __atomic_store_n(w, value, __ATOMIC_RELEASE);
  return 0;
}

static int host_graph_create(gd_backend *be, gd_backend_dev *d, gd_graph *out, char *err,
                             size_t errlen) {
  (void)be, (void)d;
  host_graph *g = calloc(1, sizeof *g);
  if (!g) {
    snprintf(err, errlen, "out of memory");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  *out = g;
  return 0;
}

static void host_graph_destroy(gd_backend *be, gd_backend_dev *d, gd_graph gg) {
  host_graph *g = gg;
  if (!g) return;
  for (size_t i = 0; i < g->n; i++) {
    if (!g->nodes[i]->copy) {
      host_graph_destroy(be, d, g->nodes[i]->body[0]);
      host_graph_destroy(be, d, g->nodes[i]->body[1]);
    }
    free(g->nodes[i]);
  }
  free(g->nodes);
  free(g);
}

static int add_node(host_graph *g, host_node *n, gd_node *out, char *err, size_t errlen) {
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 16;
    host_node **nn = realloc(g->nodes, cap * sizeof *nn);
    if (!nn) {
      free(n);
      snprintf(err, errlen, "out of memory");
      return -GRAPHD_RESOURCE_EXHAUSTED;
    }
    g->nodes = nn;
    g->cap = cap;
  }
  n->idx = g->n;
  n->owner = g;
  g->nodes[g->n++] = n;
  *out = n;
  return 0;
}

static host_node *node_new(int kind, char *err, size_t errlen) {
  host_node *n = calloc(1, sizeof *n);
  if (!n)
    snprintf(err, errlen, "out of memory");
  else
    n->kind = kind;
  return n;
}

static int host_graph_add_kernel(gd_backend *be, gd_backend_dev *d, gd_graph g, const gd_node *deps,
                                 size_t ndeps, const gd_kernel_desc *k, gd_node *out, char *err,
                                 size_t errlen) {
  (void)be, (void)d, (void)deps, (void)ndeps;
  host_node *n = node_new(HN_KERNEL, err, errlen);
  if (!n) return -GRAPHD_RESOURCE_EXHAUSTED;
  memcpy(&n->fn, &k->fn, sizeof n->fn);
  memcpy(n->grid, k->grid, sizeof n->grid);
  memcpy(n->block, k->block, sizeof n->block);
  n->shared = k->shared_bytes;
  n->params = k->params;
  return add_node(g, n, out, err, errlen);
}

static int host_graph_add_memset(gd_backend *be, gd_backend_dev *d, gd_graph g, const gd_node *deps,
                                 size_t ndeps, uint64_t dst, uint32_t element_size, uint32_t value,
                                 uint64_t count, gd_node *out, char *err, size_t errlen) {
  (void)be, (void)d, (void)deps, (void)ndeps;
  host_node *n = node_new(HN_MEMSET, err, errlen);
  if (!n) return -GRAPHD_RESOURCE_EXHAUSTED;
  n->dst = dst;
  n->es = element_size;
  n->value = value;
  n->bytes = count * element_size;
  return add_node(g, n, out, err, errlen);
}

static int host_graph_add_memcpy(gd_backend *be, gd_backend_dev *d, gd_graph g, const gd_node *deps,
                                 size_t ndeps, uint64_t dst, uint64_t src, uint64_t bytes,
                                 gd_node *out, char *err, size_t errlen) {
  (void)be, (void)d, (void)deps, (void)ndeps;
  host_node *n = node_new(HN_MEMCPY, err, errlen);
  if (!n) return -GRAPHD_RESOURCE_EXHAUSTED;
  n->dst = dst;
  n->src = src;
  n->bytes = bytes;
  return add_node(g, n, out, err, errlen);
}

/* The conditional node reads its word itself: it is its own reader. */
static int host_graph_add_conditional(gd_backend *be, gd_backend_dev *d, gd_graph g,
                                      const gd_node *deps, size_t ndeps, int kind, uint64_t cond,
                                      gd_node *out, gd_node *reader, gd_graph bodies[2],
                                      uint64_t *handle, char *err, size_t errlen) {
  (void)deps, (void)ndeps;
  host_node *n = node_new(HN_COND, err, errlen);
  if (!n) return -GRAPHD_RESOURCE_EXHAUSTED;
  n->cond_kind = kind;
  n->src = cond;
  int nbodies = kind == GD_COND_IF ? 2 : 1;
  for (int i = 0; i < nbodies; i++) {
    gd_graph b;
    int rc = host_graph_create(be, d, &b, err, errlen);
    if (rc < 0) {
      host_graph_destroy(be, d, n->body[0]);
      free(n);
      return rc;
    }
    n->body[i] = b;
    bodies[i] = b;
  }
  *handle = 0;
  int rc = add_node(g, n, out, err, errlen);
  if (rc < 0) {
    host_graph_destroy(be, d, n->body[0]);
    host_graph_destroy(be, d, n->body[1]);
  } else {
    *reader = *out;
  }
  return rc;
}

/* The worker reads the word itself before each pass: nothing to add. */
static int host_graph_close_loop(gd_backend *be, gd_backend_dev *d, gd_graph body,
                                 const gd_node *deps, size_t ndeps, uint64_t handle, uint64_t cond,
                                 gd_node *reader, char *err, size_t errlen) {
  (void)be, (void)d, (void)body, (void)deps, (void)ndeps, (void)handle, (void)cond, (void)err,
      (void)errlen;
  *reader = NULL;
  return 0;
}

/* An executable graph is a copy of the graph's nodes, so that copies of
 * one graph point their copy nodes apart; bodies are shared. */
static int host_graph_instantiate(gd_backend *be, gd_backend_dev *d, gd_graph gg, gd_stream s,
                                  gd_graph_exec *out, char *err, size_t errlen) {
  (void)s;
  host_graph *g = gg, *e;
  bool cond = false;
  for (size_t i = 0; i < g->n; i++) cond |= g->nodes[i]->kind == HN_COND;
  if (cond && g->instances > 0) {
    snprintf(err, errlen,
             "the graph cannot have another executable instance: CUDA_ERROR_NOT_SUPPORTED (a "
             "graph with a conditional node is instantiated once)");
    return -GRAPHD_FAILED_PRECONDITION;
  }
  gd_graph made;
  int rc = host_graph_create(be, d, &made, err, errlen);
  if (rc < 0) return rc;
  e = made;
  for (size_t i = 0; i < g->n; i++) {
    host_node *n = node_new(g->nodes[i]->kind, err, errlen);
    gd_node ignored;
    if (!n || add_node(e, n, &ignored, err, errlen) < 0) {
      free(n);
      host_graph_destroy(be, d, e);
      return -GRAPHD_RESOURCE_EXHAUSTED;
    }
    *n = *g->nodes[i];
    n->copy = true;
  }
  g->instances++;
  e->from = g;
  *out = e;
  return 0;
}

static void host_graph_exec_destroy(gd_backend *be, gd_backend_dev *d, gd_graph_exec e) {
  host_graph *x = e;
  if (x && x->from) x->from->instances--;
  host_graph_destroy(be, d, e);
}

static int host_graph_exec_repoint_memcpy(gd_backend *be, gd_backend_dev *d, gd_graph_exec e,
                                          gd_node nn, uint64_t dst, uint64_t src, uint64_t bytes,
                                          bool *outside, char *err, size_t errlen) {
  (void)be, (void)d;
  host_graph *x = e;
  host_node *n = x->nodes[((host_node *)nn)->idx];
  if (n->kind != HN_MEMCPY || bytes == 0) {
    snprintf(err, errlen, "not a memcpy node, or zero bytes");
    return -GRAPHD_INTERNAL;
  }
  n->dst = dst;
  n->src = src;
  n->bytes = bytes;
  *outside = false; /* host memory is all of one kind */
  return 0;
}

/* Node nn of the graph that e was made from, as e runs it: a top-level
 * node has its copy in the executable graph; a node of a conditional body
 * is the body's own (bodies are shared, and a graph with a conditional
 * node has one executable instance). */
static host_node *exec_node(gd_graph_exec e, gd_node nn) {
  host_graph *x = e;
  host_node *t = nn;
  return t->owner == x->from ? x->nodes[t->idx] : t;
}

static int host_graph_exec_kernel_params(gd_backend *be, gd_backend_dev *d, gd_graph_exec e,
                                         gd_node nn, const gd_kernel_desc *k, char *err,
                                         size_t errlen) {
  (void)be, (void)d;
  host_node *n = exec_node(e, nn);
  if (n->kind != HN_KERNEL) {
    snprintf(err, errlen, "not a kernel node");
    return -GRAPHD_INTERNAL;
  }
  n->params = k->params;
  return 0;
}

static int host_graph_exec_condition_word(gd_backend *be, gd_backend_dev *d, gd_graph_exec e,
                                          gd_node reader, uint64_t handle, uint64_t cond, char *err,
                                          size_t errlen) {
  (void)be, (void)d, (void)handle;
  host_node *n = exec_node(e, reader);
  if (n->kind != HN_COND) {
    snprintf(err, errlen, "not a conditional node");
    return -GRAPHD_INTERNAL;
  }
  n->src = cond;
  return 0;
}

/* The block's share of n units: [*lo, *hi). */
static void block_share(const graphd_host_launch *l, uint64_t n, uint64_t *lo, uint64_t *hi) {
  uint64_t blocks = (uint64_t)l->grid[0] * l->grid[1] * l->grid[2];
  uint64_t b = l->block_idx[0] +
               (uint64_t)l->grid[0] * (l->block_idx[1] + (uint64_t)l->grid[1] * l->block_idx[2]);
  uint64_t per = (n + blocks - 1) / blocks;
  *lo = b * per < n ? b * per : n;
  *hi = *lo + per < n ? *lo + per : n;
}

/* graphd's own fill and copy kernels on a host device (util_function). */
static void host_fill(const graphd_host_launch *l, void *const *params) {
  uint8_t *dst = (uint8_t *)(uintptr_t) * (const uint64_t *)params[0];
  uint64_t count = *(const uint64_t *)params[1];
  uint32_t value = *(const uint32_t *)params[2], es = *(const uint32_t *)params[3];
  uint64_t lo, hi;
  block_share(l, count, &lo, &hi);
  for (uint64_t k = lo; k < hi; k++) memcpy(dst + k * es, &value, es);
}

static void host_copy(const graphd_host_launch *l, void *const *params) {
  uint8_t *dst = (uint8_t *)(uintptr_t) * (const uint64_t *)params[0];
  const uint8_t *src = (const uint8_t *)(uintptr_t) * (const uint64_t *)params[1];
  uint64_t bytes = *(const uint64_t *)params[2];
  uint64_t lo, hi;
  block_share(l, bytes, &lo, &hi);
  if (hi > lo) memcpy(dst + lo, src + lo, hi - lo);
}

static int host_util_function(gd_backend *be, gd_backend_dev *d, int which, void **fn, char *err,
                              size_t errlen) {
  (void)be, (void)d, (void)err, (void)errlen;
  graphd_host_kernel k = which == GD_UTIL_FILL   ? host_fill
                         : which == GD_UTIL_COPY ? host_copy
                                                 : NULL;
  if (!k) return -GRAPHD_INTERNAL;
  memcpy(fn, &k, sizeof k);
  return 0;
}

static void run_kernel(gd_backend_dev *d, const host_node *n) {
  graphd_host_launch l;
  memset(&l, 0, sizeof l);
  l.fault = &d->fault;
  memcpy(l.grid, n->grid, sizeof l.grid);
  memcpy(l.block, n->block, sizeof l.block);
  l.shared_bytes = n->shared;
  void *shared = n->shared ? calloc(1, n->shared) : NULL;
  l.shared = shared;
  for (uint32_t z = 0; z < n->grid[2] && !d->fault; z++)
    for (uint32_t y = 0; y < n->grid[1] && !d->fault; y++)
      for (uint32_t x = 0; x < n->grid[0] && !d->fault; x++) {
        l.block_idx[0] = x;
        l.block_idx[1] = y;
        l.block_idx[2] = z;
        n->fn(&l, n->params);
      }
  free(shared);
}

static bool cond_true(const host_node *n) {
  return __atomic_load_n((const uint32_t *)(uintptr_t)n->src, __ATOMIC_ACQUIRE) != 0;
}

static void run_graph(gd_backend_dev *d, const host_graph *g) {
  /* Like a faulted GPU, a faulted host device runs nothing more. */
  for (size_t i = 0; g && i < g->n && !d->fault; i++) {
    const host_node *n = g->nodes[i];
    if (n->kind == HN_KERNEL) {
      run_kernel(d, n);
    } else if (n->kind == HN_MEMCPY) {
      memcpy((void *)(uintptr_t)n->dst, (const void *)(uintptr_t)n->src, n->bytes);
    } else if (n->kind == HN_COND) {
      if (n->cond_kind == GD_COND_WHILE)
        while (!d->fault && cond_true(n)) run_graph(d, n->body[0]);
      else
        run_graph(d, n->body[cond_true(n) ? 0 : 1]);
    } else {
      uint8_t *p = (uint8_t *)(uintptr_t)n->dst;
      for (uint64_t k = 0; k < n->bytes; k += n->es) memcpy(p + k, &n->value, n->es);
    }
  }
}

static int host_graph_launch(gd_backend *be, gd_backend_dev *d, gd_graph_exec e, gd_stream s,
                             char *err, size_t errlen) {
  (void)be, (void)s, (void)err, (void)errlen;
  run_graph(d, e);
  return 0;
}

static int host_memcpy_async(gd_backend *be, gd_backend_dev *d, uint64_t dst, uint64_t src,
                             uint64_t bytes, gd_stream s, char *err, size_t errlen) {
  (void)be, (void)d, (void)s, (void)err, (void)errlen;
  memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
  return 0;
}

/* How long a replay's events stay not done after the worker ran it
 * (backend_host_set_busy): 0 but while modelling a GPU still running it. */
static uint64_t busy_ns_of(const gd_backend *be) {
  return be->priv ? *(const uint64_t *)be->priv : 0;
}

static int host_event_create_timed(gd_backend *be, gd_backend_dev *d, gd_event *out, char *err,
                                   size_t errlen);

static int host_zero_async(gd_backend *be, gd_backend_dev *d, uint64_t dst, uint64_t bytes,
                           gd_stream s, char *err, size_t errlen) {
  (void)be, (void)d, (void)s, (void)err, (void)errlen;
  memset((void *)(uintptr_t)dst, 0, bytes);
  return 0;
}

/* A plain event is NULL, unless busy work is modelled: then it is the time
 * at which it is done. */
static int host_event_create(gd_backend *be, gd_backend_dev *d, gd_event *out, char *err,
                             size_t errlen) {
  if (busy_ns_of(be)) return host_event_create_timed(be, d, out, err, errlen);
  *out = NULL;
  return 0;
}

/* A timed event is the time it was last recorded (a plain one is NULL). */
static int host_event_create_timed(gd_backend *be, gd_backend_dev *d, gd_event *out, char *err,
                                   size_t errlen) {
  (void)be, (void)d;
  uint64_t *t = calloc(1, sizeof *t);
  if (!t) {
    snprintf(err, errlen, "out of memory");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  *out = t;
  return 0;
}

static void host_event_destroy(gd_backend *be, gd_backend_dev *d, gd_event e) {
  (void)be, (void)d;
  free(e);
}

/* One worker runs everything in order, so events order nothing more; a
 * timed one notes the time (the work before it has run), shifted by the
 * modelled busy time. */
static int host_event_record(gd_backend *be, gd_backend_dev *d, gd_event e, gd_stream s, char *err,
                             size_t errlen) {
  (void)d, (void)s, (void)err, (void)errlen;
  if (e) *(uint64_t *)e = gd_now_ns() + busy_ns_of(be);
  return 0;
}

static int host_event_elapsed(gd_backend *be, gd_backend_dev *d, gd_event start, gd_event end,
                              uint64_t *ns, char *err, size_t errlen) {
  (void)be, (void)d, (void)err, (void)errlen;
  uint64_t a = *(const uint64_t *)start, b = *(const uint64_t *)end;
  *ns = b > a ? b - a : 0;
  return 1;
}

static int host_stream_wait_event(gd_backend *be, gd_backend_dev *d, gd_stream s, gd_event e,
                                  char *err, size_t errlen) {
  (void)be, (void)d, (void)e, (void)s, (void)err, (void)errlen;
  return 0;
}

static int host_event_done(gd_backend *be, gd_backend_dev *d, gd_event e) {
  (void)d;
  /* The worker ran everything before it answered; with busy work
   * modelled, the event is done once its time has come. */
  return !e || !busy_ns_of(be) || gd_now_ns() >= *(const uint64_t *)e;
}

static int host_event_sync(gd_backend *be, gd_backend_dev *d, gd_event e, char *err,
                           size_t errlen) {
  (void)be, (void)d, (void)e, (void)err, (void)errlen;
  return 0;
}

static void host_destroy(gd_backend *be) {
  free(be->priv);
  free(be->devices);
  free(be);
}

int backend_host_set_busy(gd_backend *be, uint64_t busy_ns) {
  if (!be->priv && !(be->priv = calloc(1, sizeof(uint64_t)))) return -GRAPHD_RESOURCE_EXHAUSTED;
  *(uint64_t *)be->priv = busy_ns;
  return 0;
}

static const gd_backend_ops host_ops = {
    .device_open = host_open,
    .device_close = host_close,
    .device_sync = host_sync,
    .mem_info = host_mem_info,
    .device_health = host_health,
    .device_reset = host_reset,
    .module_load = host_module_load,
    .module_unload = host_module_unload,
    .function_get = host_function_get,
    .function_set_shared = host_function_set_shared,
    .region_import = host_region_import,
    .region_release = host_region_release,
    .staging_alloc = host_staging_alloc,
    .staging_free = host_staging_free,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .stream_sync = host_stream_sync,
    .flags_map = host_flags_map,
    .flags_unmap = host_flags_unmap,
    .wait_value = host_wait_value,
    .write_value = host_write_value,
    .graph_create = host_graph_create,
    .graph_destroy = host_graph_destroy,
    .graph_add_kernel = host_graph_add_kernel,
    .graph_add_memset = host_graph_add_memset,
    .graph_add_memcpy = host_graph_add_memcpy,
    .graph_add_conditional = host_graph_add_conditional,
    .graph_close_loop = host_graph_close_loop,
    .graph_exec_condition_word = host_graph_exec_condition_word,
    .graph_instantiate = host_graph_instantiate,
    .graph_exec_destroy = host_graph_exec_destroy,
    .graph_exec_repoint_memcpy = host_graph_exec_repoint_memcpy,
    .graph_exec_kernel_params = host_graph_exec_kernel_params,
    .util_function = host_util_function,
    .graph_launch = host_graph_launch,
    .memcpy_async = host_memcpy_async,
    .zero_async = host_zero_async,
    .event_create = host_event_create,
    .event_create_timed = host_event_create_timed,
    .event_elapsed = host_event_elapsed,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .stream_wait_event = host_stream_wait_event,
    .event_done = host_event_done,
    .event_sync = host_event_sync,
    .destroy = host_destroy,
};

int backend_host_new(int n, uint64_t mem_bytes, gd_backend **out, char *err, size_t errlen) {
  gd_backend *be = calloc(1, sizeof *be);
  gd_device_facts *f = calloc((size_t)n, sizeof *f);
  if (!be || !f) {
    free(be);
    free(f);
    snprintf(err, errlen, "out of memory creating %d host devices", n);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  for (int i = 0; i < n; i++) {
    /* A stable UUID per ordinal, so scripts and tests can name a host
     * device across restarts. */
    char seed[64];
    unsigned char md[SHA256_DIGEST_LENGTH];
    int k = snprintf(seed, sizeof seed, "graphd host device %d", i);
    SHA256((const unsigned char *)seed, (size_t)k, md);
    f[i].backend_index = i;
    snprintf(f[i].name, sizeof f[i].name, "graphd host device %d", i);
    memcpy(f[i].uuid, md, 16);
    gd_uuid_format(f[i].uuid, "HOST-", f[i].uuid_str);
    f[i].total_memory = mem_bytes;
    f[i].mps_enabled = 0;
  }
  be->name = "host";
  be->thread_prefix = "host";
  be->waits_on_worker = true;
  be->ops = &host_ops;
  be->ndevices = n;
  be->devices = f;
  *out = be;
  return 0;
}
