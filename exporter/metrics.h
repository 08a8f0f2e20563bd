/* The optional /metrics endpoint (--metrics-listen ADDR:PORT): the
 * daemon's status in the Prometheus text format over HTTP, with the names
 * of `graphctl stats --prometheus`. Started by main once the socket
 * listens, stopped after the loop has ended. */
#ifndef GRAPHD_EXPORTER_METRICS_H
#define GRAPHD_EXPORTER_METRICS_H

#include <stddef.h>

typedef struct gd_metrics gd_metrics;

/* Listens on listen_spec ("ADDR:PORT") and serves GET /metrics from a
 * thread of libmicrohttpd's, asking the daemon on socket_path for each
 * scrape. A connection that has not sent a whole request's headers
 * header_timeout_s after it connected (or got its last answer) is closed,
 * however it trickles them; one client address holds per_address
 * connections at most. Returns NULL with err filled in when the address
 * cannot be resolved or bound. */
gd_metrics *metrics_start(const char *listen_spec, const char *socket_path, double header_timeout_s,
                          unsigned per_address, char *err, size_t errlen);

/* Stops serving and frees m (NULL is fine). A scrape in progress ends
 * first: call it once the daemon's sessions are closed, so that it
 * cannot be waiting for the loop. */
void metrics_stop(gd_metrics *m);

#endif
