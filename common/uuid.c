#include "uuid.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

void gd_uuid_format(const uint8_t u[16], const char *prefix, char out[GD_UUID_STR_MAX]) {
  snprintf(out, GD_UUID_STR_MAX,
           "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           prefix ? prefix : "", u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9],
           u[10], u[11], u[12], u[13], u[14], u[15]);
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = (char)tolower((unsigned char)c);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
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
  int nib = 0;
  for (; *s; s++) {
    if (*s == '-') continue;
    int v = hexval(*s);
    if (v < 0 || nib >= 32) return -1;
    if (nib % 2 == 0)
      uuid[nib / 2] = (uint8_t)(v << 4);
    else
      uuid[nib / 2] |= (uint8_t)v;
    nib++;
  }
  return nib == 32 ? 0 : -1;
}
