/* libgraphd: the submission ring of asynchronous replays (graphd/protocol.h,
 * "The submission ring"; docs/design.md, "Asynchronous replay").
 *
 * DESIGN: the handle's lock guards the ring: every call that publishes or
 * reaps holds it. The other side is the device's worker in graphd, which
 * writes only sq_head, cq_tail, flags, the completions and the error text;
 * the indices cross with acquire and release, and the doorbell decision
 * with sequentially consistent accesses on each side (the worker sets
 * NEED_WAKEUP, then looks at sq_tail; we publish sq_tail, then look at
 * NEED_WAKEUP). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/memfd.h"
#include "internal.h"

#define DEFAULT_ENTRIES 256

/* --- Order across this process's rings (graphd/protocol.h, "Order across
 * rings"): one lock and one counter per GPU, for the life of the process,
 * and one group id for all of them. */
#define ORDER_DEVICES 64

struct gd_order {
  bool used;
  uint8_t uuid[16];
  pthread_mutex_t lock;
  uint32_t next;
};

static gd_order orders[ORDER_DEVICES];
static pthread_mutex_t orders_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t order_group;

/* fork(): the table's lock is taken around it; in the child the orders
 * start again (its handles are new ones, in a group of its own), and their
 * locks, which a parent's thread may have held at the fork, are made anew. */
static void orders_prepare(void) { pthread_mutex_lock(&orders_lock); }
static void orders_parent(void) { pthread_mutex_unlock(&orders_lock); }
static void orders_child(void) {
  memset(orders, 0, sizeof orders);
  order_group = 0;
  pthread_mutex_unlock(&orders_lock);
}
__attribute__((constructor)) static void orders_atfork(void) {
  pthread_atfork(orders_prepare, orders_parent, orders_child);
}

static gd_order *order_of(graphd_client *c) {
  if (c->order) return c->order;
  pthread_mutex_lock(&orders_lock);
  if (!order_group) {
    uint64_t g = 0;
    if (getrandom(&g, sizeof g, 0) != sizeof g)
      g = (uint64_t)getpid() << 32 ^ (uint64_t)gd_mono_us();
    order_group = g ? g : 1;
  }
  gd_order *o = NULL;
  for (int i = 0; i < ORDER_DEVICES && !o; i++) {
    if (!orders[i].used) {
      orders[i].used = true;
      memcpy(orders[i].uuid, c->device_uuid, 16);
      pthread_mutex_init(&orders[i].lock, NULL);
      o = &orders[i];
    } else if (memcmp(orders[i].uuid, c->device_uuid, 16) == 0) {
      o = &orders[i];
    }
  }
  /* More GPUs than slots: the last one is shared, which only orders more. */
  if (!o) o = &orders[ORDER_DEVICES - 1];
  pthread_mutex_unlock(&orders_lock);
  c->order = o;
  return o;
}

uint32_t gd_order_begin(graphd_client *c) {
  gd_order *o = order_of(c);
  pthread_mutex_lock(&o->lock);
  return o->next++;
}

void gd_order_end(graphd_client *c) { pthread_mutex_unlock(&c->order->lock); }

void gd_ring_free(graphd_client *c) {
  gd_ring *r = c->ring;
  if (!r) return;
  if (r->hdr) munmap((void *)r->hdr, r->bytes);
  if (r->fd >= 0) close(r->fd);
  if (r->doorbell >= 0) close(r->doorbell);
  free(r->ids);
  free(r);
  c->ring = NULL;
}

