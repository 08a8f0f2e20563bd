/* See evict.h. Worker thread only. */
#include "evict.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/clock.h"
#include "graphd/status.h"
#include "holwatch.h"
#include "common/log.h"

int evict_make_room(gd_device *d, const gd_capture *nc, uint32_t *n, uint64_t *bytes_freed,
                    char *err, size_t errlen) {
  uint64_t bytes = capture_staging_bytes(nc);
  char hex[2 * GD_ID_LEN + 1];
  *n = 0;
  *bytes_freed = 0;
  gd_id_hex(nc->prog->id, 1, hex);
  if (bytes > d->budget) {
    snprintf(err, errlen,
             "program %s needs %llu staging bytes, more than device %d's budget of %llu "
             "(--device-budget)",
             hex, (unsigned long long)bytes, d->index, (unsigned long long)d->budget);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  uint64_t held = capture_held_bytes(d, nc), idle = 0;
  gd_capture *c;
  if (held + bytes <= d->budget) return 0;
  /* Idle extra instances go first, least recently used first: their
   * captures stay. */
  held -= capture_trim(d, held + bytes - d->budget, nc);
  if (held + bytes <= d->budget) return 0;
  for (uint32_t i = 0; (c = capture_next(d, &i));)
    if (c != nc && !capture_busy(d, c)) idle += capture_staging_bytes(c);
  if (held - idle + bytes > d->budget) {
    /* A capture busy only because its replay waits for a ready write that
     * does not come would hold the budget for ever: its session is cut off
     * once past the ready timeout, so that a retry finds room. */
    holwatch_cut_hung(d);
    snprintf(err, errlen,
             "program %s needs %llu staging bytes; device %d's budget of %llu has %llu held "
             "by captures with replays in flight (retry, or raise --device-budget)",
             hex, (unsigned long long)bytes, d->index, (unsigned long long)d->budget,
             (unsigned long long)(held - idle));
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  while (held + bytes > d->budget) {
    gd_capture *lru = NULL;
    for (uint32_t i = 0; (c = capture_next(d, &i));) {
      if (c == nc || capture_busy(d, c)) continue;
      if (!lru || c->last_queued_ns < lru->last_queued_ns) lru = c;
    }
    if (!lru) break; /* cannot happen: idle covered the need */
    c = lru;
    uint64_t b = capture_staging_bytes(c);
    gd_id_hex(c->prog->id, 1, hex);
    GD_LOG(GD_INFO, "evict", "budget: evicting idle capture %s@%d (%llu staging bytes)", hex,
           d->index, (unsigned long long)b);
    capture_drop(d, c);
    held -= b;
    (*n)++;
    *bytes_freed += b;
  }
  return 0;
}

static void info_of(gd_device *d, const gd_capture *c, gd_capture_info *ci) {
  memset(ci, 0, sizeof *ci);
  memcpy(ci->program_id, c->prog->id, GD_ID_LEN);
  ci->device = (uint32_t)d->index;
  ci->mode = c->mode; /* what it runs as: auto shows its choice */
  ci->staging_bytes = capture_staging_bytes(c);
  ci->nodes = c->nodes;
  ci->replays = c->replays;
  ci->generation = c->generation;
  ci->created_unix_ms = c->created_unix_ms;
  ci->repoints = c->repoints;
  ci->graphs = capture_graphs(c);
  ci->instances = capture_instances(c);
  ci->queue_ns = c->queue_ns;
  for (uint32_t i = 0; i < c->nmore; i++) ci->repoints += c->more[i]->repoints;
  ci->idle_ms = c->last_queued_ns ? (gd_now_ns() - c->last_queued_ns) / 1000000u : 0;
  memcpy(ci->pids, c->pids, sizeof ci->pids);
  ci->npids = c->npids;
  ci->busy = capture_busy(d, c);
}

int evict_list(gd_device *d, gd_capture_info **out, size_t *n) {
  gd_capture *c;
  *out = NULL;
  *n = 0;
  size_t count = 0;
  for (uint32_t i = 0; capture_next(d, &i);) count++;
  if (!count) return 0;
  gd_capture_info *ci = calloc(count, sizeof *ci);
  if (!ci) return -GRAPHD_RESOURCE_EXHAUSTED;
  for (uint32_t i = 0; (c = capture_next(d, &i));) info_of(d, c, &ci[(*n)++]);
  *out = ci;
  return 0;
}

static bool prefix_matches(const gd_evict_sel *sel, const uint8_t id[GD_ID_LEN]) {
  for (uint32_t k = 0; k < sel->prefix_nibbles; k++) {
    uint8_t a = (uint8_t)(k % 2 ? sel->prefix[k / 2] & 15 : sel->prefix[k / 2] >> 4);
    uint8_t b = (uint8_t)(k % 2 ? id[k / 2] & 15 : id[k / 2] >> 4);
    if (a != b) return false;
  }
  return true;
}

static bool selected(const gd_evict_sel *sel, const gd_capture *c) {
  if (!prefix_matches(sel, c->prog->id)) return false;
  if (sel->idle_ms &&
      (!c->last_queued_ns || (gd_now_ns() - c->last_queued_ns) / 1000000u < sel->idle_ms))
    return false;
  if (sel->client_pid) {
    bool used = false;
    for (uint32_t k = 0; k < c->npids && !used; k++) used = c->pids[k] == sel->client_pid;
    if (!used) return false;
  }
  return true;
}

/* Every process that used c ran as uid: by c's users, all of whom are
 * kept (its processes are only the first few). */
static bool only_user(const gd_capture *c, uint32_t uid) {
  if (c->users_lost) return false;
  for (uint32_t k = 0; k < c->nusers; k++)
    if (c->users[k] != uid) return false;
  return true;
}

/* c was used by the one process pid, running as uid, and no other: the
 * processes kept are all there were (fewer than GD_CAPTURE_PIDS), and
 * its users are uid alone. */
static bool only_process(const gd_capture *c, uint32_t pid, uint32_t uid) {
  if (c->npids >= GD_CAPTURE_PIDS || !only_user(c, uid)) return false;
  for (uint32_t k = 0; k < c->npids; k++)
    if (c->pids[k] != pid) return false;
  return true;
}

/* Whether c goes: 1 yes, 0 it stays (shared, selected by client), or a
 * negated status with err filled. */
static int may_take(gd_device *d, const gd_evict_sel *sel, const gd_capture *c, char *err,
                    size_t errlen) {
  if (sel->admin) return 1;
  if (sel->client_pid) {
    for (uint32_t k = 0; k < c->npids; k++)
      if (c->pids[k] == sel->client_pid && c->pid_uids[k] != sel->requester_uid) {
        snprintf(err, errlen,
                 "process %u runs as another user: evicting its captures needs an admin session "
                 "(root, graphd's user, or the admin group)",
                 sel->client_pid);
        return -GRAPHD_PERMISSION_DENIED;
      }
    return only_process(c, sel->client_pid, sel->requester_uid) ? 1 : 0;
  }
  if (only_user(c, sel->requester_uid)) return 1;
  char hex[2 * GD_ID_LEN + 1];
  gd_id_hex(c->prog->id, 1, hex);
  snprintf(err, errlen,
           "capture %s@%d is shared with another user's process: evicting it needs an admin "
           "session (root, graphd's user, or the admin group)",
           hex, d->index);
  return -GRAPHD_PERMISSION_DENIED;
}

int evict_select(gd_device *d, const gd_evict_sel *sel, gd_capture_info **out, size_t *n,
                 uint64_t *bytes, char *err, size_t errlen) {
  gd_capture *c;
  *out = NULL;
  *n = 0;
  *bytes = 0;
  size_t count = 0;
  for (uint32_t i = 0; (c = capture_next(d, &i));) {
    if (!selected(sel, c)) continue;
    int take = may_take(d, sel, c, err, errlen);
    if (take < 0) return take;
    count += (size_t)take;
  }
  if (!count) return 0;
  gd_capture_info *ci = calloc(count, sizeof *ci);
  if (!ci) return -GRAPHD_RESOURCE_EXHAUSTED;
  for (uint32_t i = 0; (c = capture_next(d, &i));) {
    if (!selected(sel, c) || may_take(d, sel, c, err, errlen) != 1) continue;
    info_of(d, c, &ci[*n]);
    *bytes += capture_staging_bytes(c);
    (*n)++;
    if (!sel->dry_run) capture_drop(d, c);
  }
  *out = ci;
  return 0;
}
