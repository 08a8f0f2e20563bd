/* libgraphd: registering modules and programs, and the device stage.
 * Each call takes the handle's lock for its round trip. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>
#include <stdbool.h>
#include <unistd.h>

#include "graphd/hex.h"
#include "graphd/encoding.h"
#include "internal.h"

#define INLINE_MAX (256u << 10)

/* A sealed memfd holding bytes, for modules and programs too large to
 * inline. */
static int sealed_memfd(const char *name, const void *bytes, size_t len) {
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  size_t off = 0;
  while (off < len) {
    ssize_t n = write(fd, (const char *)bytes + off, len - off);
    if (n <= 0) goto fail;
    off += (size_t)n;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
    goto fail;
  return fd;
fail:
  close(fd);
  return -1;
}

/* Sends req with `bytes` either inline (in *inline_field) or, when large,
 * as a sealed memfd (never as a giant frame): above the inline cap, or above
 * half the daemon's frame cap. Lock held. */
static graphd_status call_with_bytes_locked(graphd_client *c, Graphd__Wire__Request *req,
                                            const char *memfd_name, const void *bytes, size_t len,
                                            ProtobufCBinaryData *inline_field) {
  int fd = -1;
  graphd_status st = GRAPHD_OK;
  if (len > INLINE_MAX || (c->max_frame && len > c->max_frame / 2)) {
    fd = sealed_memfd(memfd_name, bytes, len);
    if (fd < 0) {
      st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "cannot make a sealed memfd: %s",
                             strerror(errno));
      goto exit;
    }
  } else {
    inline_field->data = (uint8_t *)bytes;
    inline_field->len = len;
  }
  Graphd__Wire__Reply *rep = NULL;
  st = gd_client_call(c, req, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, &rep);
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
exit:
  if (fd >= 0) close(fd);
  return st;
}

/* RegisterModule of bytes under id, lock held. */
static graphd_status module_locked(graphd_client *c, uint32_t kind, const uint8_t id[GD_ID_LEN],
                                   const void *bytes, size_t len) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterModule m = GRAPHD__WIRE__REGISTER_MODULE__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_MODULE;
  req.register_module = &m;
  m.module_id.data = (uint8_t *)id;
  m.module_id.len = GD_ID_LEN;
  m.kind = kind;
  m.size = len;
  return call_with_bytes_locked(c, &req, "graphd-module", bytes, len, &m.inline_bytes);
}

/* RegisterProgram of an encoding under id, lock held. */
static graphd_status program_locked(graphd_client *c, const uint8_t id[GD_ID_LEN],
                                    const void *encoding, size_t len) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterProgram m = GRAPHD__WIRE__REGISTER_PROGRAM__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_PROGRAM;
  req.register_program = &m;
  m.program_id.data = (uint8_t *)id;
  m.program_id.len = GD_ID_LEN;
  m.size = len;
  return call_with_bytes_locked(c, &req, "graphd-program", encoding, len, &m.encoding);
}

graphd_status graphd_register_module(graphd_client *c, graphd_module_kind kind, const void *bytes,
                                     size_t len, uint8_t id_out[32]) {
  GD_OWNED(c);
  uint8_t id[GD_ID_LEN];
  graphd_status st;
  pthread_mutex_lock(&c->lock);
  if (gd_module_id((uint32_t)kind, bytes, len, id) < 0)
    st = gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT,
                           "module kind %d with %zu bytes: the kind must be PTX, "
                           "CUBIN, fatbin or host ELF and the size 1 to %u bytes",
                           (int)kind, len, GD_MAX_MODULE_BYTES);
  else
    st = module_locked(c, (uint32_t)kind, id, bytes, len);
  pthread_mutex_unlock(&c->lock);
  if (st == GRAPHD_OK && id_out) memcpy(id_out, id, GD_ID_LEN);
  return st;
}

graphd_status graphd_register_program_encoding(graphd_client *c, const uint8_t id[32],
                                               const void *encoding, size_t len) {
  GD_OWNED(c);
  pthread_mutex_lock(&c->lock);
  graphd_status st = program_locked(c, id, encoding, len);
  pthread_mutex_unlock(&c->lock);
  return st;
}

graphd_status graphd_register_program(graphd_client *c, graphd_program *p) {
  GD_OWNED(c);
  uint8_t id[GD_ID_LEN];
  const uint8_t *enc;
  size_t len;
  graphd_status st = graphd_program_finish(p, id);
  if (st == GRAPHD_OK) st = graphd_program_encoding(p, &enc, &len);
  if (st != GRAPHD_OK) {
    pthread_mutex_lock(&c->lock);
    gd_client_set_err(c, st, "the program is not valid: %s", graphd_program_error(p));
    pthread_mutex_unlock(&c->lock);
    return st;
  }
  return graphd_register_program_encoding(c, id, enc, len);
}

