/* Worker threads: one FIFO of jobs per thread, run in order, handed back
 * to the loop thread when done. A worker knows nothing of devices: what it
 * serves comes in as an opaque context and a few hooks (open at start, why
 * jobs are refused, the idle tick, the work after each job, teardown, and
 * work that arrives without a job: the submission rings of asynchronous
 * replays, which clients fill directly).
 *
 * DESIGN: the loop thread submits jobs with worker_submit(); the worker
 * runs job->run on its thread, then hands the job back through the pool's
 * completion list and uv_async_send(); the loop runs job->done. Between
 * jobs the worker runs the `poll` hook while `pending` says there is work.
 * An idle worker spins a bounded time, then sleeps in epoll_wait on its
 * own eventfd (written by worker_submit and worker_pool_stop only while
 * the worker sleeps) and on the doorbells the hooks add to its wake set
 * (worker_wake_set), so that it wakes for either. From taking work to
 * spinning again the worker is busy: it times each busy spell with the
 * clock reads the loop makes anyway and publishes the sum (worker_busy).
 *
 * Locks: each worker's `lock` guards its queue, `stopping` and `sleeping`;
 * the pool's `lock` guards the completion list. Neither lock is held while
 * running a job, a hook or a callback, and no thread takes both at once. */
#ifndef GRAPHD_WORKER_H
#define GRAPHD_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct gd_worker gd_worker;
typedef struct gd_job gd_job;
typedef struct gd_pool gd_pool;

/* Runs on the worker with its context; sets job->status (0 or a negated
 * graphd status) and job->msg. */
typedef void (*gd_job_run_fn)(gd_job *j, void *ctx);
/* Runs on the loop thread once the job is back; owns the job from then on. */
typedef void (*gd_job_done_fn)(gd_job *j);

struct gd_job {
  gd_job *next;
  gd_job_run_fn run;
  gd_job_done_fn done;
  gd_worker *worker;
  int status;    /* 0 or a negated graphd status */
  char msg[512]; /* error text for the client */
  bool ran;      /* false when failed without running (shutdown, unusable context) */
  /* Nothing of it was started because graphd is stopping (it was still
   * queued, or gave up waiting to begin): the client may send it again to
   * the next daemon (Reply.not_started). */
  bool not_started;
};

/* What a worker serves. Every hook runs on the worker thread with ctx. */
typedef struct gd_worker_hooks {
  /* The thread's tag in logs and its name ("gpu0"). */
  void (*tag)(const void *ctx, char *tag, size_t len);
  /* Before serving: open what ctx names; < 0 when it could not (jobs are
   * then refused through `refusal`). */
  int (*start)(void *ctx);
  /* NULL while jobs may run, else why they are refused. */
  const char *(*refusal)(void *ctx);
  /* About to sleep with nothing queued: whether to wake every tick. */
  bool (*wants_tick)(void *ctx);
  /* After each job, once it is handed back (had_job, with whether it ran
   * and its status), and after each tick (had_job false). */
  void (*after)(void *ctx, gd_worker *w, bool had_job, bool ran, int status);
  /* On the way out, after the last job. */
  void (*stop)(void *ctx);
  /* Work without a job is waiting (cheap: asked while spinning). */
  bool (*pending)(void *ctx);
  /* Does some of that work; returns the worst status of what it ran (0
   * or a negated status), which the after hook gets. */
  int (*poll)(void *ctx, gd_worker *w);
  /* About to sleep (asleep): ask producers for a wake-up, and say whether
   * work came meanwhile (then the worker does not sleep); awake again
   * (!asleep): they need not ring any more. */
  bool (*sleep)(void *ctx, bool asleep);
} gd_worker_hooks;

