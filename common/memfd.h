/* Memfds shared between a client and graphd: host regions, the flag page.
 * Both sides map them, so one side shrinking the file would make the
 * other's next touch of the lost pages a SIGBUS: they are made sealed
 * against shrinking and growing, and graphd refuses any that is not.
 * Thread-safe. */
#ifndef GRAPHD_COMMON_MEMFD_H
#define GRAPHD_COMMON_MEMFD_H

#include <stddef.h>
#include <stdint.h>

/* The seals every shared memfd carries (F_SEAL_SHRINK | F_SEAL_GROW). */
int gd_memfd_shared_seals(void);

/* Makes a memfd of `bytes`, sealed with gd_memfd_shared_seals() (and
 * against further sealing). Returns the fd, or -1 with errno set. */
int gd_memfd_new_shared(const char *name, uint64_t bytes);

/* Checks that fd is a memfd carrying at least the seals `need` and holding
 * at least min_bytes; err names `what` and the fault. Returns 0 or -1. */
int gd_memfd_check(int fd, int need, uint64_t min_bytes, const char *what, char *err,
                   size_t errlen);

#endif
