/* See server.h. DESIGN: loop thread only, except server_listen(), which runs
 * on the main thread before the loop starts. */
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "graphd/status.h"
#include "common/log.h"
#include "daemon/base/check.h"
#include "daemon/requests/router.h"
#include "daemon/sessions/data_session.h"
#include "daemon/requests/replay.h"
#include "daemon/sessions/session.h"

static int set_nonblock_cloexec(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
  int fdfl = fcntl(fd, F_GETFD);
  if (fdfl < 0 || fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC) < 0) return -1;
  return 0;
}

/* A socket file is live when something accepts a connection on it. */
static int probe_existing(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (lstat(path, &st) < 0) {
    if (errno == ENOENT) return 0;
    snprintf(err, errlen, "cannot inspect %s: %s", path, strerror(errno));
    return -GRAPHD_FAILED_PRECONDITION;
  }
  if (!S_ISSOCK(st.st_mode)) {
    snprintf(err, errlen, "%s exists and is not a socket; refusing to replace it", path);
    return -GRAPHD_ALREADY_EXISTS;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -GRAPHD_INTERNAL;
  }
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path, path, strlen(path) + 1);
  int rc = connect(fd, (struct sockaddr *)&a, sizeof a);
  int e = errno;
  close(fd);
  if (rc == 0) {
    snprintf(err, errlen, "%s is in use by a running graphd; stop it first or choose --socket",
             path);
    return -GRAPHD_ALREADY_EXISTS;
  }
  if (e != ECONNREFUSED) {
    snprintf(err, errlen, "cannot tell whether %s is in use: %s", path, strerror(e));
    return -GRAPHD_FAILED_PRECONDITION;
  }
  GD_LOG(GD_INFO, "server", "replacing stale socket %s left by a daemon that is gone", path);
  if (server_probed_hook) server_probed_hook(path);
  if (unlink(path) < 0 && errno != ENOENT) {
    snprintf(err, errlen, "cannot remove stale socket %s: %s", path, strerror(errno));
    return -GRAPHD_PERMISSION_DENIED;
  }
  return 0;
}

void (*server_probed_hook)(const char *path);

/* Takes an exclusive flock on "<path>.lock" (created 0600 when missing),
 * without waiting; *out is its fd. Two daemons starting on one path thus
 * never probe, unlink and bind it at once: without the lock, a daemon
 * that found the old file stale could remove the socket another had just
 * put there, and both would run with one unreachable. The file stays
 * after exit; unlinking it would let a third daemon lock a new file while
 * a second still holds the old one. */
static int lock_path(const char *path, int *out, char *err, size_t errlen) {
  char lock[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
  snprintf(lock, sizeof lock, "%s.lock", path);
  int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    snprintf(err, errlen, "cannot open the lock file %s: %s", lock, strerror(errno));
    return -GRAPHD_PERMISSION_DENIED;
  }
  while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    int e = errno;
    if (e == EINTR) continue;
    close(fd);
    if (e == EWOULDBLOCK) {
      snprintf(err, errlen,
               "another graphd holds %s (it is starting on %s); stop it first or choose --socket",
               lock, path);
      return -GRAPHD_ALREADY_EXISTS;
    }
    snprintf(err, errlen, "cannot lock %s: %s", lock, strerror(e));
    return -GRAPHD_FAILED_PRECONDITION;
  }
  *out = fd;
  return 0;
}

static int bind_socket(gd_daemon *s, const gd_options *opt, char *err, size_t errlen);

static int own_socket(gd_daemon *s, const gd_options *opt, char *err, size_t errlen) {
  const char *path = opt->socket_path;
  if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
    snprintf(err, errlen, "socket path %s is too long", path);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  char dir[sizeof s->socket_path];
  snprintf(dir, sizeof dir, "%s", path);
  char *d = dirname(dir);
  if (mkdir(d, 0755) < 0 && errno != EEXIST) {
    snprintf(err, errlen, "cannot create %s: %s", d, strerror(errno));
    return -GRAPHD_PERMISSION_DENIED;
  }
  int lock_fd;
  int rc = lock_path(path, &lock_fd, err, errlen);
  if (rc < 0) return rc;
  /* Probe, unlink and bind under the lock. Once the socket is linked into
   * place the lock may go: a later daemon's probe finds it live. */
  rc = probe_existing(path, err, errlen);
  if (rc == 0) rc = bind_socket(s, opt, err, errlen);
  close(lock_fd);
  return rc;
}

