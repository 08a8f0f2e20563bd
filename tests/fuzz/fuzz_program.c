/* libFuzzer harness: a program encoding as RegisterProgram carries it. The
 * decoder must refuse bad bytes with a message, never crash; what it
 * accepts goes through the validator; and a program that validates must
 * encode again to exactly the bytes it came from (the encoding is
 * canonical, and the id is its hash). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "graphd/encoding.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gd_program *p = NULL;
  char err[512];
  if (gd_program_decode(data, size, &p, err, sizeof err) < 0) {
    if (p || !err[0]) abort(); /* a refusal leaves nothing and says why */
    return 0;
  }
  if (gd_program_validate(p, err, sizeof err) == 0) {
    uint8_t *enc = NULL;
    size_t len = 0;
    if (gd_program_encode(p, &enc, &len, err, sizeof err) < 0) abort();
    if (len != size || memcmp(enc, data, size) != 0) abort();
    free(enc);
  }
  gd_program_free(p);
  return 0;
}
