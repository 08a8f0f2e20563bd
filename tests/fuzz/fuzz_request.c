/* libFuzzer harness: every request the daemon takes, through a real daemon
 * in this process. Each input starts a daemon on two host devices (its
 * loop, its two worker threads, its registry holding the module built from
 * fuzz_kernels.c) and drives up to three client connections, made with
 * socketpair() and adopted as sessions just as accepted ones are; then it
 * shuts the daemon down and frees everything, so that leaks show.
 *
 * The input is a one-byte header, then records (integers little-endian):
 *   header  bit 0: --device-budget 64K; bit 1: --max-region-bytes-per-uid 1M
 *   u8      connection: bits 0-1 pick one of three (3 is 0); bit 7 closes
 *           it instead (a client that leaves; the rest of the record is
 *           still read and ignored); a closed connection is opened again by
 *           its next request
 *   u8      fds: bits 0-1: 0 none, 1 one memfd, 2 two memfds, 3 a pipe (not
 *           a memfd); bits 2-3 the memfds' seals: 0 shrink, grow and seal
 *           (libgraphd's), 1 none, 2 shrink only, 3 write, shrink, grow and
 *           seal (what modules and programs need); bit 6: leave the
 *           request's declared nfds as it is
 *   u32     the memfds' size (modulo 1 MiB + 1)
 *   u16 n, n bytes: a Request message
 *   u16 n, n bytes: the memfds' first bytes
 * A record whose Request does not decode is skipped (fuzz_frame covers
 * that), as is one that would run forever by design: a program with a
 * `while` step (a loop runs until its body clears the word, as on a GPU)
 * or a launch of more than 4096 blocks (host devices run each in turn).
 *
 * Before a request is sent, fields a fuzzer cannot forge are filled in:
 * the request id (a count) and nfds (the fds sent, unless asked not to);
 * a 1-byte Hello.device_uuid names device byte % 2; a 1-byte module or
 * program id in RegisterModule or RegisterProgram becomes the hash of the
 * bytes it carries; a launch whose module id is all zeros launches the fuzz
 * module (the program is encoded again); a 1-byte program id in
 * PrepareProgram or Replay names a program this input registered, or the
 * fuzz module's program made at start. Before a Replay the harness raises
 * the ready word of its stream slot to its seq, as the client's stream
 * would, in the flag page the session registered.
 *
 * What must hold: nothing crashes or leaks (no memory, and no mapping of a
 * client's memfd once the daemon is down), and every request is answered
 * (or its session closed) within 20 s; a request left unanswered aborts.
 * The answer may be one to request id 0, which says the frame did not
 * decode: the harness packs the request again, and protobuf-c may pack
 * what it will not unpack. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/file.h"
#include "daemon/sessions/daemon.h"
#include "daemon/device_table.h"
#include "daemon/requests/router.h"
#include "daemon/sessions/data_session.h"
#include "common/log.h"
#include "graphd/frame.h"
#include "graphd.pb-c.h"
#include "graphd/protocol.h"
#include "graphd/encoding.h"
#include "graphd/wire.h"

#define NCONN 3
#define NDEV 2
#define MAX_MEMFD (1u << 20)
#define MAX_BLOCKS 4096u
#define MAX_PROGS 32
#define ANSWER_S 20.0

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The fuzz module, read once. */
static uint8_t *mod_bytes;
static size_t mod_len;
static uint8_t mod_id[GD_ID_LEN];
/* A program of the fuzz module, its encoding made once. */
static uint8_t *base_enc;
static size_t base_len;
static uint8_t base_id[GD_ID_LEN];

typedef struct conn {
  int fd; /* the client's end, -1 when closed */
  gd_frame_reader rd;
  uint64_t *flags; /* the flag page the daemon took, mapped here */
  uint32_t flag_slots;
} conn;

