#define _GNU_SOURCE
#include "harness.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/memfd.h"
#include "graphd/frame.h"
#include "graphd/protocol.h"
#include "graphd/wire.h"

extern char **environ;

static long long ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int try_connect(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
  close(fd);
  return -1;
}

/* Starts graphd on d's socket, its stderr into d's log (appended when
 * append). */
static int spawn(gd_test_daemon *d, char *const *args, char *const *env, int *status, bool append) {
  char *argv[64];
  int n = 0;
  /* GRAPHD_TEST_WRAPPER runs the daemon under a tool, e.g.
   * "compute-sanitizer --tool memcheck". */
  static char wrap[512];
  const char *wrapper = getenv("GRAPHD_TEST_WRAPPER");
  if (wrapper && *wrapper) {
    snprintf(wrap, sizeof wrap, "%s", wrapper);
    char *save = NULL;
    for (char *t = strtok_r(wrap, " ", &save); t && n < 16; t = strtok_r(NULL, " ", &save))
      argv[n++] = t;
  }
  argv[n++] = GRAPHD_BIN;
  argv[n++] = "--socket";
  argv[n++] = d->socket;
  argv[n++] = "--log-level";
  argv[n++] = "debug";
  for (int i = 0; args && args[i] && n < 62; i++) argv[n++] = args[i];
  argv[n] = NULL;
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    int lf = open(d->log, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
    dup2(lf, 2);
    int nul = open("/dev/null", O_RDWR);
    dup2(nul, 0);
    dup2(lf, 1);
    for (int i = 0; env && env[i]; i++) putenv(env[i]);
    /* The daemon must never see a test's LISTEN_FDS or NOTIFY_SOCKET. */
    if (!env) {
      unsetenv("LISTEN_FDS");
      unsetenv("NOTIFY_SOCKET");
    }
    execvp(argv[0], argv);
    _exit(127);
  }
  d->pid = pid;
  long long deadline = ms_now() + (wrapper && *wrapper ? 120000 : 20000);
  while (ms_now() < deadline) {
    int st;
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) {
      d->pid = 0;
      if (status) *status = st;
      return -1;
    }
    int fd = try_connect(d->socket);
    if (fd >= 0) {
      close(fd);
      return 0;
    }
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  d->pid = 0;
  ck_abort_msg("graphd did not start listening within 20 s");
  return -1;
}

int td_start_env(gd_test_daemon *d, char *const *args, char *const *env, int *status) {
  memset(d, 0, sizeof *d);
  snprintf(d->dir, sizeof d->dir, "/tmp/graphd-test-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(d->dir));
  snprintf(d->socket, sizeof d->socket, "%s/graphd.sock", d->dir);
  snprintf(d->log, sizeof d->log, "%s/graphd.log", d->dir);
  return spawn(d, args, env, status, false);
}

void td_start_again(gd_test_daemon *d, ...) {
  char *args[48];
  int n = 0;
  va_list ap;
  va_start(ap, d);
  const char *a;
  while ((a = va_arg(ap, const char *)) != NULL && n < 47) args[n++] = (char *)a;
  va_end(ap);
  args[n] = NULL;
  ck_assert_int_eq(d->pid, 0);
  int st = 0;
  if (spawn(d, args, NULL, &st, true) < 0) ck_abort_msg("graphd exited at start (status %d)", st);
}

int td_start(gd_test_daemon *d, ...) {
  char *args[48];
  int n = 0;
  va_list ap;
  va_start(ap, d);
  const char *a;
  while ((a = va_arg(ap, const char *)) != NULL && n < 47) args[n++] = (char *)a;
  va_end(ap);
  args[n] = NULL;
  int st = 0;
  int rc = td_start_env(d, args, NULL, &st);
  if (rc < 0) {
    char buf[4096] = "";
    FILE *f = fopen(d->log, "r");
    if (f) {
      size_t k = fread(buf, 1, sizeof buf - 1, f);
      buf[k] = 0;
      fclose(f);
    }
    ck_abort_msg("graphd exited at start (status %d): %s", st, buf);
  }
  return rc;
}

/* The graphd process under a wrapper tool (which may not forward
 * signals): the first descendant named graphd, or pid itself. */
static pid_t daemon_process(pid_t pid) {
  const char *wrapper = getenv("GRAPHD_TEST_WRAPPER");
  if (!wrapper || !*wrapper) return pid;
  pid_t cur = pid;
  for (int depth = 0; depth < 4; depth++) {
    char path[64], comm[64] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", (int)cur);
    FILE *f = fopen(path, "r");
    if (f) {
      if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
      fclose(f);
    }
    if (strcmp(comm, "graphd") == 0) return cur;
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)cur, (int)cur);
    f = fopen(path, "r");
    int child = 0;
    if (f) {
      if (fscanf(f, "%d", &child) != 1) child = 0;
      fclose(f);
    }
    if (child <= 0) break;
    cur = child;
  }
  return pid;
}

