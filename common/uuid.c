#include "uuid.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "graphd/hex.h"

void gd_uuid_format(const uint8_t u[16], const char *prefix, char out[GD_UUID_STR_MAX]) {
  char h[33];
  gd_hex_encode(u, 16, h);
  snprintf(out, GD_UUID_STR_MAX, "%s%.8s-%.4s-%.4s-%.4s-%.12s", prefix ? prefix : "", h, h + 8,
           h + 12, h + 16, h + 20);
}

int gd_uuid_parse(const char *s, uint8_t uuid[16]) {
  static const char *prefixes[] = {"GPU-", "HOST-", "MIG-"};
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
    size_t n = strlen(prefixes[i]);
    if (strncasecmp(s, prefixes[i], n) == 0) {
      s += n;
      break;
    }
  }
  /* The digits with the dashes left out: 32 of them, or it is no UUID. */
  char digits[32];
  size_t n = 0;
  for (; *s; s++) {
    if (*s == '-') continue;
    if (n == sizeof digits) return -1;
    digits[n++] = *s;
  }
  return gd_hex_decode(digits, n, uuid, 16, NULL, 0);
}
