/* See data_session.h. Loop thread, except the jobs' run functions (worker). */
#define _GNU_SOURCE
#include "data_session.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/device/capture.h"
#include "graphd/status.h"
#include "daemon/device/holwatch.h"
#include "common/log.h"
#include "daemon/replay/ring_replay.h"
#include "daemon/base/share.h"

/* --- mappings of client memory ---------------------------------------------
 * Each region, flag page and ring is one mapping (a VMA) in graphd's
 * address space, and the kernel allows vm.max_map_count of them to the
 * whole process; past that every mmap fails, whichever user asks, and so
 * do thread stacks and large allocations. So the daemon counts them over
 * all sessions, from the request that asks for one until the job that
 * lets it go has run, and refuses new ones within a bound below the
 * kernel's. Regions may take 7/8 of it, so that a new session can still
 * map its flag page and ring. It counts them per uid as well, and each
 * uid has a fair share of the bound (share.h), so that uids within their
 * region limits cannot take it all from another. */

typedef struct gd_uid_maps {
  uint32_t uid;
  uint64_t n; /* its mappings, counted as for host_maps */
  UT_hash_handle hh;
} gd_uid_maps;

static gd_uid_maps *uid_maps_find(gd_daemon *d, uid_t uid) {
  uint32_t key = (uint32_t)uid;
  gd_uid_maps *u = NULL;
  HASH_FIND(hh, d->uid_maps, &key, sizeof key, u);
  return u;
}

int data_session_maps_take(gd_daemon *d, uid_t uid) {
  gd_uid_maps *u = uid_maps_find(d, uid);
  if (!u) {
    if (!(u = calloc(1, sizeof *u))) return -1;
    u->uid = (uint32_t)uid;
    HASH_ADD(hh, d->uid_maps, uid, sizeof u->uid, u);
    d->map_users++;
  }
  u->n++;
  d->host_maps++;
  return 0;
}

void data_session_maps_give(gd_daemon *d, uid_t uid, uint64_t n) {
  d->host_maps -= n;
  gd_uid_maps *u = uid_maps_find(d, uid);
  if (!u) return;
  u->n = u->n > n ? u->n - n : 0;
  if (u->n) return;
  HASH_DEL(d->uid_maps, u);
  free(u);
  d->map_users--;
}

void data_session_maps_free(gd_daemon *d) {
  gd_uid_maps *u, *tmp;
  HASH_ITER(hh, d->uid_maps, u, tmp) {
    HASH_DEL(d->uid_maps, u);
    free(u);
  }
  d->map_users = 0;
}

void data_session_maps_init(gd_daemon *d) {
  uint64_t kernel = 65530; /* the kernel's default, when /proc says nothing */
  FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
  unsigned long long v;
  if (f && fscanf(f, "%llu", &v) == 1 && v > 0) kernel = v;
  if (f) fclose(f);
  /* A quarter for graphd's own: libraries, thread stacks, the driver's
   * mappings, staging and module loads. */
  uint64_t bound = kernel - kernel / 4;
  uint64_t asked = d->opt->max_host_maps;
  if (asked > bound)
    GD_LOG(GD_WARN, "data_session",
           "--max-host-maps %llu is more than 3/4 of the kernel's vm.max_map_count (%llu): "
           "using %llu",
           (unsigned long long)asked, (unsigned long long)kernel, (unsigned long long)bound);
  else if (asked)
    bound = asked;
  d->max_host_maps = bound ? bound : 1;
  d->kernel_max_maps = kernel;
  GD_LOG(GD_INFO, "data_session",
         "at most %llu mappings of client memory (regions, flag pages, rings); "
         "vm.max_map_count is %llu",
         (unsigned long long)d->max_host_maps, (unsigned long long)kernel);
}

/* Whether one more mapping keeps uid within its fair share of cap (all
 * of the bound, or regions' part of it). */
static bool share_fits(gd_daemon *d, uid_t uid, bool region, uint64_t cap, char *err,
                       size_t errlen) {
  if (!d->opt->fair_shares) return true;
  const gd_uid_maps *u = uid_maps_find(d, uid);
  gd_share_ask a = {.bound = cap,
                    .held = d->host_maps,
                    .users = d->map_users,
                    .mine = u ? u->n : 0,
                    .more = 1,
                    .grows = 1};
  uint64_t share;
  gd_share_verdict v = gd_share_check(&a, &share);
  if (v == GD_SHARE_OK) return true;
  char bound[128];
  if (region)
    snprintf(bound, sizeof bound, "regions may take %llu, 7/8 of --max-host-maps %llu",
             (unsigned long long)cap, (unsigned long long)d->max_host_maps);
  else
    snprintf(bound, sizeof bound, "--max-host-maps %llu", (unsigned long long)cap);
  uint32_t users = a.users + (a.mine ? 0 : 1);
  int n = snprintf(err, errlen,
                   "fair share of client mappings reached: uid %u's sessions have %llu "
                   "mappings and this is one more, ",
                   (unsigned)uid, (unsigned long long)a.mine);
  if (n < 0 || (size_t)n >= errlen) return false;
  if (v == GD_SHARE_OVER)
    snprintf(err + n, errlen - (size_t)n,
             "past its share of %llu (%s, / (%u uid%s with mappings + 1)); unregister some of "
             "uid %u's regions or close its sessions, or raise --max-host-maps (the kernel's "
             "vm.max_map_count is %llu)",
             (unsigned long long)share, bound, users, users == 1 ? "" : "s", (unsigned)uid,
             (unsigned long long)d->kernel_max_maps);
  else
    snprintf(err + n, errlen - (size_t)n,
             "more than would stay free for other users: graphd holds %llu mappings of client "
             "memory and %s; unregister some of uid %u's regions or close its sessions, or "
             "raise --max-host-maps (the kernel's vm.max_map_count is %llu)",
             (unsigned long long)a.held, bound, (unsigned)uid,
             (unsigned long long)d->kernel_max_maps);
  return false;
}

