/* Framing: partial reads, limits, and which frame each fd belongs to. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graphd/frame.h"
#include "graphd/status.h"
#include "harness.h"

static void make_frame(uint8_t *out, const char *payload, uint32_t len) {
  gd_frame_put_header(out, len);
  memcpy(out + 4, payload, len);
}

static int open_fds(void) { return td_count_fds(getpid()); }

START_TEST(test_frame_partial_reads_complete_only_at_the_end) {
  gd_frame_reader r;
  gd_frame_reader_init(&r, 1024);
  uint8_t buf[4 + 11];
  make_frame(buf, "hello world", 11);
  gd_frame f;
  for (size_t i = 0; i < sizeof buf; i++) {
    ck_assert_int_eq(gd_frame_reader_next(&r, &f), 0);
    uint8_t *p;
    size_t avail;
    ck_assert_int_eq(gd_frame_reader_space(&r, &p, &avail), 0);
    ck_assert_uint_ge(avail, 1);
    *p = buf[i];
    ck_assert_int_eq(gd_frame_reader_commit(&r, 1, NULL, 0), 0);
  }
  ck_assert_int_eq(gd_frame_reader_next(&r, &f), 1);
  ck_assert_uint_eq(f.len, 11);
  ck_assert_mem_eq(f.data, "hello world", 11);
  ck_assert_int_eq(f.nfds, 0);
  ck_assert_int_eq(gd_frame_reader_next(&r, &f), 0);
  gd_frame_reader_close(&r);
}
END_TEST

START_TEST(test_frame_zero_length_and_back_to_back_frames) {
  gd_frame_reader r;
  gd_frame_reader_init(&r, 1024);
  uint8_t buf[4 + 4 + 3];
  make_frame(buf, "", 0);
  make_frame(buf + 4, "abc", 3);
  uint8_t *p;
  size_t avail;
  ck_assert_int_eq(gd_frame_reader_space(&r, &p, &avail), 0);
  memcpy(p, buf, sizeof buf);
  ck_assert_int_eq(gd_frame_reader_commit(&r, sizeof buf, NULL, 0), 0);
  gd_frame f;
  ck_assert_int_eq(gd_frame_reader_next(&r, &f), 1);
  ck_assert_uint_eq(f.len, 0);
  ck_assert_int_eq(gd_frame_reader_next(&r, &f), 1);
  ck_assert_uint_eq(f.len, 3);
  ck_assert_mem_eq(f.data, "abc", 3);
  ck_assert_int_eq(gd_frame_reader_next(&r, &f), 0);
  gd_frame_reader_close(&r);
}
END_TEST

START_TEST(test_frame_oversize_is_refused_from_the_header_alone) {
  gd_frame_reader r;
  gd_frame_reader_init(&r, 1024);
  uint8_t hdr[4];
  gd_frame_put_header(hdr, 1025);
  uint8_t *p;
  size_t avail;
  ck_assert_int_eq(gd_frame_reader_space(&r, &p, &avail), 0);
  memcpy(p, hdr, 4);
  ck_assert_int_eq(gd_frame_reader_commit(&r, 4, NULL, 0), 0);
  gd_frame f;
  ck_assert_int_eq(gd_frame_reader_next(&r, &f), -GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_uint_eq(gd_frame_reader_pending_len(&r), 1025);
  /* A 4 GiB declaration must not make the reader allocate 4 GiB. */
  gd_frame_reader_close(&r);
  gd_frame_reader_init(&r, 1024);
  gd_frame_put_header(hdr, 0xffffffffu);
  ck_assert_int_eq(gd_frame_reader_space(&r, &p, &avail), 0);
  memcpy(p, hdr, 4);
  ck_assert_int_eq(gd_frame_reader_commit(&r, 4, NULL, 0), 0);
  ck_assert_int_eq(gd_frame_reader_space(&r, &p, &avail), 0);
  ck_assert_uint_le(r.cap, 1u << 20);
  ck_assert_int_eq(gd_frame_reader_next(&r, &f), -GRAPHD_RESOURCE_EXHAUSTED);
  gd_frame_reader_close(&r);
}
END_TEST

/* Sends a frame with one sendmsg and fds attached, as libgraphd does. */
static void send_frame(int sock, const char *payload, const int *fds, int nfds) {
  uint8_t buf[256];
  uint32_t len = (uint32_t)strlen(payload);
  make_frame(buf, payload, len);
  ck_assert_int_eq(gd_frame_sendmsg(sock, buf, 4 + len, fds, nfds, 0), (ssize_t)(4 + len));
}

static void read_all(gd_frame_reader *r, int sock) {
  for (;;) {
    ssize_t n = gd_frame_reader_recv(r, sock);
    if (n < 0 && errno == EAGAIN) return;
    ck_assert_int_gt(n, 0);
  }
}

