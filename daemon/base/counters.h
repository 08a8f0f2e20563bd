/* The device counters' list (graphd/device_counters.def) as the daemon
 * holds it: by each entry's source, a field in the loop's counters, a
 * field in a replay tally, the tally added in. Each macro below takes an
 * entry's source pasted onto its stem, so that the entries it does not
 * apply to expand to nothing, as
 *
 *   #define GRAPHD_DEVICE_COUNTER(name, field, kind, unit, source, ...) \
 *     GD_HELD_##source(name)
 *   #include "graphd/device_counters.def"
 *
 * Leaf header. */
#ifndef GRAPHD_COUNTERS_H
#define GRAPHD_COUNTERS_H

#include <stdint.h>

/* A field of gd_device_counters: the counters the loop holds (TALLY: added
 * up from replay tallies; KEPT: counted by the loop itself). */
#define GD_HELD_TALLY(name) uint64_t name;
#define GD_HELD_KEPT(name) uint64_t name;
#define GD_HELD_READ(name)

/* A field of gd_replay_tally: the counters the worker counts (TALLY). */
#define GD_TALLIED_TALLY(name) uint64_t name;
#define GD_TALLIED_KEPT(name)
#define GD_TALLIED_READ(name)

/* to->name += from->name for a counter the worker counts. */
#define GD_ADD_TALLY(to, from, name) (to)->name += (from)->name;
#define GD_ADD_KEPT(to, from, name)
#define GD_ADD_READ(to, from, name)

#endif
