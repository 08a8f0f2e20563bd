/* See worker.h for the threading design. */
#define _GNU_SOURCE
#include "worker.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graphd/status.h"
#include "log.h"
#include "capture.h"
#include "fault.h"
#include "prepare.h"

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

/* How long an idle worker spins before it sleeps on its condition. */
#define WORKER_SPIN_NS 50000u

uint64_t gd_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Hands a finished job to the loop. Any thread. */
static void complete(gd_pool *p, gd_job *j) {
  j->next = NULL;
  pthread_mutex_lock(&p->lock);
  if (p->done_tail)
    p->done_tail->next = j;
  else
    p->done_head = j;
  p->done_tail = j;
  pthread_mutex_unlock(&p->lock);
  uv_async_send(&p->async);
}

static void fail_unrun(gd_job *j, const char *why) {
  j->ran = false;
  j->status = -GRAPHD_UNAVAILABLE;
  snprintf(j->msg, sizeof j->msg, "%s", why);
}

/* How often a worker checks the ready waits it queued on its device. */
#define WATCH_PERIOD_NS 10000000L

typedef struct cut_job {
  gd_job job; /* first */
  uint64_t session_id;
} cut_job;

static void reset_done(gd_job *j) {
  gd_pool *p = j->worker->pool;
  if (p->reset_cb) p->reset_cb(p->owner, j->worker->index);
  free(j);
}

/* After a job, and every WATCH_PERIOD while work may be in flight: has the
 * device faulted? If so it is reset here and the loop is told. */
static void check_device(gd_worker *w) {
  if (atomic_load(&w->state) != GD_WORKER_OK || !fault_check(w)) return;
  gd_job *j = calloc(1, sizeof *j);
  if (!j) {
    GD_LOG(GD_ERROR, "worker", "out of memory telling the loop that device %d was reset",
           w->index);
    return;
  }
  j->done = reset_done;
  j->worker = w;
  complete(w->pool, j);
}

static void cut_done(gd_job *j) {
  cut_job *cj = (cut_job *)j;
  gd_pool *p = j->worker->pool;
  if (p->cut_cb) p->cut_cb(p->owner, cj->session_id);
  free(cj);
}

/* Runs done callbacks until none is left. A callback may submit a job that
 * completes at once (a stopping worker refuses it): that completion is run
 * here too, since at shutdown no later wake-up comes for it. */
static void drain_cb(uv_async_t *a) {
  gd_pool *p = a->data;
  for (;;) {
    pthread_mutex_lock(&p->lock);
    gd_job *j = p->done_head;
    p->done_head = p->done_tail = NULL;
    pthread_mutex_unlock(&p->lock);
    if (!j) return;
    while (j) {
      gd_job *next = j->next;
      j->done(j);
      j = next;
    }
  }
}

