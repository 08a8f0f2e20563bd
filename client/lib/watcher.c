/* libgraphd: releasing a handle's stream waits from the host, and the
 * watcher thread that does it when the daemon dies.
 *
 * DESIGN: one watcher thread per process polls the sockets of handles that
 * have a flag page for a hang-up; on one it writes every issued seq into
 * the matching done word from the host, releasing stream waits within its
 * poll period, and marks the handle dead. It keeps writing them every
 * RELEASE_PERIOD_MS until every stream is past: GPU work the dead daemon
 * queued can still land a done write, lower than ours, until the driver
 * has torn its context down (seen on the H200 as a JAX loop that hung
 * about one time in four when the daemon was killed mid-loop). A call that
 * finds the daemon gone releases at once (call.c, through
 * gd_client_release_streams), and so does close for what a live daemon did
 * not finish (replay.c).
 *
 * Locks: the watcher's lock guards its list; a handle's lock guards its
 * calls. The watcher never takes a handle's lock (the handle's calling
 * thread may be blocked in recv holding it): it reads `issued` atomics and
 * writes flag words. A handle leaves the list (under the watcher's lock)
 * before its page is freed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define WATCH_PERIOD_MS 100
#define RELEASE_PERIOD_MS 2 /* rewriting a dead daemon's done words */
#define REWRITE_FOR_MS 10000

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static graphd_client *watch_list; /* guarded by watch_lock */
static int watch_wake = -1;       /* eventfd; guarded by watch_lock */
static bool watch_started;        /* guarded by watch_lock */

/* fork(): the watcher's lock is taken around it, so that the child's copy
 * is consistent and free; the child has no watcher thread and watches none
 * of the parent's handles (they are inherited, never watched there: see
 * graphd_forget), and starts a watcher of its own with its first page. */
static void watch_prepare(void) { pthread_mutex_lock(&watch_lock); }
static void watch_parent(void) { pthread_mutex_unlock(&watch_lock); }
static void watch_child(void) {
  watch_list = NULL;
  watch_started = false;
  if (watch_wake >= 0) close(watch_wake);
  watch_wake = -1;
  pthread_mutex_unlock(&watch_lock);
}
__attribute__((constructor)) static void watch_atfork(void) {
  pthread_atfork(watch_prepare, watch_parent, watch_child);
}

void gd_flags_trace(graphd_client *c, const char *what) {
  gd_flag_page *f = c->flags;
  for (uint32_t i = 0; f && i < GD_CLIENT_FLAG_SLOTS; i++) {
    uint64_t v = atomic_load(&f->issued[i]);
    if (!v) continue;
    /* The words change under us (the caller, the daemon, the watcher
     * write them): atomic reads, as everywhere else. */
    gd_client_debug(c, "%s: slot %u issued %llu ready %llu done %llu passed %llu", what, i,
                    (unsigned long long)v,
                    (unsigned long long)__atomic_load_n(gd_flag_word(f, i, GRAPHD_FLAG_WORD_READY),
                                                        __ATOMIC_RELAXED),
                    (unsigned long long)__atomic_load_n(gd_flag_word(f, i, GRAPHD_FLAG_WORD_DONE),
                                                        __ATOMIC_RELAXED),
                    (unsigned long long)__atomic_load_n(gd_flag_word(f, i, GRAPHD_FLAG_WORD_PASSED),
                                                        __ATOMIC_RELAXED));
  }
}

/* Releases every stream wait of c from the host. The first release after
 * the daemon went away keeps the done words as the daemon left them. Under
 * watch_lock, or once the page is snapped. */
