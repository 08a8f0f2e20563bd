/* Test helpers: start and stop a graphd child on a temporary socket, raw
 * protocol sockets, and GPU detection that never calls cuInit in the
 * Check parent. */
#ifndef GRAPHD_TEST_HARNESS_H
#define GRAPHD_TEST_HARNESS_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "graphd.pb-c.h"
#include "graphd/graphd.h"

typedef struct gd_test_daemon {
  pid_t pid;
  char dir[64]; /* temporary directory, removed at stop */
  char socket[128];
  char log[128]; /* the daemon's stderr */
} gd_test_daemon;

/* Starts graphd with --socket and --log-level debug plus the given args
 * (NULL-terminated), and waits until the socket accepts connections.
 * Extra environment "NAME=value" strings may be given in env (NULL or
 * NULL-terminated). Returns 0, or -1 if the daemon exited first (its exit
 * status in *status when not NULL). */
int td_start_env(gd_test_daemon *d, char *const *args, char *const *env, int *status);
int td_start(gd_test_daemon *d, ...); /* varargs: const char *, NULL-terminated */

/* Starts a new graphd on the socket of d, whose daemon has stopped (a
 * restart: same socket path, the log appended), with these args
 * (NULL-terminated). Fails the test if it does not start. */
void td_start_again(gd_test_daemon *d, ...);

/* SIGTERM (or sig) and wait up to timeout_ms. Returns the exit status as
 * from waitpid, or -1 on timeout (then the daemon is SIGKILLed). */
int td_stop_sig(gd_test_daemon *d, int sig, int timeout_ms);
int td_stop(gd_test_daemon *d);
/* The graphd process itself (under GRAPHD_TEST_WRAPPER, the wrapper's
 * child). */
pid_t td_daemon_pid(const gd_test_daemon *d);
/* Removes the temporary directory. */
void td_cleanup(gd_test_daemon *d);

/* True if the daemon's log contains needle. */
/* Prints the daemon log's lines that contain needle ("" for all). */
void td_log_print(const gd_test_daemon *d, const char *needle);
bool td_log_contains(const gd_test_daemon *d, const char *needle);
/* Number of open fds of a process, from /proc. */
int td_count_fds(pid_t pid);
/* The same once it holds still for 20 ms (at most 2 s): a session the test
 * just closed may still be open on the daemon's side. */
int td_settled_fds(pid_t pid);

/* Monotonic seconds: for deadlines that hold however slow the machine. */
double td_now_s(void);

/* Connects libgraphd (control session). Fails the test on error. */
graphd_client *td_control(const gd_test_daemon *d);

/* Data session for the daemon's device `index` (found through status).
 * Fails the test on error. */
graphd_client *td_data(const gd_test_daemon *d, int index);
/* The same, with calls that time out after timeout_ms. */
graphd_client *td_data_timeout(const gd_test_daemon *d, int index, int timeout_ms);

/* Reads a whole file (malloc'd). Fails the test on error. */
void *td_read_file(const char *path, size_t *len);

/* Runs fn(arg) in a child process as uid and gid 65534 (nobody: not an
 * admin of the daemon; needs root) and returns its exit status: fn's
 * value, 10 when the switch of user failed, -1 when it died of a signal. */
int td_as_nobody(int (*fn)(const void *arg), const void *arg);

/* A formatted string in one of 4 static buffers of 256 bytes, used in
 * turn: messages built from the limits, so that tests follow them. */
const char *td_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Raw socket to the daemon, for malformed input. */
int td_raw_connect(const gd_test_daemon *d);
/* Sends bytes with fds in one sendmsg. */
void td_raw_send(int fd, const void *buf, size_t len, const int *fds, int nfds);
/* Sends a packed Request frame. */
void td_raw_send_request(int fd, Graphd__Wire__Request *req, const int *fds, int nfds);
/* Reads one Reply frame (timeout_ms). Returns NULL on EOF or timeout. */
Graphd__Wire__Reply *td_raw_recv(int fd, int timeout_ms);
/* True when the peer has closed (EOF within timeout_ms). */
bool td_raw_eof(int fd, int timeout_ms);
/* Checks a reply's code and that its message holds needle (may be NULL),
 * then frees it. */
void td_expect_reply(Graphd__Wire__Reply *r, uint32_t code, const char *needle);

/* Sends a control Hello and checks the reply. */
void td_raw_hello(int fd);

/* Opens a data session on the raw connection fd for device `dev` (its
 * uuid from the daemon's status, asked through c). */
void td_raw_data_hello(graphd_client *c, int fd, int dev);

/* Sends RegisterFlags (request id `id`, `slots` slots) with the memfd
 * flags_fd on the raw data session fd and returns the reply. */
Graphd__Wire__Reply *td_raw_register_flags(int fd, uint64_t id, int flags_fd, uint32_t slots);

/* A raw data session on device `dev` with a flag page, registering a ring
 * of 8 entries whose doorbell is `doorbell` (a copy is sent; the caller
 * keeps its fd). Returns the socket; the ring's reply code goes to *code
 * and its message to msg. */
int td_raw_ring_session(const gd_test_daemon *d, int dev, int doorbell, uint32_t *code, char *msg,
                        size_t msglen);

/* The doorbell wedge: one eventfd registered as the doorbell of two raw
 * sessions' rings on device `dev`, made blocking by its owner after the
 * daemon took it, then rung. The sessions' sockets go to s[2] and the
 * eventfd is returned; the caller closes all three. */
int td_raw_wedge_attempt(const gd_test_daemon *d, int dev, int s[2]);

/* Spawns argv, collecting stdout and stderr into out (NUL-terminated).
 * Returns the exit status (WEXITSTATUS) or -1. */
int td_run(char *const argv[], char *out, size_t outlen, int timeout_ms);

/* GPU tests: true when a GPU seems present (/dev/nvidia0 and libcuda.so.1
 * loadable, without initialising CUDA). td_gpu_or_skip() exits 77 when
 * not, or fails when GRAPHD_REQUIRE_GPU=1. Call it from main(). */
bool td_gpu_present(void);
void td_gpu_or_skip(void);
/* The same for the CUDA test kernels, which nvcc builds (a build without a
 * CUDA toolkit has none): exits 77 without them, or fails when
 * GRAPHD_REQUIRE_GPU=1. Call it from main(), after td_gpu_or_skip(). */
void td_gpu_kernels_or_skip(void);

/* Runs a suite in fork mode; returns the process exit code. */
int td_run_suite(Suite *s);

/* Device `dev`'s entry of a Status reply (counters, free memory, ...).
 * Fails the test on error. */
graphd_device_info td_device_info(graphd_client *c, int dev);

/* A process's resident set in KiB (VmRSS); fails the test when unreadable. */
long td_rss_kib(pid_t pid);

#endif
