#include "graphd/wire.h"

#include <stdlib.h>

#include "graphd/frame.h"
#include "graphd/protocol.h"
#include "graphd/status.h"

/* The public region kinds are the wire's, value for value. */
_Static_assert((int)GRAPHD_REGION_VMM_FD == (int)GRAPHD__WIRE__REGION_KIND__REGION_KIND_VMM_FD,
               "region kinds: VMM_FD");
_Static_assert((int)GRAPHD_REGION_LEGACY_IPC ==
                   (int)GRAPHD__WIRE__REGION_KIND__REGION_KIND_LEGACY_IPC,
               "region kinds: LEGACY_IPC");
_Static_assert((int)GRAPHD_REGION_HOST_MEMFD ==
                   (int)GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD,
               "region kinds: HOST_MEMFD");

static int pack_frame(const ProtobufCMessage *m, size_t max_payload, uint8_t **frame,
                      size_t *frame_len) {
  size_t n = protobuf_c_message_get_packed_size(m);
  if (n > max_payload || n > UINT32_MAX) return -GRAPHD_INVALID_ARGUMENT;
  uint8_t *buf = malloc(GD_FRAME_HEADER + n + 1);
  if (!buf) return -GRAPHD_RESOURCE_EXHAUSTED;
  gd_frame_put_header(buf, (uint32_t)n);
  protobuf_c_message_pack(m, buf + GD_FRAME_HEADER);
  *frame = buf;
  *frame_len = GD_FRAME_HEADER + n;
  return 0;
}

int gd_wire_pack_request(const Graphd__Wire__Request *m, size_t max_payload, uint8_t **frame,
                         size_t *frame_len) {
  return pack_frame(&m->base, max_payload, frame, frame_len);
}

int gd_wire_pack_reply(const Graphd__Wire__Reply *m, size_t max_payload, uint8_t **frame,
                       size_t *frame_len) {
  return pack_frame(&m->base, max_payload, frame, frame_len);
}

uint32_t gd_wire_first_unknown_field(const ProtobufCMessage *m) {
  if (m->n_unknown_fields == 0) return 0;
  return m->unknown_fields[0].tag;
}
