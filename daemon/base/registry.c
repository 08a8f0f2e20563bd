/* See registry.h. Loop thread for every mutation. */
#define _GNU_SOURCE
#include "registry.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "graphd/status.h"
#include "share.h"

gd_module *registry_find_module(gd_registry *r, const uint8_t id[GD_ID_LEN]) {
  gd_module *m = NULL;
  HASH_FIND(hh, r->modules, id, GD_ID_LEN, m);
  return m;
}

gd_regprog *registry_find_program(gd_registry *r, const uint8_t id[GD_ID_LEN]) {
  gd_regprog *p = NULL;
  HASH_FIND(hh, r->programs, id, GD_ID_LEN, p);
  return p;
}

/* --- indexes, owners, users ------------------------------------------------- */

static uint32_t index_take(gd_reg_index *ix) {
  return ix->nfree ? ix->free[--ix->nfree] : ix->next++;
}

static void index_give(gd_reg_index *ix, uint32_t i) {
  if (ix->nfree == ix->free_cap) {
    uint32_t cap = ix->free_cap ? 2 * ix->free_cap : 64;
    uint32_t *n = realloc(ix->free, cap * sizeof *n);
    if (!n) return; /* the index is not reused: tables stay a little larger */
    ix->free = n;
    ix->free_cap = cap;
  }
  ix->free[ix->nfree++] = i;
}

static gd_reg_user *user_get(gd_registry *r, uint32_t uid, bool make) {
  gd_reg_user *u = NULL;
  HASH_FIND(hh, r->users, &uid, sizeof uid, u);
  if (!u && make && (u = calloc(1, sizeof *u))) {
    u->uid = uid;
    HASH_ADD(hh, r->users, uid, sizeof u->uid, u);
  }
  return u;
}

/* Forgets u once it is charged for nothing and pins nothing. */
static void user_gc(gd_registry *r, gd_reg_user *u) {
  if (u->programs || u->program_bytes || u->module_bytes || u->pins) return;
  HASH_DEL(r->users, u);
  free(u);
}

gd_reg_user registry_user(gd_registry *r, uint32_t uid) {
  gd_reg_user *u = user_get(r, uid, false);
  gd_reg_user z = {.uid = uid};
  return u ? *u : z;
}

static bool owned_by(const gd_reg_usage *u, uint32_t uid) {
  for (uint32_t i = 0; i < u->nowners; i++)
    if (u->owners[i] == uid) return true;
  return false;
}

/* What an entry costs its owners: one program and its bytes, or the
 * module's bytes. */
static void charge(gd_registry *r, uint32_t uid, bool program, uint64_t bytes, int sign) {
  gd_reg_user *u = user_get(r, uid, sign > 0);
  if (!u) return;
  if (program) {
    u->programs = sign > 0 ? u->programs + 1 : u->programs - 1;
    u->program_bytes = sign > 0 ? u->program_bytes + bytes : u->program_bytes - bytes;
  } else {
    u->module_bytes = sign > 0 ? u->module_bytes + bytes : u->module_bytes - bytes;
  }
  user_gc(r, u);
}

static void unlink_program(gd_registry *r, gd_regprog *p) {
  HASH_DEL(r->programs, p);
  r->nprograms--;
  r->program_bytes -= p->bytes;
  for (uint32_t i = 0; i < p->program->nsteps; i++)
    if (p->step_module[i]) p->step_module[i]->nlaunches--;
  for (uint32_t i = 0; i < p->use.nowners; i++) charge(r, p->use.owners[i], true, p->bytes, -1);
  p->use.nowners = 0;
  p->next_dead = r->dead_programs;
  r->dead_programs = p;
}

static void unlink_module(gd_registry *r, gd_module *m) {
  HASH_DEL(r->modules, m);
  r->nmodules--;
  r->module_bytes -= m->len;
  for (uint32_t i = 0; i < m->use.nowners; i++) charge(r, m->use.owners[i], false, m->len, -1);
  m->use.nowners = 0;
  m->next_dead = r->dead_modules;
  r->dead_modules = m;
}

/* Whether an entry may go: nobody holds it, and (a module) no registered
 * program launches it. */
static bool unused_program(const gd_regprog *p) { return p->use.holders == 0; }
static bool unused_module(const gd_module *m) { return m->use.holders == 0 && !m->nlaunches; }

bool registry_owns(const gd_reg_usage *u, uint32_t uid) { return owned_by(u, uid); }

/* uid's place among the owners, or -1. */
static int owner_index(const gd_reg_usage *u, uint32_t uid) {
  for (uint32_t i = 0; i < u->nowners; i++)
    if (u->owners[i] == uid) return (int)i;
  return -1;
}

/* Whether uid may let go of an entry in use: another user owns it too,
 * and no session of uid holds it. */
