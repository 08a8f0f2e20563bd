/* libFuzzer harness: bytes as they arrive on a session socket. The input is
 * fed to the frame reader in pieces whose sizes come from the input itself;
 * each whole frame is unpacked as a Request, and the unknown-field check the
 * daemon runs on every request is applied. A declared length over the cap
 * ends the stream, as it closes a session. Nothing may crash or leak. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "graphd/frame.h"
#include "graphd.pb-c.h"
#include "graphd/wire.h"

#define MAX_FRAME (64u << 10)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gd_frame_reader r;
  gd_frame_reader_init(&r, MAX_FRAME);
  size_t at = 0;
  unsigned piece = size ? (unsigned)(data[0] % 97) + 1 : 1; /* bytes per recv */
  int rc = 0;
  while (at < size && rc >= 0) {
    uint8_t *p;
    size_t avail;
    if (gd_frame_reader_space(&r, &p, &avail) < 0) break;
    size_t n = size - at;
    if (n > piece) n = piece;
    if (n > avail) n = avail;
    memcpy(p, data + at, n);
    at += n;
    if (gd_frame_reader_commit(&r, n, NULL, 0) < 0) break;
    gd_frame f;
    while ((rc = gd_frame_reader_next(&r, &f)) == 1) {
      Graphd__Wire__Request *req = graphd__wire__request__unpack(NULL, f.len, f.data);
      if (req) {
        (void)gd_wire_first_unknown_field(&req->base);
        graphd__wire__request__free_unpacked(req, NULL);
      }
    }
  }
  gd_frame_reader_close(&r);
  return 0;
}