typedef struct harness {
  uv_loop_t loop;
  gd_options opt;
  gd_daemon d;
  conn c[NCONN];
  uint64_t next_id;
  uint8_t progs[MAX_PROGS][GD_ID_LEN]; /* programs this input registered */
  int nprogs;
} harness;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A program of two slots: a memset, a copy, a launch of fuzz_nop and one of
 * fuzz_shared with 64 bytes of shared memory. */
static void make_base_program(void) {
  gd_slot slots[2] = {{GD_ROLE_INPUT, GD_SLOT_STAGED, 256}, {GD_ROLE_OUTPUT, GD_SLOT_STAGED, 256}};
  gd_param params[2] = {{0, 4}, {8, 8}};
  uint8_t pdata[16] = {7};
  gd_step steps[4];
  memset(steps, 0, sizeof steps);
  steps[0].kind = GD_STEP_MEMSET;
  steps[0].u.memset = (gd_memset){.slot = 1, .element_size = 4, .value = 1, .bytes = 64};
  steps[1].kind = GD_STEP_COPY;
  steps[1].u.copy = (gd_copy){.dst_slot = 1, .src_slot = 0, .dst_offset = 64, .bytes = 128};
  steps[2].kind = GD_STEP_LAUNCH;
  memcpy(steps[2].u.launch.module_id, mod_id, GD_ID_LEN);
  snprintf(steps[2].u.launch.name, sizeof steps[2].u.launch.name, "fuzz_nop");
  steps[2].u.launch.grid[0] = steps[2].u.launch.grid[1] = steps[2].u.launch.grid[2] = 1;
  steps[2].u.launch.block[0] = steps[2].u.launch.block[1] = steps[2].u.launch.block[2] = 1;
  steps[3] = steps[2];
  snprintf(steps[3].u.launch.name, sizeof steps[3].u.launch.name, "fuzz_shared");
  steps[3].u.launch.grid[0] = 2;
  steps[3].u.launch.shared_bytes = 64;
  steps[3].u.launch.nparams = 2;
  steps[3].u.launch.params = params;
  steps[3].u.launch.param_bytes = sizeof pdata;
  steps[3].u.launch.param_data = pdata;
  gd_program p = {.mode = GD_MODE_STAGED, .nslots = 2, .slots = slots, .nsteps = 4, .steps = steps};
  char err[512];
  if (gd_program_encode(&p, &base_enc, &base_len, err, sizeof err) < 0) {
    fprintf(stderr, "fuzz_request: the base program: %s\n", err);
    abort();
  }
  memcpy(base_id, p.id, GD_ID_LEN);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  const char *path = getenv("GRAPHD_FUZZ_KERNELS");
  if (!path) path = FUZZ_KERNELS_SO;
  mod_bytes = gd_read_file(path, &mod_len);
  if (!mod_bytes) {
    fprintf(stderr, "fuzz_request: cannot read the fuzz module %s\n", path);
    abort();
  }
  gd_module_id(GD_MODULE_HOST_ELF, mod_bytes, mod_len, mod_id);
  make_base_program();
  gd_log_level = getenv("GRAPHD_FUZZ_LOG") ? GD_DEBUG : -1;
  return 0;
}

/* --- the daemon -------------------------------------------------------------- */

