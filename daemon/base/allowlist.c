#include "allowlist.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphd/hex.h"

static int cmp_id(const void *a, const void *b) { return memcmp(a, b, 32); }

int allowlist_load(gd_allowlist *a, const char *path, char *err, size_t errlen) {
  a->ids = NULL;
  a->n = 0;
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "cannot read the module allow-list %s: %s", path, strerror(errno));
    return -1;
  }
  size_t cap = 0;
  char *line = NULL;
  size_t linecap = 0;
  int lineno = 0;
  int rc = 0;
  while (getline(&line, &linecap, f) >= 0) {
    lineno++;
    char *s = line;
    char *hash = strchr(s, '#');
    if (hash) *hash = '\0';
    while (isspace((unsigned char)*s)) s++;
    size_t len = strlen(s);
    while (len && isspace((unsigned char)s[len - 1])) len--;
    if (!len) continue;
    uint8_t id[32];
    char why[128];
    if (gd_hex_decode(s, len, id, sizeof id, why, sizeof why) < 0) {
      snprintf(err, errlen, "%s:%d: not a module id (64 hex digits): %s", path, lineno, why);
      rc = -1;
      break;
    }
    if (a->n == cap) {
      size_t ncap = cap ? cap * 2 : 16;
      void *p = realloc(a->ids, ncap * sizeof *a->ids);
      if (!p) {
        snprintf(err, errlen, "%s: out of memory", path);
        rc = -1;
        break;
      }
      a->ids = p;
      cap = ncap;
    }
    memcpy(a->ids[a->n++], id, 32);
  }
  if (rc == 0 && ferror(f)) {
    snprintf(err, errlen, "reading %s: %s", path, strerror(errno));
    rc = -1;
  }
  free(line);
  fclose(f);
  if (rc < 0) {
    allowlist_free(a);
    return -1;
  }
  if (a->n) qsort(a->ids, a->n, sizeof *a->ids, cmp_id);
  return 0;
}

bool allowlist_has(const gd_allowlist *a, const uint8_t id[32]) {
  return a->n && bsearch(id, a->ids, a->n, sizeof *a->ids, cmp_id) != NULL;
}

void allowlist_free(gd_allowlist *a) {
  free(a->ids);
  a->ids = NULL;
  a->n = 0;
}