static bool shared_away(const gd_reg_usage *u, uint32_t uid) {
  int i = owner_index(u, uid);
  return u->nowners > 1 && i >= 0 && u->owner_holds[i] == 0;
}

/* The least recently used unused entry of the kind, owned by uid (or by
 * anyone when !by_uid), other than `keep`; NULL when none. With shared,
 * instead: an entry in use that uid owns with another user, which uid may
 * let go of (the other owner pays for it, and it stays): so that holds by
 * another user cannot keep an owner at its limit. */
static void *lru_victim(gd_registry *r, bool program, bool by_uid, uint32_t uid, const void *keep,
                        bool shared) {
  void *best = NULL;
  uint64_t best_ns = UINT64_MAX;
  if (program) {
    for (gd_regprog *p = r->programs; p; p = p->hh.next)
      if ((void *)p != keep &&
          (shared ? !unused_program(p) && shared_away(&p->use, uid) : unused_program(p)) &&
          (!by_uid || owned_by(&p->use, uid)) && p->use.used_ns < best_ns) {
        best = p;
        best_ns = p->use.used_ns;
      }
  } else {
    for (gd_module *m = r->modules; m; m = m->hh.next)
      if ((void *)m != keep &&
          (shared ? !unused_module(m) && shared_away(&m->use, uid) : unused_module(m)) &&
          (!by_uid || owned_by(&m->use, uid)) && m->use.used_ns < best_ns) {
        best = m;
        best_ns = m->use.used_ns;
      }
  }
  return best;
}

static uint32_t max_programs(const gd_registry *r) {
  uint32_t l = r->limits.max_programs;
  return l && l < GD_REGISTRY_MAX_PROGRAMS ? l : GD_REGISTRY_MAX_PROGRAMS;
}

static uint64_t max_program_bytes(const gd_registry *r) {
  uint64_t l = r->limits.max_program_bytes;
  return l && l < GD_REGISTRY_MAX_PROGRAM_BYTES ? l : GD_REGISTRY_MAX_PROGRAM_BYTES;
}

static uint64_t max_module_bytes(const gd_registry *r) {
  uint64_t l = r->limits.max_module_bytes;
  return l && l < GD_REGISTRY_MAX_MODULE_BYTES ? l : GD_REGISTRY_MAX_MODULE_BYTES;
}

/* --- fair shares ----------------------------------------------------------- */

enum { POOL_PROGRAMS, POOL_PROGRAM_BYTES, POOL_MODULES, POOL_MODULE_BYTES, NPOOLS };

/* One pool: its bound, how it is named in errors, and the flag that sets it. */
static uint64_t pool_bound(const gd_registry *r, int pool) {
  switch (pool) {
    case POOL_PROGRAMS: return max_programs(r);
    case POOL_PROGRAM_BYTES: return max_program_bytes(r);
    case POOL_MODULES: return GD_REGISTRY_MAX_MODULES;
    default: return max_module_bytes(r);
  }
}

static const char *const pool_what[NPOOLS] = {"programs", "program bytes", "modules",
                                              "module bytes"};
static const char *const pool_flag[NPOOLS] = {"--max-programs", "--max-program-bytes",
                                              "graphd's limit of modules", "--max-module-bytes"};

static uint64_t pinned_in(const gd_reg_pinned *p, int pool) {
  switch (pool) {
    case POOL_PROGRAMS: return p->programs;
    case POOL_PROGRAM_BYTES: return p->program_bytes;
    case POOL_MODULES: return p->modules;
    default: return p->module_bytes;
  }
}

/* Users pinning part of the pool. */
static uint32_t pool_users(const gd_registry *r, int pool) {
  return pool <= POOL_PROGRAM_BYTES ? r->program_pinners : r->module_pinners;
}

/* Appends to err the user that pins the most beyond its fair share of the
 * pool, if one does. */
static void name_most_over(gd_registry *r, int pool, char *err, size_t errlen) {
  uint64_t bound = pool_bound(r, pool), share = gd_share_of(bound, pool_users(r, pool));
  const gd_reg_user *most = NULL;
  for (const gd_reg_user *u = r->users; u; u = u->hh.next)
    if (pinned_in(&u->pinned, pool) > share &&
        (!most || pinned_in(&u->pinned, pool) > pinned_in(&most->pinned, pool)))
      most = u;
  if (most)
    snprintf(err, errlen,
             "; uid %u holds the most beyond its fair share (%llu %s, the share is %llu)",
             most->uid, (unsigned long long)pinned_in(&most->pinned, pool), pool_what[pool],
             (unsigned long long)share);
}

static gd_reg_pin *pin_find(const gd_reg_user *u, const void *entry) {
  gd_reg_pin *p = NULL;
  if (u) HASH_FIND_PTR(u->pins, &entry, p);
  return p;
}

