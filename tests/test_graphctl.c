/* graphctl: exit codes, one-line errors, text and JSON status. */
#include <check.h>
#include <json-c/json.h>
#include <string.h>

#include "harness.h"

static int ctl(char *out, size_t n, const char *sock, const char *a, const char *b) {
  char *argv[8];
  int k = 0;
  argv[k++] = GRAPHCTL_BIN;
  if (sock) {
    argv[k++] = "--socket";
    argv[k++] = (char *)sock;
  }
  if (a) argv[k++] = (char *)a;
  if (b) argv[k++] = (char *)b;
  argv[k] = NULL;
  return td_run(argv, out, n, 10000);
}

START_TEST(test_graphctl_cannot_connect_exits_3_with_one_line) {
  char out[2048];
  ck_assert_int_eq(ctl(out, sizeof out, "/tmp/graphd-nobody-here.sock", "status", NULL), 3);
  ck_assert_msg(strstr(out, "graphctl: cannot connect to graphd at /tmp/graphd-nobody-here.sock"),
                "%s", out);
  ck_assert_msg(strstr(out, "is the daemon running?"), "%s", out);
  /* Exactly one line. */
  ck_assert_ptr_eq(strchr(out, '\n'), out + strlen(out) - 1);
}
END_TEST

START_TEST(test_graphctl_usage_errors_exit_2) {
  char out[2048];
  ck_assert_int_eq(ctl(out, sizeof out, NULL, NULL, NULL), 2);
  ck_assert_int_eq(ctl(out, sizeof out, NULL, "frobnicate", NULL), 2);
  ck_assert_msg(strstr(out, "unknown command 'frobnicate'"), "%s", out);
  ck_assert_int_eq(ctl(out, sizeof out, NULL, "--bogus", NULL), 2);
  char *argv[] = {GRAPHCTL_BIN, "--timeout", "0", "status", NULL};
  ck_assert_int_eq(td_run(argv, out, sizeof out, 5000), 2);
}
END_TEST

START_TEST(test_graphctl_status_text_json_and_ping) {
  gd_test_daemon d;
  td_start(&d, "--host-devices", "2", NULL);
  char out[16384];
  ck_assert_int_eq(ctl(out, sizeof out, d.socket, "status", NULL), 0);
  ck_assert_msg(strstr(out, "device 0: graphd host device 0 HOST-"), "%s", out);
  ck_assert_msg(strstr(out, "device 1: graphd host device 1 HOST-"), "%s", out);
  ck_assert_msg(strstr(out, "backend host, state ok"), "%s", out);
  ck_assert_msg(strstr(out, "memory 1.0 GiB total"), "%s", out);

  ck_assert_int_eq(ctl(out, sizeof out, d.socket, "status", "--json"), 0);
  json_object *o = json_tokener_parse(out);
  ck_assert_msg(o != NULL, "not JSON: %s", out);
  json_object *devs, *dev0, *v;
  ck_assert(json_object_object_get_ex(o, "devices", &devs));
  ck_assert_int_eq((int)json_object_array_length(devs), 2);
  dev0 = json_object_array_get_idx(devs, 0);
  ck_assert(json_object_object_get_ex(dev0, "total_memory", &v));
  ck_assert_uint_eq(json_object_get_uint64(v), 1ull << 30);
  ck_assert(json_object_object_get_ex(dev0, "backend", &v));
  ck_assert_str_eq(json_object_get_string(v), "host");
  ck_assert(json_object_object_get_ex(dev0, "counters", &v));
  ck_assert(json_object_object_get_ex(o, "pid", &v));
  ck_assert_int_eq(json_object_get_int(v), d.pid);
  json_object_put(o);

  ck_assert_int_eq(ctl(out, sizeof out, d.socket, "status", "--yaml"), 2);
  ck_assert_int_eq(ctl(out, sizeof out, d.socket, "ping", NULL), 0);
  ck_assert_msg(strstr(out, "pong"), "%s", out);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

START_TEST(test_graphctl_uses_graphd_socket_env) {
  gd_test_daemon d;
  td_start(&d, "--backend", "host", NULL);
  setenv("GRAPHD_SOCKET", d.socket, 1);
  char out[4096];
  ck_assert_int_eq(ctl(out, sizeof out, NULL, "ping", NULL), 0);
  unsetenv("GRAPHD_SOCKET");
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("graphctl");
  TCase *tc = tcase_create("graphctl");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_graphctl_cannot_connect_exits_3_with_one_line);
  tcase_add_test(tc, test_graphctl_usage_errors_exit_2);
  tcase_add_test(tc, test_graphctl_status_text_json_and_ping);
  tcase_add_test(tc, test_graphctl_uses_graphd_socket_env);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
