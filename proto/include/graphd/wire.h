/* Protobuf glue: packing envelopes into whole frames, and the limits that
 * apply to strings and repeated fields on the wire.
 *
 * Leaf module: no CUDA, no libuv, no logging. Thread-safe. */
#ifndef GRAPHD_WIRE_H
#define GRAPHD_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "graphd.pb-c.h"

#include "graphd/protocol.h"
#define GD_UUID_LEN 16
#define GD_CLIENT_NAME_MAX 128

/* Packs a Request into a new malloc'd frame: header then payload. Returns 0
 * or -GRAPHD_RESOURCE_EXHAUSTED (allocation) / -GRAPHD_INVALID_ARGUMENT
 * (over max_payload). */
int gd_wire_pack_request(const Graphd__Wire__Request *m, size_t max_payload, uint8_t **frame,
                         size_t *frame_len);
int gd_wire_pack_reply(const Graphd__Wire__Reply *m, size_t max_payload, uint8_t **frame,
                       size_t *frame_len);

/* Field number of the first unknown field in m, or 0 when there is none. */
uint32_t gd_wire_first_unknown_field(const ProtobufCMessage *m);

#endif
