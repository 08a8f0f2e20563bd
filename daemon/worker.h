/* Per-device worker threads and the job queue between them and the loop.
 *
 * DESIGN: worker N owns device N: its backend state (for CUDA, the retained
 * primary context) and, in later capabilities, its session streams,
 * modules, captures, staging and imports. Only worker N touches them.
 * The loop thread submits jobs with worker_submit(); the worker runs
 * job->run on its thread, then hands the job back through the pool's
 * completion list and uv_async_send(); the loop runs job->done.
 *
 * Locks: each worker's `lock` guards its queue and `stopping`; the pool's
 * `lock` guards the completion list. Neither lock is held while running a
 * job or a callback, and no thread takes both at once. */
#ifndef GRAPHD_WORKER_H
#define GRAPHD_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "backend.h"

typedef struct gd_worker gd_worker;
typedef struct gd_job gd_job;

/* Runs on the worker; sets job->status (0 or negated code) and job->msg. */
typedef void (*gd_job_run_fn)(gd_worker *w, gd_job *j);
/* Runs on the loop thread once the job is back; owns the job from then on. */
typedef void (*gd_job_done_fn)(gd_job *j);

struct gd_job {
  gd_job *next;
  gd_job_run_fn run;
  gd_job_done_fn done;
  gd_worker *worker;
  int status;      /* 0 or a negated graphd status */
  char msg[512];   /* error text for the client */
  bool ran;        /* false when failed without running (shutdown, dead worker) */
};

enum gd_worker_state { GD_WORKER_STARTING = 0, GD_WORKER_OK = 1, GD_WORKER_FAILED = 2 };

typedef struct gd_pool gd_pool;

struct gd_worker {
  int index;              /* graphd device index */
  gd_backend *be;
  int backend_index;
  gd_backend_dev *dev;    /* worker thread only */
  gd_pool *pool;
  pthread_t thread;
  bool thread_started;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  gd_job *head, *tail;    /* guarded by lock */
  bool stopping;          /* guarded by lock */
  _Atomic int state;      /* enum gd_worker_state */
  _Atomic uint64_t epoch; /* bumped when the device is reset */
  _Atomic uint64_t heartbeat_ns; /* last time the worker woke or finished a job */
  _Atomic int busy;       /* a job is running */
  _Atomic int queued;     /* jobs in the queue, for the spin before sleeping */
  char fail_msg[320];     /* set before state becomes FAILED */
  struct gd_devstate *ds; /* worker thread only: prepare.c's per-device caches */
  struct gd_capstate *cs; /* worker thread only: capture.c's captures */
  struct gd_live_map *maps; /* worker thread only: fault.c's live imports */
  uint64_t map_serial;      /* worker thread only: the last serial given */
  uint64_t budget;        /* staging bytes captures may hold; 0 = no limit */
};

struct gd_pool {
  uv_loop_t *loop;
  uv_async_t async;
  pthread_mutex_t lock;
  gd_job *done_head, *done_tail; /* guarded by lock */
  gd_worker *workers;
  int n;
  _Atomic int started;           /* workers that finished opening */
  /* Loop thread: a worker cut off a hung client's session (capture_watch). */
  void (*cut_cb)(void *owner, uint64_t session_id);
  /* Loop thread: a worker reset its device after a fault (fault.c). */
  void (*reset_cb)(void *owner, int device);
  void *owner;
  pthread_mutex_t start_lock;
  pthread_cond_t start_cond;
};

/* Starts one worker per entry of backend_indexes and waits until each has
 * opened its device (or failed to). Loop thread, before serving clients.
 * Returns 0, or a negated status when nothing could start. */
int worker_pool_start(gd_pool *p, uv_loop_t *loop, gd_backend *be, const int *backend_indexes,
                      int n, uint64_t budget);

/* Queues j on w. Loop thread. If the worker has failed or is stopping, the
 * job completes with UNAVAILABLE without running. */
void worker_submit(gd_worker *w, gd_job *j);

/* Stops every worker: each finishes the job it runs, fails the jobs still
 * queued with UNAVAILABLE, closes its device and exits. Joins them, then
 * runs the done callbacks of everything that came back. Loop thread.
 * grace_s > 0 bounds the wait: a worker still running a job after it is
 * left alone, and the count of such workers is returned (the caller must
 * then exit the process without freeing what they use); 0 waits as long
 * as it takes. */
int worker_pool_stop(gd_pool *p, double grace_s);

/* Runs the completions still pending, then closes the pool's async handle;
 * call after worker_pool_stop(). */
void worker_pool_close(gd_pool *p);

/* Frees the worker array once the loop has closed the handle. Safe on a
 * pool that never started. */
void worker_pool_free(gd_pool *p);

/* True when another job waits in w's queue. Worker thread (a job asks
 * whether it blocks someone). */
int worker_has_queued(gd_worker *w);
/* True once worker_pool_stop() has asked w to stop. */
int worker_stopping(gd_worker *w);
/* Marks w alive (a job that waits a long time calls it). */
void worker_heartbeat(gd_worker *w);

/* Number of workers whose heartbeat is older than stale_ns while busy:
 * stuck in one job. Any thread. */
int worker_pool_stuck(gd_pool *p, uint64_t stale_ns);

uint64_t gd_now_ns(void);

#endif