/* own_socket's second half, under the lock: the path is free. */
static int bind_socket(gd_daemon *s, const gd_options *opt, char *err, size_t errlen) {
  const char *path = opt->socket_path;
  int rc;
  /* Bind, set the mode, listen under a temporary name, then link it into
   * place: the path appears only once it accepts connections (clients and
   * scripts may poll for the file), and link() never replaces a socket a
   * daemon started meanwhile. */
  char tmp[sizeof s->socket_path];
  int n = snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
  const char *bind_path = (n > 0 && (size_t)n < sizeof tmp) ? tmp : path;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -GRAPHD_INTERNAL;
  }
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path, bind_path, strlen(bind_path) + 1);
  if (bind_path == tmp) unlink(tmp); /* our own leftover of a crashed start */
  /* Bind with a tight umask so the socket is never briefly wider than asked. */
  mode_t old = umask(0177);
  rc = bind(fd, (struct sockaddr *)&a, sizeof a);
  int e = errno;
  umask(old);
  if (rc < 0) {
    snprintf(err, errlen, "cannot bind %s: %s", bind_path, strerror(e));
    close(fd);
    return e == EADDRINUSE ? -GRAPHD_ALREADY_EXISTS : -GRAPHD_PERMISSION_DENIED;
  }
  if (opt->socket_group[0]) {
    struct group gr, *res = NULL;
    char buf[4096];
    if (getgrnam_r(opt->socket_group, &gr, buf, sizeof buf, &res) != 0 || !res) {
      snprintf(err, errlen, "socket group %s does not exist", opt->socket_group);
      goto fail_unlink;
    }
    if (chown(bind_path, (uid_t)-1, gr.gr_gid) < 0) {
      snprintf(err, errlen, "cannot give %s to group %s: %s", path, opt->socket_group,
               strerror(errno));
      goto fail_unlink;
    }
  }
  if (chmod(bind_path, opt->socket_mode) < 0) {
    snprintf(err, errlen, "cannot chmod %s: %s", path, strerror(errno));
    goto fail_unlink;
  }
  if (listen(fd, 128) < 0) {
    snprintf(err, errlen, "cannot listen on %s: %s", path, strerror(errno));
    goto fail_unlink;
  }
  if (bind_path == tmp) {
    if (link(tmp, path) < 0) {
      e = errno;
      snprintf(err, errlen,
               e == EEXIST ? "%s appeared while graphd started: another daemon "
                             "serves it"
                           : "cannot create %s: %s",
               path, strerror(e));
      unlink(tmp);
      close(fd);
      return e == EEXIST ? -GRAPHD_ALREADY_EXISTS : -GRAPHD_PERMISSION_DENIED;
    }
    unlink(tmp);
  }
  struct stat st;
  if (lstat(path, &st) == 0) {
    s->socket_dev = st.st_dev;
    s->socket_ino = st.st_ino;
  }
  s->listen_fd = fd;
  s->listen_inherited = false;
  snprintf(s->socket_path, sizeof s->socket_path, "%s", path);
  return 0;

fail_unlink:
  unlink(bind_path);
  close(fd);
  return -GRAPHD_PERMISSION_DENIED;
}

