/* The daemon-wide registry of modules and programs, keyed by SHA-256 id.
 *
 * DESIGN: the loop thread adds entries (the hashing and decoding before
 * that may run on any thread, see the phases below); entries are immutable once added
 * and are never removed while the daemon runs (eviction frees captures and
 * per-device loads, not registrations: a device reset keeps programs and
 * modules across device resets). Workers therefore read an entry without a
 * lock once a job that names it has crossed their queue's mutex. */
#ifndef GRAPHD_REGISTRY_H
#define GRAPHD_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uthash.h>

#include "../proto/program.h"

#define GD_MODULE_INLINE_MAX (256u << 10) /* larger modules come as a memfd */
#define GD_REGISTRY_MAX_MODULES 4096u
#define GD_REGISTRY_MAX_PROGRAMS 65536u
#define GD_REGISTRY_MAX_MODULE_BYTES (8ull << 30)

typedef struct gd_module {
  uint8_t id[GD_ID_LEN];
  uint32_t kind;
  const uint8_t *bytes;
  size_t len;
  bool mapped;    /* bytes is an mmap of a sealed memfd, else malloc'd */
  uint32_t index; /* dense index, for per-device tables */
  UT_hash_handle hh;
} gd_module;

typedef struct gd_regprog {
  uint8_t id[GD_ID_LEN];
  gd_program *program;
  gd_module **step_module; /* per step: the launch's module, NULL otherwise */
  uint32_t index;          /* dense index, for per-device tables */
  UT_hash_handle hh;
} gd_regprog;

typedef struct gd_registry {
  gd_module *modules;   /* uthash head */
  gd_regprog *programs; /* uthash head */
  uint32_t nmodules, nprograms;
  uint64_t module_bytes;
} gd_registry;

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

gd_module *registry_find_module(gd_registry *r, const uint8_t id[GD_ID_LEN]);
gd_regprog *registry_find_program(gd_registry *r, const uint8_t id[GD_ID_LEN]);

/* Frees everything (at exit, after the workers stopped). */
void registry_close(gd_registry *r);

#endif
