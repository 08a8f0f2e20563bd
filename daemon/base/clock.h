/* The daemon's clock and small helpers every layer uses. Leaf header. */
#ifndef GRAPHD_CLOCK_H
#define GRAPHD_CLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Monotonic nanoseconds. Any thread. */
static inline uint64_t gd_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The one timing of --ready-timeout, the bound on how long a client may
 * hold others up (its ready write not come, its entries held back): a
 * wait that began at since_ns is past it once timeout_s seconds have gone
 * by at now_ns; never with timeout_s <= 0 (no bound). Who must be waiting
 * behind the client for it to be given up is each caller's part. */
static inline bool gd_ready_overdue(uint64_t since_ns, uint64_t now_ns, double timeout_s) {
  return timeout_s > 0 && (double)(now_ns - since_ns) >= timeout_s * 1e9;
}

/* The struct that holds `member` at `ptr`. */
#define gd_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#endif
