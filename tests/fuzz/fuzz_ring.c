/* libFuzzer harness: a session's submission ring as the device's worker
 * reads it (ring_replay.c, submit_ring.c, execute.c on a host device), with its entries
 * and continuation slots written by a second thread while the worker
 * reads them, as a client may do to its shared memory at any time.
 *
 * The harness thread is the worker: it polls the ring, drains it as a job
 * of the session would, and sleeps and wakes it, for a bounded number of
 * rounds. The session has a flag page of 4 slots (a third thread, the
 * client's stream, keeps each ready word at the last seq the worker took
 * there, so no replay waits for long: words are compared cyclically, as
 * the GPU compares them, so no one value is ahead of every seq), two programs (handles 0 and 1: copies and
 * memsets over staged slots of 256 and 64 bytes) and three regions of
 * 4 KiB with guard bytes on both sides (ids 1 to 3; any other id is
 * unknown).
 *
 * The input: byte 0, the ring's size (2 to 64 entries) and order group;
 * byte 1, the tail published before the worker starts (possibly out of
 * range); then the submission entries as the ring holds them (512 bytes
 * each, as many as there are, zeros past the input's end); then the
 * mutator's script, records of a slot byte, a 2-byte offset, a length byte
 * and that many bytes, which the second thread writes into the ring again
 * and again (a record whose slot byte is 0xff moves the tail instead).
 *
 * What must hold: no crash, no leak, no read or write outside the ring or
 * the regions (the guard bytes stay); every entry the worker takes gets
 * its completion (the ring's cq_tail follows sq_head), each with a status
 * of graphd's list; the worker never takes more than was published, and a
 * tail out of range stops the ring. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/memfd.h"
#include "daemon/backend/backend.h"
#include "daemon/device/capture.h"
#include "daemon/device/device.h"
#include "daemon/device/session_stream.h"
#include "common/log.h"
#include "daemon/base/registry.h"
#include "daemon/replay/ring_replay.h"
#include "daemon/device/worker.h"
#include "graphd/protocol.h"
#include "graphd/status.h"
#include "graphd/encoding.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NREGIONS 3
#define REGION_BYTES 4096u
#define GUARD 64u
#define FLAG_SLOTS 4
#define ROUNDS 8

static struct {
  gd_backend *be;
  gd_device d;
  gd_registry reg;
  const gd_regprog *prog[2];
  gd_worker w; /* not started: the harness thread is the worker */
} g;

static void die(const char *what, const char *err) {
  fprintf(stderr, "fuzz_ring: %s: %s\n", what, err);
  abort();
}

/* A program of slots {input, inout} of `bytes` (staged) and a scratch:
 * a memset of the scratch and a copy from slot 0 to slot 1. */
static const gd_regprog *add_program(uint64_t bytes, uint32_t value) {
  gd_slot slots[3] = {{GD_ROLE_INPUT, GD_SLOT_STAGED, bytes},
                      {GD_ROLE_INOUT, GD_SLOT_STAGED, bytes},
                      {GD_ROLE_SCRATCH, 0, 64}};
  gd_step steps[2];
  memset(steps, 0, sizeof steps);
  steps[0].kind = GD_STEP_MEMSET;
  steps[0].u.memset = (gd_memset){.slot = 2, .element_size = 4, .value = value, .bytes = 64};
  steps[1].kind = GD_STEP_COPY;
  steps[1].u.copy = (gd_copy){.dst_slot = 1, .src_slot = 0, .bytes = bytes};
  gd_program p = {.mode = GD_MODE_STAGED, .nslots = 3, .slots = slots, .nsteps = 2, .steps = steps};
  uint8_t *enc, id[GD_ID_LEN];
  size_t len;
  char err[512];
  if (gd_program_encode(&p, &enc, &len, err, sizeof err) < 0) die("encoding a program", err);
  gd_sha256(enc, len, id);
  bool known;
  if (registry_add_program(&g.reg, id, enc, len, &known, err, sizeof err) < 0)
    die("registering a program", err);
  free(enc);
  return registry_find_program(&g.reg, id);
}

static void setup(void) {
  char err[512];
  if (g.be) return;
  /* Refusals are the point here: log them only when asked. */
  if (!getenv("GRAPHD_FUZZ_LOG")) gd_log_level = GD_ERROR;
  if (backend_host_new(1, 64u << 20, &g.be, err, sizeof err) < 0) die("host backend", err);
  device_init(&g.d, 0, g.be, 0, 0);
  if (device_attach(&g.d) < 0 || !device_ok(&g.d)) die("host device", "cannot attach");
  g.prog[0] = add_program(256, 7);
  g.prog[1] = add_program(64, 9);
  pthread_mutex_init(&g.w.lock, NULL);
  g.w.epfd = epoll_create1(EPOLL_CLOEXEC);
  g.w.wake_fd = -1;
  if (g.w.epfd < 0) die("epoll_create1", "failed");
}

