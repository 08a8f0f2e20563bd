/* A device as the wire describes it (DeviceInfo, with its counters): what
 * Hello's reply says of a data session's device, and what Status says of
 * each device. The request families that answer with it share it here,
 * so that neither includes the other.
 *
 * DESIGN: loop thread only. */
#ifndef GRAPHD_DEVICE_INFO_H
#define GRAPHD_DEVICE_INFO_H

#include <stdint.h>

#include "daemon/sessions/daemon.h"
#include "graphd.pb-c.h"

/* Fills di (and dc, which it points at) for device i, with free_mem as its
 * free memory (0: unknown) and its worker's busy time read now. */
void device_info_fill(gd_daemon *d, int i, uint64_t free_mem, Graphd__Wire__DeviceInfo *di,
                      Graphd__Wire__DeviceCounters *dc);

#endif
