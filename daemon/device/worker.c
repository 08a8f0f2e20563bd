/* See worker.h for the threading design. */
#define _GNU_SOURCE
#include "worker.h"

#include <errno.h>
#include <math.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/base/clock.h"
#include "graphd/status.h"
#include "daemon/base/crash.h"
#include "common/log.h"

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

/* How long an idle worker spins before it sleeps in epoll_wait. */
#define WORKER_SPIN_NS 50000u

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

/* stopping: graphd is stopping, so the job was not started and may be
 * sent again to the next daemon. */
static void fail_unrun(gd_job *j, const char *why, bool stopping) {
  j->ran = false;
  j->not_started = stopping;
  j->status = -GRAPHD_UNAVAILABLE;
  snprintf(j->msg, sizeof j->msg, "%s", why);
}

#define STOPPING_MSG "graphd is shutting down; the request was not started (send it again)"

/* How often a worker that wants ticks wakes while idle. */
#define TICK_MS 10

/* Wakes a sleeping worker. w->lock held. */
static void wake(gd_worker *w) {
  uint64_t one = 1;
  if (w->sleeping && write(w->wake_fd, &one, sizeof one) < 0) { /* the counter is only a signal */
  }
}

/* Sleeps until a job, the stop or a doorbell wakes the worker, or
 * timeout_ms passes (-1: no timeout). Only the worker's own eventfd is
 * read. A doorbell is the client's: it shares its open file description
 * with the client, which can clear O_NONBLOCK on it, hand the same one to
 * two sessions, read it itself or put it in semaphore mode, so a read of
 * it could block the worker for good or wake it once per unit counted.
 * Doorbells are watched edge-triggered and never read: each write by the
 * client is one edge, whatever the counter holds. */
static void sleep_for_events(gd_worker *w, int timeout_ms) {
  struct epoll_event ev[16];
  int n = epoll_wait(w->epfd, ev, 16, timeout_ms);
  for (int i = 0; i < n; i++) {
    uint64_t v;
    if (ev[i].data.fd == w->wake_fd && read(w->wake_fd, &v, sizeof v) < 0) { /* emptied already */
    }
  }
}

/* Starts (busy) or ends a busy spell and returns the time it did, which
 * the caller uses as its own stamp. The clock is read inside the write so
 * that a reader never sees a spell end before the time it counted it up
 * to. Worker thread: the only writer (seqlock, as in worker.h). */
static uint64_t busy_mark(gd_worker *w, bool busy) {
  uint64_t seq = atomic_load_explicit(&w->busy_seq, memory_order_relaxed);
  atomic_store_explicit(&w->busy_seq, seq + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  uint64_t now = gd_now_ns();
  uint64_t since = atomic_load_explicit(&w->busy_since_ns, memory_order_relaxed);
  if (busy && !since) {
    atomic_store_explicit(&w->busy_since_ns, now, memory_order_relaxed);
  } else if (!busy && since) {
    uint64_t sum = atomic_load_explicit(&w->busy_sum_ns, memory_order_relaxed);
    atomic_store_explicit(&w->busy_sum_ns, sum + (now - since), memory_order_relaxed);
    atomic_store_explicit(&w->busy_since_ns, 0, memory_order_relaxed);
  }
  atomic_store_explicit(&w->busy_seq, seq + 2, memory_order_release);
  return now;
}

void worker_busy(gd_worker *w, uint64_t *busy_ns, uint64_t *clock_ns) {
  uint64_t from = atomic_load(&w->serving_since_ns);
  *busy_ns = *clock_ns = 0;
  if (!from) return;
  uint64_t seq, sum, since, now;
  for (;;) {
    seq = atomic_load_explicit(&w->busy_seq, memory_order_acquire);
    sum = atomic_load_explicit(&w->busy_sum_ns, memory_order_relaxed);
    since = atomic_load_explicit(&w->busy_since_ns, memory_order_relaxed);
    now = gd_now_ns();
    atomic_thread_fence(memory_order_acquire);
    if (!(seq & 1) && atomic_load_explicit(&w->busy_seq, memory_order_relaxed) == seq) break;
    cpu_relax(); /* the worker is inside busy_mark: a few instructions */
  }
  *busy_ns = sum + (since && now > since ? now - since : 0);
  *clock_ns = now > from ? now - from : 0;
  if (*busy_ns > *clock_ns) *busy_ns = *clock_ns;
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
  const gd_worker_hooks *h = w->hooks;
  char tag[16] = "worker";
  h->tag(w->ctx, tag, sizeof tag);
  gd_log_set_thread_tag(tag);
  pthread_setname_np(pthread_self(), tag);
  (void)h->start(w->ctx); /* a failed start shows in h->refusal */
  uint64_t started = gd_now_ns();
  atomic_store(&w->heartbeat_ns, started);
  atomic_store(&w->serving_since_ns, started);
  pthread_mutex_lock(&p->start_lock);
  atomic_fetch_add(&p->started, 1);
  pthread_cond_broadcast(&p->start_cond);
  pthread_mutex_unlock(&p->start_lock);

  for (;;) {
    /* Right after a job, the next request of a synchronous client is
     * usually a few tens of microseconds away, and an asynchronous client
     * may be filling its ring: spin briefly before sleeping, so that its
     * hand-off costs no wake-up. Waiting for work ends a busy spell. */
    uint64_t spin_from = busy_mark(w, false);
    for (unsigned i = 0; !atomic_load(&w->queued) && !h->pending(w->ctx); i++) {
      cpu_relax();
      if ((i & 63) == 0 && gd_now_ns() - spin_from > WORKER_SPIN_NS) break;
    }
    pthread_mutex_lock(&w->lock);
    if (!w->head && !w->stopping && !h->pending(w->ctx)) {
      bool tick = h->wants_tick(w->ctx);
      w->sleeping = true;
      pthread_mutex_unlock(&w->lock);
      /* A job queued from here on writes wake_fd (sleeping is set); a
       * ring entry published after the hook asked for a wake-up rings. */
      if (!h->sleep(w->ctx, true)) sleep_for_events(w, tick ? TICK_MS : -1);
      h->sleep(w->ctx, false);
      pthread_mutex_lock(&w->lock);
      w->sleeping = false;
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
    atomic_store(&w->heartbeat_ns, busy_mark(w, true));
    if (j) {
      const char *why = stopping ? STOPPING_MSG : h->refusal(w->ctx);
      if (why) {
        fail_unrun(j, why, stopping);
      } else {
        atomic_store(&w->busy, true);
        j->ran = true;
        j->not_started = false;
        j->status = 0;
        j->msg[0] = '\0';
        j->run(j, w->ctx);
        atomic_store(&w->busy, false);
      }
      atomic_store(&w->heartbeat_ns, gd_now_ns());
      /* The loop may free the job once it has it: keep what the hook reads. */
      bool ran = j->ran;
      int status = j->status;
      complete(p, j);
      h->after(w->ctx, w, true, ran, status);
    } else if (h->pending(w->ctx) && !h->refusal(w->ctx)) {
      atomic_store(&w->busy, true);
      int status = h->poll(w->ctx, w);
      atomic_store(&w->busy, false);
      atomic_store(&w->heartbeat_ns, gd_now_ns());
      h->after(w->ctx, w, true, true, status);
    } else {
      h->after(w->ctx, w, false, false, 0);
    }
  }
  h->stop(w->ctx);
  GD_LOG(GD_DEBUG, "worker", "stopped");
  return NULL;
}

int worker_pool_start(gd_pool *p, uv_loop_t *loop, int n, void *const *ctx,
                      const gd_worker_hooks *hooks) {
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
    w->ctx = ctx[i];
    w->hooks = hooks;
    w->pool = p;
    pthread_mutex_init(&w->lock, NULL);
    w->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = w->wake_fd};
    if (w->wake_fd < 0 || w->epfd < 0 || epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->wake_fd, &ev) < 0) {
      GD_LOG(GD_ERROR, "worker", "worker %d: cannot make its wake-up fds: %s", i, strerror(errno));
      continue;
    }
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
      GD_LOG(GD_ERROR, "worker", "worker %d: cannot start its thread", i);
      continue;
    }
    w->thread_started = true;
    launched++;
  }
  pthread_mutex_lock(&p->start_lock);
  while (atomic_load(&p->started) < launched) pthread_cond_wait(&p->start_cond, &p->start_lock);
  pthread_mutex_unlock(&p->start_lock);
  int ok = 0;
  for (int i = 0; i < n; i++) ok += p->workers[i].thread_started && !hooks->refusal(ctx[i]);
  return ok;
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
    wake(w);
  }
  pthread_mutex_unlock(&w->lock);
  if (refuse) {
    fail_unrun(j, w->thread_started ? STOPPING_MSG : "this device's worker thread did not start",
               w->thread_started);
    complete(w->pool, j);
  }
}

