/* Data sessions on the loop: a session bound to one device, from Hello to
 * its end: it ends here when its client leaves, when it is cut off as hung
 * (the head-of-line policy), or when its device is reset after a fault.
 * What it attaches meanwhile (its flag page, regions and ring) comes
 * through attach.c, within the bound on mappings of client memory kept
 * here. Its half on the device is a gd_session_stream (session_stream.c); its replays
 * are replay.c's.
 *
 * DESIGN: loop thread only; the jobs' run functions run on the device's
 * worker. A data session's state hangs off session->data until it closes. */
#ifndef GRAPHD_DATA_SESSION_H
#define GRAPHD_DATA_SESSION_H

#include <stdint.h>

#include "daemon.h"
#include "daemon/device/session_stream.h"
#include "graphd.pb-c.h"
#include "region.h"
#include "session.h"

typedef struct gd_data_session {
  gd_session_stream *ds; /* the device's half; the worker's from the end job on */
  gd_region_table regions;
  uint32_t flag_slots;           /* 0 until RegisterFlags */
  bool has_ring;                 /* RegisterRing answered OK */
  uint64_t ring_tail_seen;       /* the ring's sq_tail at the last data_session_note_work */
  bool ring_pending;             /* RegisterRing is with the worker */
  const gd_regprog **ring_progs; /* by handle: the programs RingProgram named */
  uint32_t nring_progs, ring_progs_cap;
  /* What ending the session needs, made before it is needed (when the
   * session opens, and room for each region as it is registered), so
   * that no end fails for want of memory: the end job, and the array its
   * regions' mappings go to (at least regions.n + 1 entries). */
  struct end_job *end;
  gd_region_map *end_maps;
  size_t end_maps_cap;
} gd_data_session;

/* The data session's state; NULL for a control session or once closed. */
static inline gd_data_session *data_session_of(gd_session *s) { return s->data; }

/* The session's replays taken on its device and not done, by the worker's
 * count of what it took and the done words of the flag page. */
static inline uint64_t data_session_inflight(const gd_data_session *x) {
  return x->flag_slots ? session_stream_inflight(x->ds) : 0;
}

/* Makes s a data session on device dev (Hello). Returns 0 or a negated
 * status. */
int data_session_open(gd_session *s, int dev);

/* The session set's on_close: ends the device's half behind the work the
 * session queued (a dead client's ready waits are released, the stream
 * drains, then its regions and flags are let go). Allocates nothing. */
void data_session_close(gd_session *s);

/* A client that replays through its ring sends no request, and one whose
 * replays run long on the GPU sends none meanwhile: counts the session as
 * active (s->active_ns = now) when it published ring entries since the
 * last look, has entries the worker has not taken, or has replays queued
 * and not done. The loop's sweep looks about once a second, so
 * --idle-timeout and a session's idle time in Status see such work
 * within that. */
void data_session_note_work(gd_session *s, uint64_t now);

/* Reads the kernel's vm.max_map_count and sets the bound on client
 * mappings (d->max_host_maps): --max-host-maps, at most three quarters of
 * the kernel's count, the rest left to graphd's own mappings. At start. */
void data_session_maps_init(gd_daemon *d);

/* Whether one more mapping of client memory for a session of uid fits (a
 * region's, or a flag page's or ring's): under the bound over all
 * sessions, and within uid's fair share of it (share.h; regions' part of
 * the bound for a region); if not, err says why, naming the flag. */
bool data_session_maps_fit(gd_daemon *d, uid_t uid, bool region, char *err, size_t errlen);

/* Counts one more mapping of uid's, from the request that asks for it
 * until the job that lets it go has run; -1 (nothing counted) when out of
 * memory. data_session_maps_give takes n back and allocates nothing. */
int data_session_maps_take(gd_daemon *d, uid_t uid);
void data_session_maps_give(gd_daemon *d, uid_t uid, uint64_t n);

/* Frees the per-uid counts (at exit). */
void data_session_maps_free(gd_daemon *d);

/* A region's release, made when the region is asked for so that letting
 * it go cannot fail for want of memory; NULL when out of memory. Freed by
 * the release itself, or with free() when never queued. */
struct release_job *data_session_release_new(void);

/* Queues, in rj, the unmapping of map on device dev behind whatever its
 * worker already has: the ring entries ds published before it run first
 * and the region (id) leaves the worker's view (ds NULL once the session
 * ended), the stream drains, then the import is let go, and with it one
 * of uid's mappings. */
void data_session_release_map(struct release_job *rj, gd_daemon *d, int dev,
                              const gd_region_map *map, gd_session_stream *ds, uint32_t id,
                              uid_t uid);

/* A worker released a hung client's waits: close its session, so that its
 * later requests fail. */
void data_session_cut_off(gd_daemon *d, uint64_t session_id);

/* Device dev was reset after a GPU fault (or failed to be): release every
 * wait its sessions' streams have on it, close them, and when the device
 * could not be reset, stop graphd with GD_EXIT_FAULT. */
void data_session_device_reset(gd_daemon *d, int dev);

#endif
