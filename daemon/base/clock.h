/* The daemon's clock and small helpers every layer uses. Leaf header. */
#ifndef GRAPHD_CLOCK_H
#define GRAPHD_CLOCK_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Monotonic nanoseconds. Any thread. */
static inline uint64_t gd_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The struct that holds `member` at `ptr`. */
#define gd_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#endif
