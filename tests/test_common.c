/* common/: hex text, UUID text forms and the default socket path. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graphd/hex.h"
#include "common/paths.h"
#include "common/uuid.h"
#include "harness.h"

START_TEST(test_hex_encodes_lower_case_and_decodes_either_case) {
  const uint8_t b[5] = {0x00, 0x9f, 0xa0, 0xff, 0x3c};
  char s[11];
  gd_hex_encode(b, sizeof b, s);
  ck_assert_str_eq(s, "009fa0ff3c");
  uint8_t v[5];
  ck_assert_int_eq(gd_hex_decode(s, 10, v, 5, NULL, 0), 0);
  ck_assert_mem_eq(v, b, 5);
  memset(v, 0, sizeof v);
  ck_assert_int_eq(gd_hex_decode("009FA0fF3C", 10, v, 5, NULL, 0), 0);
  ck_assert_mem_eq(v, b, 5);
  gd_hex_encode(b, 0, s);
  ck_assert_str_eq(s, "");
  /* The length is the caller's: no NUL needed, nothing read past it. */
  ck_assert_int_eq(gd_hex_decode("9fzz", 2, v, 1, NULL, 0), 0);
  ck_assert_uint_eq(v[0], 0x9f);
}
END_TEST

START_TEST(test_hex_decode_says_what_is_wrong_and_leaves_out_alone) {
  uint8_t v[4] = {1, 2, 3, 4};
  const uint8_t orig[4] = {1, 2, 3, 4};
  char err[128];
  ck_assert_int_eq(gd_hex_decode("abc", 3, v, 2, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "odd number of hex digits (3)"), "%s", err);
  ck_assert_int_eq(gd_hex_decode("abcd", 4, v, 4, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "4 hex digits where 8 were expected"), "%s", err);
  ck_assert_int_eq(gd_hex_decode("ab1g", 4, v, 2, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "'g' (char 4) is not a hex digit"), "%s", err);
  ck_assert_int_eq(gd_hex_decode("ab\n1", 4, v, 2, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "byte 0x0a (char 3) is not a hex digit"), "%s", err);
  /* What sscanf("%2x") would take. */
  static const char *const bad[] = {" f", "-1", "+1", "0x", "1 "};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
    ck_assert_msg(gd_hex_decode(bad[k], 2, v, 1, NULL, 0) == -1, "\"%s\" accepted", bad[k]);
  ck_assert_mem_eq(v, orig, 4);
}
END_TEST

START_TEST(test_hex_prefix_takes_up_to_n_nibbles) {
  uint8_t v[4] = {0};
  char err[128];
  ck_assert_int_eq(gd_hex_decode_prefix("abc", 3, v, 8, err, sizeof err), 3);
  ck_assert_uint_eq(v[0], 0xab);
  ck_assert_uint_eq(v[1], 0xc0);
  ck_assert_int_eq(gd_hex_decode_prefix("0123ABcd", 8, v, 8, NULL, 0), 8);
  const uint8_t all[4] = {0x01, 0x23, 0xab, 0xcd};
  ck_assert_mem_eq(v, all, 4);
  ck_assert_int_eq(gd_hex_decode_prefix("", 0, v, 8, NULL, 0), 0);
  ck_assert_mem_eq(v, all, 4);
  ck_assert_int_eq(gd_hex_decode_prefix("0123abcd0", 9, v, 8, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "9 hex digits, more than 8"), "%s", err);
  ck_assert_int_eq(gd_hex_decode_prefix("12x", 3, v, 8, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "'x' (char 3) is not a hex digit"), "%s", err);
  ck_assert_mem_eq(v, all, 4);
}
END_TEST

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
  tcase_add_test(tc, test_hex_encodes_lower_case_and_decodes_either_case);
  tcase_add_test(tc, test_hex_decode_says_what_is_wrong_and_leaves_out_alone);
  tcase_add_test(tc, test_hex_prefix_takes_up_to_n_nibbles);
  tcase_add_test(tc, test_uuid_formats_like_nvidia_smi_and_parses_back);
  tcase_add_test(tc, test_uuid_rejects_short_long_and_non_hex);
  tcase_add_test(tc, test_default_socket_prefers_env_then_xdg);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
