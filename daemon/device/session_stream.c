/* See session_stream.h. Worker thread, but for session_stream_new,
 * session_stream_release and session_stream_inflight. */
#include "session_stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <uthash.h>

#include "daemon/base/clock.h"
#include "graphd/status.h"
#include "common/log.h"

#define OPS (d->be->ops)
#define BE d->be, d->dev

/* The device's sessions with a flag page mapped, made on the first. */
struct gd_session_stream_set {
  gd_session_stream *head;
  uint64_t rings_gen; /* counts rings mapped and unmapped */
};

/* One region of the session as the worker knows it. The view is filled by
 * the import jobs and emptied by the release jobs and the session's end,
 * so the worker never reads the loop's region table. */
struct gd_stream_region {
  uint32_t id;
  gd_region_map map;
  UT_hash_handle hh;
};

gd_session_stream *session_stream_new(uint64_t session_id) {
  gd_session_stream *ds = calloc(1, sizeof *ds);
  if (ds) {
    ds->session_id = session_id;
    atomic_init(&ds->holders, 1);
  }
  return ds;
}

void session_stream_drop(gd_session_stream *ds) {
  if (!ds || atomic_fetch_sub(&ds->holders, 1) != 1) return;
  struct gd_stream_region *r, *tmp;
  HASH_ITER(hh, ds->regions, r, tmp) {
    HASH_DEL(ds->regions, r);
    free(r);
  }
  free(ds->seen);
  free(ds->used);
  for (int i = 0; i < GD_RESOLVED_KEPT; i++) {
    free(ds->resolved[i].b);
    free(ds->resolved[i].bind);
  }
  free(ds->entry_b);
  free(ds);
}

gd_session_stream *session_stream_first(gd_device *d) {
  return d->session_streams ? d->session_streams->head : NULL;
}

uint64_t session_stream_rings_gen(gd_device *d) {
  return d->session_streams ? d->session_streams->rings_gen : 0;
}

void session_stream_rings_changed(gd_device *d) {
  if (d->session_streams) d->session_streams->rings_gen++;
}

int session_stream_region_add(gd_session_stream *ds, uint32_t id, const gd_region_map *m) {
  ds->regions_gen++;
  struct gd_stream_region *r = calloc(1, sizeof *r);
  if (!r) return -GRAPHD_RESOURCE_EXHAUSTED;
  r->id = id;
  r->map = *m;
  HASH_ADD(hh, ds->regions, id, sizeof r->id, r);
  return 0;
}

void session_stream_region_remove(gd_session_stream *ds, uint32_t id) {
  ds->regions_gen++;
  struct gd_stream_region *r;
  HASH_FIND(hh, ds->regions, &id, sizeof id, r);
  if (!r) return;
  HASH_DEL(ds->regions, r);
  free(r);
}

const gd_region_map *session_stream_region_find(const gd_session_stream *ds, uint32_t id) {
  struct gd_stream_region *r;
  HASH_FIND(hh, ds->regions, &id, sizeof id, r);
  return r ? &r->map : NULL;
}

bool session_stream_reserve(void **buf, uint32_t *cap, uint32_t n, size_t size) {
  if (n <= *cap) return true;
  uint32_t want = n < 16 ? 16 : n;
  void *p = realloc(*buf, (size_t)want * size);
  if (!p) return false;
  *buf = p;
  *cap = want;
  return true;
}

/* The worker is the only writer of seen, used and nused; the loop reads
 * them for its count of replays in flight, hence the atomic stores. */
bool session_stream_seq_next(const gd_session_stream *ds, uint32_t slot, uint64_t seq) {
  if (!ds->seen || slot >= ds->nslots || seq == 0) return false;
  uint64_t last = ds->seen[slot];
  return !last || seq - last - 1 < GRAPHD_SEQ_MAX_STEP;
}

void session_stream_saw(gd_session_stream *ds, uint32_t slot, uint64_t seq) {
  if (!ds->seen || slot >= ds->nslots || !seq) return;
  if (!ds->seen[slot]) {
    ds->used[ds->nused] = slot;
    __atomic_store_n(&ds->nused, ds->nused + 1, __ATOMIC_RELEASE);
  }
  __atomic_store_n(&ds->seen[slot], seq, __ATOMIC_RELAXED);
}