graphd_status gd_ring_open(graphd_client *c) {
  graphd_status st;
  uint32_t entries = c->ring_entries ? c->ring_entries : DEFAULT_ENTRIES;
  gd_ring *r = calloc(1, sizeof *r);
  if (!r) return gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
  r->fd = r->doorbell = -1;
  r->gen = ++c->rings_made;
  c->ring = r;
  r->entries = entries;
  r->bytes = GRAPHD_RING_BYTES(entries);
  r->fd = gd_memfd_new_shared("graphd-ring", r->bytes);
  r->doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (r->fd < 0 || r->doorbell < 0) {
    st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "cannot make the ring: %s",
                           strerror(errno));
    goto fail;
  }
  void *p = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
  if (p == MAP_FAILED) {
    st =
        gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "cannot map the ring: %s", strerror(errno));
    goto fail;
  }
  r->hdr = p;
  r->sq = (volatile graphd_ring_sqe *)((char *)p + GRAPHD_RING_HEADER_BYTES);
  r->cq = (volatile graphd_ring_cqe *)((char *)p + GRAPHD_RING_HEADER_BYTES +
                                       (uint64_t)entries * GRAPHD_RING_SQE_BYTES);
  r->hdr->entries = entries;
  order_of(c); /* sets order_group */
  r->hdr->order_group = order_group;
  __atomic_store_n(&r->hdr->magic, GRAPHD_RING_MAGIC, __ATOMIC_RELEASE);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterRing m = GRAPHD__WIRE__REGISTER_RING__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_RING;
  req.register_ring = &m;
  m.entries = entries;
  int fds[2] = {r->fd, r->doorbell};
  Graphd__Wire__Reply *rep = NULL;
  st = gd_client_call(c, &req, fds, 2, &rep);
  /* As many bindings as the daemon takes in one entry and the ring holds. */
  uint32_t most = rep && rep->register_ring ? rep->register_ring->max_bindings : 0;
  uint64_t fit = GRAPHD_RING_MAX_BINDINGS + (uint64_t)(entries - 1) * GRAPHD_RING_CONT_BINDINGS;
  if (most < GRAPHD_RING_MAX_BINDINGS) most = GRAPHD_RING_MAX_BINDINGS;
  r->max_bindings = most < fit ? most : (uint32_t)fit;
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
  if (st != GRAPHD_OK) goto fail;
  return GRAPHD_OK;
fail:
  gd_ring_free(c);
  return st;
}

graphd_status gd_ring_handle(graphd_client *c, const uint8_t id[32], uint32_t *h) {
  gd_ring *r = c->ring;
  for (uint32_t i = 0; i < r->nids; i++)
    if (memcmp(r->ids[i], id, 32) == 0) {
      *h = i;
      return GRAPHD_OK;
    }
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RingProgram m = GRAPHD__WIRE__RING_PROGRAM__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_RING_PROGRAM;
  req.ring_program = &m;
  m.program_id.data = (uint8_t *)id;
  m.program_id.len = 32;
  Graphd__Wire__Reply *rep = NULL;
  graphd_status st = gd_client_call(c, &req, NULL, 0, &rep);
  if (st != GRAPHD_OK) return st;
  uint32_t handle = rep->body_case == GRAPHD__WIRE__REPLY__BODY_RING_PROGRAM
                        ? rep->ring_program->handle
                        : UINT32_MAX;
  graphd__wire__reply__free_unpacked(rep, NULL);
  if (handle == UINT32_MAX)
    return gd_client_set_err(c, GRAPHD_INTERNAL, "RingProgram: the reply has no handle");
  /* Handles are dense from 0 and the same for the same program. */
  if (handle >= r->ids_cap) {
    uint32_t cap = r->ids_cap ? r->ids_cap : 16;
    while (cap <= handle) cap *= 2;
    uint8_t(*n)[32] = realloc(r->ids, (size_t)cap * 32);
    if (!n) return gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    memset(n + r->ids_cap, 0, (size_t)(cap - r->ids_cap) * 32);
    r->ids = n;
    r->ids_cap = cap;
  }
  memcpy(r->ids[handle], id, 32);
  if (handle >= r->nids) r->nids = handle + 1;
  *h = handle;
  return GRAPHD_OK;
}

void gd_ring_reap(graphd_client *c) {
  gd_ring *r = c->ring;
  if (!r) return;
  volatile graphd_ring_header *h = r->hdr;
  uint64_t tail = __atomic_load_n(&h->cq_tail, __ATOMIC_ACQUIRE);
  /* A worker never writes more completions than entries published. */
  if (tail - r->cq_head > r->entries) tail = r->cq_head;
  for (; r->cq_head != tail; r->cq_head++) {
    volatile graphd_ring_cqe *e = &r->cq[r->cq_head & (r->entries - 1)];
    if (!e->seq && !e->status) continue; /* a continuation slot's */
    r->completed++;
    if (!e->status) continue;
    r->failed++;
    uint64_t text_seq = __atomic_load_n(&h->err_seq, __ATOMIC_ACQUIRE);
    bool text = text_seq && text_seq == e->seq && h->err_slot == e->stream_slot;
    if (!r->has_err) {
      r->has_err = true;
      r->err_status = (graphd_status)e->status;
      r->err_seq = e->seq;
      r->err_slot = e->stream_slot;
      if (text)
        memcpy(r->err_text, (const char *)h->err_text, sizeof r->err_text);
      else
        snprintf(r->err_text, sizeof r->err_text, "%s", graphd_status_name(r->err_status));
      r->err_text[sizeof r->err_text - 1] = '\0';
    }
    /* The text is read: the worker may write the next failure's. */
    if (text) __atomic_store_n(&h->err_seq, 0, __ATOMIC_RELEASE);
  }
  __atomic_store_n(&h->cq_head, r->cq_head, __ATOMIC_RELEASE);
}

