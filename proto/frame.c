#define _GNU_SOURCE
#include "graphd/frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "graphd/status.h"

#define READ_CHUNK 65536u

void gd_frame_reader_init(gd_frame_reader *r, size_t max_frame) {
  memset(r, 0, sizeof *r);
  r->max_frame = max_frame;
}

void gd_frame_reader_close(gd_frame_reader *r) {
  for (int i = 0; i < r->nfds; i++) close(r->fds[i].fd);
  free(r->buf);
  memset(r, 0, sizeof *r);
}

static uint32_t get_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void gd_frame_put_header(uint8_t hdr[GD_FRAME_HEADER], uint32_t len) {
  hdr[0] = (uint8_t)len;
  hdr[1] = (uint8_t)(len >> 8);
  hdr[2] = (uint8_t)(len >> 16);
  hdr[3] = (uint8_t)(len >> 24);
}

int gd_frame_reader_space(gd_frame_reader *r, uint8_t **p, size_t *avail) {
  /* Drop frames already handed out so the buffer does not grow forever. */
  if (r->consumed) {
    memmove(r->buf, r->buf + r->consumed, r->len - r->consumed);
    r->len -= r->consumed;
    r->base_off += r->consumed;
    r->consumed = 0;
  }
  /* A buffer grown for a large frame goes back to a chunk once it is
   * consumed, so an idle session holds little. */
  if (r->len == 0 && r->cap > 4 * READ_CHUNK) {
    free(r->buf);
    r->buf = NULL;
    r->cap = 0;
  }
  /* Read at most up to the end of the frame in progress (or a chunk when
   * its length is not known yet), and grow with what has arrived rather
   * than with what the header declares: a peer that declares 4 MiB and
   * sends nothing more costs one chunk, not 4 MiB. */
  size_t want = READ_CHUNK;
  if (r->len >= GD_FRAME_HEADER) {
    size_t total = GD_FRAME_HEADER + (size_t)get_le32(r->buf);
    size_t grow = r->len > READ_CHUNK ? r->len : READ_CHUNK;
    if (total > r->len && total - r->len > want) want = total - r->len;
    if (want > grow) want = grow;
    if (total - GD_FRAME_HEADER > r->max_frame) want = READ_CHUNK;
  }
  if (r->cap - r->len < want) {
    size_t ncap = r->len + want;
    uint8_t *nb = realloc(r->buf, ncap);
    if (!nb) return -GRAPHD_RESOURCE_EXHAUSTED;
    r->buf = nb;
    r->cap = ncap;
  }
  *p = r->buf + r->len;
  *avail = r->cap - r->len;
  return 0;
}

int gd_frame_reader_commit(gd_frame_reader *r, size_t n, const int *fds, int nfds) {
  if (nfds > 0 && r->nfds + nfds > GD_FRAME_MAX_FDS) {
    for (int i = 0; i < nfds; i++) close(fds[i]);
    r->len += n;
    return -GRAPHD_RESOURCE_EXHAUSTED;
  }
  uint64_t last = r->base_off + r->len + (n ? n - 1 : 0);
  for (int i = 0; i < nfds; i++) {
    r->fds[r->nfds].fd = fds[i];
    r->fds[r->nfds].at = last;
    r->nfds++;
  }
  r->len += n;
  return 0;
}

uint32_t gd_frame_reader_pending_len(const gd_frame_reader *r) {
  if (r->len - r->consumed < GD_FRAME_HEADER) return 0;
  return get_le32(r->buf + r->consumed);
}

int gd_frame_reader_next(gd_frame_reader *r, gd_frame *out) {
  size_t have = r->len - r->consumed;
  if (have < GD_FRAME_HEADER) return 0;
  uint32_t plen = get_le32(r->buf + r->consumed);
  if (plen > r->max_frame) return -GRAPHD_RESOURCE_EXHAUSTED;
  if (have < GD_FRAME_HEADER + (size_t)plen) return 0;

  uint64_t start = r->base_off + r->consumed;
  uint64_t end = start + GD_FRAME_HEADER + plen; /* exclusive */
  out->data = r->buf + r->consumed + GD_FRAME_HEADER;
  out->len = plen;
  out->nfds = 0;
  int keep = 0;
  for (int i = 0; i < r->nfds; i++) {
    if (r->fds[i].at >= start && r->fds[i].at < end) {
      out->fds[out->nfds++] = r->fds[i].fd;
    } else if (r->fds[i].at < start) {
      /* Cannot happen with a well-behaved sender; never leak it. */
      close(r->fds[i].fd);
    } else {
      r->fds[keep++] = r->fds[i];
    }
  }
  r->nfds = keep;
  r->consumed += GD_FRAME_HEADER + plen;
  return 1;
}

static ssize_t reader_recv(gd_frame_reader *r, int sock, int flags) {
  uint8_t *p;
  size_t avail;
  if (gd_frame_reader_space(r, &p, &avail) < 0) {
    errno = ENOMEM;
    return -1;
  }
  union {
    char buf[CMSG_SPACE(sizeof(int) * GD_FRAME_MAX_FDS)];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {.iov_base = p, .iov_len = avail};
  struct msghdr m = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
  ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | flags);
  if (n < 0) return -1;
  int fds[GD_FRAME_MAX_FDS];
  int nfds = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < k; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (nfds < GD_FRAME_MAX_FDS)
        fds[nfds++] = fd;
      else
        close(fd);
    }
  }
  if (m.msg_flags & MSG_CTRUNC) {
    for (int i = 0; i < nfds; i++) close(fds[i]);
    errno = EMSGSIZE;
    return -1;
  }
  if (n == 0) {
    for (int i = 0; i < nfds; i++) close(fds[i]);
    return 0;
  }
  if (gd_frame_reader_commit(r, (size_t)n, fds, nfds) < 0) {
    errno = EMSGSIZE;
    return -1;
  }
  return n;
}

ssize_t gd_frame_reader_recv(gd_frame_reader *r, int sock) {
  return reader_recv(r, sock, MSG_DONTWAIT);
}

ssize_t gd_frame_reader_recv_wait(gd_frame_reader *r, int sock) { return reader_recv(r, sock, 0); }

ssize_t gd_frame_sendmsg(int sock, const void *buf, size_t len, const int *fds, int nfds,
                         int flags) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * GD_FRAME_MAX_FDS)];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > GD_FRAME_MAX_FDS) {
    errno = EINVAL;
    return -1;
  }
  if (nfds > 0) {
    memset(&ctl, 0, sizeof ctl);
    m.msg_control = ctl.buf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  return sendmsg(sock, &m, MSG_NOSIGNAL | flags);
}
