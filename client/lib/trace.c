/* libgraphd: the $GRAPHD_CLIENT_DEBUG trace on stderr. The lowest layer
 * (internal.h lists them): it uses no other file of libgraphd. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/env.h"
#include "internal.h"

int64_t gd_mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t gd_mono_ms(void) { return gd_mono_us() / 1000; }

void gd_client_debug(const graphd_client *c, const char *fmt, ...) {
  /* Read on first use by whichever thread traces first (the watcher, a
   * caller): every thread computes the same value. */
  static _Atomic int on = -1;
  int o = atomic_load_explicit(&on, memory_order_relaxed);
  if (o < 0) {
    o = gd_env_flag("GRAPHD_CLIENT_DEBUG");
    atomic_store_explicit(&on, o, memory_order_relaxed);
  }
  if (!o) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  fprintf(stderr, "graphd-client %ld.%06ld handle %p: %s\n", (long)ts.tv_sec, ts.tv_nsec / 1000,
          (const void *)c, msg);
}
