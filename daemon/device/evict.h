/* Which captures to free, on one device: the device budget's least
 * recently used choice, and List/Evict's selectors with the privilege
 * rule. Freeing itself is capture_drop().
 *
 * DESIGN: worker thread only (the loop's half of List and Evict, which
 * asks every device and gathers the answers, is control.c). */
#ifndef GRAPHD_EVICT_H
#define GRAPHD_EVICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "capture.h"
#include "device.h"

/* What list and evict report about one capture. */
typedef struct gd_capture_info {
  uint8_t program_id[GD_ID_LEN];
  uint32_t device;
  uint32_t mode;
  uint64_t staging_bytes;
  uint32_t nodes;
  uint64_t replays;
  uint64_t idle_ms;
  uint32_t pids[GD_CAPTURE_PIDS];
  uint32_t npids;
  bool busy;
  uint32_t generation;
  uint64_t created_unix_ms;
  uint64_t repoints;  /* node parameters updated for moved buffers */
  uint32_t graphs;    /* executable graphs over its instances */
  uint32_t instances; /* its instances (1 and up) */
  uint64_t queue_ns;  /* the worker's time to queue a replay, a moving mean */
} gd_capture_info;

/* Which captures an eviction takes (every selector given must match). */
typedef struct gd_evict_sel {
  uint8_t prefix[GD_ID_LEN];
  uint32_t prefix_nibbles; /* 0: any program */
  uint32_t client_pid;     /* 0: any */
  uint64_t idle_ms;        /* 0: any */
  bool dry_run;
  bool admin; /* the requester may evict other users' captures */
  uint32_t requester_uid;
} gd_evict_sel;

/* The device budget: makes room for the new capture nc (already in d's
 * set, never taken itself) by dropping the least recently used idle
 * captures. A capture whose last replay has not finished is never taken;
 * if the idle ones do not free enough, or nc alone is over the budget, it
 * fails with RESOURCE_EXHAUSTED and nothing is dropped. *n and *bytes
 * count what was dropped. */
int evict_make_room(gd_device *d, const gd_capture *nc, uint32_t *n, uint64_t *bytes, char *err,
                    size_t errlen);

/* Every capture on d; *out is malloc'd (*n entries). */
int evict_list(gd_device *d, gd_capture_info **out, size_t *n);

/* Drops the selected captures and reports them (with dry_run, reports and
 * drops nothing). A requester that is not admin may take only captures
 * that processes of its own user alone used (every user that replayed a
 * capture is remembered, however many processes). Selected by client (a pid),
 * the captures that process alone used go and those it shares stay;
 * otherwise a selected capture another user's process used gives
 * PERMISSION_DENIED naming it, as does naming another user's process, and
 * nothing is dropped. */
int evict_select(gd_device *d, const gd_evict_sel *sel, gd_capture_info **out, size_t *n,
                 uint64_t *bytes, char *err, size_t errlen);

#endif