static void release_all(graphd_client *c) {
  gd_flag_page *f = c->flags;
  if (!f) return;
  if (!f->snapped) {
    for (uint32_t i = 0; i < GD_CLIENT_FLAG_SLOTS; i++) {
      uint64_t done = __atomic_load_n(gd_flag_word(f, i, GRAPHD_FLAG_WORD_DONE), __ATOMIC_ACQUIRE);
      uint64_t issued = atomic_load(&f->issued[i]);
      f->hangup_done[i] = done;
      /* A graceful stop finishes its devices' work before it hangs up, so
       * what is above done now never ran. After a crash, GPU work the
       * daemon queued may still finish later: counted as lost too, since
       * nothing can tell (its outputs are undefined either way). */
      if (issued > done) {
        f->lost[i][f->lost_next[i]] = (gd_seq_range){.lo = done, .hi = issued};
        f->lost_next[i] = (uint8_t)((f->lost_next[i] + 1) % GD_LOST_RANGES);
        atomic_store(&f->any_lost, true);
      }
    }
    f->snapped = true;
  }
  for (uint32_t i = 0; i < GD_CLIENT_FLAG_SLOTS; i++) {
    uint64_t v = atomic_load(&f->issued[i]);
    volatile uint64_t *done = gd_flag_word(f, i, GRAPHD_FLAG_WORD_DONE);
    /* Raised, never lowered: a done the daemon wrote past what this side
     * counts as issued stays (only the GPU can write a lower one, which
     * the rewrites cover). */
    uint64_t cur = __atomic_load_n(done, __ATOMIC_ACQUIRE);
    while (cur < v &&
           !__atomic_compare_exchange_n(done, &cur, v, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
  }
}

/* Has every slot's stream got past what it issued? */
static bool all_passed(const gd_flag_page *f) {
  for (uint32_t i = 0; i < GD_CLIENT_FLAG_SLOTS; i++)
    if (__atomic_load_n(gd_flag_word(f, i, GRAPHD_FLAG_WORD_PASSED), __ATOMIC_ACQUIRE) <
        atomic_load(&f->issued[i]))
      return false;
  return true;
}

static void *watcher_main(void *arg) {
  (void)arg;
  for (;;) {
    struct pollfd pf[256];
    graphd_client *who[256];
    int n = 0;
    bool releasing = false;
    pthread_mutex_lock(&watch_lock);
    pf[n].fd = watch_wake;
    pf[n].events = POLLIN;
    who[n++] = NULL;
    for (graphd_client *c = watch_list; c && n < 256; c = c->watch_next) {
      if (atomic_load(&c->dead)) {
        /* The daemon is gone, but GPU work it queued can still land a done
         * write, lower than our release, until the driver has torn its
         * context down: write again until every stream is past (or, for a
         * stream that never gets there, for REWRITE_FOR_MS). A dead
         * handle's socket is not polled (it reports the hang-up forever). */
        int64_t now = gd_mono_us();
        if (!c->rewrite_until_us) c->rewrite_until_us = now + REWRITE_FOR_MS * 1000;
        if (now < c->rewrite_until_us && !all_passed(c->flags)) {
          release_all(c);
          releasing = true;
        }
        continue;
      }
      pf[n].fd = c->watch_fd;
      pf[n].events = POLLRDHUP;
      who[n++] = c;
    }
    pthread_mutex_unlock(&watch_lock);
    int r = poll(pf, (nfds_t)n, releasing ? RELEASE_PERIOD_MS : WATCH_PERIOD_MS);
    if (r < 0 && errno != EINTR) {
      gd_client_debug(NULL, "watcher: poll failed (%s); the watcher stops", strerror(errno));
      break;
    }
    if (r <= 0) continue;
    if (pf[0].revents & POLLIN) {
      uint64_t v;
      if (read(watch_wake, &v, sizeof v) < 0) { /* nothing to do */
      }
    }
    pthread_mutex_lock(&watch_lock);
    for (int i = 1; i < n; i++) {
      if (!(pf[i].revents & (POLLHUP | POLLRDHUP | POLLERR))) continue;
      /* Still listed? graphd_close may have removed it meanwhile. */
      for (graphd_client *c = watch_list; c; c = c->watch_next) {
        if (c != who[i] || atomic_load(&c->dead)) continue;
        gd_client_debug(c, "watcher: the daemon hung up");
        gd_flags_trace(c, "releasing");
        atomic_store(&c->dead, true);
        release_all(c);
      }
    }
    pthread_mutex_unlock(&watch_lock);
  }
  return NULL;
}

/* Wakes the watcher (to poll a new handle, or to start writing a dead
 * handle's releases again). */
static void watch_poke(void) {
  uint64_t one = 1;
  if (watch_wake >= 0 && write(watch_wake, &one, sizeof one) < 0) { /* the period covers it */
  }
}

bool gd_watch_add(graphd_client *c) {
  pthread_mutex_lock(&watch_lock);
  bool ok = watch_started;
  if (!ok) {
    watch_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    ok = watch_wake >= 0 && pthread_create(&th, &at, watcher_main, NULL) == 0;
    watch_started = ok;
    pthread_attr_destroy(&at);
  }
  if (ok) {
    c->watch_fd = fcntl(c->fd, F_DUPFD_CLOEXEC, 0);
    ok = c->watch_fd >= 0;
  }
  if (ok) {
    c->watch_next = watch_list;
    watch_list = c;
    watch_poke();
  }
  pthread_mutex_unlock(&watch_lock);
  return ok;
}

void gd_watch_remove(graphd_client *c) {
  pthread_mutex_lock(&watch_lock);
  for (graphd_client **p = &watch_list; *p; p = &(*p)->watch_next)
    if (*p == c) {
      *p = c->watch_next;
      break;
    }
  if (c->watch_fd >= 0) close(c->watch_fd);
  c->watch_fd = -1;
  watch_poke();
  pthread_mutex_unlock(&watch_lock);
}

void gd_client_release_streams(graphd_client *c) {
  gd_flags_trace(c, "releasing");
  pthread_mutex_lock(&watch_lock);
  release_all(c);
  watch_poke(); /* it writes them again until the streams are past */
  pthread_mutex_unlock(&watch_lock);
}

bool gd_flags_cut_off(graphd_client *c, uint32_t *slot, uint64_t *done, uint64_t *want) {
  gd_flag_page *f = c->flags;
  pthread_mutex_lock(&watch_lock);
  bool snapped = f && f->snapped;
  pthread_mutex_unlock(&watch_lock);
  if (!snapped) return false;
  for (uint32_t i = 0; i < GD_CLIENT_FLAG_SLOTS; i++) {
    uint64_t v = atomic_load(&f->issued[i]);
    if (!v || f->reported[i] == v) continue;
    uint64_t w = f->unrun[i] == v ? v - 1 : v;
    /* Below: the daemon never finished it. Above: it released the slot
     * itself (a device reset), which it does only for work it lost. */
    if (f->hangup_done[i] != w) {
      *slot = i;
      *done = f->hangup_done[i];
      *want = w;
      return true;
    }
  }
  return false;
}

bool gd_flags_lost(graphd_client *c, uint32_t slot, uint64_t seq, uint64_t *done) {
  gd_flag_page *f = c->flags;
  bool lost = false;
  if (!f || slot >= GD_CLIENT_FLAG_SLOTS || !atomic_load(&f->any_lost)) return false;
  pthread_mutex_lock(&watch_lock);
  for (int i = 0; i < GD_LOST_RANGES && !lost; i++) {
    gd_seq_range r = f->lost[slot][i];
    lost = seq > r.lo && seq <= r.hi;
    if (lost) *done = r.lo;
  }
  pthread_mutex_unlock(&watch_lock);
  return lost;
}

void gd_flags_mark_reported(graphd_client *c) {
  gd_flag_page *f = c->flags;
  for (uint32_t i = 0; f && i < GD_CLIENT_FLAG_SLOTS; i++)
    f->reported[i] = atomic_load(&f->issued[i]);
}

bool gd_flags_wait_passed(graphd_client *c, int ms, bool rerelease) {
  int64_t end = gd_mono_us() + (int64_t)ms * 1000;
  for (;;) {
    if (all_passed(c->flags)) return true;
    if (gd_mono_us() >= end) return false;
    if (rerelease) release_all(c);
    struct timespec nap = {0, 20000};
    nanosleep(&nap, NULL);
  }
}
