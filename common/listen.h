/* An HTTP listen address as operators write it: "ADDR:PORT", ADDR a name,
 * an IPv4 address or a bracketed IPv6 one. Shared by the settings check
 * (--metrics-listen is refused at startup when malformed) and the
 * /metrics exporter that binds it. Thread-safe (no state). */
#ifndef GRAPHD_COMMON_LISTEN_H
#define GRAPHD_COMMON_LISTEN_H

#include <stddef.h>

/* Splits spec into host (brackets removed) and port (1 to 65535).
 * Returns 0, or -1 with err saying what is wrong. */
int gd_split_listen(const char *spec, char *host, size_t hostlen, unsigned *port, char *err,
                    size_t errlen);

#endif