graphd_status graphd_prepare_program(graphd_client *c, const uint8_t id[32],
                                     graphd_prepare_info *info) {
  GD_OWNED(c);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__PrepareProgram m = GRAPHD__WIRE__PREPARE_PROGRAM__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_PREPARE_PROGRAM;
  req.prepare_program = &m;
  m.program_id.data = (uint8_t *)id;
  m.program_id.len = GD_ID_LEN;
  pthread_mutex_lock(&c->lock);
  Graphd__Wire__Reply *rep = NULL;
  graphd_status st = gd_client_call(c, &req, NULL, 0, &rep);
  if (st == GRAPHD_OK && info && rep->body_case == GRAPHD__WIRE__REPLY__BODY_PREPARE_PROGRAM) {
    info->modules_loaded = rep->prepare_program->modules_loaded;
    info->load_ns = rep->prepare_program->load_ns;
  }
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
  pthread_mutex_unlock(&c->lock);
  return st;
}

/* --- the client-side registry --------------------------------------------------
 * DESIGN: one process-wide table behind reg_lock, small and searched
 * linearly (a process holds few programs). Entries are never removed. A
 * handle's own list of synced programs is guarded by its lock; the two
 * locks are never held together. */

typedef struct reg_module {
  uint8_t id[GD_ID_LEN];
  uint32_t kind;
  uint8_t *bytes;
  size_t len;
} reg_module;

typedef struct reg_program {
  uint8_t id[GD_ID_LEN];
  uint8_t *enc;
  size_t len;
  uint8_t (*mods)[GD_ID_LEN];
  uint32_t nmods;
} reg_program;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static reg_module *reg_mods; /* guarded by reg_lock */
static size_t reg_nmods, reg_mods_cap;
static reg_program *reg_progs; /* guarded by reg_lock */
static size_t reg_nprogs, reg_progs_cap;

/* fork(): taken around it, so that a child finds the registry whole and
 * its lock free (it is held only for copies, never across a request). */
static void reg_prepare(void) { pthread_mutex_lock(&reg_lock); }
static void reg_release(void) { pthread_mutex_unlock(&reg_lock); }
__attribute__((constructor)) static void reg_atfork(void) {
  pthread_atfork(reg_prepare, reg_release, reg_release);
}

static reg_module *find_mod(const uint8_t id[GD_ID_LEN]) {
  for (size_t i = 0; i < reg_nmods; i++)
    if (memcmp(reg_mods[i].id, id, GD_ID_LEN) == 0) return &reg_mods[i];
  return NULL;
}

static reg_program *find_prog(const uint8_t id[GD_ID_LEN]) {
  for (size_t i = 0; i < reg_nprogs; i++)
    if (memcmp(reg_progs[i].id, id, GD_ID_LEN) == 0) return &reg_progs[i];
  return NULL;
}

static int grow_array(void **arr, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return 0;
  size_t nc = *cap ? 2 * *cap : 16;
  void *p = realloc(*arr, nc * elem);
  if (!p) return -1;
  *arr = p;
  *cap = nc;
  return 0;
}

graphd_status graphd_registry_add_module(graphd_module_kind kind, const void *bytes, size_t len,
                                         uint8_t id_out[32]) {
  uint8_t id[GD_ID_LEN];
  if (gd_module_id((uint32_t)kind, bytes, len, id) < 0) return GRAPHD_INVALID_ARGUMENT;
  graphd_status st = GRAPHD_OK;
  pthread_mutex_lock(&reg_lock);
  if (!find_mod(id)) {
    uint8_t *copy = malloc(len);
    if (!copy || grow_array((void **)&reg_mods, &reg_mods_cap, reg_nmods, sizeof *reg_mods) < 0) {
      free(copy);
      st = GRAPHD_RESOURCE_EXHAUSTED;
    } else {
      memcpy(copy, bytes, len);
      reg_module *m = &reg_mods[reg_nmods++];
      memcpy(m->id, id, GD_ID_LEN);
      m->kind = (uint32_t)kind;
      m->bytes = copy;
      m->len = len;
    }
  }
  pthread_mutex_unlock(&reg_lock);
  if (st == GRAPHD_OK && id_out) memcpy(id_out, id, GD_ID_LEN);
  return st;
}

