/* See hello.h. Loop thread. */
#define _GNU_SOURCE
#include "hello.h"

#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "common/uuid.h"
#include "daemon/sessions/daemon.h"
#include "device_info.h"
#include "daemon/sessions/data_session.h"
#include "graphd/status.h"
#include "common/log.h"
#include "version.h"
#include "graphd/wire.h"

/* The admin rule (docs/design.md, "Privilege"): root, the daemon's own
 * uid, or a member of the admin group (primary or supplementary, from
 * SO_PEERGROUPS). */
static bool peer_is_admin(gd_session *s) {
  gd_daemon *d = daemon_of(s);
  if (s->uid == 0 || s->uid == d->euid) return true;
  const char *gname = d->opt->admin_group;
  if (!gname[0]) return false;
  struct group gr, *res = NULL;
  char buf[4096];
  if (getgrnam_r(gname, &gr, buf, sizeof buf, &res) != 0 || !res) return false;
  if (s->gid == gr.gr_gid) return true;
  gid_t groups[256];
  socklen_t len = sizeof groups;
  if (getsockopt(s->fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0) return false;
  for (size_t k = 0; k < len / sizeof(gid_t); k++)
    if (groups[k] == gr.gr_gid) return true;
  return false;
}

/* A client's name goes into logs, status, JSON and terminals as it is: it
 * must be UTF-8 without control characters. Returns the offending byte's
 * offset, or -1 when the name is fine; *what says what is wrong there. */
static long name_fault(const char *name, const char **what) {
  const unsigned char *p = (const unsigned char *)name;
  for (size_t i = 0; p[i];) {
    unsigned c = p[i], need, cp;
    if (c < 0x80) {
      need = 0, cp = c;
    } else if (c >= 0xc2 && c <= 0xdf) {
      need = 1, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      need = 2, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      need = 3, cp = c & 0x07;
    } else {
      *what = "is not valid UTF-8";
      return (long)i;
    }
    for (unsigned k = 1; k <= need; k++) {
      if ((p[i + k] & 0xc0) != 0x80) {
        *what = "is not valid UTF-8";
        return (long)i;
      }
      cp = cp << 6 | (p[i + k] & 0x3f);
    }
    if ((need == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (need == 3 && (cp < 0x10000 || cp > 0x10ffff))) {
      *what = "is not valid UTF-8";
      return (long)i;
    }
    if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f)) {
      *what = "has a control character";
      return (long)i;
    }
    i += 1 + need;
  }
  return -1;
}

/* Hello's protocol version and client name; false (the refusal answered
 * and the session closing after it) when either will not do. */
static bool hello_acceptable(gd_session *s, const Graphd__Wire__Request *req) {
  const Graphd__Wire__Hello *h = req->hello;
  if (h->protocol_version != GRAPHD_PROTOCOL_VERSION) {
    session_reply_error(s, req->request_id, GRAPHD_FAILED_PRECONDITION,
                        "protocol version %u is not supported: this daemon speaks version %u",
                        h->protocol_version, GRAPHD_PROTOCOL_VERSION);
    session_close_after_flush(s);
    return false;
  }
  if (h->client_name && strlen(h->client_name) > GD_CLIENT_NAME_MAX) {
    session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                        "Hello.client_name is %zu bytes, over the limit of %d",
                        strlen(h->client_name), GD_CLIENT_NAME_MAX);
    session_close_after_flush(s);
    return false;
  }
  const char *what = NULL;
  long at = h->client_name ? name_fault(h->client_name, &what) : -1;
  if (at >= 0) {
    session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                        "Hello.client_name %s (byte %ld, 0x%02x): it must be UTF-8 without "
                        "control characters",
                        what, at, (unsigned char)h->client_name[at]);
    session_close_after_flush(s);
    return false;
  }
  return true;
}

/* Makes s a data session on the device whose UUID Hello names. Returns
 * the device's index, or -1 (the refusal answered and the session closing
 * after it) when no usable device has that UUID or memory runs out. */
