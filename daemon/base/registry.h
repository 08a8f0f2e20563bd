/* The daemon-wide registry of modules and programs, keyed by SHA-256 id.
 *
 * DESIGN: the loop thread adds and removes entries (the hashing and
 * decoding before adding may run on any thread, see the phases below);
 * entries are immutable while registered. Workers read an entry without a
 * lock once a job that names it has crossed their queue's mutex.
 *
 * Who pays for an entry, and when it may go: every user (uid) that
 * registered an entry owns it, and is charged for it against the per-uid
 * limits (a program counts once and by its bytes, a module by its bytes),
 * and so is every user whose session holds it without having registered
 * it; every open session that registered it, or prepared or replayed a
 * program, holds it. An entry nobody holds is unused and may be freed,
 * least recently used first: when its owner needs room under a per-uid
 * limit (the owner lets go of it; it goes when no owner is left), or when
 * the registry as a whole is full (it goes at once). An owner at its limit
 * may also let go of an entry in use that another user owns as well (it
 * stays, charged to the other). A module that a registered program
 * launches is never freed before the program, and the program's owners
 * are charged for it too.
 *
 * Fair shares: what sessions hold cannot be freed, so the registry also
 * keeps what each user pins (the entries its open sessions hold, and the
 * modules the programs they hold launch), and a hold is refused when it
 * would take its user past the rule of share.h in any pool it adds to
 * (programs by count and by bytes, modules by count and by bytes): so
 * that other users always find room, which unpinned entries make.
 *
 * Removal has two halves: the registry unlinks the entry at once (its id
 * is unknown from then on, its counts are given back) and keeps it on a
 * dead list; the daemon then has every device forget its index (after the
 * jobs queued before, which may still use it) and frees it
 * (registry_free_dead), which is when its index may be handed out again. */
#ifndef GRAPHD_REGISTRY_H
#define GRAPHD_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uthash.h>

#include "graphd/encoding.h"

#define GD_MODULE_INLINE_MAX (256u << 10) /* larger modules come as a memfd */
#define GD_REGISTRY_MAX_MODULES 4096u
#define GD_REGISTRY_MAX_PROGRAMS 65536u
#define GD_REGISTRY_MAX_MODULE_BYTES (8ull << 30)
#define GD_REGISTRY_MAX_PROGRAM_BYTES (8ull << 30)

/* Who owns and holds an entry, and when it was last used (see above). */
typedef struct gd_reg_usage {
  uint64_t used_ns;
  uint32_t holders; /* open sessions holding it */
  uint32_t nowners, owners_cap;
  uint32_t *owners;      /* uids charged for it */
  uint32_t *owner_holds; /* per owner: its sessions that hold it */
  uint32_t pinners;      /* users that pin it (gd_reg_user.pins) */
} gd_reg_usage;

typedef struct gd_module {
  uint8_t id[GD_ID_LEN];
  uint32_t kind;
  const uint8_t *bytes;
  size_t len;
  bool mapped;        /* bytes is an mmap of a sealed memfd, else malloc'd */
  uint32_t index;     /* dense index, for per-device tables */
  uint32_t nlaunches; /* launch steps of registered programs that use it */
  uint64_t mark;      /* registry_hold counts it once per hold (gd_registry.mark) */
  gd_reg_usage use;
  struct gd_module *next_dead;
  UT_hash_handle hh;
} gd_module;

typedef struct gd_regprog {
  uint8_t id[GD_ID_LEN];
  gd_program *program;
  gd_module **step_module; /* per step: the launch's module, NULL otherwise */
  uint64_t bytes;          /* what it takes in memory (registry_program_bytes) */
  uint32_t index;          /* dense index, for per-device tables */
  gd_reg_usage use;
  struct gd_regprog *next_dead;
  UT_hash_handle hh;
} gd_regprog;

/* One entry a user pins, and how many times (its sessions' holds, and
 * for a module the launches of the programs they hold). */
typedef struct gd_reg_pin {
  void *entry; /* the key */
  uint32_t refs;
  UT_hash_handle hh;
} gd_reg_pin;

/* What one pool of the registry holds pinned: entries (each once) and
 * their bytes; per user, or over all users. */
typedef struct gd_reg_pinned {
  uint32_t programs, modules;
  uint64_t program_bytes, module_bytes;
} gd_reg_pinned;

/* What one user is charged for, and what it pins. */
typedef struct gd_reg_user {
  uint32_t uid;
  uint32_t programs;
  uint64_t program_bytes;
  uint64_t module_bytes;
  gd_reg_pinned pinned;
  gd_reg_pin *pins; /* uthash by entry */
  UT_hash_handle hh;
} gd_reg_user;

/* The limits; 0 leaves a per-uid one off. */
typedef struct gd_reg_limits {
  uint32_t max_programs;     /* in all (at most GD_REGISTRY_MAX_PROGRAMS) */
  uint64_t max_module_bytes; /* in all (at most GD_REGISTRY_MAX_MODULE_BYTES) */
  uint32_t max_programs_per_uid;
  uint64_t max_module_bytes_per_uid;
  uint64_t max_program_bytes; /* in all (at most GD_REGISTRY_MAX_PROGRAM_BYTES) */
  uint64_t max_program_bytes_per_uid;
  bool no_fair_shares; /* --fair-shares no: the pools have no shares */
} gd_reg_limits;

/* A dense index that is handed out again once freed. */
typedef struct gd_reg_index {
  uint32_t next;
  uint32_t *free;
  uint32_t nfree, free_cap;
} gd_reg_index;