pid_t td_daemon_pid(const gd_test_daemon *d) { return daemon_process(d->pid); }

/* The first line of /proc/PID/task/TID/WHAT, without its newline. */
static void task_line(pid_t pid, const char *tid, const char *what, char *out, size_t cap) {
  char path[384];
  snprintf(out, cap, "?");
  snprintf(path, sizeof path, "/proc/%d/task/%s/%s", (int)pid, tid, what);
  FILE *f = fopen(path, "r");
  if (!f) return;
  if (fgets(out, (int)cap, f)) out[strcspn(out, "\n")] = 0;
  fclose(f);
}

/* A daemon that outlived its stop: where each of its threads is, and how
 * its log ends, before it is killed and the log removed. */
static void report_stuck(const gd_test_daemon *d, pid_t pid, int sig, int timeout_ms) {
  fprintf(stderr, "graphd (pid %d) was still running %d ms after signal %d; its threads:\n",
          (int)pid, timeout_ms, sig);
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *dir = opendir(path);
  struct dirent *e;
  while (dir && (e = readdir(dir))) {
    if (e->d_name[0] == '.') continue;
    char comm[64], wchan[64], stat[512];
    task_line(pid, e->d_name, "comm", comm, sizeof comm);
    task_line(pid, e->d_name, "wchan", wchan, sizeof wchan);
    task_line(pid, e->d_name, "stat", stat, sizeof stat);
    const char *paren = strrchr(stat, ')'); /* the state letter follows "(comm) " */
    char state = paren && paren[1] && paren[2] ? paren[2] : '?';
    fprintf(stderr, "  thread %s %-16s state %c wchan %s\n", e->d_name, comm, state, wchan);
  }
  if (dir) closedir(dir);
  FILE *f = fopen(d->log, "r");
  if (!f) return;
  static char tail[40][512];
  int n = 0;
  while (fgets(tail[n % 40], sizeof tail[0], f)) n++;
  fclose(f);
  fprintf(stderr, "the last %d lines of its log:\n", n < 40 ? n : 40);
  for (int i = n < 40 ? 0 : n - 40; i < n; i++) fprintf(stderr, "  %s", tail[i % 40]);
}

int td_stop_sig(gd_test_daemon *d, int sig, int timeout_ms) {
  if (d->pid <= 0) return -1;
  kill(daemon_process(d->pid), sig);
  long long deadline = ms_now() + timeout_ms;
  int st = -1;
  while (ms_now() < deadline) {
    pid_t w = waitpid(d->pid, &st, WNOHANG);
    if (w == d->pid) {
      d->pid = 0;
      return st;
    }
    usleep(5000);
  }
  if (sig != SIGKILL) report_stuck(d, daemon_process(d->pid), sig, timeout_ms);
  kill(d->pid, SIGKILL);
  waitpid(d->pid, NULL, 0);
  d->pid = 0;
  return -1;
}

int td_stop(gd_test_daemon *d) { return td_stop_sig(d, SIGTERM, 10000); }

void td_cleanup(gd_test_daemon *d) {
  if (d->pid > 0) td_stop_sig(d, SIGKILL, 2000);
  if (!d->dir[0]) return;
  if (getenv("GRAPHD_TEST_KEEP")) return; /* leave the daemon's log for a look */
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", d->dir);
  d->dir[0] = 0;
}

