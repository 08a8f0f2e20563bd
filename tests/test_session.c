/* Framing and codec errors against a live daemon: each gets a clear error
 * reply or a closed session, never a crash, and another session connected
 * at the same time keeps working throughout. */
#define _GNU_SOURCE
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "graphd/frame.h"
#include "graphd/graphd.h"
#include "harness.h"
#include "graphd/wire.h"

static gd_test_daemon d;
static graphd_client *bystander;
static int base_fds;

static void setup(void) {
  td_start(&d, "--backend", "host", "--max-frame", "64K", NULL);
  bystander = td_control(&d);
  ck_assert_int_eq(graphd_ping(bystander, "before", 6), GRAPHD_OK);
  /* The harness's readiness probe may still be open: wait it out. */
  for (int i = 0;; i++) {
    graphd_daemon_status *st;
    ck_assert_int_eq(graphd_get_status(bystander, &st), GRAPHD_OK);
    uint64_t n = st->sessions;
    graphd_daemon_status_free(st);
    if (n == 1) break;
    ck_assert_int_lt(i, 500);
    usleep(10000);
  }
  base_fds = td_count_fds(d.pid);
}

static void teardown(void) {
  /* The other session still works, and the daemon is alive and clean. */
  ck_assert_int_eq(graphd_ping(bystander, "after", 5), GRAPHD_OK);
  graphd_close(bystander);
  ck_assert_int_eq(kill(d.pid, 0), 0);
  int st = td_stop(&d);
  ck_assert_msg(st == 0, "graphd exit status %d", st);
  td_cleanup(&d);
}

static void expect_error(int fd, uint32_t code, const char *needle) {
  td_expect_reply(td_raw_recv(fd, 5000), code, needle);
}

static void ping_raw(int fd, uint64_t id) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Ping p = GRAPHD__WIRE__PING__INIT;
  req.request_id = id;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_PING;
  req.ping = &p;
  td_raw_send_request(fd, &req, NULL, 0);
  Graphd__Wire__Reply *r = td_raw_recv(fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->code, 0);
  ck_assert_uint_eq(r->request_id, id);
  ck_assert_int_eq(r->body_case, GRAPHD__WIRE__REPLY__BODY_PONG);
  graphd__wire__reply__free_unpacked(r, NULL);
}

/* The daemon's fd count settles back to what it was before the test. */
static void expect_fds_back(void) {
  for (int i = 0; i < 200; i++) {
    if (td_count_fds(d.pid) == base_fds) return;
    usleep(10000);
  }
  ck_abort_msg("daemon holds %d fds, %d before", td_count_fds(d.pid), base_fds);
}

START_TEST(test_session_partial_frames_are_reassembled) {
  int fd = td_raw_connect(&d);
  td_raw_hello(fd);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Ping p = GRAPHD__WIRE__PING__INIT;
  req.request_id = 7;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_PING;
  req.ping = &p;
  p.payload.data = (uint8_t *)"dribble";
  p.payload.len = 7;
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(gd_wire_pack_request(&req, 1 << 20, &buf, &len), 0);
  for (size_t i = 0; i < len; i++) {
    td_raw_send(fd, buf + i, 1, NULL, 0);
    usleep(2000);
  }
  free(buf);
  Graphd__Wire__Reply *r = td_raw_recv(fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->code, 0);
  ck_assert_uint_eq(r->request_id, 7);
  ck_assert_mem_eq(r->pong->payload.data, "dribble", 7);
  graphd__wire__reply__free_unpacked(r, NULL);
  close(fd);
}
END_TEST

START_TEST(test_session_zero_length_frame_gets_an_error_and_stays_open) {
  int fd = td_raw_connect(&d);
  td_raw_hello(fd);
  uint8_t hdr[4];
  gd_frame_put_header(hdr, 0);
  td_raw_send(fd, hdr, 4, NULL, 0);
  expect_error(fd, GRAPHD_INVALID_ARGUMENT, "empty request");
  ping_raw(fd, 9);
  close(fd);
}
END_TEST

START_TEST(test_session_rejects_oversize_frame) {
  int fd = td_raw_connect(&d);
  td_raw_hello(fd);
  uint8_t hdr[4];
  gd_frame_put_header(hdr, (64u << 10) + 1);
  td_raw_send(fd, hdr, 4, NULL, 0);
  expect_error(fd, GRAPHD_RESOURCE_EXHAUSTED, "65537 bytes is over the 65536-byte cap");
  ck_assert(td_raw_eof(fd, 5000));
  close(fd);
  expect_fds_back();
}
END_TEST