uint64_t session_stream_inflight(const gd_session_stream *ds) {
  uint64_t n = 0;
  uint32_t nused = __atomic_load_n(&ds->nused, __ATOMIC_ACQUIRE);
  for (uint32_t i = 0; i < nused; i++) {
    uint32_t slot = ds->used[i];
    uint64_t seen = __atomic_load_n(&ds->seen[slot], __ATOMIC_RELAXED);
    uint64_t done =
        __atomic_load_n(session_stream_word(ds, slot, GRAPHD_FLAG_WORD_DONE), __ATOMIC_ACQUIRE);
    if ((int64_t)(seen - done) > 0) n += seen - done;
  }
  return n;
}

static int ensure_stream(gd_device *d, gd_session_stream *ds, char *err, size_t errlen) {
  if (ds->has_stream) return 0;
  int rc = OPS->stream_create(BE, &ds->stream, err, errlen);
  ds->has_stream = rc == 0;
  ds->epoch = atomic_load(&d->epoch);
  return rc;
}

int session_stream_map_flags(gd_device *d, gd_session_stream *ds, int fd, uint32_t slots, char *err,
                             size_t errlen) {
  if (ds->has_flags) {
    snprintf(err, errlen, "this session already registered its flags");
    return -GRAPHD_ALREADY_EXISTS;
  }
  if (!d->session_streams && !(d->session_streams = calloc(1, sizeof *d->session_streams))) {
    snprintf(err, errlen, "out of memory");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  int rc = ensure_stream(d, ds, err, errlen);
  if (rc < 0) return rc;
  free(ds->seen);
  free(ds->used);
  ds->used = NULL;
  if (!(ds->seen = calloc(slots, sizeof *ds->seen)) ||
      !(ds->used = calloc(slots, sizeof *ds->used))) {
    free(ds->seen);
    ds->seen = NULL;
    snprintf(err, errlen, "out of memory");
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  rc = OPS->flags_map(BE, fd, (uint64_t)slots * GRAPHD_FLAG_STRIDE, &ds->flags, err, errlen);
  if (rc < 0) return rc;
  ds->has_flags = true;
  atomic_fetch_add(&ds->holders, 1);
  ds->nslots = slots;
  ds->prev = NULL;
  ds->next = d->session_streams->head;
  if (ds->next) ds->next->prev = ds;
  d->session_streams->head = ds;
  return 0;
}

/* Unmaps the flag page and takes ds off the device's list, which lets go
 * of it: ds may be freed on return. */
static void unmap_flags(gd_device *d, gd_session_stream *ds) {
  if (!ds->has_flags) return;
  if (ds->prev)
    ds->prev->next = ds->next;
  else
    d->session_streams->head = ds->next;
  if (ds->next) ds->next->prev = ds->prev;
  ds->prev = ds->next = NULL;
  if (ds->ring) session_stream_rings_changed(d);
  submit_ring_unmap(ds->ring);
  ds->ring = NULL;
  OPS->flags_unmap(BE, &ds->flags);
  ds->has_flags = false;
  session_stream_drop(ds);
}

static void destroy_stream(gd_device *d, gd_session_stream *ds) {
  if (ds->has_stream && ds->epoch == atomic_load(&d->epoch)) OPS->stream_destroy(BE, ds->stream);
  ds->has_stream = false;
}

/* Writes values[i] into one word of each of the session's flag slots. */
static void write_words(gd_session_stream *ds, uint32_t word, const uint64_t *values) {
  for (uint32_t i = 0; ds->has_flags && i < ds->nslots; i++)
    __atomic_store_n(session_stream_word(ds, i, word), values[i], __ATOMIC_RELEASE);
}

void session_stream_release(gd_session_stream *ds, uint32_t word, uint64_t *written) {
  /* Stream waits compare cyclically (graphd_seq_reached). The session
   * stream waits on the ready word for seqs the worker took, none above
   * the slot's last (seen), so that value releases them all, whatever the
   * client left in the word (a value 2^63 ahead is behind). The client's
   * own streams wait on the done word for seqs the worker may not have
   * taken yet: those jump 2^62 ahead of what the word holds. */
  uint64_t own[GRAPHD_MAX_FLAG_SLOTS];
  uint64_t *v = written ? written : own;
  for (uint32_t i = 0; ds->has_flags && i < ds->nslots; i++) {
    uint64_t now = __atomic_load_n(session_stream_word(ds, i, word), __ATOMIC_ACQUIRE);
    uint64_t last = ds->seen ? __atomic_load_n(&ds->seen[i], __ATOMIC_RELAXED) : 0;
    if (word != GRAPHD_FLAG_WORD_READY)
      v[i] = now + (1ull << 62);
    else
      v[i] = last && !graphd_seq_reached(now, last) ? last : now;
  }
  write_words(ds, word, v);
}

void session_stream_sync(gd_device *d, gd_session_stream *ds) {
  /* A stream from before a reset is gone with its context. */
  if (!ds || !ds->has_stream || ds->epoch != atomic_load(&d->epoch)) return;
  char e[256];
  if (OPS->stream_sync(BE, ds->stream, e, sizeof e) < 0)
    GD_LOG(GD_WARN, "session_stream", "session %llu: stream sync failed: %s",
           (unsigned long long)ds->session_id, e);
}

/* A closed session's client writes no more ready values: release every
 * wait of its stream from the host so nothing queued behind them waits
 * forever. GPU work a killed client queued can still land a ready write,
 * lower than the release, until the driver has torn its context down; so
 * the same release is written again while the stream drains, for at most
 * DRAIN_REWRITE_NS. A stream still not drained then is held by a client
 * process that goes on writing its flag page after its session ended: a
 * sync would hang the worker, so the device is marked wedged instead, and
 * the worker resets it (device_faulted). Returns false then. */
#define DRAIN_REWRITE_NS 2000000000ull
static bool release_and_drain(gd_device *d, gd_session_stream *ds) {
  uint64_t target[GRAPHD_MAX_FLAG_SLOTS];
  session_stream_release(ds, GRAPHD_FLAG_WORD_READY, target);
  gd_event ev;
  char e[256];
  bool drained = true;
  if (ds->has_flags && ds->has_stream && ds->epoch == atomic_load(&d->epoch) &&
      OPS->event_create(BE, &ev, e, sizeof e) == 0) {
    if (OPS->event_record(BE, ev, ds->stream, e, sizeof e) == 0) {
      uint64_t end = gd_now_ns() + DRAIN_REWRITE_NS;
      while (!(drained = OPS->event_done(BE, ev)) && gd_now_ns() < end) {
        write_words(ds, GRAPHD_FLAG_WORD_READY, target);
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
      }
    }
    OPS->event_destroy(BE, ev);
  }
  if (!drained) {
    snprintf(d->wedged, sizeof d->wedged,
             "session %llu's stream still waits on its ready flag %.1f s after the session "
             "ended (its client process goes on writing the flag page)",
             (unsigned long long)ds->session_id, DRAIN_REWRITE_NS / 1e9);
    return false;
  }
  session_stream_sync(d, ds);
  return true;
}

int session_stream_end(gd_device *d, gd_session_stream *ds, gd_region_map *maps, size_t nmaps) {
  bool drained = !ds || release_and_drain(d, ds);
  /* Work still queued may use the imports: the reset releases them. */
  for (size_t i = 0; drained && i < nmaps; i++) device_release_import(d, &maps[i]);
  if (!ds) return 0;
  /* After a reset the flag page's registration is gone with the old
   * context (unregistering fails, harmlessly) but the mapping is ours. */
  if (drained) destroy_stream(d, ds);
  unmap_flags(d, ds);
  session_stream_drop(ds);
  return drained ? 0 : -GRAPHD_UNAVAILABLE;
}

void session_stream_close_all(gd_device *d) {
  while (d->session_streams && d->session_streams->head) {
    gd_session_stream *ds = d->session_streams->head;
    destroy_stream(d, ds);
    unmap_flags(d, ds);
  }
  free(d->session_streams);
  d->session_streams = NULL;
}
