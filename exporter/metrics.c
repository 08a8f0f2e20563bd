/* GET /metrics over HTTP (metrics.h). libmicrohttpd runs the listener in
 * a thread of its own; a scrape there asks this daemon for Status over its
 * own socket, as a control client (one session kept between scrapes), and
 * writes the reply with gd_prom_write, the renderer graphctl uses. The loop
 * sees one more control session, and a busy device costs a scrape what it
 * costs `graphctl stats`: at most the Status bound.
 *
 * Slow clients: libmicrohttpd's own timeout restarts on every byte, so a
 * client that trickles a header line now and then would hold its
 * connection for ever. A sweeper thread of ours closes (shutdown(2)) every
 * connection whose request headers are not all in by the header deadline
 * after it connected or got its last answer; libmicrohttpd then sees the
 * end and frees it. One address holds a few connections at most.
 *
 * Locks: m->lock guards the connection list; taken by libmicrohttpd's
 * thread (connection callbacks, on_request) and the sweeper, never while
 * calling into libmicrohttpd. */
#define _GNU_SOURCE
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "prom.h"
#include "graphd/graphd.h"
#include "common/log.h"
#include "common/listen.h"

#define SCRAPE_TIMEOUT_MS 5000 /* connect and Status, each */
#define HTTP_CONNECTIONS 64    /* connections at once, in all */
#define HTTP_IDLE_S 10         /* an HTTP connection idle this long is closed */
#define SWEEP_MS 100           /* how often the header deadline is checked */

/* One HTTP connection, from libmicrohttpd's "started" to its "closed". */
typedef struct http_conn {
  struct http_conn *prev, *next;
  int fd;            /* our dup of its socket: never reused while listed */
  uint64_t since_ns; /* connected, or last request answered */
  bool headers_in;   /* the current request's headers all arrived */
  bool cut;          /* shut down past the deadline */
} http_conn;

struct gd_metrics {
  struct MHD_Daemon *http;
  pthread_mutex_t lock;
  http_conn *conns;     /* guarded by lock */
  uint64_t deadline_ns; /* for a request's headers */
  pthread_t sweeper;
  bool sweeper_started;
  bool stopping;            /* guarded by lock */
  pthread_cond_t stop_cond; /* signalled with stopping */
  uint64_t cut_total;       /* guarded by lock: connections cut, for the log */
  graphd_client *c;         /* kept between scrapes; only libmicrohttpd's thread uses it */
  char socket_path[108];
  char where[160]; /* ADDR:PORT as bound, for the log */
};

/* Queues r (consumed) with its content type and, for 405, Allow. */
static enum MHD_Result send_response(struct MHD_Connection *conn, unsigned code,
                                     struct MHD_Response *r, const char *type, const char *allow) {
  if (!r) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
  enum MHD_Result ret = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned code, const char *text,
                             const char *allow) {
  return send_response(
      conn, code,
      MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY),
      "text/plain; charset=utf-8", allow);
}

/* The daemon's status through m's session, connected first when there is
 * none; NULL with why filled in (and the session dropped) on failure. */
static graphd_daemon_status *ask_status(gd_metrics *m, char *why, size_t whylen) {
  graphd_daemon_status *s = NULL;
  if (!m->c) {
    graphd_connect_options o;
    graphd_connect_options_init(&o);
    o.socket_path = m->socket_path;
    o.timeout_ms = SCRAPE_TIMEOUT_MS;
    o.client_name = "graphd-metrics";
    if (graphd_connect(&o, &m->c, why, whylen) != GRAPHD_OK) {
      m->c = NULL;
      return NULL;
    }
    (void)graphd_set_reconnect_wait(m->c, 0); /* a stopping daemon is not waited for */
  }
  graphd_status st = graphd_get_status_now(m->c, &s);
  if (st == GRAPHD_OK) return s;
  snprintf(why, whylen, "status: %s: %s", graphd_status_name(st), graphd_last_error(m->c));
  graphd_close(m->c);
  m->c = NULL;
  return NULL;
}

/* The exposition text of the daemon's status (malloc'd, *len bytes), or
 * NULL with why filled in. A session the daemon closed since the last
 * scrape (an idle timeout) is replaced once. */
