/* The loop thread's half of replays: RegisterFlags and Replay requests are
 * checked here (program, flags, bindings against regions and slots, without
 * overflow), resolved to device addresses and handed to the session
 * device's worker (capture.c), whose completion updates the counters and
 * replies. Loop thread only. */
#ifndef GRAPHD_REPLAY_H
#define GRAPHD_REPLAY_H

#include "graphd.pb-c.h"
#include "session.h"

/* Gives a new data session its worker-side state. */
int replay_session_open(gd_session *s);

/* Ends a data session's worker-side state behind its queued work. */
void replay_session_close(gd_session *s);

void replay_handle_register_flags(gd_session *s, uint64_t request_id,
                                  const Graphd__Wire__RegisterFlags *m, int fd);
void replay_handle(gd_session *s, uint64_t request_id, const Graphd__Wire__Replay *m);

/* A worker released a hung client's waits (the head-of-line policy): close
 * its session, so its later requests fail. owner is the gd_server. */
void replay_cut_off(void *owner, uint64_t session_id);

/* The pool's reset callback: device was reset after a GPU fault (fault.h).
 * Releases every wait of its data sessions' streams and closes them. */
void replay_device_reset(void *owner, int device);

#endif