/* u's pin of the entry starts (sign > 0) or ends: the user's, and (when it
 * is the first or last user to pin it) the registry's counts follow. */
static void pin_count(gd_registry *r, gd_reg_user *u, bool program, void *entry, int sign) {
  uint64_t bytes = program ? ((gd_regprog *)entry)->bytes : ((gd_module *)entry)->len;
  gd_reg_usage *use = program ? &((gd_regprog *)entry)->use : &((gd_module *)entry)->use;
  gd_reg_pinned *up = &u->pinned, *rp = &r->pinned;
  bool first_user = sign > 0 ? use->pinners++ == 0 : --use->pinners == 0;
  if (program) {
    if (sign > 0 && up->programs++ == 0) r->program_pinners++;
    if (sign < 0 && --up->programs == 0) r->program_pinners--;
    up->program_bytes = sign > 0 ? up->program_bytes + bytes : up->program_bytes - bytes;
    if (first_user) {
      rp->programs = sign > 0 ? rp->programs + 1 : rp->programs - 1;
      rp->program_bytes = sign > 0 ? rp->program_bytes + bytes : rp->program_bytes - bytes;
    }
  } else {
    if (sign > 0 && up->modules++ == 0) r->module_pinners++;
    if (sign < 0 && --up->modules == 0) r->module_pinners--;
    up->module_bytes = sign > 0 ? up->module_bytes + bytes : up->module_bytes - bytes;
    if (first_user) {
      rp->modules = sign > 0 ? rp->modules + 1 : rp->modules - 1;
      rp->module_bytes = sign > 0 ? rp->module_bytes + bytes : rp->module_bytes - bytes;
    }
  }
}

/* u pins one entry once more; -1 when out of memory (nothing changed). */
static int pin_one(gd_registry *r, gd_reg_user *u, bool program, void *entry) {
  gd_reg_pin *p = pin_find(u, entry);
  if (p) {
    p->refs++;
    return 0;
  }
  if (!(p = calloc(1, sizeof *p))) return -1;
  p->entry = entry;
  p->refs = 1;
  HASH_ADD_PTR(u->pins, entry, p);
  pin_count(r, u, program, entry, +1);
  return 0;
}

/* The reverse of pin_one (allocates nothing). */
static void unpin_one(gd_registry *r, gd_reg_user *u, bool program, void *entry) {
  gd_reg_pin *p = pin_find(u, entry);
  if (!p || --p->refs) return;
  HASH_DEL(u->pins, p);
  free(p);
  pin_count(r, u, program, entry, -1);
}

/* One hold of u's on the entry: a program pins the modules it launches too. */
static void unpin(gd_registry *r, gd_reg_user *u, bool program, void *entry, uint32_t nsteps) {
  if (program)
    for (uint32_t i = 0; i < nsteps; i++)
      if (((gd_regprog *)entry)->step_module[i])
        unpin_one(r, u, false, ((gd_regprog *)entry)->step_module[i]);
  unpin_one(r, u, program, entry);
}

static int pin(gd_registry *r, gd_reg_user *u, bool program, void *entry) {
  if (pin_one(r, u, program, entry) < 0) return -1;
  if (!program) return 0;
  gd_regprog *p = entry;
  for (uint32_t i = 0; i < p->program->nsteps; i++)
    if (p->step_module[i] && pin_one(r, u, false, p->step_module[i]) < 0) {
      unpin(r, u, true, p, i);
      return -1;
    }
  return 0;
}

/* Whether a hold of uid's on the entry keeps uid within share.h's rule in
 * every pool it adds to; RESOURCE_EXHAUSTED with err naming the pool, its
 * bound and its flag if not. */
