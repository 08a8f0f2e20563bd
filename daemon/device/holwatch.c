/* See holwatch.h. Worker thread only. */
#include "holwatch.h"

#include <stdlib.h>
#include <time.h>

#include "daemon/base/clock.h"
#include "common/log.h"

typedef struct gd_watch {
  gd_session_stream *ds;
  uint32_t slot;
  uint64_t seq;
  uint64_t since_ns;
  uint64_t added; /* the list's add count when it came */
  double timeout_s;
  const void *key;
} gd_watch;

/* Per key with watches: the last add and the last add by another session,
 * so that "another session queued work on this key after watch x" is one
 * comparison, not a scan of the list on every add. */
typedef struct gd_wkey {
  const void *key;
  const gd_session_stream *last_ds; /* the session of the last add */
  uint64_t last;                    /* its add count */
  uint64_t other;                   /* the last add by a session other than last_ds (0: none) */
  uint32_t watches;                 /* watches on the list with this key */
} gd_wkey;

/* Sessions cut off while the worker itself waited on the device
 * (holwatch_wait_event), reported by the next holwatch_check. */
#define HELD_CUTS 64

struct gd_holwatch {
  gd_watch *w;
  uint32_t n, cap;
  gd_wkey *k;
  uint32_t nk, kcap;
  uint64_t adds;       /* queued waits seen, watched or not */
  uint64_t checked_ns; /* the last full check */
  uint64_t held_cuts[HELD_CUTS];
  int nheld_cuts;
};

/* A full check (met waits dropped, timeouts looked at) at most this often:
 * the worker asks after every job and poll, the timeouts are seconds, and
 * each look at a flag the GPU wrote is a cache miss. */
#define CHECK_EVERY_NS 1000000u

static bool met(const gd_watch *x) {
  return graphd_seq_reached(
      __atomic_load_n(session_stream_word(x->ds, x->slot, GRAPHD_FLAG_WORD_READY),
                      __ATOMIC_ACQUIRE),
      x->seq);
}

static gd_wkey *find_key(struct gd_holwatch *h, const void *key) {
  for (uint32_t i = 0; i < h->nk; i++)
    if (h->k[i].key == key) return &h->k[i];
  return NULL;
}

/* Another session queued work on x's key after x. */
static bool blocking(struct gd_holwatch *h, const gd_watch *x) {
  const gd_wkey *k = find_key(h, x->key);
  if (!k) return false;
  return k->last_ds != x->ds ? k->last > x->added : k->other > x->added;
}

/* Forgets a key whose last watch went. */
static void unwatch(struct gd_holwatch *h, const void *key) {
  gd_wkey *k = find_key(h, key);
  if (k && --k->watches == 0) *k = h->k[--h->nk];
}

void holwatch_add(gd_device *d, gd_session_stream *ds, uint32_t slot, uint64_t seq,
                  double timeout_s, const void *key) {
  struct gd_holwatch *h = d->hol;
  if (!h && !(h = d->hol = calloc(1, sizeof *h))) return; /* unwatched: only the timeout is lost */
  uint64_t add = ++h->adds;
  gd_wkey *k = find_key(h, key);
  if (k) {
    if (k->last_ds != ds) k->other = k->last;
    k->last_ds = ds;
    k->last = add;
  }
  gd_watch x = {.ds = ds,
                .slot = slot,
                .seq = seq,
                .since_ns = gd_now_ns(),
                .added = add,
                .timeout_s = timeout_s,
                .key = key};
  if (timeout_s <= 0 || ds->cut_off || met(&x)) return;
  if (!k) {
    /* No watch on this key: earlier adds on it are behind nobody's wait. */
    if (h->nk == h->kcap) {
      uint32_t cap = h->kcap ? 2 * h->kcap : 8;
      gd_wkey *n = realloc(h->k, cap * sizeof *n);
      if (!n) return;
      h->k = n;
      h->kcap = cap;
    }
    k = &h->k[h->nk++];
    *k = (gd_wkey){.key = key, .last_ds = ds, .last = add};
  }
  if (h->n == h->cap) {
    uint32_t cap = h->cap ? 2 * h->cap : 16;
    gd_watch *n = realloc(h->w, cap * sizeof *n);
    if (!n) {
      if (!k->watches) *k = h->k[--h->nk];
      return;
    }
    h->w = n;
    h->cap = cap;
  }
  h->w[h->n++] = x;
  k->watches++;
}

void holwatch_drop_stream(gd_device *d, const gd_session_stream *ds) {
  struct gd_holwatch *h = d->hol;
  uint32_t k = 0;
  for (uint32_t i = 0; h && i < h->n; i++)
    if (h->w[i].ds != ds)
      h->w[k++] = h->w[i];
    else
      unwatch(h, h->w[i].key);
  if (h) h->n = k;
}

void holwatch_drop_key(gd_device *d, const void *key) {
  struct gd_holwatch *h = d->hol;
  for (uint32_t k = 0; h && k < h->n;)
    if (h->w[k].key == key) {
      unwatch(h, key);
      h->w[k] = h->w[--h->n];
    } else {
      k++;
    }
}