int server_listen(gd_daemon *s, const gd_options *opt, char *err, size_t errlen) {
  s->opt = opt;
  s->listen_fd = -1;
  s->euid = geteuid();
  int n = sd_listen_fds(1);
  if (n < 0) {
    snprintf(err, errlen, "LISTEN_FDS is malformed: %s", strerror(-n));
    return -GRAPHD_INVALID_ARGUMENT;
  }
  if (n == 0) return own_socket(s, opt, err, errlen);
  if (n > 1) {
    snprintf(err, errlen, "systemd passed %d sockets; graphd.socket must pass exactly one", n);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  int fd = SD_LISTEN_FDS_START;
  if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
    snprintf(err, errlen, "the socket systemd passed is not a listening Unix stream socket");
    return -GRAPHD_INVALID_ARGUMENT;
  }
  if (set_nonblock_cloexec(fd) < 0) {
    snprintf(err, errlen, "cannot configure the inherited socket: %s", strerror(errno));
    return -GRAPHD_INTERNAL;
  }
  struct sockaddr_un a;
  socklen_t al = sizeof a;
  memset(&a, 0, sizeof a);
  if (getsockname(fd, (struct sockaddr *)&a, &al) == 0 && a.sun_path[0])
    snprintf(s->socket_path, sizeof s->socket_path, "%s", a.sun_path);
  else
    snprintf(s->socket_path, sizeof s->socket_path, "(inherited)");
  s->listen_fd = fd;
  s->listen_inherited = true;
  return 0;
}

static void accept_cb(uv_poll_t *h, int status, int events);

/* A connection past --max-connections or --max-connections-per-uid is told
 * which limit it met, and closed. */
static void refuse_over_limit(gd_daemon *s, gd_session *sess) {
  const gd_options *o = s->opt;
  uint64_t same_uid = 0;
  for (gd_session *x = s->sessions.head; x; x = x->next) same_uid += x->uid == sess->uid;
  if (s->sessions.n > o->max_connections)
    session_reply_error(sess, 0, GRAPHD_RESOURCE_EXHAUSTED,
                        "graphd holds the most connections it takes (--max-connections %u); "
                        "try again when some close",
                        o->max_connections);
  else if (same_uid > o->max_connections_per_uid)
    session_reply_error(sess, 0, GRAPHD_RESOURCE_EXHAUSTED,
                        "uid %u holds the most connections one user may "
                        "(--max-connections-per-uid %u); close some first",
                        (unsigned)sess->uid, o->max_connections_per_uid);
  else
    return;
  GD_LOG(GD_WARN, "server", "refused a connection from pid %d uid %u: connection limit",
         (int)sess->pid, (unsigned)sess->uid);
  session_close_after_flush(sess);
}

/* Once a second: closes connections that never said Hello within
 * --hello-timeout, and sessions idle past --idle-timeout. */
static void sweep_cb(uv_timer_t *t) {
  gd_daemon *s = t->data;
  const gd_options *o = s->opt;
  uint64_t now = gd_now_ns();
  for (gd_session *x = s->sessions.head, *next; x; x = next) {
    next = x->next;
    if (x->closing || x->close_after_flush || x->busy) continue;
    data_session_note_work(x, now);
    if (x->kind == GD_SESSION_NONE && o->hello_timeout_s > 0 &&
        (double)(now - x->opened_ns) > o->hello_timeout_s * 1e9) {
      session_reply_error(x, 0, GRAPHD_DEADLINE_EXCEEDED,
                          "no Hello within %g s (--hello-timeout); closing", o->hello_timeout_s);
      session_close_after_flush(x);
    } else if (x->kind != GD_SESSION_NONE && o->idle_timeout_s > 0 &&
               (double)(now - x->active_ns) > o->idle_timeout_s * 1e9) {
      GD_LOG(GD_INFO, "server",
             "session %llu (pid %d) idle for over %g s (--idle-timeout); closing",
             (unsigned long long)x->id, (int)x->pid, o->idle_timeout_s);
      session_close(x, "idle");
    }
  }
}

/* How long the listener rests when accept() finds no file descriptor left. */
#define ACCEPT_REST_MS 100

static void accept_resume_cb(uv_timer_t *t) {
  gd_daemon *s = t->data;
  if (s->shutting_down || !s->listen_active) return;
  if (uv_poll_start(&s->listen_poll, UV_READABLE, accept_cb) < 0)
    GD_LOG(GD_ERROR, "server", "cannot resume accepting connections");
}

