/* Regions: client memory imported on a data session's device.
 *
 * DESIGN: the table is per session and loop-thread only. Imports and
 * releases run as jobs on the session's device worker, so a release queued
 * after a job that uses the region runs after it (the worker's queue is
 * FIFO), and a release first drains the session's stream: that is how a
 * region outlives the in-flight work that uses it. Replay jobs carry the
 * resolved addresses, never a pointer to the table entry. */
#ifndef GRAPHD_REGION_H
#define GRAPHD_REGION_H

#include <stdbool.h>
#include <stdint.h>
#include <uthash.h>

#include "backend.h"
#include "graphd.pb-c.h"
#include "session.h"

#define GD_MAX_REGIONS_PER_SESSION 4096u

typedef struct gd_region {
  uint32_t id;
  gd_region_map map;
  uint64_t client_base;
  UT_hash_handle hh;
} gd_region;

/* Handles RegisterRegion (fd already checked against the declared count). */
void region_handle_register(gd_session *s, uint64_t request_id,
                            const Graphd__Wire__RegisterRegion *m, int fd);
/* Handles UnregisterRegion. */
void region_handle_unregister(gd_session *s, uint64_t request_id,
                              const Graphd__Wire__UnregisterRegion *m);

gd_region *region_find(gd_session *s, uint32_t id);

/* Checks that [offset, offset + bytes) lies inside the region, without
 * overflow. Returns 0 or -GRAPHD_OUT_OF_RANGE with err naming the region. */
int region_check_range(const gd_region *r, uint64_t offset, uint64_t bytes, char *err,
                       size_t errlen);

/* Takes every region of a closing session out of its table (counters
 * included) and hands their mappings to the caller, which releases them on
 * the worker once the session's stream has drained. */
int region_take_all(gd_session *s, gd_region_map **maps, size_t *n);


#endif
