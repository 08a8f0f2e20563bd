/* The GPU time of replays, sampled on one device: a replay chosen for it
 * gets a pair of timed events around all it queues on the worker's stream
 * (copies in, the launch, copies out). Replays are chosen at random gaps,
 * one in `every` on average, so that no kind of replay is favoured (the
 * first after an idle spell, say, which is the one that re-points its
 * graph); the pairs are read in the order they were queued, once their
 * end has been reached, and never waited for. Pairs are made as replays
 * run ahead of the GPU, up to GD_GPU_SAMPLE_MAX_PAIRS; a replay chosen
 * while all are in flight is counted as missed.
 *
 * DESIGN: worker thread only. */
#ifndef GRAPHD_GPUSAMPLE_H
#define GRAPHD_GPUSAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/backend/backend.h"

#define GD_GPU_SAMPLE_MAX_PAIRS 4096

struct gd_device;

typedef struct gd_gpu_sampler {
  gd_event *start, *end; /* a ring of pairs: cap of them made */
  uint32_t cap;
  uint32_t head, pending; /* the oldest pair queued, and how many are */
  uint32_t gap;           /* replays until the next one timed */
  uint64_t rng;           /* xorshift state for the gaps */
  bool broken;            /* events could not be made: no sampling on this device */
  uint64_t ns, n;         /* finished samples not yet taken */
  uint64_t missed;        /* replays chosen while every pair was in flight */
} gd_gpu_sampler;

/* Whether the replay about to be queued on st is timed: then its start is
 * recorded and the pair's index returned (give it to gpu_sample_end once
 * the replay's work is queued); else -1. */
int gpu_sample_begin(struct gd_device *d, gd_gpu_sampler *g, gd_stream st);
void gpu_sample_end(struct gd_device *d, gd_gpu_sampler *g, gd_stream st, int k);

/* Reads the samples whose end has been reached, oldest first. */
void gpu_sample_poll(struct gd_device *d, gd_gpu_sampler *g);

/* Adds the samples read since the last call, and how many, to *ns, *n. */
void gpu_sample_take(gd_gpu_sampler *g, uint64_t *ns, uint64_t *n);

/* Destroys the events (device reset, worker exit); g is empty after. */
void gpu_sample_free(struct gd_device *d, gd_gpu_sampler *g);
#endif
