/* Framing: a u32 little-endian length, then that many payload bytes.
 *
 * The reader also tracks file descriptors that arrive with SCM_RIGHTS and
 * hands each one to the frame it was sent with. Linux attaches a
 * sendmsg()'s fds to the first byte of that call's data, and a recvmsg()
 * that picks up fds stops at the end of the buffer that carried them, so
 * the fds of one recvmsg belong to the frame holding the last byte that
 * recvmsg returned. Senders must therefore send each frame that carries fds
 * with one sendmsg() whose data starts at the frame's first byte.
 *
 * Leaf module: no CUDA, no libuv, no logging. Not thread-safe; one reader
 * per connection. */
#ifndef GRAPHD_FRAME_H
#define GRAPHD_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define GD_FRAME_HEADER 4u
#define GD_FRAME_MAX_FDS 32
#define GD_FRAME_DEFAULT_MAX (4u << 20) /* 4 MiB */
#define GD_FRAME_MIN_MAX 1024u
#define GD_FRAME_LIMIT (256u << 20) /* no configured cap may exceed this */

typedef struct gd_frame {
  const uint8_t *data; /* payload; valid until the next reader call */
  size_t len;
  int fds[GD_FRAME_MAX_FDS]; /* owned by the caller once returned */
  int nfds;
} gd_frame;

typedef struct gd_frame_reader {
  uint8_t *buf;
  size_t len; /* bytes held in buf */
  size_t cap;
  size_t consumed;   /* bytes of buf already returned as frames */
  size_t max_frame;  /* payload cap */
  uint64_t base_off; /* stream offset of buf[0] */
  struct {
    int fd;
    uint64_t at; /* stream offset of the last byte of the delivering recv */
  } fds[GD_FRAME_MAX_FDS];
  int nfds;
} gd_frame_reader;

void gd_frame_reader_init(gd_frame_reader *r, size_t max_frame);
/* Frees the buffer and closes every fd not yet handed out. */
void gd_frame_reader_close(gd_frame_reader *r);

/* Space for the next read: *p and *avail. Returns 0, or -GRAPHD_RESOURCE_EXHAUSTED
 * when no memory could be had. */
int gd_frame_reader_space(gd_frame_reader *r, uint8_t **p, size_t *avail);

/* Records n bytes written at the space from gd_frame_reader_space(), and the
 * fds that the same recvmsg delivered. On too many pending fds every fd
 * passed in is closed and -GRAPHD_RESOURCE_EXHAUSTED is returned. */
int gd_frame_reader_commit(gd_frame_reader *r, size_t n, const int *fds, int nfds);

/* Takes the next whole frame. Returns 1 with *out filled, 0 when more bytes
 * are needed, -GRAPHD_RESOURCE_EXHAUSTED when the declared length is over
 * the cap (the stream cannot be resynchronised: close it). */
int gd_frame_reader_next(gd_frame_reader *r, gd_frame *out);

/* Length declared by the header of the frame being read, or 0. For error
 * messages. */
uint32_t gd_frame_reader_pending_len(const gd_frame_reader *r);

/* Reads one recvmsg from a socket into the reader, with MSG_CMSG_CLOEXEC.
 * Returns bytes read (>0), 0 on EOF, -1 with errno set on error (EAGAIN
 * included). A truncated control message (too many fds) closes what did
 * arrive and fails with errno EMSGSIZE. */
ssize_t gd_frame_reader_recv(gd_frame_reader *r, int sock);

/* The same, blocking (up to the socket's SO_RCVTIMEO): one syscall where a
 * non-blocking read would take three (recv, poll, recv). */
ssize_t gd_frame_reader_recv_wait(gd_frame_reader *r, int sock);

/* Writes the 4-byte header for a payload of len bytes. */
void gd_frame_put_header(uint8_t hdr[GD_FRAME_HEADER], uint32_t len);

/* One sendmsg() of buf with fds attached (nfds may be 0), MSG_NOSIGNAL and
 * flags added. Returns what sendmsg returns. */
ssize_t gd_frame_sendmsg(int sock, const void *buf, size_t len, const int *fds, int nfds,
                         int flags);

#endif