typedef struct gd_registry {
  gd_module *modules;   /* uthash head */
  gd_regprog *programs; /* uthash head */
  uint32_t nmodules, nprograms;
  uint64_t module_bytes, program_bytes;
  gd_reg_limits limits;
  gd_reg_user *users; /* uthash head */
  /* Pinned over all users, and how many users pin programs, and modules:
   * the fair shares' terms. */
  gd_reg_pinned pinned;
  uint32_t program_pinners, module_pinners;
  uint64_t mark; /* gd_module.mark */
  gd_reg_index module_index, program_index;
  /* Unlinked, to be forgotten by every device and then freed. */
  gd_module *dead_modules;
  gd_regprog *dead_programs;
  uint64_t freed_programs, freed_modules; /* since start */
} gd_registry;

/* The set of entries one session holds (opaque). */
typedef struct gd_reg_holds gd_reg_holds;

/* Registers module bytes (inline: bytes/len; or a sealed memfd of len
 * bytes: fd >= 0, not closed here). The daemon recomputes the id and
 * refuses a mismatch. *known is set when the id was already registered. */
int registry_add_module(gd_registry *r, const uint8_t id[GD_ID_LEN], uint32_t kind,
                        const void *bytes, size_t len, int fd, bool *known, char *err,
                        size_t errlen);

/* The same in phases, so that hashing and decoding, which take time in
 * proportion to the bytes, can run off the loop thread:
 * - registry_module_new (loop): the cheap checks and the bytes (copied,
 *   or the memfd mapped), in a module that is not registered yet, or
 *   *known when the id is;
 * - registry_module_verify (any thread): hashes the bytes against the id;
 * - registry_module_insert (loop): registers it, or frees it with *known
 *   when another session registered the id meanwhile; it takes m.
 * registry_module_discard frees a module that is not inserted. */
int registry_module_new(gd_registry *r, const uint8_t id[GD_ID_LEN], uint32_t kind,
                        const void *bytes, size_t len, int fd, gd_module **out, bool *known,
                        char *err, size_t errlen);
int registry_module_verify(const gd_module *m, char *err, size_t errlen);
int registry_module_insert(gd_registry *r, gd_module *m, bool *known, char *err, size_t errlen);
void registry_module_discard(gd_module *m);

/* Maps a memfd sealed against write, shrink and grow, of exactly len bytes,
 * read-only (munmap it when done). `what` names it in errors. */
int registry_map_sealed(int fd, size_t len, const char *what, const uint8_t **out, char *err,
                        size_t errlen);

/* Decodes and validates a canonical program encoding, checks the claimed id
 * and that every module it launches is registered. */
int registry_add_program(gd_registry *r, const uint8_t id[GD_ID_LEN], const uint8_t *enc,
                         size_t len, bool *known, char *err, size_t errlen);

/* In phases, as for modules: registry_program_decode (any thread) decodes,
 * validates and checks the id; registry_program_insert (loop) checks that
 * its modules are registered and registers it, taking prog (freed with
 * *known when the id was registered meanwhile). registry_same_program
 * (any thread) says whether an encoding hashes to id. */
int registry_program_decode(const uint8_t id[GD_ID_LEN], const uint8_t *enc, size_t len,
                            gd_program **out, char *err, size_t errlen);
int registry_program_insert(gd_registry *r, gd_program *prog, bool *known, char *err,
                            size_t errlen);
bool registry_same_program(const uint8_t id[GD_ID_LEN], const uint8_t *enc, size_t len);

/* The memory a decoded program takes in the registry (its steps, slots,
 * parameters and patches): what it is charged as program bytes. */
uint64_t registry_program_bytes(const gd_program *p);

gd_module *registry_find_module(gd_registry *r, const uint8_t id[GD_ID_LEN]);
gd_regprog *registry_find_program(gd_registry *r, const uint8_t id[GD_ID_LEN]);

/* The registry's limits; a zero total means the compiled-in maximum.
 * Before the first entry. */
void registry_set_limits(gd_registry *r, const gd_reg_limits *l);

/* Charges user uid for an entry it registered (program, or module), once
 * per user: if that takes the user over a per-uid limit, the user's unused
 * entries are let go, least recently used first, and when that is not
 * enough the charge is refused with RESOURCE_EXHAUSTED naming the limit
 * (and an entry nobody owns or holds is unlinked). A program's first
 * charge to uid also charges uid for the modules it launches. */
int registry_claim(gd_registry *r, uint32_t uid, bool program, void *entry, char *err,
                   size_t errlen);

/* The session *h, of user uid, holds the entry from now on (once); it is
 * used now. A user that does not own the entry is charged for it first
 * (registry_claim), so that holds count against the holder's limits;
 * RESOURCE_EXHAUSTED (err filled) when they do not let it, or when the
 * hold would take the user past its fair share (see above). */
int registry_hold(gd_registry *r, gd_reg_holds **h, uint32_t uid, bool program, void *entry,
                  char *err, size_t errlen);

/* Whether uid is charged for (owns) the entry: who may see its id. */
bool registry_owns(const gd_reg_usage *u, uint32_t uid);

/* The entry is used now (a replay). */
static inline void registry_touch(gd_reg_usage *u, uint64_t now_ns) { u->used_ns = now_ns; }

/* The session closed: it holds nothing any more; frees *h. */
void registry_release(gd_registry *r, gd_reg_holds **h);

/* What a user is charged for (zeros for a stranger). */
gd_reg_user registry_user(gd_registry *r, uint32_t uid);

/* Takes the dead lists (unlinked entries); the caller has every device
 * forget them, then frees each with registry_free_dead_*. */
void registry_take_dead(gd_registry *r, gd_regprog **programs, gd_module **modules);
void registry_free_dead_program(gd_registry *r, gd_regprog *p);
void registry_free_dead_module(gd_registry *r, gd_module *m);

/* Frees everything (at exit, after the workers stopped). */
void registry_close(gd_registry *r);

#endif
