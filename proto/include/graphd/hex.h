/* Hex text of bytes (ids, UUIDs): written in lower case, read in either
 * case. Thread-safe. */
#ifndef GRAPHD_PROTO_HEX_H
#define GRAPHD_PROTO_HEX_H

#include <stddef.h>
#include <stdint.h>

/* Writes the 2n lower-case hex digits of bytes[0..n) and a NUL to out,
 * which holds 2n + 1 chars. */
void gd_hex_encode(const void *bytes, size_t n, char *out);

/* Decodes the len hex digits at s (no NUL needed) into exactly n bytes at
 * out. Digits only: no "0x", sign or white space. Returns 0; or -1, out
 * untouched, with the reason in err when errlen > 0: an odd number of
 * digits, a number other than 2n, or a character that is not a hex digit
 * (and where it is). */
int gd_hex_decode(const char *s, size_t len, uint8_t *out, size_t n, char *err, size_t errlen);

/* Decodes a prefix of at most max_nibbles hex digits: the len digits at s
 * go to out, two to a byte; an odd last digit fills the high half of its
 * byte and leaves the low half 0. Returns the number of digits (0 for
 * none); or -1, out untouched, with the reason in err when errlen > 0:
 * more than max_nibbles digits, or a character that is not a hex digit. */
int gd_hex_decode_prefix(const char *s, size_t len, uint8_t *out, size_t max_nibbles, char *err,
                         size_t errlen);

#endif
