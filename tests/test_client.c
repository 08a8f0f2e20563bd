/* libgraphd: thread safety of one handle, timeouts, and connect errors. */
#define _GNU_SOURCE
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

typedef struct ping_arg {
  graphd_client *c;
  int id;
  int failures;
} ping_arg;

static void *pinger(void *p) {
  ping_arg *a = p;
  for (int i = 0; i < 300; i++) {
    char payload[32];
    int n = snprintf(payload, sizeof payload, "thread %d ping %d", a->id, i);
    /* graphd_ping checks that the pong echoes exactly this payload, so a
     * reply crossing over to another thread would fail here. */
    if (graphd_ping(a->c, payload, (size_t)n) != GRAPHD_OK) a->failures++;
  }
  return NULL;
}

START_TEST(test_client_one_handle_is_safe_from_many_threads) {
  gd_test_daemon d;
  td_start(&d, "--backend", "host", NULL);
  graphd_client *c = td_control(&d);
  enum { T = 8 };
  pthread_t th[T];
  ping_arg args[T];
  for (int i = 0; i < T; i++) {
    args[i] = (ping_arg){.c = c, .id = i};
    ck_assert_int_eq(pthread_create(&th[i], NULL, pinger, &args[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    ck_assert_int_eq(args[i].failures, 0);
  }
  graphd_close(c);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

/* A listener that accepts and never answers. */
static void *mute_server(void *p) {
  int ls = *(int *)p;
  int c = accept(ls, NULL, NULL);
  sleep(1);
  if (c >= 0) close(c);
  return NULL;
}

START_TEST(test_client_times_out_when_the_daemon_does_not_answer) {
  char path[] = "/tmp/graphd-mute-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(path));
  char sock[128];
  snprintf(sock, sizeof sock, "%s/s", path);
  int ls = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path, sock, strlen(sock) + 1);
  ck_assert_int_eq(bind(ls, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(listen(ls, 4), 0);
  pthread_t th;
  pthread_create(&th, NULL, mute_server, &ls);
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = sock;
  o.timeout_ms = 300;
  graphd_client *c = NULL;
  char err[GRAPHD_ERRMAX];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ck_assert_int_eq(graphd_connect(&o, &c, err, sizeof err), GRAPHD_DEADLINE_EXCEEDED);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  ck_assert_double_ge(ms, 250);
  ck_assert_double_lt(ms, 2000);
  ck_assert_msg(strstr(err, "did not answer within 300 ms"), "%s", err);
  ck_assert_ptr_null(c);
  pthread_join(th, NULL);
  close(ls);
  unlink(sock);
  rmdir(path);
}
END_TEST

START_TEST(test_client_connect_errors_are_clear) {
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = "/tmp/graphd-definitely-not-here.sock";
  graphd_client *c = NULL;
  char err[GRAPHD_ERRMAX];
  ck_assert_int_eq(graphd_connect(&o, &c, err, sizeof err), GRAPHD_UNAVAILABLE);
  ck_assert_msg(strstr(err, "is the daemon running?"), "%s", err);
  char longpath[200];
  memset(longpath, 'a', sizeof longpath - 1);
  longpath[sizeof longpath - 1] = 0;
  o.socket_path = longpath;
  ck_assert_int_eq(graphd_connect(&o, &c, err, sizeof err), GRAPHD_INVALID_ARGUMENT);
  o.socket_path = "/tmp/x.sock";
  o.kind = (graphd_session_kind)7;
  ck_assert_int_eq(graphd_connect(&o, &c, err, sizeof err), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err, "unknown session kind 7"), "%s", err);
  /* errbuf may be NULL. */
  o.kind = GRAPHD_SESSION_CONTROL;
  o.socket_path = "/tmp/graphd-definitely-not-here.sock";
  ck_assert_int_eq(graphd_connect(&o, &c, NULL, 0), GRAPHD_UNAVAILABLE);
  graphd_close(NULL);
}
END_TEST

START_TEST(test_client_uuid_helpers_round_trip) {
  uint8_t u[16], v[16];
  for (int i = 0; i < 16; i++) u[i] = (uint8_t)(255 - i);
  char s[48];
  graphd_uuid_format(u, "GPU-", s);
  ck_assert_int_eq(graphd_uuid_parse(s, v), GRAPHD_OK);
  ck_assert_mem_eq(u, v, 16);
  ck_assert_int_eq(graphd_uuid_parse("GPU-nothex", v), GRAPHD_INVALID_ARGUMENT);
}
END_TEST

int main(void) {
  Suite *s = suite_create("client");
  TCase *tc = tcase_create("client");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_client_one_handle_is_safe_from_many_threads);
  tcase_add_test(tc, test_client_times_out_when_the_daemon_does_not_answer);
  tcase_add_test(tc, test_client_connect_errors_are_clear);
  tcase_add_test(tc, test_client_uuid_helpers_round_trip);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