START_TEST(test_frame_fds_go_to_the_frame_they_were_sent_with) {
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  int p1[2], p2[2];
  ck_assert_int_eq(pipe(p1), 0);
  ck_assert_int_eq(pipe(p2), 0);
  int two[2] = {p1[1], p2[1]};
  send_frame(sv[0], "first", NULL, 0);
  send_frame(sv[0], "second", two, 2);
  send_frame(sv[0], "third", &p1[1], 1);
  send_frame(sv[0], "fourth", NULL, 0);

  gd_frame_reader r;
  gd_frame_reader_init(&r, 1024);
  gd_frame f;
  const char *want[] = {"first", "second", "third", "fourth"};
  int want_fds[] = {0, 2, 1, 0};
  int got = 0;
  while (got < 4) {
    int k = gd_frame_reader_next(&r, &f);
    ck_assert_int_ge(k, 0);
    if (k == 0) {
      ck_assert_int_gt(gd_frame_reader_recv(&r, sv[1]), 0);
      continue;
    }
    ck_assert_uint_eq(f.len, strlen(want[got]));
    ck_assert_mem_eq(f.data, want[got], f.len);
    ck_assert_int_eq(f.nfds, want_fds[got]);
    if (got == 1) {
      /* The received fds really are the pipes' write ends, in order. */
      ck_assert_int_eq(write(f.fds[0], "A", 1), 1);
      ck_assert_int_eq(write(f.fds[1], "B", 1), 1);
      char c;
      ck_assert_int_eq(read(p1[0], &c, 1), 1);
      ck_assert_int_eq(c, 'A');
      ck_assert_int_eq(read(p2[0], &c, 1), 1);
      ck_assert_int_eq(c, 'B');
    }
    for (int i = 0; i < f.nfds; i++) close(f.fds[i]);
    got++;
  }
  gd_frame_reader_close(&r);
  close(sv[0]);
  close(sv[1]);
}
END_TEST

START_TEST(test_frame_too_many_fds_are_closed_not_leaked) {
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
  int base = open_fds();
  /* The kernel caps one SCM_RIGHTS at 253; send more than we accept. */
  int fds[GD_FRAME_MAX_FDS + 8];
  int n = GD_FRAME_MAX_FDS + 8;
  int null = open("/dev/null", O_RDONLY);
  for (int i = 0; i < n; i++) fds[i] = null;
  uint8_t buf[8];
  make_frame(buf, "x", 1);
  union {
    char b[CMSG_SPACE(sizeof(int) * (GD_FRAME_MAX_FDS + 8))];
    struct cmsghdr a;
  } ctl;
  struct iovec iov = {.iov_base = buf, .iov_len = 5};
  struct msghdr m = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
  memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n);
  ck_assert_int_eq(sendmsg(sv[0], &m, 0), 5);
  gd_frame_reader r;
  gd_frame_reader_init(&r, 1024);
  errno = 0;
  ck_assert_int_eq(gd_frame_reader_recv(&r, sv[1]), -1);
  ck_assert_int_eq(errno, EMSGSIZE);
  gd_frame_reader_close(&r);
  close(null);
  ck_assert_int_eq(open_fds(), base);
  close(sv[0]);
  close(sv[1]);
}
END_TEST

START_TEST(test_frame_reader_close_releases_pending_fds) {
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
  int base = open_fds();
  int null = open("/dev/null", O_RDONLY);
  /* A frame whose payload never completes: its fds stay pending. */
  uint8_t buf[8];
  gd_frame_put_header(buf, 100);
  memcpy(buf + 4, "abcd", 4);
  ck_assert_int_eq(gd_frame_sendmsg(sv[0], buf, 8, &null, 1, 0), 8);
  close(null);
  gd_frame_reader r;
  gd_frame_reader_init(&r, 1024);
  read_all(&r, sv[1]);
  gd_frame f;
  ck_assert_int_eq(gd_frame_reader_next(&r, &f), 0);
  ck_assert_int_eq(r.nfds, 1);
  ck_assert_int_eq(open_fds(), base + 1);
  gd_frame_reader_close(&r);
  ck_assert_int_eq(open_fds(), base);
  close(sv[0]);
  close(sv[1]);
}
END_TEST

START_TEST(test_frame_large_payload_across_many_reads) {
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  size_t len = 3u << 20;
  uint8_t *buf = malloc(len + 4);
  for (size_t i = 0; i < len; i++) buf[4 + i] = (uint8_t)(i * 31);
  gd_frame_put_header(buf, (uint32_t)len);
  pid_t pid = fork();
  if (pid == 0) {
    size_t off = 0;
    while (off < len + 4) {
      ssize_t k = write(sv[0], buf + off, len + 4 - off);
      if (k <= 0) _exit(1);
      off += (size_t)k;
    }
    _exit(0);
  }
  gd_frame_reader r;
  gd_frame_reader_init(&r, 4u << 20);
  gd_frame f;
  int reads = 0;
  while (gd_frame_reader_next(&r, &f) == 0) {
    ssize_t n = gd_frame_reader_recv(&r, sv[1]);
    if (n < 0 && errno == EAGAIN) {
      struct pollfd pf = {.fd = sv[1], .events = POLLIN};
      poll(&pf, 1, 1000);
      continue;
    }
    ck_assert_int_gt(n, 0);
    reads++;
  }
  ck_assert_int_gt(reads, 1);
  ck_assert_uint_eq(f.len, len);
  ck_assert_mem_eq(f.data, buf + 4, len);
  gd_frame_reader_close(&r);
  free(buf);
}
END_TEST

int main(void) {
  Suite *s = suite_create("frame");
  TCase *tc = tcase_create("frame");
  tcase_set_timeout(tc, 20);
  tcase_add_test(tc, test_frame_partial_reads_complete_only_at_the_end);
  tcase_add_test(tc, test_frame_zero_length_and_back_to_back_frames);
  tcase_add_test(tc, test_frame_oversize_is_refused_from_the_header_alone);
  tcase_add_test(tc, test_frame_fds_go_to_the_frame_they_were_sent_with);
  tcase_add_test(tc, test_frame_too_many_fds_are_closed_not_leaked);
  tcase_add_test(tc, test_frame_reader_close_releases_pending_fds);
  tcase_add_test(tc, test_frame_large_payload_across_many_reads);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
