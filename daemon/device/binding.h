/* A replay's bindings, as its request names them (a slot and a range of
 * one of the session's regions) and as the worker resolved them (a
 * device address for the slot). Both front ends of the replay path fill
 * the first kind; a capture reads the second.
 *
 * DESIGN: plain data, no functions; any thread. */
#ifndef GRAPHD_BINDING_H
#define GRAPHD_BINDING_H

#include <stdbool.h>
#include <stdint.h>

/* A binding as a replay's request carries it: a slot, and a range of one
 * of the session's regions (24 bytes, no padding: compared whole). */
typedef struct gd_bind_req {
  uint32_t slot;
  uint32_t region_id;
  uint64_t offset;
  uint64_t bytes;
} gd_bind_req;

/* A slot bound to client memory for one replay. */
typedef struct gd_bound {
  bool bound;
  uint64_t addr; /* device address of the client's bytes */
  uint64_t bytes;
} gd_bound;

#endif
