/* The wire contracts that graphd, libgraphd and the Python package share
 * beyond the protobuf schema: the protocol version spoken at Hello, the
 * layout of the flag page through which a client's stream and the daemon's
 * session stream order each other, the layout of the submission ring of
 * asynchronous replays, and the kinds of client memory.
 *
 * Leaf header: constants and fixed layouts only. docs/protocol.md
 * describes each. */
#ifndef GRAPHD_PROTOCOL_H
#define GRAPHD_PROTOCOL_H

#include <stdint.h>

/* The version both sides send in Hello; any other is refused. */
#define GRAPHD_PROTOCOL_VERSION 1

/* The flag page: one memfd page shared by the client and the daemon,
 * GRAPHD_FLAG_STRIDE bytes per client stream ("flag slot"), each slot a
 * row of 64-bit little-endian words:
 *   READY  written by the client's stream: it has reached call n;
 *   DONE   written by the daemon's session stream: replay n is finished
 *          with the client's buffers;
 *   PASSED written by the client's stream after its wait on DONE: nothing
 *          of the client's stream still waits on the page up to n.
 * The rest of a row is reserved. */
#define GRAPHD_FLAG_STRIDE 32
#define GRAPHD_FLAG_WORD_READY 0
#define GRAPHD_FLAG_WORD_DONE 1
#define GRAPHD_FLAG_WORD_PASSED 2
#define GRAPHD_FLAG_WORDS_PER_SLOT (GRAPHD_FLAG_STRIDE / 8)
/* Whether a flag word has reached seq, compared as the GPU compares a
 * 64-bit stream wait (CU_STREAM_WAIT_VALUE_GEQ: (int64_t)(word - seq) >= 0),
 * so that the host and the GPU never disagree: a word 2^63 or more ahead
 * of seq is behind it, and seqs may wrap past 2^64. */
static inline int graphd_seq_reached(uint64_t word, uint64_t seq) {
  return (int64_t)(word - seq) >= 0;
}
/* The most a slot's seq may step from the last one the daemon took there
 * (cyclically). Every wait the daemon queues on a slot then lies within
 * 2^63 below the last seq it took, so writing that one value releases
 * them all. */
#define GRAPHD_SEQ_MAX_STEP (1ull << 32)
/* The most flag slots one page may have (RegisterFlags.slots). */
#define GRAPHD_MAX_FLAG_SLOTS 1024

/* Kinds of client memory a region can be; the values are those of the
 * wire's RegionKind. */
enum graphd_region_kind {
  GRAPHD_REGION_VMM_FD = 1,     /* cuMemCreate memory exported as a POSIX fd */
  GRAPHD_REGION_LEGACY_IPC = 2, /* cuMemAlloc memory: a CUipcMemHandle */
  GRAPHD_REGION_HOST_MEMFD = 3, /* host backend: a memfd */
};

/* The submission ring (RegisterRing): one sealed memfd per data session,
 * mapped by the client and by the device's worker, in three parts:
 *   [0, 4096)                      the header (graphd_ring_header)
 *   [4096, +entries * 512)         submission entries (graphd_ring_sqe)
 *   [.., +entries * 16)            completion entries (graphd_ring_cqe)
 * entries is a power of two from GRAPHD_RING_MIN_ENTRIES to
 * GRAPHD_RING_MAX_ENTRIES. Indices run freely (64 bits) and are masked
 * with entries - 1. The client fills sqe[tail] and then publishes
 * sq_tail (release); the worker reads entries up to sq_tail (acquire),
 * writes one completion per entry, in order, into cqe[cq_tail], and
 * publishes sq_head and cq_tail (release). The client reaps completions up
 * to cq_tail and publishes cq_head; it may fill an entry only while
 * sq_tail - cq_head < entries, so a completion never overwrites one it
 * has not read. Before sleeping the worker sets GRAPHD_RING_NEED_WAKEUP
 * in flags and looks at sq_tail once more; a client that finds the flag
 * set after publishing sq_tail writes the ring's doorbell (an eventfd).
 *
 * Order across rings: a client process whose streams on one device use
 * several sessions (rings) gives them one order_group and numbers its
 * entries across them in the order it queued their stream operations,
 * publishing each entry before numbering the next. The worker then takes
 * the group's entries in that order, as it does one ring's. Stream memory
 * operations are invisible to the GPU's scheduler, and one process's
 * streams may share hardware queues: a stream's wait for one replay can
 * hold back another stream's ready write behind it, so the daemon must not
 * queue the second replay ahead of the first. */