static void daemon_up(harness *h, uint8_t header) {
  char err[512];
  gd_daemon *d = &h->d;
  options_defaults(&h->opt);
  h->opt.admin_group[0] = 0;
  h->opt.ready_timeout_s = 1;
  h->opt.max_frame = 1u << 20;
  if (header & 1) h->opt.device_budget = 64u << 10;
  if (header & 2) h->opt.max_region_bytes_per_uid = 1u << 20;
  uv_loop_init(&h->loop);
  d->loop = &h->loop;
  d->opt = &h->opt;
  d->euid = geteuid();
  if (backend_host_new(NDEV, 16u << 20, &d->be, err, sizeof err) < 0) abort();
  d->ndevices = NDEV;
  d->facts = calloc(NDEV, sizeof *d->facts);
  d->counters = calloc(NDEV, sizeof *d->counters);
  if (!d->facts || !d->counters) abort();
  int idx[NDEV];
  for (int i = 0; i < NDEV; i++) {
    idx[i] = i;
    d->facts[i] = &d->be->devices[i];
  }
  if (device_table_start(d, &h->loop, idx, NDEV, h->opt.device_budget) < 0) abort();
  d->start_ns = gd_now_ns();
  d->sessions.loop = &h->loop;
  d->sessions.max_frame = h->opt.max_frame;
  router_attach(d);
  bool known;
  if (registry_add_module(&d->reg, mod_id, GD_MODULE_HOST_ELF, mod_bytes, mod_len, -1, &known, err,
                          sizeof err) < 0 ||
      registry_add_program(&d->reg, base_id, base_enc, base_len, &known, err, sizeof err) < 0) {
    fprintf(stderr, "fuzz_request: %s\n", err);
    abort();
  }
  for (int i = 0; i < NCONN; i++) h->c[i].fd = -1;
}

static void conn_close(conn *c) {
  if (c->fd < 0) return;
  close(c->fd);
  c->fd = -1;
  gd_frame_reader_close(&c->rd);
  if (c->flags) munmap(c->flags, (size_t)c->flag_slots * GRAPHD_FLAG_STRIDE);
  c->flags = NULL;
  c->flag_slots = 0;
}

static void daemon_down(harness *h) {
  gd_daemon *d = &h->d;
  for (int i = 0; i < NCONN; i++) conn_close(&h->c[i]);
  d->shutting_down = true;
  for (gd_session *x = d->sessions.head, *next; x; x = next) {
    next = x->next;
    session_stop_reading(x);
  }
  if (worker_pool_stop(&d->pool, 0) != 0) abort();
  while (d->sessions.head) session_close(d->sessions.head, "fuzz input done");
  worker_pool_close(&d->pool);
  uv_run(&h->loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&h->loop) != 0) {
    fprintf(stderr, "fuzz_request: the loop closed with handles open\n");
    abort();
  }
  worker_pool_free(&d->pool);
  device_table_free(d);
  registry_close(&d->reg);
  data_session_maps_free(d); /* what sessions whose end the stopped workers refused still counted */
  free(d->facts);
  free(d->counters);
  d->be->ops->destroy(d->be);
}

static int conn_open(harness *h, conn *c) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return -1;
  gd_session *s;
  if (session_new(&h->d.sessions, sv[1], &s) < 0) {
    close(sv[0]);
    return -1;
  }
  /* Not an admin (graphd's own uid is one): host modules stay the fuzz
   * module, never fuzzed bytes loaded as native code. */
  s->uid = 65534;
  s->gid = 65534;
  fcntl(sv[0], F_SETFL, O_NONBLOCK);
  c->fd = sv[0];
  gd_frame_reader_init(&c->rd, 64u << 20);
  return 0;
}

/* --- records ----------------------------------------------------------------- */

typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader;

static bool take(reader *r, size_t n, const uint8_t **out) {
  if (r->n < n) return false;
  *out = r->p;
  r->p += n;
  r->n -= n;
  return true;
}

static bool take_u(reader *r, size_t n, uint64_t *v) {
  const uint8_t *p;
  if (!take(r, n, &p)) return false;
  *v = 0;
  for (size_t i = 0; i < n; i++) *v |= (uint64_t)p[i] << (8 * i);
  return true;
}