graphd_status graphd_registry_add_program(const uint8_t id[32], const void *encoding, size_t len) {
  gd_program *p = NULL;
  char err[256];
  if (gd_program_decode(encoding, len, &p, err, sizeof err) < 0) return GRAPHD_INVALID_ARGUMENT;
  graphd_status st = GRAPHD_OK;
  if (memcmp(p->id, id, GD_ID_LEN) != 0) {
    gd_program_free(p);
    return GRAPHD_INVALID_ARGUMENT;
  }
  uint8_t(*mods)[GD_ID_LEN] = calloc(p->nsteps, GD_ID_LEN);
  uint8_t *copy = malloc(len);
  uint32_t nmods = mods ? gd_program_modules(p, mods, p->nsteps) : 0;
  gd_program_free(p);
  pthread_mutex_lock(&reg_lock);
  if (find_prog(id)) goto exit; /* the id is the content: nothing new */
  for (uint32_t i = 0; i < nmods; i++)
    if (!find_mod(mods[i])) st = GRAPHD_NOT_FOUND;
  if (st == GRAPHD_OK &&
      (!mods || !copy ||
       grow_array((void **)&reg_progs, &reg_progs_cap, reg_nprogs, sizeof *reg_progs) < 0))
    st = GRAPHD_RESOURCE_EXHAUSTED;
  if (st == GRAPHD_OK) {
    memcpy(copy, encoding, len);
    reg_program *r = &reg_progs[reg_nprogs++];
    memcpy(r->id, id, GD_ID_LEN);
    r->enc = copy;
    r->len = len;
    r->mods = mods;
    r->nmods = nmods;
    copy = NULL;
    mods = NULL;
  }
exit:
  pthread_mutex_unlock(&reg_lock);
  free(copy);
  free(mods);
  return st;
}

static bool synced(graphd_client *c, const uint8_t id[GD_ID_LEN]) {
  pthread_mutex_lock(&c->lock);
  bool found = false;
  for (uint32_t i = 0; i < c->nsynced && !found; i++) found = !memcmp(c->synced[i], id, GD_ID_LEN);
  pthread_mutex_unlock(&c->lock);
  return found;
}

graphd_status graphd_registry_sync(graphd_client *c, const uint8_t id[32]) {
  GD_OWNED(c);
  if (synced(c, id)) return GRAPHD_OK;
  /* Copy what the session needs out of the registry, then talk to the
   * daemon without holding reg_lock. */
  pthread_mutex_lock(&reg_lock);
  reg_program *r = find_prog(id);
  if (!r) {
    pthread_mutex_unlock(&reg_lock);
    pthread_mutex_lock(&c->lock);
    char hex[2 * GD_ID_LEN + 1];
    gd_hex_encode(id, GD_ID_LEN, hex);
    graphd_status st = gd_client_set_err(c, GRAPHD_NOT_FOUND,
                                         "program %s is not in this process's registry "
                                         "(graphd_registry_add_program)",
                                         hex);
    pthread_mutex_unlock(&c->lock);
    return st;
  }
  reg_program prog = *r;
  reg_module *mods = calloc(prog.nmods ? prog.nmods : 1, sizeof *mods);
  for (uint32_t i = 0; mods && i < prog.nmods; i++) mods[i] = *find_mod(prog.mods[i]);
  pthread_mutex_unlock(&reg_lock);
  if (!mods) return GRAPHD_RESOURCE_EXHAUSTED;
  /* Entries are never freed, so the bytes stay valid without the lock. */
  graphd_status st = GRAPHD_OK;
  for (uint32_t i = 0; i < prog.nmods && st == GRAPHD_OK; i++)
    st = graphd_register_module(c, (graphd_module_kind)mods[i].kind, mods[i].bytes, mods[i].len,
                                NULL);
  free(mods);
  if (st == GRAPHD_OK) st = graphd_register_program_encoding(c, id, prog.enc, prog.len);
  if (st != GRAPHD_OK) return st;
  pthread_mutex_lock(&c->lock);
  if (c->nsynced == c->synced_cap) {
    uint32_t cap = c->synced_cap ? 2 * c->synced_cap : 8;
    void *n = realloc(c->synced, cap * sizeof *c->synced);
    if (n) {
      c->synced = n;
      c->synced_cap = cap;
    }
  }
  if (c->nsynced < c->synced_cap) memcpy(c->synced[c->nsynced++], id, GD_ID_LEN);
  pthread_mutex_unlock(&c->lock);
  return GRAPHD_OK;
}

graphd_status gd_registry_sync_again(graphd_client *c) {
  for (uint32_t k = 0; k < c->nsynced; k++) {
    /* Entries are never freed: their bytes stay valid without reg_lock. */
    pthread_mutex_lock(&reg_lock);
    reg_program *r = find_prog(c->synced[k]);
    reg_program prog = r ? *r : (reg_program){0};
    pthread_mutex_unlock(&reg_lock);
    if (!r) continue;
    for (uint32_t i = 0; i < prog.nmods; i++) {
      pthread_mutex_lock(&reg_lock);
      reg_module m = *find_mod(prog.mods[i]);
      pthread_mutex_unlock(&reg_lock);
      graphd_status st = module_locked(c, m.kind, m.id, m.bytes, m.len);
      if (st != GRAPHD_OK) return st;
    }
    graphd_status st = program_locked(c, prog.id, prog.enc, prog.len);
    if (st != GRAPHD_OK) return st;
  }
  return GRAPHD_OK;
}
