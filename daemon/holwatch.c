/* See holwatch.h. Worker thread only. */
#include "holwatch.h"

#include <stdlib.h>

#include "clock.h"
#include "common/log.h"

typedef struct gd_watch {
  gd_dstream *ds;
  uint32_t slot;
  uint64_t seq;
  uint64_t since_ns;
  double timeout_s;
  const void *key;
  bool blocking; /* another session queued work on key behind it */
} gd_watch;

struct gd_holwatch {
  gd_watch *w;
  uint32_t n, cap;
};

static bool met(const gd_watch *x) {
  return __atomic_load_n(dstream_word(x->ds, x->slot, GRAPHD_FLAG_WORD_READY), __ATOMIC_ACQUIRE) >=
         x->seq;
}

void holwatch_add(gd_device *d, gd_dstream *ds, uint32_t slot, uint64_t seq, double timeout_s,
                  const void *key) {
  struct gd_holwatch *h = d->hol;
  for (uint32_t i = 0; h && i < h->n; i++)
    if (h->w[i].key == key && h->w[i].ds != ds) h->w[i].blocking = true;
  gd_watch x = {.ds = ds,
                .slot = slot,
                .seq = seq,
                .since_ns = gd_now_ns(),
                .timeout_s = timeout_s,
                .key = key};
  if (timeout_s <= 0 || ds->cut_off || met(&x)) return;
  if (!h && !(h = d->hol = calloc(1, sizeof *h))) return; /* unwatched: only the timeout is lost */
  if (h->n == h->cap) {
    uint32_t cap = h->cap ? 2 * h->cap : 16;
    gd_watch *n = realloc(h->w, cap * sizeof *n);
    if (!n) return;
    h->w = n;
    h->cap = cap;
  }
  h->w[h->n++] = x;
}

void holwatch_drop_stream(gd_device *d, const gd_dstream *ds) {
  struct gd_holwatch *h = d->hol;
  uint32_t k = 0;
  for (uint32_t i = 0; h && i < h->n; i++)
    if (h->w[i].ds != ds) h->w[k++] = h->w[i];
  if (h) h->n = k;
}

void holwatch_drop_key(gd_device *d, const void *key) {
  struct gd_holwatch *h = d->hol;
  for (uint32_t k = 0; h && k < h->n;)
    if (h->w[k].key == key)
      h->w[k] = h->w[--h->n];
    else
      k++;
}

int holwatch_check(gd_device *d, uint64_t *cut, int ncut, bool *pending) {
  struct gd_holwatch *h = d->hol;
  int n = 0;
  *pending = false;
  if (!h) return 0;
  uint64_t now = gd_now_ns();
  uint32_t k = 0;
  for (uint32_t i = 0; i < h->n; i++)
    if (!met(&h->w[i])) h->w[k++] = h->w[i];
  h->n = k;
  for (uint32_t i = 0; i < h->n && n < ncut; i++) {
    gd_watch *x = &h->w[i];
    if ((double)(now - x->since_ns) < x->timeout_s * 1e9 || x->ds->cut_off) continue;
    if (!x->blocking) continue; /* slow, but in nobody's way */
    /* Hung: let its replay run now (its outputs are undefined) so the ones
     * behind it can, and have the loop close its session. */
    gd_dstream *ds = x->ds;
    ds->cut_off = true;
    for (uint32_t j = 0; j < h->n; j++)
      if (h->w[j].ds == ds) {
        volatile uint64_t *r = dstream_word(ds, h->w[j].slot, GRAPHD_FLAG_WORD_READY);
        if (__atomic_load_n(r, __ATOMIC_ACQUIRE) < h->w[j].seq)
          __atomic_store_n(r, h->w[j].seq, __ATOMIC_RELEASE);
      }
    GD_LOG(GD_WARN, "holwatch",
           "session %llu: its ready flag did not reach %llu within %.3g s while another "
           "session waited behind it; released from the host and cut off",
           (unsigned long long)ds->session_id, (unsigned long long)x->seq, x->timeout_s);
    cut[n++] = ds->session_id;
  }
  for (int i = 0; i < n; i++)
    for (uint32_t j = 0; j < h->n; j++)
      if (h->w[j].ds->session_id == cut[i]) {
        holwatch_drop_stream(d, h->w[j].ds);
        break;
      }
  *pending = h->n > 0;
  return n;
}

void holwatch_close(gd_device *d) {
  if (!d->hol) return;
  free(d->hol->w);
  free(d->hol);
  d->hol = NULL;
}
