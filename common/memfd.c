/* See memfd.h. */
#define _GNU_SOURCE
#include "memfd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int gd_memfd_shared_seals(void) { return F_SEAL_SHRINK | F_SEAL_GROW; }

int gd_memfd_new_shared(const char *name, uint64_t bytes) {
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (ftruncate(fd, (off_t)bytes) < 0 ||
      fcntl(fd, F_ADD_SEALS, gd_memfd_shared_seals() | F_SEAL_SEAL) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int gd_memfd_check(int fd, int need, uint64_t min_bytes, const char *what, char *err,
                   size_t errlen) {
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    snprintf(err, errlen, "the %s fd is not a memfd", what);
    return -1;
  }
  if ((seals & need) != need) {
    snprintf(err, errlen, "the %s memfd must be sealed against %s%s%s", what,
             need & F_SEAL_WRITE ? "write, " : "", "shrink", need & F_SEAL_GROW ? " and grow" : "");
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < min_bytes) {
    snprintf(err, errlen, "the %s memfd holds %lld bytes, fewer than the %llu it must", what,
             (long long)st.st_size, (unsigned long long)min_bytes);
    return -1;
  }
  return 0;
}