static void *worker_main(void *arg) {
  gd_worker *w = arg;
  gd_pool *p = w->pool;
  char tag[16];
  snprintf(tag, sizeof tag, "%s%d", strcmp(w->be->name, "cuda") == 0 ? "gpu" : "host", w->index);
  gd_log_set_thread_tag(tag);
  pthread_setname_np(pthread_self(), tag);

  char err[160] = "";
  int rc = w->be->ops->device_open(w->be, w->backend_index, &w->dev, err, sizeof err);
  if (rc < 0) {
    snprintf(w->fail_msg, sizeof w->fail_msg, "device %d (%s) could not be opened: %s", w->index,
             w->be->devices[w->backend_index].uuid_str, err);
    GD_LOG(GD_ERROR, "worker", "%s", w->fail_msg);
    atomic_store(&w->state, GD_WORKER_FAILED);
  } else {
    atomic_store(&w->state, GD_WORKER_OK);
    GD_LOG(GD_INFO, "worker", "serving device %d: %s %s", w->index,
           w->be->devices[w->backend_index].name, w->be->devices[w->backend_index].uuid_str);
  }
  atomic_store(&w->heartbeat_ns, gd_now_ns());
  pthread_mutex_lock(&p->start_lock);
  atomic_fetch_add(&p->started, 1);
  pthread_cond_broadcast(&p->start_cond);
  pthread_mutex_unlock(&p->start_lock);

  bool watching = false; /* ready waits queued on the device are watched */
  bool maybe_busy = false; /* a replay may still run on the device */
  for (;;) {
    /* Right after a job, the next request of a synchronous client is
     * usually a few tens of microseconds away: spin briefly before
     * sleeping, so that its hand-off costs no futex wake-up. */
    uint64_t spin_from = gd_now_ns();
    for (unsigned i = 0; !atomic_load(&w->queued); i++) {
      cpu_relax();
      if ((i & 63) == 0 && gd_now_ns() - spin_from > WORKER_SPIN_NS) break;
    }
    /* About to sleep with replays still running: keep waking every
     * WATCH_PERIOD to notice a fault (asked here, not after every job). */
    if (maybe_busy && !atomic_load(&w->queued)) maybe_busy = capture_busy(w);
    bool tick = watching || maybe_busy;
    pthread_mutex_lock(&w->lock);
    bool timed_out = false;
    while (!w->head && !w->stopping && !timed_out) {
      if (tick) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WATCH_PERIOD_NS;
        if (ts.tv_nsec >= 1000000000L) {
          ts.tv_sec++;
          ts.tv_nsec -= 1000000000L;
        }
        timed_out = pthread_cond_timedwait(&w->cond, &w->lock, &ts) == ETIMEDOUT;
      } else {
        pthread_cond_wait(&w->cond, &w->lock);
      }
    }
    gd_job *j = w->head;
    if (j) {
      w->head = j->next;
      if (!w->head) w->tail = NULL;
      atomic_fetch_sub(&w->queued, 1);
    }
    bool stopping = w->stopping;
    pthread_mutex_unlock(&w->lock);
    if (!j && stopping) break;
    atomic_store(&w->heartbeat_ns, gd_now_ns());
    /* When to ask whether the device faulted: on a wake-up with no job;
     * after a failed job (a fault fails every later call in its context);
     * after any job where the worker runs the work itself (host). */
    bool ask = !j || w->be->waits_on_worker;
    if (j) {
      if (stopping) {
        fail_unrun(j, "graphd is shutting down; the request was not run");
      } else if (atomic_load(&w->state) != GD_WORKER_OK) {
        fail_unrun(j, w->fail_msg);
      } else {
        atomic_store(&w->busy, 1);
        j->ran = true;
        j->status = 0;
        j->msg[0] = '\0';
        j->run(w, j);
        atomic_store(&w->busy, 0);
        ask = ask || j->status < 0;
        maybe_busy = true;
      }
      atomic_store(&w->heartbeat_ns, gd_now_ns());
      complete(p, j);
    }
    if (ask) check_device(w);
    if (!w->be->waits_on_worker && atomic_load(&w->state) == GD_WORKER_OK) {
      uint64_t cut[8];
      int pending = 0;
      int n = capture_watch(w, cut, 8, &pending);
      watching = pending;
      for (int i = 0; i < n; i++) {
        cut_job *cj = calloc(1, sizeof *cj);
        if (!cj) continue;
        cj->session_id = cut[i];
        cj->job.done = cut_done;
        cj->job.worker = w;
        complete(p, &cj->job);
      }
    }
  }
  capture_close_all(w);
  prepare_close(w);
  fault_close(w);
  if (w->dev) w->be->ops->device_close(w->be, w->dev);
  w->dev = NULL;
  GD_LOG(GD_DEBUG, "worker", "stopped");
  return NULL;
}

int worker_pool_start(gd_pool *p, uv_loop_t *loop, gd_backend *be, const int *idx, int n,
                      uint64_t budget) {
  memset(p, 0, sizeof *p);
  p->loop = loop;
  p->n = n;
  p->workers = calloc((size_t)n, sizeof *p->workers);
  if (!p->workers) return -GRAPHD_RESOURCE_EXHAUSTED;
  pthread_mutex_init(&p->lock, NULL);
  pthread_mutex_init(&p->start_lock, NULL);
  pthread_cond_init(&p->start_cond, NULL);
  int rc = uv_async_init(loop, &p->async, drain_cb);
  if (rc < 0) {
    GD_LOG(GD_ERROR, "worker", "uv_async_init: %s", uv_strerror(rc));
    return -GRAPHD_INTERNAL;
  }
  p->async.data = p;
  int launched = 0;
  for (int i = 0; i < n; i++) {
    gd_worker *w = &p->workers[i];
    w->index = i;
    w->be = be;
    w->budget = budget;
    w->backend_index = idx[i];
    w->pool = p;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
      snprintf(w->fail_msg, sizeof w->fail_msg, "device %d: cannot start its worker thread", i);
      atomic_store(&w->state, GD_WORKER_FAILED);
      GD_LOG(GD_ERROR, "worker", "%s", w->fail_msg);
      continue;
    }
    w->thread_started = true;
    launched++;
  }
  pthread_mutex_lock(&p->start_lock);
  while (atomic_load(&p->started) < launched) pthread_cond_wait(&p->start_cond, &p->start_lock);
  pthread_mutex_unlock(&p->start_lock);
  int ok = 0;
  for (int i = 0; i < n; i++) ok += atomic_load(&p->workers[i].state) == GD_WORKER_OK;
  return ok > 0 ? 0 : -GRAPHD_UNAVAILABLE;
}

