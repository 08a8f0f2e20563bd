/* The head-of-line policy where ready waits are queued on the device (see
 * docs/design.md, "A client that holds back its ready flag"): the worker
 * remembers each ready wait it queued and has not seen met, and checks
 * them from the host. A wait older than the ready timeout, while another
 * session has queued work on the same capture behind it, is released from
 * the host, and its session is reported for the loop to close. A slow
 * client in nobody's way is left alone.
 *
 * On backends where the worker itself waits for the flag (host), the
 * policy is the replay's give-up callback instead, and nothing is watched.
 *
 * DESIGN: worker thread only; the list hangs off the device (d->hol). A
 * watch names its capture only as an opaque key. */
#ifndef GRAPHD_HOLWATCH_H
#define GRAPHD_HOLWATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "device.h"
#include "session_stream.h"

/* A replay of `key` was queued on ds's stream behind "ready[slot] >= seq":
 * marks other sessions' watched waits on the same key as blocking it, and
 * watches this one unless it is met already, timeout_s is 0 (never), or
 * the session was cut off. */
void holwatch_add(gd_device *d, gd_session_stream *ds, uint32_t slot, uint64_t seq,
                  double timeout_s, const void *key);

/* Drops the waits that were met, releases the hung ones as above and
 * writes their sessions' ids to cut[] (at most ncut). Returns how many;
 * *pending says whether waits are still watched. */
int holwatch_check(gd_device *d, uint64_t *cut, int ncut, bool *pending);

/* Cuts off, at once, every session whose watched ready wait is past its
 * timeout, in another session's way or not: the worker is held behind it
 * (holwatch_wait_event), or the device's budget is held by its capture.
 * The sessions cut off are reported by the next holwatch_check. */
void holwatch_cut_hung(gd_device *d);

/* Waits until ev is done, as the worker must before it frees memory that
 * queued work may use, cutting off hung sessions (holwatch_cut_hung) while
 * it waits: the worker itself is held behind them, and with it every
 * session of the device. */
void holwatch_wait_event(gd_device *d, gd_event ev);

/* The same for everything queued on ds's stream so far (nothing when ds is
 * NULL, or its stream went with a reset). */
void holwatch_sync_stream(gd_device *d, gd_session_stream *ds);

/* Forgets the waits of a session (it is ending) or of a key (evicted). */
void holwatch_drop_stream(gd_device *d, const gd_session_stream *ds);
void holwatch_drop_key(gd_device *d, const void *key);

/* Frees the list. */
void holwatch_close(gd_device *d);

#endif