/* The second thread: writes the script's records into the ring until
 * told to stop. */
typedef struct mutator {
  volatile uint8_t *sq; /* the submission entries */
  volatile graphd_ring_header *hdr;
  uint32_t entries;
  const uint8_t *script;
  size_t len;
  atomic_bool stop;
} mutator;

static void *mutate(void *arg) {
  mutator *m = arg;
  uint64_t bytes = (uint64_t)m->entries * GRAPHD_RING_SQE_BYTES;
  while (!atomic_load_explicit(&m->stop, memory_order_relaxed)) {
    size_t i = 0;
    while (i + 4 <= m->len && !atomic_load_explicit(&m->stop, memory_order_relaxed)) {
      uint8_t slot = m->script[i];
      uint32_t off = (uint32_t)m->script[i + 1] | (uint32_t)m->script[i + 2] << 8;
      uint32_t n = m->script[i + 3];
      i += 4;
      if (n > m->len - i) n = (uint32_t)(m->len - i);
      if (slot == 0xff) {
        /* The tail, moved by a little (either way), or set. */
        uint64_t t = __atomic_load_n(&m->hdr->sq_tail, __ATOMIC_RELAXED);
        __atomic_store_n(&m->hdr->sq_tail, off & 0x8000 ? off & 0x7f : t + (int8_t)off,
                         __ATOMIC_SEQ_CST);
      } else {
        uint64_t at = (uint64_t)(slot % m->entries) * GRAPHD_RING_SQE_BYTES + off;
        for (uint32_t k = 0; k < n && at + k < bytes; k++)
          __atomic_store_n(&m->sq[at + k], m->script[i + k], __ATOMIC_RELAXED);
      }
      i += n;
    }
    if (m->len < 4) break;
  }
  return NULL;
}

/* The client's stream: writes each slot's ready word up to the seq the
 * worker took there last, until told to stop. */
typedef struct readier {
  gd_session_stream *ds;
  volatile uint64_t *flags;
  atomic_bool stop;
} readier;