/* libgraphd learns the cap from HelloReply: a program encoding too large
 * for a frame goes as a sealed memfd (the daemon decodes it: here it finds
 * the module missing), and a request it cannot shrink is refused locally, so
 * the session is not closed under the caller. */
START_TEST(test_session_client_keeps_requests_under_the_cap_and_stays_open) {
  graphd_client *c = td_data(&d, 0);
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, 256, 1);
  uint8_t mod[32] = {7}, blob[4000] = {0};
  uint32_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  for (int i = 0; i < 20; i++) { /* about 80 KB of parameters */
    int s = graphd_program_add_launch(p, mod, "k", grid, block, 0);
    graphd_program_param(p, (uint32_t)s, 0, blob, sizeof blob);
  }
  uint8_t id[32];
  ck_assert_int_eq(graphd_program_finish(p, id), GRAPHD_OK);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_NOT_FOUND);
  ck_assert_msg(strstr(graphd_last_error(c), "is not registered"), "%s", graphd_last_error(c));
  graphd_program_free(p);
  static char big[100000];
  ck_assert_int_eq(graphd_ping(c, big, sizeof big), GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(graphd_last_error(c), "65536-byte frame cap") &&
                    strstr(graphd_last_error(c), "--max-frame"),
                "%s", graphd_last_error(c));
  ck_assert_int_eq(graphd_ping(c, "still", 5), GRAPHD_OK);
  graphd_close(c);
}
END_TEST

START_TEST(test_session_garbage_bytes_get_an_error_and_stay_open) {
  int fd = td_raw_connect(&d);
  td_raw_hello(fd);
  uint8_t buf[4 + 16];
  gd_frame_put_header(buf, 16);
  memset(buf + 4, 0xff, 16);
  td_raw_send(fd, buf, sizeof buf, NULL, 0);
  expect_error(fd, GRAPHD_INVALID_ARGUMENT, "malformed request");
  ping_raw(fd, 11);
  close(fd);
}
END_TEST

START_TEST(test_session_truncated_protobuf_gets_an_error) {
  int fd = td_raw_connect(&d);
  td_raw_hello(fd);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Ping p = GRAPHD__WIRE__PING__INIT;
  req.request_id = 5;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_PING;
  req.ping = &p;
  p.payload.data = (uint8_t *)"0123456789abcdef";
  p.payload.len = 16;
  size_t n = graphd__wire__request__get_packed_size(&req);
  uint8_t *pb = malloc(n);
  graphd__wire__request__pack(&req, pb);
  /* Frame only the first n - 5 bytes: the ping payload is cut short. */
  uint8_t *buf = malloc(4 + n);
  gd_frame_put_header(buf, (uint32_t)(n - 5));
  memcpy(buf + 4, pb, n - 5);
  td_raw_send(fd, buf, 4 + n - 5, NULL, 0);
  expect_error(fd, GRAPHD_INVALID_ARGUMENT, "malformed request");
  ping_raw(fd, 12);
  free(pb);
  free(buf);
  close(fd);
}
END_TEST

START_TEST(test_session_unknown_oneof_is_unimplemented) {
  int fd = td_raw_connect(&d);
  td_raw_hello(fd);
  /* request_id = 3 (field 1), then field 99 as a length-delimited body. */
  uint8_t pb[] = {0x08, 0x03, 0x9a, 0x06, 0x02, 0x08, 0x01};
  uint8_t buf[4 + sizeof pb];
  gd_frame_put_header(buf, sizeof pb);
  memcpy(buf + 4, pb, sizeof pb);
  td_raw_send(fd, buf, sizeof buf, NULL, 0);
  Graphd__Wire__Reply *r = td_raw_recv(fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->code, GRAPHD_UNIMPLEMENTED);
  ck_assert_uint_eq(r->request_id, 3);
  ck_assert_msg(strstr(r->message, "field 99"), "%s", r->message);
  graphd__wire__reply__free_unpacked(r, NULL);
  ping_raw(fd, 13);
  close(fd);
}
END_TEST