static int open_data_session(gd_session *s, const Graphd__Wire__Request *req) {
  gd_daemon *d = daemon_of(s);
  const Graphd__Wire__Hello *h = req->hello;
  int dev = -1;
  if (h->device_uuid.len != GD_UUID_LEN) {
    session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                        "Hello.device_uuid must be %d bytes, got %zu", GD_UUID_LEN,
                        h->device_uuid.len);
    session_close_after_flush(s);
    return -1;
  }
  for (int i = 0; i < d->ndevices; i++)
    if (memcmp(d->facts[i]->uuid, h->device_uuid.data, GD_UUID_LEN) == 0) dev = i;
  if (dev < 0) {
    char want[48], have[512] = "";
    size_t n = 0;
    gd_uuid_format(h->device_uuid.data, "", want);
    for (int i = 0; i < d->ndevices && n < sizeof have; i++)
      n +=
          (size_t)snprintf(have + n, sizeof have - n, "%s%s", i ? ", " : "", d->facts[i]->uuid_str);
    session_reply_error(s, req->request_id, GRAPHD_NOT_FOUND,
                        "no device with UUID %s is served by this daemon (it serves: %s)", want,
                        have);
    session_close_after_flush(s);
    return -1;
  }
  gd_device *device = &d->devices[dev];
  if (!device_ok(device)) {
    session_reply_error(s, req->request_id, GRAPHD_UNAVAILABLE, "device %d (%s) is not usable: %s",
                        dev, d->facts[dev]->uuid_str, device->fail_msg);
    session_close_after_flush(s);
    return -1;
  }
  if (data_session_open(s, dev) < 0) {
    session_reply_error(s, req->request_id, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    session_close_after_flush(s);
    return -1;
  }
  return dev;
}

void hello_handle_hello(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  (void)fds;
  gd_daemon *d = daemon_of(s);
  Graphd__Wire__Hello *h = req->hello;
  if (s->kind != GD_SESSION_NONE) {
    session_reply_error(s, req->request_id, GRAPHD_FAILED_PRECONDITION,
                        "Hello was already sent on this session");
    return;
  }
  if (!hello_acceptable(s, req)) return;
  int dev = -1;
  if (h->kind == GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_DATA) {
    if ((dev = open_data_session(s, req)) < 0) return;
  } else if (h->kind == GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_CONTROL) {
    s->kind = GD_SESSION_CONTROL;
  } else {
    session_reply_error(s, req->request_id, GRAPHD_INVALID_ARGUMENT,
                        "Hello.kind must be DATA or CONTROL, got %d", (int)h->kind);
    session_close_after_flush(s);
    return;
  }
  if (h->client_name) snprintf(s->client_name, sizeof s->client_name, "%s", h->client_name);
  s->admin = peer_is_admin(s);

  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__HelloReply hr = GRAPHD__WIRE__HELLO_REPLY__INIT;
  Graphd__Wire__DeviceInfo di;
  Graphd__Wire__DeviceCounters dc;
  r.request_id = req->request_id;
  r.body_case = GRAPHD__WIRE__REPLY__BODY_HELLO;
  r.hello = &hr;
  hr.protocol_version = GRAPHD_PROTOCOL_VERSION;
  hr.session_id = s->id;
  hr.daemon_version = (char *)GRAPHD_VERSION_STRING;
  hr.admin = s->admin;
  hr.max_frame = d->opt->max_frame;
  if (dev >= 0) {
    device_info_fill(d, dev, 0, &di, &dc);
    hr.device = &di;
  }
  GD_LOG(GD_INFO, "session", "session %llu: %s session for pid %d uid %u (%s)%s%s",
         (unsigned long long)s->id, dev >= 0 ? "data" : "control", (int)s->pid, (unsigned)s->uid,
         s->client_name[0] ? s->client_name : "unnamed", dev >= 0 ? " on " : "",
         dev >= 0 ? d->facts[dev]->uuid_str : "");
  session_reply(s, &r);
}

void hello_handle_ping(gd_session *s, Graphd__Wire__Request *req, int *fds) {
  (void)fds;
  Graphd__Wire__Reply r = GRAPHD__WIRE__REPLY__INIT;
  Graphd__Wire__Pong pong = GRAPHD__WIRE__PONG__INIT;
  r.request_id = req->request_id;
  r.body_case = GRAPHD__WIRE__REPLY__BODY_PONG;
  r.pong = &pong;
  pong.payload = req->ping->payload;
  session_reply(s, &r);
}
