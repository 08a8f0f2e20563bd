/* Logging to stderr: one line per call, with a level, a thread tag ([loop],
 * [gpu0]) and a subsystem. Under systemd (JOURNAL_STREAM names our stderr)
 * lines start with a syslog priority prefix ("<4>") that journald reads,
 * and no timestamp, since journald adds its own.
 *
 * GD_LOG checks the level before evaluating its arguments. Thread-safe: a
 * line is written with one write(2). */
#ifndef GRAPHD_COMMON_LOG_H
#define GRAPHD_COMMON_LOG_H

#include <stdarg.h>

enum gd_log_level { GD_ERROR = 0, GD_WARN = 1, GD_INFO = 2, GD_DEBUG = 3 };

extern int gd_log_level;

#define GD_LOG(level, subsys, ...)                                                                 \
  do {                                                                                             \
    if ((level) <= gd_log_level) gd_log_emit((level), (subsys), __VA_ARGS__);                      \
  } while (0)

void gd_log_emit(int level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sets this thread's tag, e.g. "loop" or "gpu0" (at most 15 chars). */
void gd_log_set_thread_tag(const char *tag);

/* Parses "error", "warn", "info" or "debug". Returns the level or -1. */
int gd_log_parse_level(const char *s);

/* Detects journald on stderr (JOURNAL_STREAM) and picks the line format. */
void gd_log_init(void);

#endif