void td_log_print(const gd_test_daemon *d, const char *needle) {
  FILE *f = fopen(d->log, "r");
  if (!f) return;
  char line[4096];
  while (fgets(line, sizeof line, f))
    if (strstr(line, needle)) printf("daemon log: %s", line);
  fclose(f);
}

bool td_log_contains(const gd_test_daemon *d, const char *needle) {
  FILE *f = fopen(d->log, "r");
  if (!f) return false;
  char line[4096];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

int td_count_fds(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *dir = opendir(path);
  if (!dir) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir)))
    if (e->d_name[0] != '.') n++;
  closedir(dir);
  return n;
}

double td_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int td_settled_fds(pid_t pid) {
  int n = td_count_fds(pid);
  for (int i = 0; i < 100; i++) {
    usleep(20000);
    int m = td_count_fds(pid);
    if (m == n) return n;
    n = m;
  }
  return n;
}

graphd_client *td_control(const gd_test_daemon *d) {
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = d->socket;
  o.timeout_ms = 10000;
  o.client_name = "test";
  graphd_client *c = NULL;
  char err[GRAPHD_ERRMAX];
  graphd_status st = graphd_connect(&o, &c, err, sizeof err);
  ck_assert_msg(st == GRAPHD_OK, "connect: %s", err);
  return c;
}

graphd_device_info td_device_info(graphd_client *c, int dev) {
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  ck_assert_int_lt(dev, (int)s->ndevices);
  graphd_device_info d = s->devices[dev];
  graphd_daemon_status_free(s);
  return d;
}

long td_rss_kib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  long kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  fclose(f);
  ck_assert_int_ge(kib, 0);
  return kib;
}

graphd_client *td_data(const gd_test_daemon *d, int index) {
  return td_data_timeout(d, index, 30000);
}

graphd_client *td_data_timeout(const gd_test_daemon *d, int index, int timeout_ms) {
  graphd_client *ctl = td_control(d);
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(ctl, &s), GRAPHD_OK);
  ck_assert_int_lt(index, (int)s->ndevices);
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = d->socket;
  o.kind = GRAPHD_SESSION_DATA;
  o.timeout_ms = timeout_ms;
  o.client_name = "test-data";
  memcpy(o.device_uuid, s->devices[index].uuid, 16);
  graphd_daemon_status_free(s);
  graphd_close(ctl);
  graphd_client *c = NULL;
  char err[GRAPHD_ERRMAX];
  graphd_status st = graphd_connect(&o, &c, err, sizeof err);
  ck_assert_msg(st == GRAPHD_OK, "data connect: %s", err);
  return c;
}

int td_as_nobody(int (*fn)(const void *arg), const void *arg) {
  pid_t p = fork();
  ck_assert_int_ge(p, 0);
  if (p == 0) _exit(setgid(65534) != 0 || setuid(65534) != 0 ? 10 : fn(arg));
  int st;
  ck_assert_int_eq(waitpid(p, &st, 0), p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const char *td_fmt(const char *fmt, ...) {
  static char bufs[4][256];
  static int next;
  char *b = bufs[next++ % 4];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof bufs[0], fmt, ap);
  va_end(ap);
  return b;
}

void *td_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *buf = malloc((size_t)n + 1);
  ck_assert_ptr_nonnull(buf);
  ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return buf;
}

int td_raw_connect(const gd_test_daemon *d) {
  int fd = try_connect(d->socket);
  ck_assert_int_ge(fd, 0);
  return fd;
}

void td_raw_send(int fd, const void *buf, size_t len, const int *fds, int nfds) {
  size_t off = 0;
  while (off < len) {
    ssize_t n = gd_frame_sendmsg(fd, (const char *)buf + off, len - off, off ? NULL : fds,
                                 off ? 0 : nfds, 0);
    ck_assert_msg(n > 0, "send: %s", strerror(errno));
    off += (size_t)n;
  }
}

void td_raw_send_request(int fd, Graphd__Wire__Request *req, const int *fds, int nfds) {
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(gd_wire_pack_request(req, 1u << 30, &buf, &len), 0);
  td_raw_send(fd, buf, len, fds, nfds);
  free(buf);
}