static char *scrape(gd_metrics *m, size_t *len, char *why, size_t whylen) {
  char *text = NULL;
  bool fresh = m->c == NULL;
  graphd_daemon_status *s = ask_status(m, why, whylen);
  if (!s && !fresh) s = ask_status(m, why, whylen);
  if (!s) return NULL;
  gd_client_row *cl;
  size_t ncl = gd_client_rows(s, (uint32_t)getpid(), &cl);
  FILE *f = open_memstream(&text, len);
  if (f) {
    gd_prom_write(f, s, cl, ncl);
    if (fclose(f) != 0) {
      free(text);
      text = NULL;
    }
  }
  if (!text) snprintf(why, whylen, "out of memory");
  free(cl);
  graphd_daemon_status_free(s);
  return text;
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The record libmicrohttpd keeps for conn (set when it started). */
static http_conn *conn_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* A connection starts or ends: it joins or leaves the swept list. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  gd_metrics *m = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    http_conn *c = calloc(1, sizeof *c);
    if (!c) return; /* not swept: libmicrohttpd's idle timeout still holds */
    c->fd = ci ? fcntl(ci->connect_fd, F_DUPFD_CLOEXEC, 0) : -1;
    c->since_ns = mono_ns();
    pthread_mutex_lock(&m->lock);
    c->next = m->conns;
    if (m->conns) m->conns->prev = c;
    m->conns = c;
    pthread_mutex_unlock(&m->lock);
    *socket_context = c;
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    http_conn *c = *socket_context;
    if (!c) return;
    pthread_mutex_lock(&m->lock);
    if (c->prev)
      c->prev->next = c->next;
    else
      m->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_mutex_unlock(&m->lock);
    if (c->fd >= 0) close(c->fd);
    free(c);
    *socket_context = NULL;
  }
}

/* A request was answered (or dropped): the next one on a kept-alive
 * connection has the whole deadline from now. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode why) {
  gd_metrics *m = cls;
  (void)req_cls;
  (void)why;
  http_conn *c = conn_of(conn);
  if (!c) return;
  pthread_mutex_lock(&m->lock);
  c->since_ns = mono_ns();
  c->headers_in = false;
  pthread_mutex_unlock(&m->lock);
}

/* Every SWEEP_MS: connections whose headers are late are shut down. */
static void *sweep_main(void *arg) {
  gd_metrics *m = arg;
  pthread_mutex_lock(&m->lock);
  while (!m->stopping) {
    uint64_t now = mono_ns();
    for (http_conn *c = m->conns; c; c = c->next)
      if (!c->headers_in && !c->cut && c->fd >= 0 && now - c->since_ns > m->deadline_ns) {
        (void)shutdown(c->fd, SHUT_RDWR);
        c->cut = true;
        if (m->cut_total++ % 1000 == 0)
          GD_LOG(GD_INFO, "metrics",
                 "closed an HTTP connection that sent no complete request within the header "
                 "deadline (%llu so far; --metrics-header-timeout)",
                 (unsigned long long)m->cut_total);
      }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += SWEEP_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    (void)pthread_cond_timedwait(&m->stop_cond, &m->lock, &ts);
  }
  pthread_mutex_unlock(&m->lock);
  return NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls) {
  (void)version;
  (void)upload_data;
  (void)upload_data_size;
  (void)req_cls;
  gd_metrics *m = cls;
  http_conn *c = conn_of(conn);
  if (c) {
    pthread_mutex_lock(&m->lock);
    c->headers_in = true;
    pthread_mutex_unlock(&m->lock);
  }
  if (strcmp(url, "/metrics") != 0)
    return reply(conn, MHD_HTTP_NOT_FOUND, "not found: graphd serves /metrics only\n", NULL);
  bool head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  if (!head && strcmp(method, MHD_HTTP_METHOD_GET) != 0)
    return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: use GET\n", "GET, HEAD");
  char why[GRAPHD_ERRMAX + 64];
  size_t len = 0;
  char *text = scrape(m, &len, why, sizeof why);
  if (!text) {
    GD_LOG(GD_WARN, "metrics", "scrape failed: %s", why);
    char body[sizeof why + 32];
    snprintf(body, sizeof body, "graphd did not answer: %s\n", why);
    return reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, body, NULL);
  }
  struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
  if (!r) free(text);
  return send_response(conn, MHD_HTTP_OK, r, "text/plain; version=0.0.4; charset=utf-8", NULL);
}