/* Out of file descriptors: the pending connection stays pending, so polling
 * would wake at once and spin; rest the listener instead, and say so once
 * per episode. */
static void accept_rest(gd_daemon *s, int e) {
  if (!s->accept_resting)
    GD_LOG(GD_WARN, "server",
           "accept: %s: %llu sessions open; new connections wait until some close (raise "
           "LimitNOFILE or lower the clients' connections)",
           strerror(e), (unsigned long long)s->sessions.n);
  s->accept_resting = true;
  uv_poll_stop(&s->listen_poll);
  uv_timer_start(&s->accept_timer, accept_resume_cb, ACCEPT_REST_MS, 0);
}

static void accept_cb(uv_poll_t *h, int status, int events) {
  gd_daemon *s = h->data;
  (void)events;
  if (status < 0) {
    GD_LOG(GD_WARN, "server", "listener poll: %s", uv_strerror(status));
    return;
  }
  for (int i = 0; i < 64 && !s->shutting_down; i++) {
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_rest(s, errno);
        return;
      }
      GD_LOG(GD_WARN, "server", "accept: %s", strerror(errno));
      return;
    }
    if (s->accept_resting) {
      GD_LOG(GD_INFO, "server", "accepting connections again");
      s->accept_resting = false;
    }
    gd_session *sess;
    if (session_new(&s->sessions, fd, &sess) == 0) refuse_over_limit(s, sess);
  }
}

static void signal_cb(uv_signal_t *h, int signum) {
  gd_daemon *s = h->data;
  server_shutdown(s, s->exit_code == GD_EXIT_FAULT ? "a device faulted and cannot be reset"
                     : signum == SIGTERM           ? "SIGTERM"
                                                   : "SIGINT");
}

int server_signals_start(gd_daemon *s, uv_loop_t *loop) {
  int rc = 0;
  s->loop = loop;
  UV_CHECK_GOTO(uv_signal_init(loop, &s->sig_term), GRAPHD_INTERNAL, exit);
  UV_CHECK_GOTO(uv_signal_init(loop, &s->sig_int), GRAPHD_INTERNAL, exit);
  s->sig_term.data = s->sig_int.data = s;
  UV_CHECK_GOTO(uv_signal_start(&s->sig_term, signal_cb, SIGTERM), GRAPHD_INTERNAL, exit);
  UV_CHECK_GOTO(uv_signal_start(&s->sig_int, signal_cb, SIGINT), GRAPHD_INTERNAL, exit);
exit:
  return rc;
}

int server_start(gd_daemon *s, uv_loop_t *loop) {
  int rc = 0;
  s->loop = loop;
  s->start_ns = gd_now_ns();
  s->sessions.loop = loop;
  s->sessions.max_frame = s->opt->max_frame;
  router_attach(s);
  UV_CHECK_GOTO(uv_poll_init(loop, &s->listen_poll, s->listen_fd), GRAPHD_INTERNAL, exit);
  s->listen_poll.data = s;
  UV_CHECK_GOTO(uv_timer_init(loop, &s->accept_timer), GRAPHD_INTERNAL, exit);
  s->accept_timer.data = s;
  UV_CHECK_GOTO(uv_timer_init(loop, &s->sweep_timer), GRAPHD_INTERNAL, exit);
  s->sweep_timer.data = s;
  UV_CHECK_GOTO(uv_timer_init(loop, &s->wait_timer), GRAPHD_INTERNAL, exit);
  s->wait_timer.data = s;
  {
    double least = s->opt->hello_timeout_s;
    if (s->opt->idle_timeout_s > 0 && (least <= 0 || s->opt->idle_timeout_s < least))
      least = s->opt->idle_timeout_s;
    uint64_t every = least > 0 && least < 4 ? (uint64_t)(least * 250) + 1 : 1000;
    UV_CHECK_GOTO(uv_timer_start(&s->sweep_timer, sweep_cb, every, every), GRAPHD_INTERNAL, exit);
  }
  UV_CHECK_GOTO(uv_poll_start(&s->listen_poll, UV_READABLE, accept_cb), GRAPHD_INTERNAL, exit);
  s->listen_active = true;
  GD_LOG(GD_INFO, "server", "listening on %s%s", s->socket_path,
         s->listen_inherited ? " (socket from systemd)" : "");
exit:
  return rc;
}