static int read_exact(int fd, void *p, size_t n, long long deadline) {
  size_t off = 0;
  while (off < n) {
    long long left = deadline - ms_now();
    if (left <= 0) return -1;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, (int)left) <= 0) continue;
    ssize_t k = recv(fd, (char *)p + off, n - off, 0);
    if (k <= 0) return -1;
    off += (size_t)k;
  }
  return 0;
}

Graphd__Wire__Reply *td_raw_recv(int fd, int timeout_ms) {
  long long deadline = ms_now() + timeout_ms;
  uint8_t hdr[4];
  if (read_exact(fd, hdr, 4, deadline) < 0) return NULL;
  uint32_t len =
      (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;
  uint8_t *buf = malloc(len + 1);
  ck_assert_ptr_nonnull(buf);
  if (read_exact(fd, buf, len, deadline) < 0) {
    free(buf);
    return NULL;
  }
  Graphd__Wire__Reply *r = graphd__wire__reply__unpack(NULL, len, buf);
  free(buf);
  ck_assert_ptr_nonnull(r);
  return r;
}

bool td_raw_eof(int fd, int timeout_ms) {
  long long deadline = ms_now() + timeout_ms;
  char c;
  while (ms_now() < deadline) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 50) <= 0) continue;
    ssize_t k = recv(fd, &c, 1, MSG_DONTWAIT);
    if (k == 0) return true;
    if (k < 0 && errno != EAGAIN) return true; /* reset counts as closed */
  }
  return false;
}

void td_expect_reply(Graphd__Wire__Reply *r, uint32_t code, const char *needle) {
  ck_assert_msg(r != NULL, "no reply");
  ck_assert_msg(r->code == code, "code %u (%s), want %u", r->code, r->message, code);
  if (needle) ck_assert_msg(strstr(r->message, needle), "'%s' lacks '%s'", r->message, needle);
  graphd__wire__reply__free_unpacked(r, NULL);
}

void td_raw_data_hello(graphd_client *c, int fd, int dev) {
  graphd_device_info info = td_device_info(c, dev);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Hello h = GRAPHD__WIRE__HELLO__INIT;
  req.request_id = 1;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_HELLO;
  req.hello = &h;
  h.protocol_version = GRAPHD_PROTOCOL_VERSION;
  h.kind = GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_DATA;
  h.device_uuid.data = info.uuid;
  h.device_uuid.len = 16;
  td_raw_send_request(fd, &req, NULL, 0);
  td_expect_reply(td_raw_recv(fd, 5000), GRAPHD_OK, NULL);
}

Graphd__Wire__Reply *td_raw_register_flags(int fd, uint64_t id, int flags_fd, uint32_t slots) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterFlags rf = GRAPHD__WIRE__REGISTER_FLAGS__INIT;
  req.request_id = id;
  req.nfds = 1;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_FLAGS;
  req.register_flags = &rf;
  rf.slots = slots;
  td_raw_send_request(fd, &req, &flags_fd, 1);
  return td_raw_recv(fd, 5000);
}

int td_raw_ring_session(const gd_test_daemon *d, int dev, int doorbell, uint32_t *code, char *msg,
                        size_t msglen) {
  graphd_client *ctl = td_control(d);
  int fd = td_raw_connect(d);
  td_raw_data_hello(ctl, fd, dev);
  graphd_close(ctl);
  int flags = gd_memfd_new_shared("flags", 4096);
  ck_assert_int_ge(flags, 0);
  td_expect_reply(td_raw_register_flags(fd, 2, flags, 64), GRAPHD_OK, NULL);
  close(flags);
  uint64_t bytes = GRAPHD_RING_BYTES(8);
  int ring = gd_memfd_new_shared("ring", bytes);
  ck_assert_int_ge(ring, 0);
  graphd_ring_header *h = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ring, 0);
  ck_assert_ptr_ne(h, MAP_FAILED);
  h->entries = 8;
  __atomic_store_n(&h->magic, GRAPHD_RING_MAGIC, __ATOMIC_RELEASE);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterRing m = GRAPHD__WIRE__REGISTER_RING__INIT;
  req.request_id = 3;
  req.nfds = 2;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_RING;
  req.register_ring = &m;
  m.entries = 8;
  int fds[2] = {ring, doorbell};
  td_raw_send_request(fd, &req, fds, 2);
  close(ring);
  munmap(h, bytes); /* the daemon keeps its own mapping */
  Graphd__Wire__Reply *r = td_raw_recv(fd, 5000);
  ck_assert_ptr_nonnull(r);
  *code = r->code;
  snprintf(msg, msglen, "%s", r->message ? r->message : "");
  graphd__wire__reply__free_unpacked(r, NULL);
  return fd;
}

