#include "graphd/hex.h"

#include <limits.h>
#include <stdio.h>

static int digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Checks every char of s[0..len) is a hex digit, then writes them to out
 * two to a byte (an odd last one in the high half). */
static int decode_digits(const char *s, size_t len, uint8_t *out, char *err, size_t errlen) {
  for (size_t k = 0; k < len; k++) {
    if (digit_value(s[k]) >= 0) continue;
    unsigned char ch = (unsigned char)s[k];
    if (errlen) {
      if (ch > ' ' && ch < 0x7f)
        snprintf(err, errlen, "'%c' (char %zu) is not a hex digit", ch, k + 1);
      else
        snprintf(err, errlen, "byte 0x%02x (char %zu) is not a hex digit", ch, k + 1);
    }
    return -1;
  }
  for (size_t k = 0; k < len; k++) {
    uint8_t v = (uint8_t)digit_value(s[k]);
    if (k % 2 == 0)
      out[k / 2] = (uint8_t)(v << 4);
    else
      out[k / 2] |= v;
  }
  return 0;
}

void gd_hex_encode(const void *bytes, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  const uint8_t *b = bytes;
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * n] = '\0';
}

int gd_hex_decode(const char *s, size_t len, uint8_t *out, size_t n, char *err, size_t errlen) {
  if (len % 2) {
    if (errlen) snprintf(err, errlen, "an odd number of hex digits (%zu)", len);
    return -1;
  }
  if (len != 2 * n) {
    if (errlen) snprintf(err, errlen, "%zu hex digits where %zu were expected", len, 2 * n);
    return -1;
  }
  return decode_digits(s, len, out, err, errlen);
}

int gd_hex_decode_prefix(const char *s, size_t len, uint8_t *out, size_t max_nibbles, char *err,
                         size_t errlen) {
  if (len > max_nibbles || len > INT_MAX) {
    if (errlen) snprintf(err, errlen, "%zu hex digits, more than %zu", len, max_nibbles);
    return -1;
  }
  return decode_digits(s, len, out, err, errlen) < 0 ? -1 : (int)len;
}