static void *keep_ready(void *arg) {
  readier *r = arg;
  while (!atomic_load_explicit(&r->stop, memory_order_relaxed))
    for (uint32_t k = 0; k < FLAG_SLOTS; k++)
      __atomic_store_n(&r->flags[k * GRAPHD_FLAG_WORDS_PER_SLOT + GRAPHD_FLAG_WORD_READY],
                       __atomic_load_n(&r->ds->seen[k], __ATOMIC_RELAXED), __ATOMIC_RELEASE);
  return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  setup();
  if (size < 2) return 0;
  char err[512];
  uint32_t entries = 2u << (data[0] % 6);
  uint64_t group = data[0] & 0x80 ? 7 : 0;
  uint64_t tail = data[1];
  size_t sq_bytes = (size_t)entries * GRAPHD_RING_SQE_BYTES;
  const uint8_t *body = data + 2;
  size_t body_len = size - 2;
  size_t init = body_len < sq_bytes ? body_len : sq_bytes;

  /* The session's half: its flag page and regions. */
  gd_session_stream *ds = session_stream_new(1);
  int flags_fd = gd_memfd_new_shared("fuzz-flags", 4096);
  if (!ds || flags_fd < 0) die("session", "out of memory");
  volatile uint64_t *flags = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, flags_fd, 0);
  if (flags == MAP_FAILED) die("flag page", "cannot map");
  if (session_stream_map_flags(&g.d, ds, flags_fd, FLAG_SLOTS, err, sizeof err) < 0)
    die("session_stream_map_flags", err);
  close(flags_fd);
  readier rd = {.ds = ds, .flags = flags};
  pthread_t rt;
  if (pthread_create(&rt, NULL, keep_ready, &rd) != 0) die("readier", "cannot start");
  uint8_t *mem[NREGIONS];
  uint64_t epoch = atomic_load(&g.d.epoch);
  for (uint32_t i = 0; i < NREGIONS; i++) {
    mem[i] = malloc(REGION_BYTES + 2 * GUARD);
    if (!mem[i]) die("region", "out of memory");
    memset(mem[i], 0xa5, REGION_BYTES + 2 * GUARD);
    gd_region_map m = {.ptr = (uint64_t)(uintptr_t)(mem[i] + GUARD),
                       .size = REGION_BYTES,
                       .mapped = REGION_BYTES,
                       .kind = GRAPHD_REGION_HOST_MEMFD,
                       .epoch = epoch};
    if (session_stream_region_add(ds, i + 1, &m) < 0) die("region", "out of memory");
  }

  /* The ring, written as the input says, then handed to the worker. */
  uint64_t ring_bytes = GRAPHD_RING_BYTES(entries);
  int ring_fd = gd_memfd_new_shared("fuzz-ring", ring_bytes);
  int bell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ring_fd < 0 || bell < 0) die("ring", "cannot make its memfd or doorbell");
  uint8_t *ring = mmap(NULL, ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd, 0);
  if (ring == MAP_FAILED) die("ring", "cannot map");
  volatile graphd_ring_header *hdr = (volatile graphd_ring_header *)ring;
  volatile graphd_ring_cqe *cq =
      (volatile graphd_ring_cqe *)(ring + GRAPHD_RING_HEADER_BYTES + sq_bytes);
  hdr->entries = entries;
  hdr->order_group = group;
  hdr->magic = GRAPHD_RING_MAGIC;
  memcpy(ring + GRAPHD_RING_HEADER_BYTES, body, init);
  gd_ring_params params = {.entries = entries,
                           .ready_timeout_s = 0,
                           .max_inflight = 1u << 20,
                           .client_pid = 1,
                           .client_uid = 1};
  if (ring_replay_attach(&g.d, &g.w, ds, &params, ring_fd, bell, err, sizeof err) < 0)
    die("ring_replay_attach", err);
  close(ring_fd);
  for (uint32_t h = 0; h < 2; h++)
    if (ring_replay_set_program(ds, h, g.prog[h], err, sizeof err) < 0)
      die("ring_replay_set_program", err);
  __atomic_store_n(&hdr->sq_tail, tail, __ATOMIC_SEQ_CST);

  mutator m = {.sq = ring + GRAPHD_RING_HEADER_BYTES,
               .hdr = hdr,
               .entries = entries,
               .script = body + init,
               .len = body_len - init};
  pthread_t t;
  bool racing = m.len >= 4;
  if (racing && pthread_create(&t, NULL, mutate, &m) != 0) die("mutator", "cannot start");

  /* The worker: polls, a job's drain, a sleep and a wake, a few rounds. */
  gd_replay_tally st;
  uint64_t hung[4];
  for (int round = 0; round < ROUNDS; round++) {
    uint64_t head = __atomic_load_n(&hdr->sq_head, __ATOMIC_ACQUIRE);
    uint64_t published = __atomic_load_n(&hdr->sq_tail, __ATOMIC_SEQ_CST);
    if (ring_replay_pending(&g.d)) (void)ring_replay_poll(&g.d, &g.w);
    if (round & 1) ring_replay_drain(&g.d, &g.w, ds);
    (void)ring_replay_sleep(&g.d, true);
    (void)ring_replay_sleep(&g.d, false);
    (void)ring_replay_take_stats(&g.d, true, &st);
    (void)ring_replay_take_hung(&g.d, hung, 4);
    (void)ring_replay_held(&g.d);
    /* Without the mutator the worker takes at most what was published,
     * an entry's continuation slots included. */
    uint64_t now = __atomic_load_n(&hdr->sq_head, __ATOMIC_ACQUIRE);
    if (!racing && now != head && now - head > published - head) {
      fprintf(stderr, "fuzz_ring: the worker took %llu slots of %llu published\n",
              (unsigned long long)(now - head), (unsigned long long)(published - head));
      abort();
    }
  }
  if (racing) {
    atomic_store(&m.stop, true);
    pthread_join(t, NULL);
  }
  atomic_store(&rd.stop, true);
  pthread_join(rt, NULL);

  /* Every slot taken is completed, with a status of graphd's list. */
  uint64_t head = __atomic_load_n(&hdr->sq_head, __ATOMIC_ACQUIRE);
  if (__atomic_load_n(&hdr->cq_tail, __ATOMIC_ACQUIRE) != head) {
    fprintf(stderr, "fuzz_ring: sq_head %llu, cq_tail %llu\n", (unsigned long long)head,
            (unsigned long long)hdr->cq_tail);
    abort();
  }
  uint64_t from = head > entries ? head - entries : 0;
  for (uint64_t k = from; k < head; k++) {
    uint32_t status = cq[k & (entries - 1)].status;
    if (status >= 64 || !strcmp(graphd_status_name((graphd_status)status), "UNKNOWN")) {
      fprintf(stderr, "fuzz_ring: completion %llu has status %u\n", (unsigned long long)k, status);
      abort();
    }
  }
  for (uint32_t i = 0; i < NREGIONS; i++)
    for (uint32_t k = 0; k < GUARD; k++)
      if (mem[i][k] != 0xa5 || mem[i][GUARD + REGION_BYTES + k] != 0xa5) {
        fprintf(stderr, "fuzz_ring: region %u's guard bytes were written\n", i + 1);
        abort();
      }

  /* The session's end, as its end job runs it. */
  for (uint32_t i = 0; i < NREGIONS; i++)
    capture_forget_memory(&g.d, (uint64_t)(uintptr_t)(mem[i] + GUARD), REGION_BYTES);
  session_stream_end(&g.d, ds, NULL, 0);
  munmap(ring, ring_bytes);
  munmap((void *)flags, 4096);
  for (uint32_t i = 0; i < NREGIONS; i++) free(mem[i]);
  return 0;
}
