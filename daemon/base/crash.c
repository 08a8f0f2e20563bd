/* See crash.h. */
#define _GNU_SOURCE
#include "crash.h"

#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static void say(const char *s) {
  if (write(STDERR_FILENO, s, strlen(s)) < 0) { /* nothing more to do */
  }
}

static void write_stack(void) {
  void *frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
}

static void fatal(int sig) {
  say(sig == SIGSEGV  ? "graphd: fatal signal 11 (SIGSEGV); stack:\n"
      : sig == SIGBUS ? "graphd: fatal signal (SIGBUS); stack:\n"
      : sig == SIGFPE ? "graphd: fatal signal (SIGFPE); stack:\n"
                      : "graphd: fatal signal (SIGILL); stack:\n");
  write_stack();
  signal(sig, SIG_DFL);
  raise(sig); /* delivered when the handler returns: the default action */
}

static void dump_self(int sig) {
  (void)sig;
  int saved = errno; /* the interrupted code may be reading it */
  char name[17] = {0};
  if (prctl(PR_GET_NAME, name) != 0) strcpy(name, "?");
  say("graphd: stack of thread ");
  say(name);
  say(":\n");
  write_stack();
  errno = saved;
}

void gd_crash_install(void) {
  void *warm[1];
  backtrace(warm, 1);
  static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
  struct sigaction sa;
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fatal;
    sa.sa_flags = SA_RESETHAND;
    sigaction(sigs[i], &sa, NULL);
  }
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = dump_self;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &sa, NULL);
}

void gd_dump_thread_stack(pthread_t t) { pthread_kill(t, SIGUSR2); }