static void listen_close_cb(uv_handle_t *h) {
  gd_daemon *s = h->data;
  close(s->listen_fd);
  s->listen_fd = -1;
}

void server_shutdown(gd_daemon *s, const char *why) {
  if (s->shutting_down) return;
  s->shutting_down = true;
  GD_LOG(GD_INFO, "server", "shutting down (%s): %llu sessions open", why,
         (unsigned long long)s->sessions.n);
  /* First, so systemd hears STOPPING=1 before we wait on workers. */
  if (s->on_shutdown) s->on_shutdown(s);
  if (s->accept_timer.loop && !uv_is_closing((uv_handle_t *)&s->accept_timer))
    uv_close((uv_handle_t *)&s->accept_timer, NULL);
  if (s->sweep_timer.loop && !uv_is_closing((uv_handle_t *)&s->sweep_timer))
    uv_close((uv_handle_t *)&s->sweep_timer, NULL);
  replay_release_held(s); /* before the workers stop: they run or refuse them */
  if (s->wait_timer.loop && !uv_is_closing((uv_handle_t *)&s->wait_timer))
    uv_close((uv_handle_t *)&s->wait_timer, NULL);
  if (s->listen_active) {
    s->listen_active = false;
    uv_poll_stop(&s->listen_poll);
    uv_close((uv_handle_t *)&s->listen_poll, listen_close_cb);
  } else if (s->listen_fd >= 0) {
    close(s->listen_fd);
    s->listen_fd = -1;
  }
  /* No new requests: each socket is shut for reading, so a client's later
   * send fails at once; what a client had sent is answered UNAVAILABLE
   * with not_started (its request never began, so it may go to the next
   * daemon). Then the workers finish the job each runs and answer their
   * queued jobs the same way; a replay still waiting for its client's
   * ready flag on a host device was not started either. */
  for (gd_session *x = s->sessions.head, *next; x; x = next) {
    next = x->next;
    session_stop_reading(x);
  }
  if (worker_pool_stop(&s->pool, s->opt->shutdown_grace_s) > 0) {
    /* A device is stuck (a GPU wait that never ends, a kernel that never
     * returns): its worker still uses sessions and the pool, so nothing
     * is freed; the socket goes, and the process exits at once. */
    server_cleanup(s);
    GD_LOG(GD_ERROR, "server", "exiting without a clean shutdown (--shutdown-grace %.1f s)",
           s->opt->shutdown_grace_s);
    _exit(1);
  }
  for (gd_session *x = s->sessions.head, *next; x; x = next) {
    next = x->next;
    if (!x->busy) session_refuse_unread(x);
  }
  while (s->sessions.head) session_close(s->sessions.head, "daemon shutting down");
  worker_pool_close(&s->pool);
  uv_close((uv_handle_t *)&s->sig_term, NULL);
  uv_close((uv_handle_t *)&s->sig_int, NULL);
}

void server_cleanup(gd_daemon *s) {
  if (s->listen_inherited || !s->socket_path[0]) return;
  /* Only the file we made: another graphd may have started on this path
   * since (after ours was removed), and its socket is not ours to remove. */
  struct stat st;
  if (lstat(s->socket_path, &st) < 0) return;
  if (st.st_dev != s->socket_dev || st.st_ino != s->socket_ino) {
    GD_LOG(GD_INFO, "server", "%s is another daemon's socket now; leaving it", s->socket_path);
    return;
  }
  if (unlink(s->socket_path) < 0 && errno != ENOENT)
    GD_LOG(GD_WARN, "server", "cannot remove %s: %s", s->socket_path, strerror(errno));
}