bool data_session_maps_fit(gd_daemon *d, uid_t uid, bool region, char *err, size_t errlen) {
  uint64_t max = d->max_host_maps;
  uint64_t cap = region ? max - max / 8 : max;
  if (!max) return true;
  if (d->host_maps < cap) return share_fits(d, uid, region, cap, err, errlen);
  if (region)
    snprintf(err, errlen,
             "graphd holds %llu mappings of client memory over all sessions; regions may take "
             "%llu, 7/8 of --max-host-maps %llu (the rest is kept for new sessions' flag pages "
             "and rings; the kernel's vm.max_map_count is %llu); unregister some first",
             (unsigned long long)d->host_maps, (unsigned long long)cap, (unsigned long long)max,
             (unsigned long long)d->kernel_max_maps);
  else
    snprintf(err, errlen,
             "graphd holds %llu mappings of client memory over all sessions, the most "
             "--max-host-maps %llu allows (the kernel's vm.max_map_count is %llu); try again "
             "once other sessions let some go",
             (unsigned long long)d->host_maps, (unsigned long long)max,
             (unsigned long long)d->kernel_max_maps);
  return false;
}

/* --- the end of a session -------------------------------------------------- */

typedef struct end_job {
  gd_job job;
  gd_daemon *d;
  gd_session_stream *ds;
  gd_region_map *maps;
  size_t nmaps;
  uint64_t unmapped; /* mappings of client memory the worker let go */
  uid_t uid;         /* whose they were */
} end_job;