graphd_status gd_ring_take_error(graphd_client *c) {
  gd_ring *r = c->ring;
  if (!r || !r->has_err) return GRAPHD_OK;
  r->has_err = false;
  return gd_client_set_err(c, r->err_status, "async replay seq %llu on stream slot %u failed: %s",
                           (unsigned long long)r->err_seq, r->err_slot, r->err_text);
}

/* Rings the doorbell when the worker said it sleeps. The tail's store and
 * this load are sequentially consistent, as are the worker's store of the
 * flag and its load of the tail: one of the two sides sees the other. */
static void ring_doorbell(gd_ring *r) {
  if (__atomic_load_n(&r->hdr->flags, __ATOMIC_SEQ_CST) & GRAPHD_RING_NEED_WAKEUP) {
    uint64_t one = 1;
    if (write(r->doorbell, &one, sizeof one) < 0) { /* the counter is only a signal */
    }
  }
}

graphd_status gd_ring_reserve(graphd_client *c, uint32_t nslots) {
  gd_ring *r = c->ring;
  if (r->tail - r->cq_head + nslots <= r->entries) return GRAPHD_OK;
  int64_t t0 = gd_mono_us();
  int64_t deadline = c->timeout_ms > 0 ? t0 + (int64_t)c->timeout_ms * 1000 : INT64_MAX;
  graphd_status st = GRAPHD_OK;
  for (unsigned spins = 0; r->tail - r->cq_head + nslots > r->entries; spins++) {
    /* Full: the worker takes entries as the device catches up. */
    gd_ring_reap(c);
    if (r->tail - r->cq_head + nslots <= r->entries) break;
    if (atomic_load(&c->dead)) {
      st = gd_client_set_err(c, GRAPHD_UNAVAILABLE,
                             "graphd went away while the ring was full; the replay was not sent");
      break;
    }
    if (gd_mono_us() > deadline) {
      st = gd_client_set_err(c, GRAPHD_DEADLINE_EXCEEDED,
                             "the ring stayed full for %d ms; the replay was not sent",
                             c->timeout_ms);
      break;
    }
    ring_doorbell(r);
    if (spins > 64) {
      struct timespec nap = {0, 20000};
      nanosleep(&nap, NULL);
    }
  }
  atomic_fetch_add_explicit(&c->ring_wait_ns, (uint64_t)(gd_mono_us() - t0) * 1000,
                            memory_order_relaxed);
  return st;
}

graphd_ring_cont *gd_ring_cont_slot(graphd_client *c, uint32_t k) {
  gd_ring *r = c->ring;
  return (graphd_ring_cont *)(uintptr_t)&r->sq[(r->tail + k) & (r->entries - 1)];
}

void gd_ring_publish(graphd_client *c, const graphd_ring_sqe *e, uint32_t nslots) {
  gd_ring *r = c->ring;
  memcpy((void *)&r->sq[r->tail & (r->entries - 1)], e, sizeof *e);
  r->tail += nslots;
  r->issued++;
  __atomic_store_n(&r->hdr->sq_tail, r->tail, __ATOMIC_SEQ_CST);
  ring_doorbell(r);
}

uint64_t graphd_ring_wait_ns(graphd_client *c) {
  return c ? atomic_load_explicit(&c->ring_wait_ns, memory_order_relaxed) : 0;
}

bool gd_ring_wait_taken(graphd_client *c, int ms) {
  gd_ring *r = c->ring;
  if (!r) return true;
  int64_t end = gd_mono_us() + (int64_t)ms * 1000;
  while (__atomic_load_n(&r->hdr->sq_head, __ATOMIC_ACQUIRE) != r->tail) {
    if (atomic_load(&c->dead) || gd_mono_us() > end) return false;
    ring_doorbell(r);
    struct timespec nap = {0, 20000};
    nanosleep(&nap, NULL);
  }
  return true;
}
