/* common/: UUID text forms and the default socket path. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/paths.h"
#include "../common/uuid.h"
#include "harness.h"

START_TEST(test_uuid_formats_like_nvidia_smi_and_parses_back) {
  uint8_t u[16], v[16];
  for (int i = 0; i < 16; i++) u[i] = (uint8_t)(i * 17 + 3);
  char s[GD_UUID_STR_MAX];
  gd_uuid_format(u, "GPU-", s);
  ck_assert_str_eq(s, "GPU-03142536-4758-697a-8b9c-adbecfe0f102");
  ck_assert_int_eq(gd_uuid_parse(s, v), 0);
  ck_assert_mem_eq(u, v, 16);
  ck_assert_int_eq(gd_uuid_parse("HOST-03142536-4758-697a-8b9c-adbecfe0f102", v), 0);
  ck_assert_mem_eq(u, v, 16);
  ck_assert_int_eq(gd_uuid_parse("03142536475869 7a8b9cadbecfe0f102", v), -1);
  ck_assert_int_eq(gd_uuid_parse("031425364758697A8B9CADBECFE0F102", v), 0);
  ck_assert_mem_eq(u, v, 16);
}
END_TEST

START_TEST(test_uuid_rejects_short_long_and_non_hex) {
  uint8_t v[16];
  ck_assert_int_eq(gd_uuid_parse("GPU-0314", v), -1);
  ck_assert_int_eq(gd_uuid_parse("GPU-03142536-4758-697a-8b9c-adbecfe0f10200", v), -1);
  ck_assert_int_eq(gd_uuid_parse("GPU-03142536-4758-697a-8b9c-adbecfe0f1zz", v), -1);
  ck_assert_int_eq(gd_uuid_parse("", v), -1);
}
END_TEST

START_TEST(test_default_socket_prefers_env_then_xdg) {
  char buf[108];
  setenv("GRAPHD_SOCKET", "/tmp/x/graphd.sock", 1);
  ck_assert_int_eq(gd_default_socket_path(buf, sizeof buf), 0);
  ck_assert_str_eq(buf, "/tmp/x/graphd.sock");
  unsetenv("GRAPHD_SOCKET");
  ck_assert_int_eq(gd_default_socket_path(buf, sizeof buf), 0);
  if (geteuid() == 0) {
    ck_assert_str_eq(buf, GD_SYSTEM_SOCKET);
  } else {
    setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
    ck_assert_int_eq(gd_default_socket_path(buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "/run/user/1234/graphd.sock");
  }
  char tiny[8];
  setenv("GRAPHD_SOCKET", "/a/long/path/graphd.sock", 1);
  ck_assert_int_eq(gd_default_socket_path(tiny, sizeof tiny), -1);
}
END_TEST

int main(void) {
  Suite *s = suite_create("common");
  TCase *tc = tcase_create("common");
  tcase_add_test(tc, test_uuid_formats_like_nvidia_smi_and_parses_back);
  tcase_add_test(tc, test_uuid_rejects_short_long_and_non_hex);
  tcase_add_test(tc, test_default_socket_prefers_env_then_xdg);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
