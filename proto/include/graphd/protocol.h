/* The wire contracts that graphd, libgraphd and the Python package share
 * beyond the protobuf schema: the protocol version spoken at Hello, the
 * layout of the flag page through which a client's stream and the daemon's
 * session stream order each other, and the kinds of client memory.
 *
 * Leaf header: constants only. docs/protocol.md describes each. */
#ifndef GRAPHD_PROTOCOL_H
#define GRAPHD_PROTOCOL_H

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
/* The most flag slots one page may have (RegisterFlags.slots). */
#define GRAPHD_MAX_FLAG_SLOTS 1024

/* Kinds of client memory a region can be; the values are those of the
 * wire's RegionKind. */
enum graphd_region_kind {
  GRAPHD_REGION_VMM_FD = 1,     /* cuMemCreate memory exported as a POSIX fd */
  GRAPHD_REGION_LEGACY_IPC = 2, /* cuMemAlloc memory: a CUipcMemHandle */
  GRAPHD_REGION_HOST_MEMFD = 3, /* host backend: a memfd */
};

#endif