int td_raw_wedge_attempt(const gd_test_daemon *d, int dev, int s[2]) {
  int bell = eventfd(0, EFD_NONBLOCK);
  ck_assert_int_ge(bell, 0);
  for (int i = 0; i < 2; i++) {
    uint32_t code;
    char msg[256];
    s[i] = td_raw_ring_session(d, dev, bell, &code, msg, sizeof msg);
    ck_assert_msg(code == GRAPHD_OK, "ring %d: %s", i, msg);
  }
  ck_assert_int_eq(fcntl(bell, F_SETFL, fcntl(bell, F_GETFL) & ~O_NONBLOCK), 0);
  uint64_t one = 1;
  ck_assert_int_eq(write(bell, &one, sizeof one), (int)sizeof one);
  return bell;
}

void td_raw_hello(int fd) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Hello h = GRAPHD__WIRE__HELLO__INIT;
  req.request_id = 1;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_HELLO;
  req.hello = &h;
  h.protocol_version = GRAPHD_PROTOCOL_VERSION;
  h.kind = GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_CONTROL;
  td_raw_send_request(fd, &req, NULL, 0);
  Graphd__Wire__Reply *r = td_raw_recv(fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->code, 0);
  ck_assert_int_eq(r->body_case, GRAPHD__WIRE__REPLY__BODY_HELLO);
  graphd__wire__reply__free_unpacked(r, NULL);
}

int td_run(char *const argv[], char *out, size_t outlen, int timeout_ms) {
  int pfd[2];
  if (pipe(pfd) < 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pfd[1], 1);
    dup2(pfd[1], 2);
    close(pfd[0]);
    close(pfd[1]);
    execv(argv[0], argv);
    _exit(127);
  }
  close(pfd[1]);
  size_t n = 0;
  long long deadline = ms_now() + timeout_ms;
  for (;;) {
    long long left = deadline - ms_now();
    if (left <= 0) break;
    struct pollfd pf = {.fd = pfd[0], .events = POLLIN};
    if (poll(&pf, 1, (int)left) <= 0) break;
    char tmp[4096];
    ssize_t k = read(pfd[0], tmp, sizeof tmp);
    if (k <= 0) break;
    size_t take = (size_t)k;
    if (n + take >= outlen) take = outlen - 1 - n;
    memcpy(out + n, tmp, take);
    n += take;
  }
  out[n] = 0;
  close(pfd[0]);
  int st;
  long long kill_at = ms_now() + 2000;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (ms_now() > kill_at) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    usleep(2000);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool td_gpu_present(void) {
  if (access("/dev/nvidia0", F_OK) != 0 && access("/dev/nvidiactl", F_OK) != 0) return false;
  /* dlopen alone does not initialise CUDA, so the parent stays fork-safe. */
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return false;
  dlclose(h);
  return true;
}

void td_gpu_or_skip(void) {
  if (td_gpu_present()) return;
  const char *req = getenv("GRAPHD_REQUIRE_GPU");
  if (req && strcmp(req, "1") == 0) {
    fprintf(stderr, "GRAPHD_REQUIRE_GPU=1 but no GPU was found: failing instead of skipping\n");
    exit(1);
  }
  fprintf(stderr, "no GPU: skipping\n");
  exit(77);
}

void td_gpu_kernels_or_skip(void) {
  if (HAVE_CUDA_KERNELS) return;
  const char *req = getenv("GRAPHD_REQUIRE_GPU");
  bool fail = req && strcmp(req, "1") == 0;
  fprintf(stderr,
          "this build has no CUDA test kernels (no nvcc when it was configured; install the CUDA "
          "13 toolkit and configure again): %s\n",
          fail ? "GRAPHD_REQUIRE_GPU=1, failing instead of skipping" : "skipping");
  exit(fail ? 1 : 77);
}

int td_run_suite(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