static void send_ping_with_fds(int fd, uint32_t declared, int nfds) {
  int fds[8];
  for (int i = 0; i < nfds; i++) fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Ping p = GRAPHD__WIRE__PING__INIT;
  req.request_id = 21;
  req.nfds = declared;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_PING;
  req.ping = &p;
  td_raw_send_request(fd, &req, fds, nfds);
  for (int i = 0; i < nfds; i++) close(fds[i]);
}

START_TEST(test_session_fd_count_mismatch_closes_the_session) {
  int fd = td_raw_connect(&d);
  td_raw_hello(fd);
  send_ping_with_fds(fd, 0, 2);
  expect_error(fd, GRAPHD_INVALID_ARGUMENT, "declares 0 file descriptors but 2 arrived");
  ck_assert(td_raw_eof(fd, 5000));
  close(fd);
  expect_fds_back();

  fd = td_raw_connect(&d);
  td_raw_hello(fd);
  send_ping_with_fds(fd, 3, 1);
  expect_error(fd, GRAPHD_INVALID_ARGUMENT, "declares 3 file descriptors but 1 arrived");
  ck_assert(td_raw_eof(fd, 5000));
  close(fd);
  expect_fds_back();
}
END_TEST

START_TEST(test_session_fds_on_a_request_without_fds_are_closed) {
  int fd = td_raw_connect(&d);
  td_raw_hello(fd);
  send_ping_with_fds(fd, 2, 2);
  expect_error(fd, GRAPHD_INVALID_ARGUMENT, "Ping takes no file descriptors");
  ping_raw(fd, 22);
  close(fd);
  expect_fds_back();
}
END_TEST

START_TEST(test_session_too_many_fds_close_the_session_without_leaks) {
  int fd = td_raw_connect(&d);
  td_raw_hello(fd);
  send_ping_with_fds(fd, 8, 8);
  expect_error(fd, GRAPHD_INVALID_ARGUMENT, "takes no file descriptors");
  /* Now more than one frame may carry: 40 in one message. */
  int null = open("/dev/null", O_RDONLY);
  int many[40];
  for (int i = 0; i < 40; i++) many[i] = null;
  uint8_t buf[8];
  gd_frame_put_header(buf, 0);
  union {
    char b[CMSG_SPACE(sizeof many)];
    struct cmsghdr a;
  } ctl;
  struct iovec iov = {.iov_base = buf, .iov_len = 4};
  struct msghdr m = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof many);
  memcpy(CMSG_DATA(c), many, sizeof many);
  ck_assert_int_eq(sendmsg(fd, &m, 0), 4);
  close(null);
  expect_error(fd, GRAPHD_RESOURCE_EXHAUSTED, "file descriptors sent at once");
  ck_assert(td_raw_eof(fd, 5000));
  close(fd);
  expect_fds_back();
}
END_TEST

START_TEST(test_session_requires_hello_first) {
  int fd = td_raw_connect(&d);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__StatusRequest sr = GRAPHD__WIRE__STATUS_REQUEST__INIT;
  req.request_id = 1;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_STATUS;
  req.status = &sr;
  td_raw_send_request(fd, &req, NULL, 0);
  expect_error(fd, GRAPHD_FAILED_PRECONDITION, "must be Hello");
  ck_assert(td_raw_eof(fd, 5000));
  close(fd);
}
END_TEST

START_TEST(test_session_refuses_other_protocol_versions_and_second_hello) {
  int fd = td_raw_connect(&d);
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Hello h = GRAPHD__WIRE__HELLO__INIT;
  req.request_id = 1;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_HELLO;
  req.hello = &h;
  h.protocol_version = 2;
  h.kind = GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_CONTROL;
  td_raw_send_request(fd, &req, NULL, 0);
  expect_error(fd, GRAPHD_FAILED_PRECONDITION, "protocol version 2 is not supported");
  ck_assert(td_raw_eof(fd, 5000));
  close(fd);

  fd = td_raw_connect(&d);
  td_raw_hello(fd);
  h.protocol_version = GRAPHD_PROTOCOL_VERSION;
  td_raw_send_request(fd, &req, NULL, 0);
  expect_error(fd, GRAPHD_FAILED_PRECONDITION, "already sent");
  ping_raw(fd, 2);
  close(fd);

  fd = td_raw_connect(&d);
  h.kind = GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_DATA;
  h.device_uuid.data = (uint8_t *)"short";
  h.device_uuid.len = 5;
  td_raw_send_request(fd, &req, NULL, 0);
  expect_error(fd, GRAPHD_INVALID_ARGUMENT, "device_uuid must be 16 bytes");
  ck_assert(td_raw_eof(fd, 5000));
  close(fd);
}
END_TEST

