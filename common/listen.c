#include "listen.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gd_split_listen(const char *spec, char *host, size_t hostlen, unsigned *port, char *err,
                    size_t errlen) {
  const char *colon = strrchr(spec, ':');
  const char *h = spec, *hend = colon;
  char *end;
  if (!colon) {
    snprintf(err, errlen, "'%s' is not ADDR:PORT (for example 127.0.0.1:9464 or [::1]:9464)", spec);
    return -1;
  }
  if (*spec == '[') {
    if (colon == spec || colon[-1] != ']') {
      snprintf(err, errlen, "'%s': an IPv6 address goes in brackets, [ADDR]:PORT", spec);
      return -1;
    }
    h = spec + 1;
    hend = colon - 1;
  } else if (memchr(spec, ':', (size_t)(colon - spec))) {
    snprintf(err, errlen, "'%s': an IPv6 address goes in brackets, [ADDR]:PORT", spec);
    return -1;
  }
  if (hend == h) {
    snprintf(err, errlen, "'%s' names no address (0.0.0.0 or [::] for every interface)", spec);
    return -1;
  }
  if ((size_t)(hend - h) >= hostlen) {
    snprintf(err, errlen, "'%s': the address is too long", spec);
    return -1;
  }
  errno = 0;
  long p = strtol(colon + 1, &end, 10);
  if (errno || end == colon + 1 || *end || p < 1 || p > 65535) {
    snprintf(err, errlen, "'%s': the port is not a number from 1 to 65535", spec);
    return -1;
  }
  memcpy(host, h, (size_t)(hend - h));
  host[hend - h] = '\0';
  *port = (unsigned)p;
  return 0;
}