static void http_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  char msg[256];
  vsnprintf(msg, sizeof msg, fmt, ap);
  msg[strcspn(msg, "\n")] = '\0';
  GD_LOG(GD_WARN, "metrics", "libmicrohttpd: %s", msg);
}

/* A listening TCP socket on host:port, or -1 with err filled in. */
static int listen_on(const char *host, unsigned port, char *where, size_t wherelen, char *err,
                     size_t errlen) {
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
  struct addrinfo *ai = NULL;
  char ports[8];
  snprintf(ports, sizeof ports, "%u", port);
  int rc = getaddrinfo(host, ports, &hints, &ai);
  if (rc != 0) {
    snprintf(err, errlen, "metrics-listen: cannot resolve '%s': %s", host, gai_strerror(rc));
    return -1;
  }
  int fd = -1, e = 0;
  for (struct addrinfo *a = ai; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      e = errno;
      continue;
    }
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ai_family == AF_INET6) (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      char h[NI_MAXHOST];
      if (getnameinfo(a->ai_addr, a->ai_addrlen, h, sizeof h, NULL, 0, NI_NUMERICHOST) != 0)
        snprintf(h, sizeof h, "%s", host);
      snprintf(where, wherelen, a->ai_family == AF_INET6 ? "[%s]:%u" : "%s:%u", h, port);
      break;
    }
    e = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(ai);
  if (fd < 0)
    snprintf(err, errlen, "metrics-listen: %s:%u: %s%s", host, port, strerror(e),
             e == EAFNOSUPPORT || e == EPERM
                 ? " (under systemd, allow AF_INET and AF_INET6 in RestrictAddressFamilies=)"
                 : "");
  return fd;
}

gd_metrics *metrics_start(const char *listen_spec, const char *socket_path, double header_timeout_s,
                          unsigned per_address, char *err, size_t errlen) {
  char host[128];
  unsigned port;
  char why[160];
  if (gd_split_listen(listen_spec, host, sizeof host, &port, why, sizeof why) < 0) {
    snprintf(err, errlen, "metrics-listen: %s", why);
    return NULL;
  }
  gd_metrics *m = calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "metrics-listen: out of memory");
    return NULL;
  }
  snprintf(m->socket_path, sizeof m->socket_path, "%s", socket_path);
  m->deadline_ns = (uint64_t)(header_timeout_s * 1e9);
  pthread_mutex_init(&m->lock, NULL);
  pthread_cond_init(&m->stop_cond, NULL);
  int fd = listen_on(host, port, m->where, sizeof m->where, err, errlen);
  if (fd < 0) goto fail;
  m->http = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0,
                             NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER, http_log, NULL,
                             MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
                             (unsigned)HTTP_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                             per_address, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_S,
                             MHD_OPTION_NOTIFY_CONNECTION, on_connection, m,
                             MHD_OPTION_NOTIFY_COMPLETED, on_completed, m, MHD_OPTION_END);
  if (!m->http) {
    snprintf(err, errlen, "metrics-listen: %s: libmicrohttpd did not start", m->where);
    close(fd);
    goto fail;
  }
  if (pthread_create(&m->sweeper, NULL, sweep_main, m) != 0) {
    snprintf(err, errlen, "metrics-listen: cannot start the header deadline's thread");
    MHD_socket lfd = MHD_quiesce_daemon(m->http);
    MHD_stop_daemon(m->http);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    goto fail;
  }
  m->sweeper_started = true;
  GD_LOG(GD_INFO, "metrics", "serving http://%s/metrics", m->where);
  return m;

fail:
  pthread_cond_destroy(&m->stop_cond);
  pthread_mutex_destroy(&m->lock);
  free(m);
  return NULL;
}

void metrics_stop(gd_metrics *m) {
  if (!m) return;
  if (m->sweeper_started) {
    pthread_mutex_lock(&m->lock);
    m->stopping = true;
    pthread_cond_signal(&m->stop_cond);
    pthread_mutex_unlock(&m->lock);
    pthread_join(m->sweeper, NULL);
  }
  /* Quiesced first, the listening socket is handed back to us, to close
   * once libmicrohttpd's thread has stopped. */
  MHD_socket fd = MHD_quiesce_daemon(m->http);
  MHD_stop_daemon(m->http);
  if (fd != MHD_INVALID_SOCKET) close(fd);
  if (m->c) graphd_close(m->c);
  pthread_cond_destroy(&m->stop_cond);
  pthread_mutex_destroy(&m->lock);
  free(m);
}
