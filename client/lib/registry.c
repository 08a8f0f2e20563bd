/* libgraphd: registering modules and programs, and the device stage.
 * Each call takes the handle's lock for its round trip. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../proto/program.h"
#include "internal.h"

#define INLINE_MAX (256u << 10)

/* A sealed memfd holding bytes, for modules too large to inline. */
static int sealed_memfd(const void *bytes, size_t len) {
  int fd = memfd_create("graphd-module", MFD_CLOEXEC | MFD_ALLOW_SEALING);
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

graphd_status graphd_register_module(graphd_client *c, graphd_module_kind kind,
                                     const void *bytes, size_t len, uint8_t id_out[32]) {
  uint8_t id[GD_ID_LEN];
  if (gd_module_id((uint32_t)kind, bytes, len, id) < 0) {
    pthread_mutex_lock(&c->lock);
    graphd_status st = gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT,
                                         "module kind %d with %zu bytes: the kind must be PTX, "
                                         "CUBIN, fatbin or host ELF and the size 1 to %u bytes",
                                         (int)kind, len, GD_MAX_MODULE_BYTES);
    pthread_mutex_unlock(&c->lock);
    return st;
  }
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterModule m = GRAPHD__WIRE__REGISTER_MODULE__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_MODULE;
  req.register_module = &m;
  m.module_id.data = id;
  m.module_id.len = GD_ID_LEN;
  m.kind = (uint32_t)kind;
  m.size = len;
  int fd = -1;
  pthread_mutex_lock(&c->lock);
  graphd_status st = GRAPHD_OK;
  if (len > INLINE_MAX) {
    fd = sealed_memfd(bytes, len);
    if (fd < 0) {
      st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "cannot make a sealed memfd: %s",
                             strerror(errno));
      goto exit;
    }
  } else {
    m.inline_bytes.data = (uint8_t *)bytes;
    m.inline_bytes.len = len;
  }
  Graphd__Wire__Reply *rep = NULL;
  st = gd_client_call(c, &req, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, &rep);
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
exit:
  if (fd >= 0) close(fd);
  pthread_mutex_unlock(&c->lock);
  if (st == GRAPHD_OK && id_out) memcpy(id_out, id, GD_ID_LEN);
  return st;
}

graphd_status graphd_register_program_encoding(graphd_client *c, const uint8_t id[32],
                                               const void *encoding, size_t len) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterProgram m = GRAPHD__WIRE__REGISTER_PROGRAM__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_PROGRAM;
  req.register_program = &m;
  m.program_id.data = (uint8_t *)id;
  m.program_id.len = GD_ID_LEN;
  m.encoding.data = (uint8_t *)encoding;
  m.encoding.len = len;
  pthread_mutex_lock(&c->lock);
  Graphd__Wire__Reply *rep = NULL;
  graphd_status st = gd_client_call(c, &req, NULL, 0, &rep);
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
  pthread_mutex_unlock(&c->lock);
  return st;
}

graphd_status graphd_register_program(graphd_client *c, graphd_program *p) {
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