int data_session_open(gd_session *s, int dev) {
  gd_daemon *d = daemon_of(s);
  gd_data_session *x = calloc(1, sizeof *x);
  if (!x || !(x->end = calloc(1, sizeof *x->end)) || !(x->ds = session_stream_new(s->id))) {
    if (x) free(x->end);
    free(x);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  s->data = x;
  s->kind = GD_SESSION_DATA;
  s->device = dev;
  d->counters[dev].sessions++;
  return 0;
}

static void end_run(gd_job *j, void *ctx) {
  end_job *ej = gd_container_of(j, end_job, job);
  gd_device *dev = ctx;
  ej->unmapped = ej->nmaps;
  if (ej->ds) ej->unmapped += ej->ds->has_flags + (ej->ds->ring != NULL);
  if (ej->ds) {
    holwatch_drop_stream(dev, ej->ds);
    capture_release_session(dev, ej->ds->session_id);
  }
  for (size_t i = 0; i < ej->nmaps; i++)
    capture_forget_memory(dev, ej->maps[i].ptr, ej->maps[i].size);
  /* A stream that would not drain fails the job, so that the worker asks
   * device_faulted next and resets the device. */
  j->status = session_stream_end(dev, ej->ds, ej->maps, ej->nmaps);
  ej->ds = NULL;
}

static void end_done(gd_job *j) {
  end_job *ej = gd_container_of(j, end_job, job);
  data_session_maps_give(ej->d, ej->uid, ej->unmapped);
  session_stream_drop(ej->ds); /* only when the end was refused and nothing ran */
  free(ej->maps);
  free(ej);
}

void data_session_note_work(gd_session *s, uint64_t now) {
  gd_data_session *x = data_session_of(s);
  if (!x || !x->ds) return;
  if (data_session_inflight(x) > 0) s->active_ns = now;
  /* ds->ring was set on the worker before RegisterRing's answer, and
   * stays until the end job, which runs after the session has closed. */
  if (!x->has_ring || !x->ds->ring) return;
  volatile graphd_ring_header *h = x->ds->ring->hdr;
  uint64_t tail = __atomic_load_n(&h->sq_tail, __ATOMIC_RELAXED);
  uint64_t head = __atomic_load_n(&h->sq_head, __ATOMIC_RELAXED);
  if (tail != x->ring_tail_seen || tail != head) s->active_ns = now;
  x->ring_tail_seen = tail;
}

void data_session_close(gd_session *s) {
  gd_daemon *d = daemon_of(s);
  gd_data_session *x = data_session_of(s);
  if (!x) return;
  gd_device_counters *c = &d->counters[s->device];
  c->sessions--;
  c->regions -= x->regions.n;
  c->region_bytes -= x->regions.bytes;
  /* Nothing is allocated here: the job and the room for the mappings
   * were made when the session and its regions were. */
  end_job *ej = x->end;
  gd_region *r, *tmp;
  HASH_ITER(hh, x->regions.head, r, tmp) {
    x->end_maps[ej->nmaps++] = r->map;
    free(r->release);
    region_remove(&x->regions, r);
  }
  ej->maps = x->end_maps;
  /* A replay waiting on this client's ready flag stops waiting now. */
  atomic_store(&x->ds->client_gone, true);
  ej->d = d;
  ej->uid = s->uid;
  ej->ds = x->ds;
  ej->job.run = end_run;
  ej->job.done = end_done;
  worker_submit(daemon_worker(d, s->device), &ej->job);
  free(x->ring_progs);
  free(x);
  s->data = NULL;
}

/* --- a region let go ------------------------------------------------------- */

typedef struct release_job {
  gd_job job;
  gd_daemon *d;
  gd_region_map map;
  /* The session's half, NULL once it ended: the ring entries published
   * before the release run first, the region leaves the worker's view,
   * and the stream drains before unmapping. */
  gd_session_stream *ds;
  uint32_t id;
  uid_t uid; /* whose mapping it is */
} release_job;

static void release_run(gd_job *j, void *ctx) {
  release_job *rj = gd_container_of(j, release_job, job);
  if (rj->ds) {
    ring_replay_drain(ctx, j->worker, rj->ds);
    session_stream_region_remove(rj->ds, rj->id);
  }
  /* GPU work of this session's replays may still read or write it. A
   * replay of its own still waiting for a ready write that does not come
   * is cut off after the ready timeout, rather than holding the worker. */
  holwatch_sync_stream(ctx, rj->ds);
  capture_forget_memory(ctx, rj->map.ptr, rj->map.size);
  device_release_import(ctx, &rj->map);
}

static void release_done(gd_job *j) {
  release_job *rj = gd_container_of(j, release_job, job);
  data_session_maps_give(rj->d, rj->uid, 1);
  free(rj);
}

struct release_job *data_session_release_new(void) {
  return calloc(1, sizeof(release_job));
}

void data_session_release_map(release_job *rj, gd_daemon *d, int dev, const gd_region_map *map,
                              gd_session_stream *ds, uint32_t id, uid_t uid) {
  rj->d = d;
  rj->uid = uid;
  rj->map = *map;
  rj->ds = ds;
  rj->id = id;
  rj->job.run = release_run;
  rj->job.done = release_done;
  worker_submit(daemon_worker(d, dev), &rj->job);
}

/* --- ends forced by a worker ----------------------------------------------- */

void data_session_cut_off(gd_daemon *d, uint64_t session_id) {
  for (gd_session *s = d->sessions.head; s; s = s->next) {
    if (s->id != session_id) continue;
    GD_LOG(GD_WARN, "data_session",
           "session %llu (pid %d) is hung: its ready flag did not come "
           "within --ready-timeout while another session waited behind it; closing it",
           (unsigned long long)s->id, (int)s->pid);
    d->counters[s->device].errors++;
    session_close(s, "cut off as hung");
    return;
  }
}

void data_session_device_reset(gd_daemon *d, int dev) {
  gd_device_counters *c = &d->counters[dev];
  c->errors++;
  /* The worker dropped every capture with the old context. */
  c->captures = 0;
  c->staging_bytes = 0;
  gd_session *next;
  for (gd_session *s = d->sessions.head; s; s = next) {
    next = s->next;
    gd_data_session *x = data_session_of(s);
    if (!x || s->device != dev || s->closing) continue;
    /* Whatever its stream waits for from the old context will not come:
     * write every done value from the host, so no client stream waits
     * forever. The worker's last write to the page came before the reset,
     * whose news comes through the completion queue. */
    session_stream_release(x->ds, GRAPHD_FLAG_WORD_DONE, NULL);
    GD_LOG(GD_WARN, "data_session",
           "session %llu (pid %d): device %d was reset after a GPU fault; "
           "closing the session (the client reconnects)",
           (unsigned long long)s->id, (int)s->pid, dev);
    session_close(s, "device reset after a GPU fault");
  }
  gd_device *device = &d->devices[dev];
  if (atomic_load(&device->state) != GD_DEVICE_FAILED || d->shutting_down) return;
  /* The reset failed: CUDA (13, as measured) makes no new context in a
   * process whose context took a sticky fault. Only a new process brings
   * the GPU back, so stop cleanly and let the service manager start one;
   * every client reconnects. */
  GD_LOG(GD_ERROR, "data_session",
         "%s; exiting with status %d so that the service manager restarts "
         "graphd (clients of every device reconnect)",
         device->fail_msg, GD_EXIT_FAULT);
  d->exit_code = GD_EXIT_FAULT;
  /* Through the signal path, so the shutdown starts from the loop's top
   * level rather than inside the completion callbacks it drains. */
  if (uv_kill(getpid(), SIGTERM) != 0) _exit(GD_EXIT_FAULT);
}
