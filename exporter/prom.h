/* A daemon status in the Prometheus text exposition format (version
 * 0.0.4), written the same way by `graphctl stats --prometheus` and by the
 * daemon's /metrics endpoint, so that their names cannot drift apart. */
#ifndef GRAPHD_EXPORTER_PROM_H
#define GRAPHD_EXPORTER_PROM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "graphd/graphd.h"

/* One client process: its sessions folded together. name points into the
 * status it came from. */
typedef struct gd_client_row {
  uint32_t pid, uid;
  const char *name;
  uint64_t sessions, data_sessions, regions, region_bytes;
  /* Over its sessions: the oldest one's age and the least idle time
   * (graphd_session_record); timed: the status had them. */
  uint64_t age_ms, idle_ms;
  bool timed;
} gd_client_row;

/* The client processes of s in first-seen order, each named after its
 * first data session (else its first session), leaving out the control
 * sessions of process `self` (the asker's own) and the daemon's own
 * sessions (its /metrics scraper). Returns the count; *out is malloc'd (the
 * caller frees it), NULL with 0 when out of memory. */
size_t gd_client_rows(const graphd_daemon_status *s, uint32_t self, gd_client_row **out);

/* Writes s to f: the daemon's build info and totals; each device's health
 * (info, up, state, MPS, memory, staging budget), every counter of the
 * device counters' list with a family of its own (graphd_device_metric),
 * replay latency as a histogram and as quantiles, and the workers' time
 * (labels device and uuid); the request counters (label request); and the
 * client rows cl (from gd_client_rows) with their sessions, regions, idle
 * time and age (labels pid, uid and name). */
void gd_prom_write(FILE *f, const graphd_daemon_status *s, const gd_client_row *cl, size_t ncl);

#endif
