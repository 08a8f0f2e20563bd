/* Fair shares of the pools that every user's clients draw from (the
 * registry's programs and modules, the mappings of client memory).
 *
 * What a user holds there stays while its sessions want it, so room for
 * other users has to be kept before it is needed. The rule, the same for
 * every pool: a user may always hold up to the floor, 1/64 of the pool;
 * beyond it, at most its fair share, the pool's bound divided by one more
 * than the users holding part of it (room for one more), and never more
 * than stays free for the others after the request. Users that hold
 * alike end at their shares; one that came first and took more than its
 * share holds at most half of the pool, and each user after it still
 * finds room.
 *
 * DESIGN: pure arithmetic, any thread; the callers count the holdings. */
#ifndef GRAPHD_SHARE_H
#define GRAPHD_SHARE_H

#include <stdint.h>

/* One request against a pool. */
typedef struct gd_share_ask {
  uint64_t bound; /* the pool's bound */
  uint64_t held;  /* what all users hold now, each thing once */
  uint32_t users; /* users holding part of it now (the asker among them or not) */
  uint64_t mine;  /* what the asker holds now */
  uint64_t more;  /* what the request adds to the asker's holding */
  uint64_t grows; /* ... and to the pool's (less when others hold it too) */
} gd_share_ask;

typedef enum {
  GD_SHARE_OK = 0,
  GD_SHARE_OVER,  /* past the asker's fair share */
  GD_SHARE_GREEDY /* more than would stay free for the other users */
} gd_share_verdict;

/* The fair share of a pool of `bound` among `users` users (the asker
 * counted): bound / (users + 1), at least the floor. */
static inline uint64_t gd_share_of(uint64_t bound, uint64_t users) {
  uint64_t share = bound / (users + 1), floor = bound / 64;
  if (floor < 1) floor = 1;
  return share > floor ? share : floor;
}

/* Whether the request keeps the asker within the rule; *share gets its
 * fair share. Whether the pool has room at all is the caller's check. */
static inline gd_share_verdict gd_share_check(const gd_share_ask *a, uint64_t *share) {
  uint64_t users = a->users + (a->mine ? 0 : 1);
  uint64_t after = a->mine + a->more, held = a->held + a->grows;
  uint64_t floor = a->bound / 64 ? a->bound / 64 : 1;
  *share = gd_share_of(a->bound, users);
  if (after <= floor) return GD_SHARE_OK;
  if (after > *share) return GD_SHARE_OVER;
  if (held > a->bound || after > a->bound - held) return GD_SHARE_GREEDY;
  return GD_SHARE_OK;
}

#endif
