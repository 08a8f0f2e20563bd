/* Regions: client memory imported on a data session's device, in a table
 * per session, by the id the daemon gave it.
 *
 * DESIGN: loop thread only. The imports and releases themselves run on
 * the device's worker (data_session.c queues them), so a release queued after
 * a job that uses the region runs after it (the worker's queue is FIFO),
 * and a release first drains the session's stream: that is how a region
 * outlives the in-flight work that uses it. Replay jobs carry resolved
 * addresses, never a pointer into the table. */
#ifndef GRAPHD_REGION_H
#define GRAPHD_REGION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uthash.h>

#include "daemon/backend/backend.h"

typedef struct gd_region {
  uint32_t id;
  gd_region_map map;
  uint64_t client_base;
  void *release; /* data_session.c: the job that lets it go, made with it */
  UT_hash_handle hh;
} gd_region;

typedef struct gd_region_table {
  gd_region *head; /* uthash */
  uint32_t next_id;
  uint64_t n;
  uint64_t bytes;
} gd_region_table;

gd_region *region_find(gd_region_table *t, uint32_t id);

/* region_find as a lookup of exec_bind's (table is a gd_region_table). */
const gd_region_map *region_lookup(void *table, uint32_t id);

/* Adds an import under a new id; NULL when out of memory. */
gd_region *region_add(gd_region_table *t, const gd_region_map *map, uint64_t client_base);

/* A new id, for an import that region_add_as adds once it is made (the
 * worker learns the id with the import, for the session's ring). */
uint32_t region_new_id(gd_region_table *t);
gd_region *region_add_as(gd_region_table *t, uint32_t id, const gd_region_map *map,
                         uint64_t client_base);

/* Takes r out of the table and frees the entry (not the mapping). */
void region_remove(gd_region_table *t, gd_region *r);

/* Checks that [offset, offset + bytes) lies inside the region, without
 * overflow. Returns 0 or -GRAPHD_OUT_OF_RANGE with err naming the region. */
int region_check_range(const gd_region *r, uint64_t offset, uint64_t bytes, char *err,
                       size_t errlen);

/* Empties the table, handing every mapping to the caller (*maps is
 * malloc'd, *n entries), which releases them on the worker once the
 * session's stream has drained. */
int region_take_all(gd_region_table *t, gd_region_map **maps, size_t *n);

#endif