/* A client's name reaches logs, JSON and terminals: only UTF-8 without
 * control characters is taken, and a refused Hello names the byte. */
START_TEST(test_session_refuses_client_names_with_control_characters_or_bad_utf8) {
  static const struct {
    const char *name, *why;
  } bad[] = {
      {"job\n2026-12-03 graphd: forged line", "has a control character (byte 3, 0x0a)"},
      {"evil\x1b[2J", "has a control character (byte 4, 0x1b)"},
      {"bad\xff", "is not valid UTF-8 (byte 3, 0xff)"},
      {"half\xc3", "is not valid UTF-8 (byte 4, 0xc3)"},
      {"c1\xc2\x85", "has a control character (byte 2, 0xc2)"},
      {"overlong\xe0\x80\xaf", "is not valid UTF-8 (byte 8, 0xe0)"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    int fd = td_raw_connect(&d);
    Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
    Graphd__Wire__Hello h = GRAPHD__WIRE__HELLO__INIT;
    req.request_id = 1;
    req.body_case = GRAPHD__WIRE__REQUEST__BODY_HELLO;
    req.hello = &h;
    h.protocol_version = GRAPHD_PROTOCOL_VERSION;
    h.kind = GRAPHD__WIRE__SESSION_KIND__SESSION_KIND_CONTROL;
    h.client_name = (char *)bad[k].name;
    td_raw_send_request(fd, &req, NULL, 0);
    expect_error(fd, GRAPHD_INVALID_ARGUMENT, bad[k].why);
    ck_assert(td_raw_eof(fd, 5000));
    close(fd);
  }
  ck_assert(!td_log_contains(&d, "forged line"));
  /* UTF-8 names are fine. */
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = d.socket;
  o.client_name = "Gr\xc3\xbc\xc3\x9f\x65 \xe6\x97\xa5\xe6\x9c\xac";
  graphd_client *c = NULL;
  char err[GRAPHD_ERRMAX];
  ck_assert_msg(graphd_connect(&o, &c, err, sizeof err) == GRAPHD_OK, "%s", err);
  graphd_close(c);
}
END_TEST

START_TEST(test_session_abrupt_disconnects_leave_nothing_behind) {
  for (int i = 0; i < 50; i++) {
    int fd = td_raw_connect(&d);
    if (i % 2) td_raw_hello(fd);
    /* Half a frame, then gone. */
    uint8_t hdr[6];
    gd_frame_put_header(hdr, 100);
    td_raw_send(fd, hdr, 6, NULL, 0);
    close(fd);
  }
  expect_fds_back();
  graphd_daemon_status *st;
  for (int i = 0; i < 100; i++) {
    ck_assert_int_eq(graphd_get_status(bystander, &st), GRAPHD_OK);
    uint64_t n = st->sessions;
    graphd_daemon_status_free(st);
    if (n == 1) return;
    usleep(10000);
  }
  ck_abort_msg("sessions did not return to 1");
}
END_TEST

int main(void) {
  Suite *s = suite_create("session");
  TCase *tc = tcase_create("session");
  tcase_set_timeout(tc, 30);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_session_partial_frames_are_reassembled);
  tcase_add_test(tc, test_session_zero_length_frame_gets_an_error_and_stays_open);
  tcase_add_test(tc, test_session_rejects_oversize_frame);
  tcase_add_test(tc, test_session_client_keeps_requests_under_the_cap_and_stays_open);
  tcase_add_test(tc, test_session_garbage_bytes_get_an_error_and_stay_open);
  tcase_add_test(tc, test_session_truncated_protobuf_gets_an_error);
  tcase_add_test(tc, test_session_unknown_oneof_is_unimplemented);
  tcase_add_test(tc, test_session_fd_count_mismatch_closes_the_session);
  tcase_add_test(tc, test_session_fds_on_a_request_without_fds_are_closed);
  tcase_add_test(tc, test_session_too_many_fds_close_the_session_without_leaks);
  tcase_add_test(tc, test_session_requires_hello_first);
  tcase_add_test(tc, test_session_refuses_other_protocol_versions_and_second_hello);
  tcase_add_test(tc, test_session_refuses_client_names_with_control_characters_or_bad_utf8);
  tcase_add_test(tc, test_session_abrupt_disconnects_leave_nothing_behind);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