/* Drops the watches that were met. */
static void drop_met(struct gd_holwatch *h) {
  uint32_t k = 0;
  for (uint32_t i = 0; i < h->n; i++)
    if (!met(&h->w[i]))
      h->w[k++] = h->w[i];
    else
      unwatch(h, h->w[i].key);
  h->n = k;
}

/* Cuts off the sessions with a wait past its timeout: those in another
 * session's way, or (any) all of them. Each is released from the host
 * (its watched ready words set to what they wait for), its watches
 * dropped, and its id written to cut[] (at most ncut). Returns how many. */
static int cut_hung(gd_device *d, uint64_t now, bool any, uint64_t *cut, int ncut) {
  struct gd_holwatch *h = d->hol;
  int n = 0;
  for (uint32_t i = 0; i < h->n && n < ncut; i++) {
    gd_watch *x = &h->w[i];
    if (!gd_ready_overdue(x->since_ns, now, x->timeout_s) || x->ds->cut_off) continue;
    if (!any && !blocking(h, x)) continue; /* slow, but in nobody's way */
    /* Hung: let its replay run now (its outputs are undefined) so the ones
     * behind it can, and have the loop close its session. */
    gd_session_stream *ds = x->ds;
    ds->cut_off = true;
    for (uint32_t j = 0; j < h->n; j++)
      if (h->w[j].ds == ds) {
        volatile uint64_t *r = session_stream_word(ds, h->w[j].slot, GRAPHD_FLAG_WORD_READY);
        if (!graphd_seq_reached(__atomic_load_n(r, __ATOMIC_ACQUIRE), h->w[j].seq))
          __atomic_store_n(r, h->w[j].seq, __ATOMIC_RELEASE);
      }
    GD_LOG(GD_WARN, "holwatch",
           "session %llu: its ready flag did not reach %llu within %.3g s while %s waited "
           "behind it; released from the host and cut off",
           (unsigned long long)ds->session_id, (unsigned long long)x->seq, x->timeout_s,
           any ? "the device's worker" : "another session");
    cut[n++] = ds->session_id;
  }
  for (int i = 0; i < n; i++)
    for (uint32_t j = 0; j < h->n; j++)
      if (h->w[j].ds->session_id == cut[i]) {
        holwatch_drop_stream(d, h->w[j].ds);
        break;
      }
  return n;
}

int holwatch_check(gd_device *d, uint64_t *cut, int ncut, bool *pending) {
  struct gd_holwatch *h = d->hol;
  int n = 0;
  *pending = false;
  if (!h) return 0;
  while (h->nheld_cuts && n < ncut) cut[n++] = h->held_cuts[--h->nheld_cuts];
  if (!h->n) return n;
  *pending = true;
  uint64_t now = gd_now_ns();
  if (now - h->checked_ns < CHECK_EVERY_NS) return n;
  h->checked_ns = now;
  drop_met(h);
  n += cut_hung(d, now, false, cut + n, ncut - n);
  *pending = h->n > 0 || h->nheld_cuts > 0;
  return n;
}

void holwatch_cut_hung(gd_device *d) {
  struct gd_holwatch *h = d->hol;
  uint64_t now = gd_now_ns();
  if (!h || !h->n || now - h->checked_ns < CHECK_EVERY_NS) return;
  h->checked_ns = now;
  drop_met(h);
  if (h->nheld_cuts == HELD_CUTS) return;
  h->nheld_cuts += cut_hung(d, now, true, h->held_cuts + h->nheld_cuts, HELD_CUTS - h->nheld_cuts);
  if (h->nheld_cuts) d->watching = true; /* the next check reports them */
}

void holwatch_wait_event(gd_device *d, gd_event ev) {
  const gd_backend_ops *ops = d->be->ops;
  long nap_ns = 2000;
  while (!ops->event_done(d->be, d->dev, ev)) {
    holwatch_cut_hung(d);
    struct timespec t = {0, nap_ns};
    nanosleep(&t, NULL);
    if (nap_ns < 1000000) nap_ns *= 2;
  }
}

void holwatch_sync_stream(gd_device *d, gd_session_stream *ds) {
  if (!ds || !ds->has_stream || ds->epoch != atomic_load(&d->epoch)) return;
  const gd_backend_ops *ops = d->be->ops;
  gd_event ev;
  char e[256];
  if (ops->event_create(d->be, d->dev, &ev, e, sizeof e) < 0) {
    session_stream_sync(d, ds);
    return;
  }
  if (ops->event_record(d->be, d->dev, ev, ds->stream, e, sizeof e) == 0)
    holwatch_wait_event(d, ev);
  else
    session_stream_sync(d, ds);
  ops->event_destroy(d->be, d->dev, ev);
}

void holwatch_close(gd_device *d) {
  if (!d->hol) return;
  free(d->hol->k);
  free(d->hol->w);
  free(d->hol);
  d->hol = NULL;
}
