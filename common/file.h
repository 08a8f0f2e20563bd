/* Reading a whole file (module images, kernels) into memory, for the
 * tools, benches and tests beside the daemon. */
#ifndef GRAPHD_COMMON_FILE_H
#define GRAPHD_COMMON_FILE_H

#include <stddef.h>

/* Returns the file's bytes (malloc'd; the caller frees) and their count in
 * *len, or NULL with errno set (EIO for an empty file or a short read). */
void *gd_read_file(const char *path, size_t *len);

#endif
