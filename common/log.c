#define _GNU_SOURCE
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int gd_log_level = GD_INFO;
static int journal; /* stderr is connected to journald */
static __thread char thread_tag[16] = "main";

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
static const int level_prio[] = {3, 4, 6, 7}; /* syslog priorities */

void gd_log_set_thread_tag(const char *tag) { snprintf(thread_tag, sizeof thread_tag, "%s", tag); }

int gd_log_parse_level(const char *s) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (strcmp(s, names[i]) == 0) return i;
  if (strcmp(s, "warning") == 0) return GD_WARN;
  return -1;
}

void gd_log_init(void) {
  /* JOURNAL_STREAM is "device:inode" of the stream journald gave us. */
  const char *js = getenv("JOURNAL_STREAM");
  struct stat st;
  unsigned long dev, ino;
  journal = 0;
  if (js && sscanf(js, "%lu:%lu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0)
    journal = (unsigned long)st.st_dev == dev && (unsigned long)st.st_ino == ino;
}

void gd_log_emit(int level, const char *subsys, const char *fmt, ...) {
  char line[2048];
  size_t n = 0;
  if (level < GD_ERROR) level = GD_ERROR;
  if (level > GD_DEBUG) level = GD_DEBUG;
  if (journal) {
    n = (size_t)snprintf(line, sizeof line, "<%d>%s [%s] %s: ", level_prio[level],
                         level_names[level], thread_tag, subsys);
  } else {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(line + n, sizeof line - n, ".%03ldZ %-5s [%s] %s: ", ts.tv_nsec / 1000000,
                          level_names[level], thread_tag, subsys);
  }
  if (n >= sizeof line) n = sizeof line - 1;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(line + n, sizeof line - n, fmt, ap);
  va_end(ap);
  if (k < 0) k = 0;
  n += (size_t)k;
  if (n > sizeof line - 2) n = sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, n);
  (void)w;
}
