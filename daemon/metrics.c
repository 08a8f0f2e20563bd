/* GET /metrics over HTTP (metrics.h). libmicrohttpd runs the listener in
 * a thread of its own; a scrape there asks this daemon for Status over its
 * own socket, as a control client (one session kept between scrapes), and
 * writes the reply with gd_prom_write, the renderer graphctl uses. The loop
 * sees one more control session, and a busy device costs a scrape what it
 * costs `graphctl stats`: at most the Status bound. */
#define _GNU_SOURCE
#include "metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../common/prom.h"
#include "graphd/graphd.h"
#include "log.h"
#include "options.h"

#define SCRAPE_TIMEOUT_MS 5000 /* connect and Status, each */
#define HTTP_CONNECTIONS 16    /* scrapers served at once */
#define HTTP_IDLE_S 10         /* an HTTP connection idle this long is closed */

struct gd_metrics {
  struct MHD_Daemon *http;
  graphd_client *c; /* kept between scrapes; only libmicrohttpd's thread uses it */
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
  graphd_status st = graphd_get_status(m->c, &s);
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

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls) {
  (void)version;
  (void)upload_data;
  (void)upload_data_size;
  (void)req_cls;
  gd_metrics *m = cls;
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

gd_metrics *metrics_start(const char *listen_spec, const char *socket_path, char *err,
                          size_t errlen) {
  char host[128];
  unsigned port;
  char why[160];
  if (options_split_listen(listen_spec, host, sizeof host, &port, why, sizeof why) < 0) {
    snprintf(err, errlen, "metrics-listen: %s", why);
    return NULL;
  }
  gd_metrics *m = calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "metrics-listen: out of memory");
    return NULL;
  }
  snprintf(m->socket_path, sizeof m->socket_path, "%s", socket_path);
  int fd = listen_on(host, port, m->where, sizeof m->where, err, errlen);
  if (fd < 0) {
    free(m);
    return NULL;
  }
  m->http = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0,
                             NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER, http_log, NULL,
                             MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
                             (unsigned)HTTP_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT,
                             (unsigned)HTTP_IDLE_S, MHD_OPTION_END);
  if (!m->http) {
    snprintf(err, errlen, "metrics-listen: %s: libmicrohttpd did not start", m->where);
    close(fd);
    free(m);
    return NULL;
  }
  GD_LOG(GD_INFO, "metrics", "serving http://%s/metrics", m->where);
  return m;
}

void metrics_stop(gd_metrics *m) {
  if (!m) return;
  /* Quiesced first, the listening socket is handed back to us, to close
   * once libmicrohttpd's thread has stopped. */
  MHD_socket fd = MHD_quiesce_daemon(m->http);
  MHD_stop_daemon(m->http);
  if (fd != MHD_INVALID_SOCKET) close(fd);
  if (m->c) graphd_close(m->c);
  free(m);
}