int worker_pool_stop(gd_pool *p, double grace_s) {
  for (int i = 0; i < p->n; i++) {
    gd_worker *w = &p->workers[i];
    pthread_mutex_lock(&w->lock);
    w->stopping = true;
    wake(w);
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
      GD_LOG(GD_ERROR, "worker",
             "device %d's worker is still running a job after the "
             "%.1f s shutdown grace; leaving it (its stack follows)",
             w->index, grace_s);
      gd_dump_thread_stack(w->thread);
      usleep(100000); /* the stack is written before graphd exits */
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

/* Busy in one job, last heard of more than stale_ns before now. */
static bool worker_stuck(gd_worker *w, uint64_t now, uint64_t stale_ns) {
  return atomic_load(&w->busy) && now - atomic_load(&w->heartbeat_ns) > stale_ns;
}

void worker_pool_dump_stuck(gd_pool *p, uint64_t stale_ns) {
  uint64_t now = gd_now_ns();
  for (int i = 0; i < p->n; i++) {
    gd_worker *w = &p->workers[i];
    if (w->thread_started && worker_stuck(w, now, stale_ns)) gd_dump_thread_stack(w->thread);
  }
}

int worker_pool_stuck(gd_pool *p, uint64_t stale_ns) {
  uint64_t now = gd_now_ns();
  int stuck = 0;
  for (int i = 0; i < p->n; i++) {
    gd_worker *w = &p->workers[i];
    if (worker_stuck(w, now, stale_ns)) stuck++;
  }
  return stuck;
}

void worker_pool_free(gd_pool *p) {
  for (int i = 0; p->workers && i < p->n; i++) {
    gd_worker *w = &p->workers[i];
    pthread_mutex_destroy(&w->lock);
    if (w->epfd >= 0) close(w->epfd);
    if (w->wake_fd >= 0) close(w->wake_fd);
  }
  free(p->workers);
  p->workers = NULL;
  p->n = 0;
}

bool worker_has_queued(gd_worker *w) {
  pthread_mutex_lock(&w->lock);
  bool q = w->head != NULL;
  pthread_mutex_unlock(&w->lock);
  return q;
}

bool worker_stopping(gd_worker *w) {
  pthread_mutex_lock(&w->lock);
  bool s = w->stopping;
  pthread_mutex_unlock(&w->lock);
  return s;
}

int worker_wake_set(gd_worker *w) { return w->epfd; }

void worker_heartbeat(gd_worker *w) { atomic_store(&w->heartbeat_ns, gd_now_ns()); }

void worker_post(gd_worker *w, gd_job *j) {
  j->worker = w;
  complete(w->pool, j);
}