static int make_memfd(unsigned seals, uint64_t bytes, const uint8_t *payload, size_t plen) {
  int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (plen > bytes) plen = (size_t)bytes;
  if (ftruncate(fd, (off_t)bytes) < 0 || (plen && pwrite(fd, payload, plen, 0) != (ssize_t)plen)) {
    close(fd);
    return -1;
  }
  static const int seal_sets[4] = {F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, 0, F_SEAL_SHRINK,
                                   F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL};
  if (seal_sets[seals & 3] && fcntl(fd, F_ADD_SEALS, seal_sets[seals & 3]) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Whether a program would run without end on a host device. */
static bool runs_forever(const gd_program *p) {
  for (uint32_t i = 0; i < p->nsteps; i++) {
    const gd_step *s = &p->steps[i];
    if (s->kind == GD_STEP_WHILE) return true;
    if (s->kind == GD_STEP_LAUNCH) {
      const uint32_t *g = s->u.launch.grid;
      if ((uint64_t)g[0] * g[1] * g[2] > MAX_BLOCKS) return true;
    }
  }
  return false;
}

/* The fix-ups of a program encoding (see the top). Returns false when the
 * record is to be skipped; *enc and *len may be replaced by a malloc'd
 * encoding (*made). */
static bool fix_program(const uint8_t **enc, size_t *len, uint8_t **made) {
  gd_program *p = NULL;
  char err[512];
  *made = NULL;
  if (gd_program_decode(*enc, *len, &p, err, sizeof err) < 0) return true; /* the daemon refuses */
  bool skip = runs_forever(p), changed = false;
  static const uint8_t zero[GD_ID_LEN];
  for (uint32_t i = 0; !skip && i < p->nsteps; i++) {
    gd_step *s = &p->steps[i];
    if (s->kind == GD_STEP_LAUNCH && !memcmp(s->u.launch.module_id, zero, GD_ID_LEN)) {
      memcpy(s->u.launch.module_id, mod_id, GD_ID_LEN);
      changed = true;
    }
  }
  if (!skip && changed && gd_program_encode(p, made, len, err, sizeof err) == 0) *enc = *made;
  gd_program_free(p);
  return !skip;
}

/* A bytes field swapped for the time of one pack. */
typedef struct swap {
  ProtobufCBinaryData *field, saved;
} swap;

static void swap_in(swap *sw, int *n, ProtobufCBinaryData *field, uint8_t *data, size_t len) {
  sw[*n].field = field;
  sw[*n].saved = *field;
  field->data = data;
  field->len = len;
  (*n)++;
}

static const uint8_t *known_program(harness *h, uint8_t pick) {
  int n = h->nprogs + 1;
  int k = pick % n;
  return k == h->nprogs ? base_id : h->progs[k];
}

/* Reads the client's end until the answer to request id comes, or the
 * daemon closes the connection, running the loop meanwhile. Replies to
 * RegisterFlags that succeeded keep the flag page mapped here. */
static void await_answer(harness *h, conn *c, uint64_t id, int flags_fd, uint32_t flag_slots) {
  double t0 = now_s();
  for (;;) {
    uv_run(&h->loop, UV_RUN_NOWAIT);
    for (;;) {
      ssize_t n = gd_frame_reader_recv(&c->rd, c->fd);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        conn_close(c); /* the daemon closed it */
        return;
      }
      if (n < 0) break;
      gd_frame f;
      int rc;
      while ((rc = gd_frame_reader_next(&c->rd, &f)) == 1) {
        for (int i = 0; i < f.nfds; i++) close(f.fds[i]);
        Graphd__Wire__Reply *r = graphd__wire__reply__unpack(NULL, f.len, f.data);
        if (!r) abort(); /* the daemon's replies always decode */
        /* Request id 0 answers a frame that does not decode: protobuf-c
         * may pack again what it will not unpack (a field number 0 read
         * from a tag in a longer form than needed). */
        bool mine = r->request_id == id || r->request_id == 0;
        if (getenv("GRAPHD_FUZZ_LOG"))
          fprintf(stderr, "fuzz_request: request %llu: code %u %s\n",
                  (unsigned long long)r->request_id, r->code, r->message ? r->message : "");
        if (mine && r->code == 0 && r->body_case == GRAPHD__WIRE__REPLY__BODY_REGISTER_FLAGS &&
            flags_fd >= 0 && !c->flags) {
          void *p = mmap(NULL, (size_t)flag_slots * GRAPHD_FLAG_STRIDE, PROT_READ | PROT_WRITE,
                         MAP_SHARED, flags_fd, 0);
          if (p != MAP_FAILED) {
            c->flags = p;
            c->flag_slots = flag_slots;
          }
        }
        graphd__wire__reply__free_unpacked(r, NULL);
        if (mine) return;
      }
      if (rc < 0) abort(); /* a reply over 64 MiB */
    }
    if (now_s() - t0 > ANSWER_S) {
      fprintf(stderr, "fuzz_request: request %llu was not answered in %.0f s\n",
              (unsigned long long)id, ANSWER_S);
      abort();
    }
    struct pollfd pf[2] = {{uv_backend_fd(&h->loop), POLLIN, 0}, {c->fd, POLLIN, 0}};
    int timeout = uv_backend_timeout(&h->loop);
    poll(pf, 2, timeout < 0 || timeout > 10 ? 10 : timeout);
  }
}

/* One record: false when the input is used up. */
static bool run_record(harness *h, reader *in) {
  uint64_t which, fdspec, bytes, rlen, plen;
  const uint8_t *rbytes, *payload;
  if (!take_u(in, 1, &which) || !take_u(in, 1, &fdspec) || !take_u(in, 4, &bytes) ||
      !take_u(in, 2, &rlen) || !take(in, rlen, &rbytes) || !take_u(in, 2, &plen) ||
      !take(in, plen, &payload))
    return false;
  conn *c = &h->c[(which & 3) % NCONN];
  if (which & 0x80) {
    conn_close(c);
    return true;
  }
  Graphd__Wire__Request *req = graphd__wire__request__unpack(NULL, rlen, rbytes);
  if (!req) return true;
  bytes %= MAX_MEMFD + 1;
  int nfds = 0, fds[2] = {-1, -1};
  unsigned kind = fdspec & 3, seals = (fdspec >> 2) & 3;
  swap sw[4];
  int nsw = 0;
  uint8_t id[GD_ID_LEN], *made = NULL;
  uint8_t uuid[16];
  const uint8_t *enc = NULL;
  size_t enc_len = 0;
  bool skip = false;

  /* The fix-ups of the fields a fuzzer cannot forge. */
  switch (req->body_case) {
    case GRAPHD__WIRE__REQUEST__BODY_HELLO: {
      ProtobufCBinaryData *u = &req->hello->device_uuid;
      if (u->len == 1) {
        memcpy(uuid, h->d.facts[u->data[0] % NDEV]->uuid, 16);
        swap_in(sw, &nsw, u, uuid, 16);
      }
      break;
    }
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_MODULE: {
      Graphd__Wire__RegisterModule *m = req->register_module;
      if (m->module_id.len == 1) {
        bool by_fd = kind == 1 && !m->inline_bytes.len;
        gd_module_id(m->kind, by_fd ? payload : m->inline_bytes.data,
                     by_fd ? (size_t)(plen < bytes ? plen : bytes) : m->inline_bytes.len, id);
        swap_in(sw, &nsw, &m->module_id, id, GD_ID_LEN);
      }
      break;
    }
    case GRAPHD__WIRE__REQUEST__BODY_REGISTER_PROGRAM: {
      Graphd__Wire__RegisterProgram *m = req->register_program;
      bool by_fd = kind == 1 && !m->encoding.len;
      enc = by_fd ? payload : m->encoding.data;
      enc_len = by_fd ? (size_t)(plen < bytes ? plen : bytes) : m->encoding.len;
      if (!fix_program(&enc, &enc_len, &made)) {
        skip = true;
        break;
      }
      if (by_fd) {
        payload = enc;
        plen = bytes = enc_len;
        if (m->size == 0) m->size = enc_len;
      } else if (made) {
        swap_in(sw, &nsw, &m->encoding, made, enc_len);
      }
      if (m->program_id.len == 1) {
        gd_sha256(enc, enc_len, id);
        swap_in(sw, &nsw, &m->program_id, id, GD_ID_LEN);
        if (h->nprogs < MAX_PROGS) memcpy(h->progs[h->nprogs++], id, GD_ID_LEN);
      }
      break;
    }
    case GRAPHD__WIRE__REQUEST__BODY_PREPARE_PROGRAM: {
      ProtobufCBinaryData *p = &req->prepare_program->program_id;
      if (p->len == 1) swap_in(sw, &nsw, p, (uint8_t *)known_program(h, p->data[0]), GD_ID_LEN);
      break;
    }
    case GRAPHD__WIRE__REQUEST__BODY_REPLAY: {
      ProtobufCBinaryData *p = &req->replay->program_id;
      if (p->len == 1) swap_in(sw, &nsw, p, (uint8_t *)known_program(h, p->data[0]), GD_ID_LEN);
      break;
    }
    default: break;
  }
  if (skip) goto exit;

  if (c->fd < 0 && conn_open(h, c) < 0) goto exit;
  if (req->body_case == GRAPHD__WIRE__REQUEST__BODY_REPLAY && c->flags &&
      req->replay->stream_slot < c->flag_slots) {
    /* The client's stream reached the call. */
    uint64_t *ready =
        &c->flags[req->replay->stream_slot * GRAPHD_FLAG_WORDS_PER_SLOT + GRAPHD_FLAG_WORD_READY];
    if (__atomic_load_n(ready, __ATOMIC_ACQUIRE) < req->replay->seq)
      __atomic_store_n(ready, req->replay->seq, __ATOMIC_RELEASE);
  }
  if (kind == 1 || kind == 2) {
    for (unsigned i = 0; i < kind; i++)
      if ((fds[nfds] = make_memfd(seals, bytes, payload, plen)) >= 0) nfds++;
  } else if (kind == 3) {
    int pp[2];
    if (pipe2(pp, O_CLOEXEC) == 0) {
      close(pp[1]);
      fds[nfds++] = pp[0];
    }
  }
  req->request_id = ++h->next_id;
  if (!(fdspec & 0x40)) req->nfds = (uint32_t)nfds;
  uint8_t *frame = NULL;
  size_t flen = 0;
  if (gd_wire_pack_request(req, 1u << 20, &frame, &flen) == 0) {
    /* The socket holds a frame of up to 1 MiB, and the daemon reads as it
     * comes: send it in pieces while running the loop. */
    size_t off = 0;
    double t0 = now_s();
    while (off < flen && c->fd >= 0) {
      ssize_t n = gd_frame_sendmsg(c->fd, frame + off, flen - off, off ? NULL : fds, off ? 0 : nfds,
                                   MSG_DONTWAIT);
      if (n > 0) {
        off += (size_t)n;
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        break;
      } else {
        uv_run(&h->loop, UV_RUN_NOWAIT);
        if (now_s() - t0 > ANSWER_S) abort();
      }
    }
    free(frame);
    bool flags = req->body_case == GRAPHD__WIRE__REQUEST__BODY_REGISTER_FLAGS;
    if (c->fd >= 0 && off == flen)
      await_answer(h, c, req->request_id, flags && nfds == 1 ? fds[0] : -1,
                   flags ? req->register_flags->slots : 0);
  }
exit:
  for (int i = 0; i < nfds; i++) close(fds[i]);
  for (int i = nsw - 1; i >= 0; i--) *sw[i].field = sw[i].saved;
  free(made);
  graphd__wire__request__free_unpacked(req, NULL);
  return true;
}

/* Mappings of this input's memfds still in the process: LeakSanitizer
 * sees no mmap, so the harness counts them itself. */
static int memfds_mapped(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return 0;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "/memfd:fuzz ")) n++;
  fclose(f);
  return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  harness *h = calloc(1, sizeof *h);
  if (!h) abort();
  daemon_up(h, data[0]);
  reader in = {data + 1, size - 1};
  while (run_record(h, &in)) {
  }
  daemon_down(h);
  free(h);
  int left = memfds_mapped();
  if (left) {
    fprintf(stderr, "fuzz_request: %d mappings of client memfds outlive the daemon\n", left);
    abort();
  }
  return 0;
}