#define GRAPHD_RING_MAGIC 0x31474e5244485047ull /* "GPHDRNG1" */
#define GRAPHD_RING_HEADER_BYTES 4096
#define GRAPHD_RING_SQE_BYTES 512
#define GRAPHD_RING_CQE_BYTES 16
#define GRAPHD_RING_MIN_ENTRIES 2
#define GRAPHD_RING_MAX_ENTRIES 4096
/* Bindings an entry's own slot carries. An entry of more takes the slots
 * after it too (wrapping), GRAPHD_RING_CONT_BINDINGS bindings in each
 * (graphd_ring_cont), GRAPHD_RING_ENTRY_SLOTS in all, published with one
 * tail; the worker completes each slot it takes: the entry's own with the
 * entry's completion, the others with seq 0 and status 0, which the client
 * skips. RegisterRingReply.max_bindings says how many one entry may carry;
 * a daemon that leaves it 0 takes GRAPHD_RING_MAX_BINDINGS at most, and
 * the client sends a replay of more the synchronous way. */
#define GRAPHD_RING_MAX_BINDINGS 20
#define GRAPHD_RING_CONT_BINDINGS 21
#define GRAPHD_RING_ENTRY_SLOTS(n)                                                                 \
  (1u + ((n) > GRAPHD_RING_MAX_BINDINGS                                                            \
             ? ((uint32_t)(n)-GRAPHD_RING_MAX_BINDINGS + GRAPHD_RING_CONT_BINDINGS - 1) /          \
                   GRAPHD_RING_CONT_BINDINGS                                                       \
             : 0u))
#define GRAPHD_RING_NEED_WAKEUP 1u
/* Bytes of the ring memfd for `entries` entries. */
#define GRAPHD_RING_BYTES(entries)                                                                 \
  ((uint64_t)GRAPHD_RING_HEADER_BYTES +                                                            \
   (uint64_t)(entries) * (GRAPHD_RING_SQE_BYTES + GRAPHD_RING_CQE_BYTES))

/* Each index on a cache line of its own: the two sides write different ones. */
typedef struct graphd_ring_header {
  uint64_t magic;   /* GRAPHD_RING_MAGIC, written by the client */
  uint32_t entries; /* as registered */
  uint32_t reserved0;
  /* Nonzero: this ring's entries carry `order` numbers shared with the
   * other rings of the same client process that name the same group here
   * (written by the client before RegisterRing; read once then). */
  uint64_t order_group;
  uint8_t pad0[40];
  uint64_t sq_tail; /* client: entries published */
  uint8_t pad1[56];
  uint64_t sq_head; /* worker: entries taken */
  uint64_t cq_tail; /* worker: completions written */
  uint32_t flags;   /* worker: GRAPHD_RING_NEED_WAKEUP */
  uint8_t pad2[44];
  uint64_t cq_head; /* client: completions reaped */
  uint8_t pad3[56];
  /* The text of a failed entry's error, for the client: the worker writes
   * it only while err_seq is 0, then publishes err_seq (release); the
   * client reads it and stores 0 again. */
  uint64_t err_seq;
  uint32_t err_slot;
  uint32_t err_code;
  char err_text[240];
} graphd_ring_header;

typedef struct graphd_ring_binding {
  uint32_t slot;      /* program slot */
  uint32_t region_id; /* the session's region (RegisterRegionReply.region_id) */
  uint64_t offset;    /* into the region */
  uint64_t bytes;     /* the slot's size */
} graphd_ring_binding;

typedef struct graphd_ring_sqe {
  uint64_t seq;         /* > the previous seq on this stream slot */
  uint32_t program;     /* handle from RingProgramReply */
  uint32_t stream_slot; /* flag slot */
  uint32_t nbindings;   /* here up to GRAPHD_RING_MAX_BINDINGS, the rest after */
  /* With an order_group: the client's submission order across the rings
   * of its group (serial-number arithmetic: it may wrap). */
  uint32_t order;
  uint32_t reserved[2];
  graphd_ring_binding bindings[GRAPHD_RING_MAX_BINDINGS];
} graphd_ring_sqe;

/* A slot that follows an entry of many bindings: the next of them. */
typedef struct graphd_ring_cont {
  graphd_ring_binding bindings[GRAPHD_RING_CONT_BINDINGS];
  uint8_t reserved[8];
} graphd_ring_cont;

typedef struct graphd_ring_cqe {
  uint64_t seq;         /* the entry's seq */
  uint32_t stream_slot; /* the entry's flag slot */
  uint32_t status;      /* 0, or the graphd_status it failed with */
} graphd_ring_cqe;

_Static_assert(sizeof(graphd_ring_header) <= GRAPHD_RING_HEADER_BYTES, "ring header too large");
_Static_assert(sizeof(graphd_ring_sqe) == GRAPHD_RING_SQE_BYTES, "ring entry size");
_Static_assert(sizeof(graphd_ring_cqe) == GRAPHD_RING_CQE_BYTES, "ring completion size");
_Static_assert(sizeof(graphd_ring_cont) == GRAPHD_RING_SQE_BYTES, "ring continuation size");

#endif
