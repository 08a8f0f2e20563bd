/* See region.h. Loop thread only. */
#include "region.h"

#include <stdio.h>
#include <stdlib.h>

#include "graphd/status.h"

gd_region *region_find(gd_region_table *t, uint32_t id) {
  gd_region *r = NULL;
  HASH_FIND(hh, t->head, &id, sizeof id, r);
  return r;
}

uint32_t region_new_id(gd_region_table *t) { return ++t->next_id; }

gd_region *region_add(gd_region_table *t, const gd_region_map *map, uint64_t client_base) {
  return region_add_as(t, region_new_id(t), map, client_base);
}

gd_region *region_add_as(gd_region_table *t, uint32_t id, const gd_region_map *map,
                         uint64_t client_base) {
  gd_region *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->id = id;
  r->map = *map;
  r->client_base = client_base;
  HASH_ADD(hh, t->head, id, sizeof r->id, r);
  t->n++;
  t->bytes += map->size;
  return r;
}

void region_remove(gd_region_table *t, gd_region *r) {
  HASH_DEL(t->head, r);
  t->n--;
  t->bytes -= r->map.size;
  free(r);
}

int region_check_range(const gd_region *r, uint64_t offset, uint64_t bytes, char *err,
                       size_t errlen) {
  if (offset > r->map.size || bytes > r->map.size - offset) {
    snprintf(err, errlen,
             "region %u: bytes %llu..+%llu are out of range: the region has %llu bytes", r->id,
             (unsigned long long)offset, (unsigned long long)bytes,
             (unsigned long long)r->map.size);
    return -GRAPHD_OUT_OF_RANGE;
  }
  return 0;
}

int region_take_all(gd_region_table *t, gd_region_map **maps, size_t *n) {
  size_t k = 0;
  *maps = NULL;
  *n = 0;
  if (t->n == 0) return 0;
  gd_region_map *m = calloc(t->n, sizeof *m);
  if (!m) return -GRAPHD_RESOURCE_EXHAUSTED;
  gd_region *r, *tmp;
  HASH_ITER(hh, t->head, r, tmp) {
    HASH_DEL(t->head, r);
    m[k++] = r->map;
    free(r);
  }
  t->n = 0;
  t->bytes = 0;
  *maps = m;
  *n = k;
  return 0;
}

const gd_region_map *region_lookup(void *table, uint32_t id) {
  gd_region *r = region_find(table, id);
  return r ? &r->map : NULL;
}