struct gd_worker {
  int index;
  void *ctx;
  const gd_worker_hooks *hooks;
  gd_pool *pool;
  pthread_t thread;
  bool thread_started;
  pthread_mutex_t lock;
  int wake_fd;                   /* eventfd: jobs or the stop for a sleeping worker */
  int epfd;                      /* epoll set: wake_fd and the hooks' doorbells */
  gd_job *head, *tail;           /* guarded by lock */
  bool stopping;                 /* guarded by lock */
  bool sleeping;                 /* guarded by lock: in epoll_wait, or about to be */
  _Atomic uint64_t heartbeat_ns; /* last time the worker woke or finished a job */
  _Atomic bool busy;             /* a job is running */
  _Atomic int queued;            /* jobs in the queue, for the spin before sleeping */
  /* The busy clock (worker_busy): the worker's time at work (jobs, ring
   * work, its hooks) as against spinning or sleeping for work. Only the
   * worker writes it, as a seqlock: busy_seq is odd while it updates the
   * two figures, which any thread may read between. */
  _Atomic uint64_t busy_seq;
  _Atomic uint64_t busy_sum_ns;      /* the busy spells that ended */
  _Atomic uint64_t busy_since_ns;    /* when the current spell began; 0: waiting for work */
  _Atomic uint64_t serving_since_ns; /* when it began serving, after its start hook; 0: not yet */
};

struct gd_pool {
  uv_loop_t *loop;
  uv_async_t async;
  pthread_mutex_t lock;
  gd_job *done_head, *done_tail; /* guarded by lock */
  gd_worker *workers;
  int n;
  _Atomic int started; /* workers past their start hook */
  pthread_mutex_t start_lock;
  pthread_cond_t start_cond;
};

/* Starts n workers, worker i serving ctx[i] with hooks, and waits until
 * each has run its start hook. Loop thread, before serving clients.
 * Returns how many started (their start hook returned 0), or a negated
 * status when the pool itself could not be made. */
int worker_pool_start(gd_pool *p, uv_loop_t *loop, int n, void *const *ctx,
                      const gd_worker_hooks *hooks);

/* Queues j on w. Loop thread. If the worker is stopping or has no thread,
 * the job completes with UNAVAILABLE without running. */
void worker_submit(gd_worker *w, gd_job *j);

/* Hands j straight to the loop (its done runs there; run never does). Any
 * thread: a worker tells the loop of something this way. */
void worker_post(gd_worker *w, gd_job *j);

/* Stops every worker: each finishes the job it runs, fails the jobs still
 * queued with UNAVAILABLE, runs its stop hook and exits. Joins them, then
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
bool worker_has_queued(gd_worker *w);
/* True once worker_pool_stop() has asked w to stop. */
bool worker_stopping(gd_worker *w);
/* The epoll set w sleeps on: the worker's hooks add clients' eventfds to
 * it (EPOLLIN | EPOLLET, data.fd the fd; the worker never reads them, so
 * nothing a client does to its eventfd can block the worker or make it
 * spin) and must remove each before closing it. Worker thread. */
int worker_wake_set(gd_worker *w);
/* True when a job waits in w's queue; without the lock (a ring's poll asks
 * it between entries, to let jobs go first). Worker thread. */
static inline bool worker_jobs_waiting(gd_worker *w) { return atomic_load(&w->queued) > 0; }
/* Marks w alive (a job that waits a long time calls it). */
void worker_heartbeat(gd_worker *w);

/* How long w has been at work since it began serving (*busy_ns: jobs, ring
 * work and its hooks, a spell still running counted up to now), and how
 * long it has served (*clock_ns), read at one instant: over an interval
 * the share of the time it was busy is the change in the one over the
 * change in the other, and *busy_ns <= *clock_ns. Both 0 before it
 * serves. Any thread; lock-free (it retries while the worker updates). */
void worker_busy(gd_worker *w, uint64_t *busy_ns, uint64_t *clock_ns);

/* Asks each stuck worker (as worker_pool_stuck counts them) to write its
 * stack to the log. Loop thread. */
void worker_pool_dump_stuck(gd_pool *p, uint64_t stale_ns);

/* Number of workers whose heartbeat is older than stale_ns while busy:
 * stuck in one job. Any thread. */
int worker_pool_stuck(gd_pool *p, uint64_t stale_ns);

#endif
