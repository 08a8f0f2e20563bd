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

#include "graphd/status.h"

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
  free(m);
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
  if (r->nmodules >= GD_REGISTRY_MAX_MODULES ||
      r->module_bytes + len > GD_REGISTRY_MAX_MODULE_BYTES) {
    snprintf(err, errlen, "the module registry is full (%u modules, %llu bytes)", r->nmodules,
             (unsigned long long)r->module_bytes);
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
  if (r->nmodules >= GD_REGISTRY_MAX_MODULES ||
      r->module_bytes + m->len > GD_REGISTRY_MAX_MODULE_BYTES) {
    snprintf(err, errlen, "the module registry is full (%u modules, %llu bytes)", r->nmodules,
             (unsigned long long)r->module_bytes);
    free_module(m);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  m->index = r->nmodules++;
  r->module_bytes += m->len;
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
  if (r->nprograms >= GD_REGISTRY_MAX_PROGRAMS) {
    snprintf(err, errlen, "the program registry is full (%u programs)", r->nprograms);
    gd_program_free(prog);
    return -GRAPHD_RESOURCE_EXHAUSTED;
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
  p->index = r->nprograms++;
  HASH_ADD(hh, r->programs, id, GD_ID_LEN, p);
  return 0;
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
  if (r->nprograms >= GD_REGISTRY_MAX_PROGRAMS) {
    snprintf(err, errlen, "the program registry is full (%u programs)", r->nprograms);
    return -GRAPHD_RESOURCE_EXHAUSTED;
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
    gd_program_free(p->program);
    free(p->step_module);
    free(p);
  }
  gd_module *m, *mtmp;
  HASH_ITER(hh, r->modules, m, mtmp) {
    HASH_DEL(r->modules, m);
    free_module(m);
  }
  memset(r, 0, sizeof *r);
}
