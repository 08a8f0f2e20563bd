/* One device as its worker thread sees it: the backend's handle, the
 * device's state and epoch, and everything made on it: the module cache
 * (modcache.c), the captures (capture.c), the ready waits watched for the
 * head-of-line policy (holwatch.c) and the live region imports (here).
 * What the worker does between and after jobs (fault checks and the reset,
 * the watch, teardown) is upkeep.c.
 *
 * DESIGN: worker thread only, except the fields marked otherwise. The
 * device does not know about threads or queues: worker.c runs it, and the
 * loop learns of resets and cut-offs from what upkeep.c reports. Only the
 * device's own worker touches the device. */
#ifndef GRAPHD_DEVICE_H
#define GRAPHD_DEVICE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/backend/backend.h"
#include "daemon/base/counters.h"

enum gd_device_state { GD_DEVICE_STARTING = 0, GD_DEVICE_OK = 1, GD_DEVICE_FAILED = 2 };

/* --gpu-time-sample's default: one replay in this many timed on the GPU. */
#define GD_GPU_SAMPLE_DEFAULT 16

/* --ready-hold-rings' default: while a device serves more submission
 * rings than this, replays whose ready write is behind wait for it on the
 * worker rather than on the GPU (ring_replay.c). */
#define GD_READY_HOLD_RINGS_DEFAULT 2
#define GD_READY_HOLD_MAX_US_DEFAULT 10

typedef struct gd_device {
  int index; /* graphd's device index */
  gd_backend *be;
  int backend_index;
  gd_backend_dev *dev;
  _Atomic int state;              /* enum gd_device_state; any thread reads it */
  _Atomic uint64_t epoch;         /* bumped at each reset; any thread reads it */
  char fail_msg[320];             /* written before state becomes FAILED; then read-only */
  uint64_t budget;                /* staging bytes captures may hold; 0 = no limit */
  bool fair_shares;               /* a uid past its share of the budget gets no more instances */
  uint32_t gpu_sample_every;      /* time one replay in this many (gpusample.h); 0 = none */
  uint32_t ready_hold_rings;      /* rings served above which ready writes are awaited here */
  uint64_t ready_hold_max_ns;     /* ... for programs the worker queues within this time */
  struct gd_modcache *mods;       /* modcache.c */
  struct gd_capture_set *caps;    /* capture.c */
  struct gd_holwatch *hol;        /* holwatch.c */
  struct gd_live_import *imports; /* live region imports (uthash, by serial) */
  /* session_stream.c: the sessions' halves with a flag page mapped. */
  struct gd_session_stream_set *session_streams;
  uint64_t import_serial; /* the last serial given */
  bool watching;          /* upkeep.c: ready waits are watched */
  bool maybe_busy;        /* upkeep.c: a replay may still run on the device */
  /* Why the device must be reset though its context did not fault (a
   * session stream that would not drain, session_stream.c); device_faulted
   * reports it once. Worker thread only. */
  char wedged[256];
} gd_device;

/* What replays on a device did, kept by the worker (per ring) or a
 * request until the loop adds it to the device's counters
 * (gd_counters_add_tally). */
typedef struct gd_replay_tally {
  /* A field for each device counter that replays count (source TALLY in
   * device_counters.def), by the counter's name: exec_replay counts them
   * (the GPU and launch times through capture_take_gpu_time and
   * capture_take_launch_time). */
#define GRAPHD_DEVICE_COUNTER(name, field, kind, unit, source, ...) GD_TALLIED_##source(name)
#include "graphd/device_counters.def"
  /* What the loop adds in its own way (gd_counters_add_tally). */
  uint64_t captures, staging_bytes, evicted, evicted_bytes;
  uint64_t trimmed_bytes; /* staging of idle instances freed for room (capture_trim) */
} gd_replay_tally;

static inline void gd_tally_add(gd_replay_tally *to, const gd_replay_tally *from) {
#define GRAPHD_DEVICE_COUNTER(name, field, kind, unit, source, ...) GD_ADD_##source(to, from, name)
#include "graphd/device_counters.def"
  to->captures += from->captures;
  to->staging_bytes += from->staging_bytes;
  to->evicted += from->evicted;
  to->evicted_bytes += from->evicted_bytes;
  to->trimmed_bytes += from->trimmed_bytes;
}

/* Prepares d for device `backend_index` of be (any thread, before its
 * worker starts). */
void device_init(gd_device *d, int index, gd_backend *be, int backend_index, uint64_t budget);

/* Takes the device (for CUDA: retains the primary context and makes it
 * current on this thread) and marks it OK or FAILED. Worker thread. */
int device_attach(gd_device *d);

/* The thread tag of d's worker ("gpu0", "host1"). */
void device_tag(const gd_device *d, char *tag, size_t len);

static inline bool device_ok(const gd_device *d) { return atomic_load(&d->state) == GD_DEVICE_OK; }

/* Marks d failed with the reason (printf-style). */
void device_fail(gd_device *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 0 while the device works; a negated status with why filled once a sticky
 * error has made its context unusable, or once the device is wedged. */
int device_faulted(gd_device *d, char *why, size_t whylen);

/* Imports client memory and remembers it, stamped with a serial and the
 * epoch, so that a reset releases what the session has not. */
int device_import(gd_device *d, const gd_region_import *in, gd_region_map *out, char *err,
                  size_t errlen);

/* Releases an import unless the reset already did. */
void device_release_import(gd_device *d, gd_region_map *m);

/* Releases every live import (the device is being reset). */
void device_release_imports(gd_device *d);

/* Gives the device back and forgets the imports (released by then). */
void device_detach(gd_device *d);

#endif
