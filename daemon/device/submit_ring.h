/* A data session's submission ring on its device: the shared memory
 * mapped and checked, its doorbell, the program handles, and what the
 * worker keeps of it between entries.
 *
 * The ring (graphd/protocol.h, "The submission ring") is a sealed memfd
 * that the client fills with replay entries and the device's worker reads
 * itself, without the loop thread and without protobuf; its doorbell is an
 * eventfd in the worker's wake set. Everything the client can write there
 * is read once into the worker's own memory and checked before use.
 *
 * DESIGN: worker thread only. */
#ifndef GRAPHD_SUBMIT_RING_H
#define GRAPHD_SUBMIT_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "graphd/protocol.h"
#include "daemon/base/registry.h"

typedef struct gd_submit_ring {
  volatile graphd_ring_header *hdr;
  volatile graphd_ring_sqe *sq;
  volatile graphd_ring_cqe *cq;
  uint32_t entries;
  uint64_t bytes; /* mapped */
  int doorbell;   /* eventfd, in the worker's wake set epfd */
  int epfd;
  uint64_t head;        /* the next entry to take */
  bool broken;          /* indices that cannot be: the ring is no longer read */
  bool warned;          /* ... and the log said so */
  bool hung, hung_told; /* ring_replay.c: held others up; read no more, told to the loop */
  bool ready_held_told; /* ring_replay.c: the log said its entries wait for their ready writes */
  /* ring_replay.c: when its head entry began to wait for its ready write;
   * 0 once an entry leaves the head (take_one). */
  uint64_t ready_held_since;
  const gd_regprog **progs; /* by handle (RingProgram), held by the session */
  uint32_t nprogs, progs_cap;
  double ready_timeout_s; /* the daemon's settings, for entries */
  uint32_t max_inflight;
  uint32_t client_pid, client_uid;
  uint64_t order_group; /* the header's, read once at the map; 0: none */
  uint32_t peers;       /* other rings of the device in its order group, and ... */
  uint32_t rings;       /* ... the device's rings, this one included, ... */
  uint64_t counted_gen; /* ... as counted at this session_stream_rings_gen (ring_replay.c) */
  /* Counted since the loop last heard (ring_replay_take_stats). */
  gd_replay_tally tally;
  uint64_t taken_ns; /* when they were last taken */
} gd_submit_ring;

/* Checks and maps a ring of `entries` entries from memfd `fd` (sealed
 * against shrinking and growing, large enough, its header written by the
 * client) with eventfd `doorbell`, which joins epfd (the worker's wake
 * set) and is owned by the ring from then on, even on failure; fd is not
 * closed. Returns 0 or a negated status with err saying why. */
int submit_ring_map(int fd, int doorbell, uint32_t entries, int epfd, gd_submit_ring **out,
                    char *err, size_t errlen);

/* Takes the doorbell out of the wake set, closes it and unmaps the ring. */
void submit_ring_unmap(gd_submit_ring *r);

/* Gives program p handle h (the loop picks handles densely). 0 or
 * -GRAPHD_RESOURCE_EXHAUSTED. */
int submit_ring_set_program(gd_submit_ring *r, uint32_t h, const gd_regprog *p);

/* The number of entries published and not yet taken; false (and the ring
 * marked broken) when the client's tail cannot be. */
bool submit_ring_avail(gd_submit_ring *r, uint64_t *n);

#endif