static int fair_share_check(gd_registry *r, uint32_t uid, bool program, void *entry, char *err,
                            size_t errlen) {
  if (r->limits.no_fair_shares) return 0;
  const gd_reg_user *u = user_get(r, uid, false);
  if (pin_find(u, entry)) return 0; /* another of its sessions holds it: nothing new */
  /* What the hold adds to uid's pins (mine) and to the registry's (all). */
  uint64_t mine[NPOOLS] = {0}, all[NPOOLS] = {0};
  if (program) {
    gd_regprog *p = entry;
    mine[POOL_PROGRAMS] = 1;
    mine[POOL_PROGRAM_BYTES] = p->bytes;
    if (!p->use.pinners) {
      all[POOL_PROGRAMS] = 1;
      all[POOL_PROGRAM_BYTES] = p->bytes;
    }
    uint64_t mark = ++r->mark;
    for (uint32_t i = 0; i < p->program->nsteps; i++) {
      gd_module *m = p->step_module[i];
      if (!m || m->mark == mark) continue;
      m->mark = mark;
      if (!pin_find(u, m)) {
        mine[POOL_MODULES]++;
        mine[POOL_MODULE_BYTES] += m->len;
      }
      if (!m->use.pinners) {
        all[POOL_MODULES]++;
        all[POOL_MODULE_BYTES] += m->len;
      }
    }
  } else {
    gd_module *m = entry;
    mine[POOL_MODULES] = 1;
    mine[POOL_MODULE_BYTES] = m->len;
    if (!m->use.pinners) {
      all[POOL_MODULES] = 1;
      all[POOL_MODULE_BYTES] = m->len;
    }
  }
  for (int k = 0; k < NPOOLS; k++) {
    if (!mine[k]) continue;
    gd_share_ask ask = {.bound = pool_bound(r, k),
                        .held = pinned_in(&r->pinned, k),
                        .users = pool_users(r, k),
                        .mine = u ? pinned_in(&u->pinned, k) : 0,
                        .more = mine[k],
                        .grows = all[k]};
    uint64_t share;
    gd_share_verdict v = gd_share_check(&ask, &share);
    if (v == GD_SHARE_OK) continue;
    uint32_t users = ask.users + (ask.mine ? 0 : 1);
    int n = snprintf(err, errlen,
                     "fair share of %s reached: uid %u's open sessions hold %llu and this needs "
                     "%llu more, ",
                     pool_what[k], uid, (unsigned long long)ask.mine, (unsigned long long)ask.more);
    if (n < 0 || (size_t)n >= errlen) return -GRAPHD_RESOURCE_EXHAUSTED;
    if (v == GD_SHARE_OVER)
      snprintf(err + n, errlen - (size_t)n,
               "past its share of %llu (%s %llu / (%u uid%s holding %s + 1)); close some of uid "
               "%u's sessions%s%s",
               (unsigned long long)share, pool_flag[k], (unsigned long long)ask.bound, users,
               users == 1 ? "" : "s", pool_what[k], uid, k == POOL_MODULES ? "" : ", or raise ",
               k == POOL_MODULES ? "" : pool_flag[k]);
    else
      snprintf(err + n, errlen - (size_t)n,
               "more than would stay free for other users: open sessions hold %llu of %s %llu; "
               "close some of uid %u's sessions%s%s",
               (unsigned long long)ask.held, pool_flag[k], (unsigned long long)ask.bound, uid,
               k == POOL_MODULES ? "" : ", or raise ", k == POOL_MODULES ? "" : pool_flag[k]);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  return 0;
}

/* Room in the whole registry for one more program, or one more module, of
 * len bytes: unused entries go, least recently used first. */
static int global_room(gd_registry *r, bool program, uint64_t len, char *err, size_t errlen) {
  if (program && len > max_program_bytes(r)) {
    snprintf(err, errlen,
             "the program takes %llu bytes in memory, more than the whole program registry may "
             "(--max-program-bytes %llu)",
             (unsigned long long)len, (unsigned long long)max_program_bytes(r));
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  for (;;) {
    bool fits =
        program
            ? r->nprograms < max_programs(r) && r->program_bytes + len <= max_program_bytes(r)
            : r->nmodules < GD_REGISTRY_MAX_MODULES && r->module_bytes + len <= max_module_bytes(r);
    if (fits) return 0;
    void *v = lru_victim(r, program, false, 0, NULL, false);
    if (v) {
      if (program)
        unlink_program(r, v);
      else
        unlink_module(r, v);
      continue;
    }
    /* Modules in use only by unused programs: those programs go first. */
    gd_regprog *p = program ? NULL : lru_victim(r, true, false, 0, NULL, false);
    if (!p) break;
    unlink_program(r, p);
  }
  int n;
  if (program && r->nprograms >= max_programs(r))
    n = snprintf(err, errlen,
                 "the program registry is full (max-programs %u) and every program in it is "
                 "held by an open session",
                 max_programs(r));
  else if (program)
    n = snprintf(err, errlen,
                 "the program registry is full (%llu of --max-program-bytes %llu, this program "
                 "%llu more) and every program in it is held by an open session",
                 (unsigned long long)r->program_bytes, (unsigned long long)max_program_bytes(r),
                 (unsigned long long)len);
  else
    n = snprintf(err, errlen,
                 "the module registry is full (%u modules, %llu bytes; max-module-bytes %llu) and "
                 "every module in it is in use",
                 r->nmodules, (unsigned long long)r->module_bytes,
                 (unsigned long long)max_module_bytes(r));
  if (n > 0 && (size_t)n < errlen && !r->limits.no_fair_shares)
    name_most_over(
        r,
        program ? (r->nprograms >= max_programs(r) ? POOL_PROGRAMS : POOL_PROGRAM_BYTES)
                : (r->nmodules >= GD_REGISTRY_MAX_MODULES ? POOL_MODULES : POOL_MODULE_BYTES),
        err + n, errlen - (size_t)n);
  return -GRAPHD_RESOURCE_EXHAUSTED;
}

void registry_set_limits(gd_registry *r, const gd_reg_limits *l) { r->limits = *l; }

/* registry_claim for one entry; keep is a program that must not be freed
 * to make room (the one whose modules are being claimed). */
static int claim(gd_registry *r, uint32_t uid, bool program, void *entry, const void *keep,
                 char *err, size_t errlen) {
  gd_reg_usage *use = program ? &((gd_regprog *)entry)->use : &((gd_module *)entry)->use;
  uint64_t bytes = program ? ((gd_regprog *)entry)->bytes : ((gd_module *)entry)->len;
  if (owned_by(use, uid)) return 0;
  uint64_t limit = program ? r->limits.max_programs_per_uid : r->limits.max_module_bytes_per_uid;
  uint64_t blimit = program ? r->limits.max_program_bytes_per_uid : 0;
  for (;;) {
    gd_reg_user u = registry_user(r, uid);
    uint64_t have = program ? u.programs : u.module_bytes;
    uint64_t need = program ? 1 : bytes;
    bool count_over = limit && have + need > limit;
    bool bytes_over = blimit && u.program_bytes + bytes > blimit;
    if (!count_over && !bytes_over) break;
    void *v = lru_victim(r, program, true, uid, entry, false);
    bool vprog = program;
    if (!v && !program) {
      /* The user's modules may be in use only by its own unused programs. */
      v = lru_victim(r, true, true, uid, keep, false);
      vprog = true;
    }
    if (!v) {
      /* Entries another owner holds: the user lets go, the other pays. */
      v = lru_victim(r, program, true, uid, entry, true);
      vprog = program;
    }
    if (!v) {
      if (program && !count_over)
        snprintf(err, errlen,
                 "max-program-bytes-per-uid (%llu) reached: uid %u has %llu program bytes "
                 "registered and this program is %llu more; open sessions hold the rest "
                 "(close sessions, or raise --max-program-bytes-per-uid)",
                 (unsigned long long)blimit, uid, (unsigned long long)u.program_bytes,
                 (unsigned long long)bytes);
      else if (program)
        snprintf(err, errlen,
                 "max-programs-per-uid (%llu) reached: uid %u has %u programs registered and "
                 "open sessions hold every one; close sessions or raise the limit",
                 (unsigned long long)limit, uid, u.programs);
      else
        snprintf(err, errlen,
                 "max-module-bytes-per-uid (%llu) reached: uid %u has %llu module bytes "
                 "registered and this module is %llu more; the rest are in use",
                 (unsigned long long)limit, uid, (unsigned long long)u.module_bytes,
                 (unsigned long long)bytes);
      /* Nobody else wants the entry either: it goes. */
      bool orphan = use->nowners == 0 && use->holders == 0 &&
                    (program || ((gd_module *)entry)->nlaunches == 0);
      if (orphan) {
        if (program)
          unlink_program(r, entry);
        else
          unlink_module(r, entry);
      }
      return -GRAPHD_RESOURCE_EXHAUSTED;
    }
    /* The user lets go of its least recently used unused entry; it goes
     * when nobody else owns it. */
    gd_reg_usage *vu = vprog ? &((gd_regprog *)v)->use : &((gd_module *)v)->use;
    int vi = owner_index(vu, uid);
    if (vi >= 0) {
      vu->nowners--;
      vu->owners[vi] = vu->owners[vu->nowners];
      vu->owner_holds[vi] = vu->owner_holds[vu->nowners];
    }
    charge(r, uid, vprog, vprog ? ((gd_regprog *)v)->bytes : ((gd_module *)v)->len, -1);
    if (!vu->nowners) {
      if (vprog)
        unlink_program(r, v);
      else
        unlink_module(r, v);
    }
  }
  if (use->nowners == use->owners_cap) {
    uint32_t cap = use->owners_cap ? 2 * use->owners_cap : 2;
    uint32_t *n = realloc(use->owners, cap * sizeof *n);
    if (n) use->owners = n;
    uint32_t *nh = n ? realloc(use->owner_holds, cap * sizeof *nh) : NULL;
    if (nh) use->owner_holds = nh;
    if (!n || !nh) {
      snprintf(err, errlen, "out of memory");
      return -GRAPHD_RESOURCE_EXHAUSTED;
    }
    use->owners_cap = cap;
  }
  use->owner_holds[use->nowners] = 0;
  use->owners[use->nowners++] = uid;
  charge(r, uid, program, bytes, +1);
  return 0;
}

int registry_claim(gd_registry *r, uint32_t uid, bool program, void *entry, char *err,
                   size_t errlen) {
  gd_regprog *p = entry;
  bool had = program && owned_by(&p->use, uid);
  int rc = claim(r, uid, program, entry, NULL, err, errlen);
  if (rc < 0 || !program || had) return rc;
  /* A program keeps the modules it launches: its owners pay for them too,
   * so that another user's program cannot keep a module's owner at its
   * limit (the owner may let go of a module another owner pays for). */
  for (uint32_t i = 0; i < p->program->nsteps && rc == 0; i++)
    if (p->step_module[i]) rc = claim(r, uid, false, p->step_module[i], p, err, errlen);
  return rc;
}

/* --- what sessions hold ------------------------------------------------------ */

typedef struct held {
  void *entry;  /* the key */
  uint32_t uid; /* of the holding session */
  bool program;
  UT_hash_handle hh;
} held;

struct gd_reg_holds {
  held *set;
};

int registry_hold(gd_registry *r, gd_reg_holds **h, uint32_t uid, bool program, void *entry,
                  char *err, size_t errlen) {
  gd_reg_usage *use = program ? &((gd_regprog *)entry)->use : &((gd_module *)entry)->use;
  use->used_ns = gd_now_ns();
  if (!*h && !(*h = calloc(1, sizeof **h))) goto oom;
  held *x = NULL;
  HASH_FIND_PTR((*h)->set, &entry, x);
  if (x) return 0;
  /* Past its fair share, the user is refused before it is charged for
   * anything. */
  int rc = fair_share_check(r, uid, program, entry, err, errlen);
  if (rc < 0) return rc;
  /* A hold on another user's entry is charged to the holder, as if it had
   * registered it: no user can pin more than its own limits allow. */
  rc = registry_claim(r, uid, program, entry, err, errlen);
  if (rc < 0) return rc;
  gd_reg_user *u = user_get(r, uid, true);
  if (!u) goto oom;
  if (!(x = calloc(1, sizeof *x)) || pin(r, u, program, entry) < 0) {
    free(x);
    user_gc(r, u);
    goto oom;
  }
  x->entry = entry;
  x->uid = uid;
  x->program = program;
  HASH_ADD_PTR((*h)->set, entry, x);
  use->holders++;
  int oi = owner_index(use, uid);
  if (oi >= 0) use->owner_holds[oi]++;
  return 0;
oom:
  snprintf(err, errlen, "out of memory");
  return -GRAPHD_RESOURCE_EXHAUSTED;
}

void registry_release(gd_registry *r, gd_reg_holds **h) {
  if (!*h) return;
  uint64_t now = gd_now_ns();
  held *x, *tmp;
  HASH_ITER(hh, (*h)->set, x, tmp) {
    gd_reg_usage *use = x->program ? &((gd_regprog *)x->entry)->use : &((gd_module *)x->entry)->use;
    gd_reg_user *u = user_get(r, x->uid, false);
    if (u) {
      unpin(r, u, x->program, x->entry, x->program ? ((gd_regprog *)x->entry)->program->nsteps : 0);
      user_gc(r, u);
    }
    use->holders--;
    int oi = owner_index(use, x->uid);
    if (oi >= 0 && use->owner_holds[oi]) use->owner_holds[oi]--;
    use->used_ns = now; /* in use until now */
    HASH_DEL((*h)->set, x);
    free(x);
  }
  free(*h);
  *h = NULL;
}

/* --- freeing ---------------------------------------------------------------- */

void registry_take_dead(gd_registry *r, gd_regprog **programs, gd_module **modules) {
  *programs = r->dead_programs;
  *modules = r->dead_modules;
  r->dead_programs = NULL;
  r->dead_modules = NULL;
}

static void free_program(gd_regprog *p) {
  gd_program_free(p->program);
  free(p->step_module);
  free(p->use.owners);
  free(p->use.owner_holds);
  free(p);
}

/* Maps a sealed memfd read-only. Sealing is what makes the bytes we hash the
 * bytes we later use: nobody can write them afterwards. */
int registry_map_sealed(int fd, size_t len, const char *what, const uint8_t **out, char *err,
                        size_t errlen) {
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    snprintf(err, errlen, "the %s fd is not a memfd", what);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  int need = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW;
  if ((seals & need) != need) {
    snprintf(err, errlen, "the %s memfd must be sealed against write, shrink and grow", what);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != len) {
    snprintf(err, errlen, "the %s memfd holds %lld bytes, but the request declares %zu", what,
             (long long)st.st_size, len);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  void *p = mmap(NULL, len ? len : 1, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    snprintf(err, errlen, "cannot map the %s memfd: %s", what, strerror(errno));
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  *out = p;
  return 0;
}

static void free_module(gd_module *m) {
  if (m->mapped)
    munmap((void *)m->bytes, m->len);
  else
    free((void *)m->bytes);
  free(m->use.owners);
  free(m->use.owner_holds);
  free(m);
}

void registry_free_dead_program(gd_registry *r, gd_regprog *p) {
  index_give(&r->program_index, p->index);
  r->freed_programs++;
  free_program(p);
}

void registry_free_dead_module(gd_registry *r, gd_module *m) {
  index_give(&r->module_index, m->index);
  r->freed_modules++;
  free_module(m);
}

int registry_module_new(gd_registry *r, const uint8_t id[GD_ID_LEN], uint32_t kind,
                        const void *bytes, size_t len, int fd, gd_module **out, bool *known,
                        char *err, size_t errlen) {
  *out = NULL;
  *known = false;
  if (kind < GD_MODULE_PTX || kind > GD_MODULE_HOST_ELF) {
    snprintf(err, errlen,
             "RegisterModule.kind %u is not PTX (1), CUBIN (2), fatbin (3) or host ELF (4)", kind);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  if (len == 0 || len > GD_MAX_MODULE_BYTES) {
    snprintf(err, errlen, "module of %zu bytes: the size must be 1 to %u", len,
             GD_MAX_MODULE_BYTES);
    return len ? -GRAPHD_RESOURCE_EXHAUSTED : -GRAPHD_INVALID_ARGUMENT;
  }
  if (registry_find_module(r, id)) {
    /* Same id, same bytes: nothing to do (the id is the content). */
    *known = true;
    return 0;
  }
  if (len > max_module_bytes(r)) {
    snprintf(err, errlen, "module of %zu bytes: over max-module-bytes (%llu)", len,
             (unsigned long long)max_module_bytes(r));
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  gd_module *m = calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "out of memory registering a module");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  int rc;
  if (fd >= 0) {
    rc = registry_map_sealed(fd, len, "module", &m->bytes, err, errlen);
    if (rc < 0) {
      free(m);
      return rc;
    }
    m->mapped = true;
  } else {
    uint8_t *copy = malloc(len);
    if (!copy) {
      free(m);
      snprintf(err, errlen, "out of memory registering a module of %zu bytes", len);
      return -GRAPHD_RESOURCE_EXHAUSTED;
    }
    memcpy(copy, bytes, len);
    m->bytes = copy;
  }
  m->len = len;
  m->kind = kind;
  memcpy(m->id, id, GD_ID_LEN);
  *out = m;
  return 0;
}

int registry_module_verify(const gd_module *m, char *err, size_t errlen) {
  uint8_t got[GD_ID_LEN];
  if (gd_module_id(m->kind, m->bytes, m->len, got) == 0 && memcmp(got, m->id, GD_ID_LEN) == 0)
    return 0;
  char want[2 * GD_ID_LEN + 1], have[2 * GD_ID_LEN + 1];
  gd_id_hex(m->id, 0, want);
  gd_id_hex(got, 0, have);
  snprintf(err, errlen, "module id mismatch: the request says %s but the bytes hash to %s", want,
           have);
  return -GRAPHD_INVALID_ARGUMENT;
}

int registry_module_insert(gd_registry *r, gd_module *m, bool *known, char *err, size_t errlen) {
  *known = false;
  if (registry_find_module(r, m->id)) { /* registered by another session meanwhile */
    *known = true;
    free_module(m);
    return 0;
  }
  int rc = global_room(r, false, m->len, err, errlen);
  if (rc < 0) {
    free_module(m);
    return rc;
  }
  m->index = index_take(&r->module_index);
  r->nmodules++;
  r->module_bytes += m->len;
  m->use.used_ns = gd_now_ns();
  HASH_ADD(hh, r->modules, id, GD_ID_LEN, m);
  return 0;
}

void registry_module_discard(gd_module *m) {
  if (m) free_module(m);
}

int registry_add_module(gd_registry *r, const uint8_t id[GD_ID_LEN], uint32_t kind,
                        const void *bytes, size_t len, int fd, bool *known, char *err,
                        size_t errlen) {
  gd_module *m;
  int rc = registry_module_new(r, id, kind, bytes, len, fd, &m, known, err, errlen);
  if (rc < 0 || *known) return rc;
  if ((rc = registry_module_verify(m, err, errlen)) < 0) {
    free_module(m);
    return rc;
  }
  return registry_module_insert(r, m, known, err, errlen);
}

int registry_program_decode(const uint8_t id[GD_ID_LEN], const uint8_t *enc, size_t len,
                            gd_program **out, char *err, size_t errlen) {
  gd_program *prog = NULL;
  *out = NULL;
  int rc = gd_program_decode(enc, len, &prog, err, errlen);
  if (rc < 0) return rc;
  if (memcmp(prog->id, id, GD_ID_LEN) != 0) {
    char want[2 * GD_ID_LEN + 1], got[2 * GD_ID_LEN + 1];
    gd_id_hex(id, 0, want);
    gd_id_hex(prog->id, 0, got);
    snprintf(err, errlen, "program id mismatch: the request says %s but the encoding hashes to %s",
             want, got);
    gd_program_free(prog);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  *out = prog;
  return 0;
}

int registry_program_insert(gd_registry *r, gd_program *prog, bool *known, char *err,
                            size_t errlen) {
  *known = false;
  if (registry_find_program(r, prog->id)) { /* registered by another session meanwhile */
    *known = true;
    gd_program_free(prog);
    return 0;
  }
  uint64_t bytes = registry_program_bytes(prog);
  int rc = global_room(r, true, bytes, err, errlen);
  if (rc < 0) {
    gd_program_free(prog);
    return rc;
  }
  gd_regprog *p = calloc(1, sizeof *p);
  gd_module **mods = calloc(prog->nsteps, sizeof *mods);
  if (!p || !mods) {
    free(p);
    free(mods);
    gd_program_free(prog);
    snprintf(err, errlen, "out of memory registering a program");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  for (uint32_t i = 0; i < prog->nsteps; i++) {
    if (prog->steps[i].kind != GD_STEP_LAUNCH) continue;
    mods[i] = registry_find_module(r, prog->steps[i].u.launch.module_id);
    if (!mods[i]) {
      char hex[2 * GD_ID_LEN + 1];
      gd_id_hex(prog->steps[i].u.launch.module_id, 0, hex);
      snprintf(err, errlen, "step %u (launch %s): module %s is not registered; register it first",
               i, prog->steps[i].u.launch.name, hex);
      free(p);
      free(mods);
      gd_program_free(prog);
      return -GRAPHD_NOT_FOUND;
    }
  }
  memcpy(p->id, prog->id, GD_ID_LEN);
  p->program = prog;
  p->step_module = mods;
  for (uint32_t i = 0; i < prog->nsteps; i++)
    if (mods[i]) mods[i]->nlaunches++;
  p->bytes = bytes;
  p->index = index_take(&r->program_index);
  r->nprograms++;
  r->program_bytes += bytes;
  p->use.used_ns = gd_now_ns();
  HASH_ADD(hh, r->programs, id, GD_ID_LEN, p);
  return 0;
}

uint64_t registry_program_bytes(const gd_program *p) {
  uint64_t b = sizeof(gd_regprog) + sizeof *p + (uint64_t)p->nslots * sizeof *p->slots +
               (uint64_t)p->nsteps * (sizeof *p->steps + sizeof(gd_module *));
  for (uint32_t i = 0; i < p->nsteps; i++) {
    if (p->steps[i].kind != GD_STEP_LAUNCH) continue;
    const gd_launch *l = &p->steps[i].u.launch;
    b += (uint64_t)l->nparams * sizeof *l->params + l->param_bytes +
         (uint64_t)l->npatches * sizeof *l->patches;
  }
  return b;
}

bool registry_same_program(const uint8_t id[GD_ID_LEN], const uint8_t *enc, size_t len) {
  uint8_t got[GD_ID_LEN];
  gd_sha256(enc, len, got);
  return memcmp(got, id, GD_ID_LEN) == 0;
}

int registry_add_program(gd_registry *r, const uint8_t id[GD_ID_LEN], const uint8_t *enc,
                         size_t len, bool *known, char *err, size_t errlen) {
  *known = false;
  /* The id is checked against the bytes when first registered; a repeat
   * with other bytes under the same id is still refused below. */
  if (registry_find_program(r, id) && registry_same_program(id, enc, len)) {
    *known = true;
    return 0;
  }
  gd_program *prog;
  int rc = registry_program_decode(id, enc, len, &prog, err, errlen);
  if (rc < 0) return rc;
  return registry_program_insert(r, prog, known, err, errlen);
}

void registry_close(gd_registry *r) {
  gd_regprog *p, *ptmp;
  HASH_ITER(hh, r->programs, p, ptmp) {
    HASH_DEL(r->programs, p);
    free_program(p);
  }
  gd_module *m, *mtmp;
  HASH_ITER(hh, r->modules, m, mtmp) {
    HASH_DEL(r->modules, m);
    free_module(m);
  }
  while ((p = r->dead_programs)) {
    r->dead_programs = p->next_dead;
    free_program(p);
  }
  while ((m = r->dead_modules)) {
    r->dead_modules = m->next_dead;
    free_module(m);
  }
  gd_reg_user *u, *utmp;
  HASH_ITER(hh, r->users, u, utmp) {
    gd_reg_pin *pn, *pntmp;
    HASH_ITER(hh, u->pins, pn, pntmp) {
      HASH_DEL(u->pins, pn);
      free(pn);
    }
    HASH_DEL(r->users, u);
    free(u);
  }
  free(r->module_index.free);
  free(r->program_index.free);
  memset(r, 0, sizeof *r);
}
