/* A set of 32-byte ids read from a text file: the host modules that
 * clients who are not admins may register (--host-module-allow). */
#ifndef GRAPHD_ALLOWLIST_H
#define GRAPHD_ALLOWLIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gd_allowlist {
  uint8_t (*ids)[32]; /* sorted */
  size_t n;
} gd_allowlist;

/* Reads path: one id per line as 64 hex digits, with blank lines and
 * "#" comments (whole-line or after the id) ignored. Returns 0; or -1 with
 * err giving "path:line: reason" (or why the file could not be read), and
 * a left empty. */
int allowlist_load(gd_allowlist *a, const char *path, char *err, size_t errlen);

bool allowlist_has(const gd_allowlist *a, const uint8_t id[32]);

void allowlist_free(gd_allowlist *a);

#endif
