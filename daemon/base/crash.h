/* Stacks in the log: a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL)
 * writes the crashing thread's stack to stderr (the journal) before the
 * signal's default action, and a thread asked with gd_dump_thread_stack
 * writes its own stack and goes on. Frames read "graphd(+0xOFFSET)", for
 * addr2line.
 *
 * DESIGN: the handlers are installed once by main before any thread starts;
 * they use only write(2), backtrace(3) (loaded at install, so that it does
 * not allocate in a handler) and prctl(2). */
#ifndef GRAPHD_CRASH_H
#define GRAPHD_CRASH_H

#include <pthread.h>

void gd_crash_install(void);

/* Asks thread t (SIGUSR2) to write its stack; returns at once. */
void gd_dump_thread_stack(pthread_t t);

#endif
