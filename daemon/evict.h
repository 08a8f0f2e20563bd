/* graphctl list and evict on the loop: each request fans out to the
 * devices' workers (capture_list, capture_evict) and replies once every
 * one has answered. Loop thread only. */
#ifndef GRAPHD_EVICT_H
#define GRAPHD_EVICT_H

#include "graphd.pb-c.h"
#include "session.h"

void evict_handle_list(gd_session *s, uint64_t request_id);
void evict_handle_evict(gd_session *s, uint64_t request_id, const Graphd__Wire__Evict *m);

#endif
