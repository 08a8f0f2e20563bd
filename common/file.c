#include "file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

void *gd_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  void *buf = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
  if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n)) != NULL &&
      fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  int e = buf ? 0 : (errno ? errno : EIO);
  fclose(f);
  if (!buf) {
    errno = n == 0 ? EIO : e;
    return NULL;
  }
  *len = (size_t)n;
  return buf;
}