void worker_submit(gd_worker *w, gd_job *j) {
  j->worker = w;
  j->next = NULL;
  pthread_mutex_lock(&w->lock);
  bool refuse = w->stopping || !w->thread_started;
  if (!refuse) {
    if (w->tail)
      w->tail->next = j;
    else
      w->head = j;
    w->tail = j;
    atomic_fetch_add(&w->queued, 1);
    pthread_cond_signal(&w->cond);
  }
  pthread_mutex_unlock(&w->lock);
  if (refuse) {
    fail_unrun(j, w->thread_started ? "graphd is shutting down; the request was not run"
                                    : w->fail_msg);
    complete(w->pool, j);
  }
}

int worker_pool_stop(gd_pool *p, double grace_s) {
  for (int i = 0; i < p->n; i++) {
    gd_worker *w = &p->workers[i];
    pthread_mutex_lock(&w->lock);
    w->stopping = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
  }
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  if (grace_s > 0) {
    double whole = floor(grace_s);
    deadline.tv_sec += (time_t)whole;
    deadline.tv_nsec += (long)((grace_s - whole) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
      deadline.tv_sec++;
      deadline.tv_nsec -= 1000000000L;
    }
  }
  int left = 0;
  for (int i = 0; i < p->n; i++) {
    gd_worker *w = &p->workers[i];
    if (!w->thread_started) continue;
    int rc = grace_s > 0 ? pthread_timedjoin_np(w->thread, NULL, &deadline)
                         : pthread_join(w->thread, NULL);
    if (rc != 0) {
      GD_LOG(GD_ERROR, "worker", "device %d's worker is still running a job after the "
             "%.1f s shutdown grace; leaving it", w->index, grace_s);
      left++;
      continue;
    }
    w->thread_started = false;
  }
  if (left) return left;
  drain_cb(&p->async);
  return 0;
}

void worker_pool_close(gd_pool *p) {
  if (uv_is_closing((uv_handle_t *)&p->async)) return;
  /* Jobs refused after the stop (sessions closed at shutdown) completed
   * into the done list; no wake-up will run them once the handle closes. */
  drain_cb(&p->async);
  uv_close((uv_handle_t *)&p->async, NULL);
}

int worker_pool_stuck(gd_pool *p, uint64_t stale_ns) {
  uint64_t now = gd_now_ns();
  int stuck = 0;
  for (int i = 0; i < p->n; i++) {
    gd_worker *w = &p->workers[i];
    if (atomic_load(&w->busy) && now - atomic_load(&w->heartbeat_ns) > stale_ns) stuck++;
  }
  return stuck;
}

void worker_pool_free(gd_pool *p) {
  for (int i = 0; p->workers && i < p->n; i++) {
    pthread_mutex_destroy(&p->workers[i].lock);
    pthread_cond_destroy(&p->workers[i].cond);
  }
  free(p->workers);
  p->workers = NULL;
  p->n = 0;
}

int worker_has_queued(gd_worker *w) {
  pthread_mutex_lock(&w->lock);
  int q = w->head != NULL;
  pthread_mutex_unlock(&w->lock);
  return q;
}

int worker_stopping(gd_worker *w) {
  pthread_mutex_lock(&w->lock);
  int s = w->stopping;
  pthread_mutex_unlock(&w->lock);
  return s;
}

void worker_heartbeat(gd_worker *w) { atomic_store(&w->heartbeat_ns, gd_now_ns()); }
