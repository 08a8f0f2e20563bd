/* See submit_ring.h. Worker thread. */
#define _GNU_SOURCE
#include "submit_ring.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/memfd.h"
#include "graphd/status.h"

/* An eventfd shows in /proc as "anon_inode:[eventfd]"; nothing else that a
 * client may send reads the same. The worker never reads a doorbell (see
 * worker_wake_set), but only an eventfd signals each write as one edge. */
static bool is_eventfd(int fd) {
  char path[64], link[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  if (n < 0) return false;
  link[n] = '\0';
  return strcmp(link, "anon_inode:[eventfd]") == 0;
}

int submit_ring_map(int fd, int doorbell, uint32_t entries, int epfd, gd_submit_ring **out,
                    char *err, size_t errlen) {
  int rc = -GRAPHD_INVALID_ARGUMENT;
  gd_submit_ring *r = NULL;
  void *p = MAP_FAILED;
  uint64_t bytes = GRAPHD_RING_BYTES(entries);
  *out = NULL;
  if (gd_memfd_check(fd, gd_memfd_shared_seals(), bytes, "ring", err, errlen) < 0) goto fail;
  if (!is_eventfd(doorbell)) {
    snprintf(err, errlen, "the ring's doorbell must be an eventfd");
    goto fail;
  }
  p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    snprintf(err, errlen, "cannot map the ring (%llu bytes)", (unsigned long long)bytes);
    rc = -GRAPHD_RESOURCE_EXHAUSTED;
    goto fail;
  }
  volatile graphd_ring_header *h = p;
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != GRAPHD_RING_MAGIC ||
      __atomic_load_n(&h->entries, __ATOMIC_RELAXED) != entries) {
    snprintf(err, errlen,
             "the ring's header must hold GRAPHD_RING_MAGIC and entries = %u (graphd/protocol.h)",
             entries);
    goto fail;
  }
  r = calloc(1, sizeof *r);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    rc = -GRAPHD_RESOURCE_EXHAUSTED;
    goto fail;
  }
  /* Edge-triggered and never read: the file description is the client's
   * too (its flags, its counter, its other registrations). */
  struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = doorbell};
  if (epoll_ctl(epfd, EPOLL_CTL_ADD, doorbell, &ev) < 0) {
    snprintf(err, errlen, "cannot watch the doorbell");
    rc = -GRAPHD_INTERNAL;
    goto fail;
  }
  r->hdr = h;
  r->sq = (volatile graphd_ring_sqe *)((char *)p + GRAPHD_RING_HEADER_BYTES);
  r->cq = (volatile graphd_ring_cqe *)((char *)p + GRAPHD_RING_HEADER_BYTES +
                                       (uint64_t)entries * GRAPHD_RING_SQE_BYTES);
  r->entries = entries;
  r->bytes = bytes;
  r->doorbell = doorbell;
  r->epfd = epfd;
  r->order_group = h->order_group;
  /* The worker takes entries from where the client is: 0 for a new ring. */
  r->head = __atomic_load_n(&h->sq_head, __ATOMIC_ACQUIRE);
  *out = r;
  return 0;
fail:
  free(r);
  if (p != MAP_FAILED) munmap(p, bytes);
  close(doorbell);
  return rc;
}

void submit_ring_unmap(gd_submit_ring *r) {
  if (!r) return;
  epoll_ctl(r->epfd, EPOLL_CTL_DEL, r->doorbell, NULL);
  close(r->doorbell);
  munmap((void *)r->hdr, r->bytes);
  free(r->progs);
  free(r);
}

int submit_ring_set_program(gd_submit_ring *r, uint32_t h, const gd_regprog *p) {
  if (h >= r->progs_cap) {
    uint32_t cap = r->progs_cap ? r->progs_cap * 2 : 16;
    while (cap <= h) cap *= 2;
    const gd_regprog **np = realloc(r->progs, cap * sizeof *np);
    if (!np) return -GRAPHD_RESOURCE_EXHAUSTED;
    memset(np + r->progs_cap, 0, (cap - r->progs_cap) * sizeof *np);
    r->progs = np;
    r->progs_cap = cap;
  }
  r->progs[h] = p;
  if (h >= r->nprogs) r->nprogs = h + 1;
  return 0;
}

bool submit_ring_avail(gd_submit_ring *r, uint64_t *n) {
  *n = 0;
  if (r->broken) return false;
  /* Sequentially consistent: see ring_replay_sleep. */
  uint64_t tail = __atomic_load_n(&r->hdr->sq_tail, __ATOMIC_SEQ_CST);
  if (tail - r->head > r->entries) {
    r->broken = true;
    return false;
  }
  *n = tail - r->head;
  return true;
}
