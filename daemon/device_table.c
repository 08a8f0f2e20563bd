/* See device_table.h. */
#include "device_table.h"

#include <stdlib.h>

#include "daemon/sessions/data_session.h"
#include "graphd/status.h"
#include "common/log.h"
#include "daemon/replay/ring_replay.h"
#include "daemon/device/upkeep.h"

static void tag_hook(const void *ctx, char *tag, size_t len) { device_tag(ctx, tag, len); }

static int start_hook(void *ctx) { return device_attach(ctx); }

static const char *refusal_hook(void *ctx) {
  gd_device *dev = ctx;
  return device_ok(dev) ? NULL : dev->fail_msg;
}

/* Ticks also while a ring is held back by --max-inflight-replays: its
 * entries may run once the device has caught up. */
static bool tick_hook(void *ctx) {
  return upkeep_wants_tick(ctx) || ring_replay_held(ctx) || ring_replay_has_stats(ctx);
}

static bool pending_hook(void *ctx) { return ring_replay_pending(ctx); }

static int poll_hook(void *ctx, gd_worker *w) { return ring_replay_poll(ctx, w); }

static bool sleep_hook(void *ctx, bool asleep) { return ring_replay_sleep(ctx, asleep); }

/* The loop's side of what the rings ran: the device's counters. */
typedef struct ring_stats_job {
  gd_job job;
  gd_daemon *d;
  int dev;
  gd_replay_tally st;
} ring_stats_job;

static void ring_stats_done(gd_job *j) {
  ring_stats_job *sj = gd_container_of(j, ring_stats_job, job);
  gd_counters_add_tally(&sj->d->counters[sj->dev], &sj->st);
  free(sj);
}

/* The loop's side of upkeep news. */
typedef struct news_job {
  gd_job job;
  gd_daemon *d;
  int dev;
  bool reset;
  uint64_t session_id; /* cut off, when !reset */
} news_job;

static void news_done(gd_job *j) {
  news_job *nj = gd_container_of(j, news_job, job);
  if (nj->reset)
    data_session_device_reset(nj->d, nj->dev);
  else
    data_session_cut_off(nj->d, nj->session_id);
  free(nj);
}

static void post_news(gd_worker *w, gd_device *dev, bool reset, uint64_t session_id) {
  news_job *nj = calloc(1, sizeof *nj);
  if (!nj) {
    GD_LOG(GD_ERROR, "devices", "out of memory telling the loop about device %d", dev->index);
    return;
  }
  nj->d = gd_container_of(w->pool, gd_daemon, pool);
  nj->dev = dev->index;
  nj->reset = reset;
  nj->session_id = session_id;
  nj->job.done = news_done;
  worker_post(w, &nj->job);
}

static void after_hook(void *ctx, gd_worker *w, bool had_job, bool ran, int status) {
  gd_device *dev = ctx;
  gd_upkeep_news news;
  upkeep_after(dev, had_job, ran, status, &news);
  gd_replay_tally st;
  if (ring_replay_take_stats(dev, !had_job, &st)) {
    ring_stats_job *sj = calloc(1, sizeof *sj);
    if (sj) {
      sj->d = gd_container_of(w->pool, gd_daemon, pool);
      sj->dev = dev->index;
      sj->st = st;
      sj->job.done = ring_stats_done;
      worker_post(w, &sj->job);
    }
  }
  if (news.reset) post_news(w, dev, true, 0);
  for (int i = 0; i < news.ncut; i++) post_news(w, dev, false, news.cut[i]);
  /* Sessions whose ring held others up past the ready timeout. */
  uint64_t hung[GD_UPKEEP_MAX_CUTS];
  int nhung = ring_replay_take_hung(dev, hung, GD_UPKEEP_MAX_CUTS);
  for (int i = 0; i < nhung; i++) post_news(w, dev, false, hung[i]);
}

static void stop_hook(void *ctx) { upkeep_close(ctx); }

static const gd_worker_hooks device_hooks = {
    .tag = tag_hook,
    .start = start_hook,
    .refusal = refusal_hook,
    .wants_tick = tick_hook,
    .after = after_hook,
    .stop = stop_hook,
    .pending = pending_hook,
    .poll = poll_hook,
    .sleep = sleep_hook,
};

int device_table_start(gd_daemon *d, uv_loop_t *loop, const int *idx, int n, uint64_t budget) {
  d->devices = calloc((size_t)n, sizeof *d->devices);
  void **ctx = calloc((size_t)n, sizeof *ctx);
  if (!d->devices || !ctx) {
    free(ctx);
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  for (int i = 0; i < n; i++) {
    device_init(&d->devices[i], i, d->be, idx[i], budget);
    if (d->opt) {
      d->devices[i].gpu_sample_every = d->opt->gpu_time_sample;
      d->devices[i].ready_hold_rings = d->opt->ready_hold_rings;
      d->devices[i].ready_hold_max_ns = d->opt->ready_hold_max_us * 1000ull;
      d->devices[i].fair_shares = d->opt->fair_shares != 0;
    }
    ctx[i] = &d->devices[i];
  }
  int ok = worker_pool_start(&d->pool, loop, n, ctx, &device_hooks);
  free(ctx);
  if (ok < 0) return ok;
  return ok > 0 ? 0 : -GRAPHD_UNAVAILABLE;
}

void device_table_free(gd_daemon *d) {
  free(d->devices);
  d->devices = NULL;
}
