/* The status list: absl numbering, names and descriptions. */
#include <check.h>
#include <string.h>

#include "graphd/status.h"
#include "harness.h"

START_TEST(test_status_values_match_absl_and_xla) {
  /* XLA_FFI_Error_Code uses absl's numbering; the mapping is the identity. */
  ck_assert_int_eq(GRAPHD_OK, 0);
  ck_assert_int_eq(GRAPHD_INVALID_ARGUMENT, 3);
  ck_assert_int_eq(GRAPHD_DEADLINE_EXCEEDED, 4);
  ck_assert_int_eq(GRAPHD_NOT_FOUND, 5);
  ck_assert_int_eq(GRAPHD_ALREADY_EXISTS, 6);
  ck_assert_int_eq(GRAPHD_PERMISSION_DENIED, 7);
  ck_assert_int_eq(GRAPHD_RESOURCE_EXHAUSTED, 8);
  ck_assert_int_eq(GRAPHD_FAILED_PRECONDITION, 9);
  ck_assert_int_eq(GRAPHD_ABORTED, 10);
  ck_assert_int_eq(GRAPHD_OUT_OF_RANGE, 11);
  ck_assert_int_eq(GRAPHD_UNIMPLEMENTED, 12);
  ck_assert_int_eq(GRAPHD_INTERNAL, 13);
  ck_assert_int_eq(GRAPHD_UNAVAILABLE, 14);
  ck_assert_int_eq(GRAPHD_DATA_LOSS, 15);
}
END_TEST

START_TEST(test_status_every_code_has_a_name_and_text) {
#define CHECK_ONE(name, value, desc)                                                               \
  ck_assert_str_eq(graphd_status_name(value), #name);                                              \
  ck_assert_str_eq(graphd_status_name(-(value)), #name);                                           \
  ck_assert_str_eq(graphd_strerror(value), desc);                                                  \
  ck_assert_int_eq(graphd_status_valid(value), 1);
  GRAPHD_STATUS_LIST(CHECK_ONE)
#undef CHECK_ONE
}
END_TEST

START_TEST(test_status_codes_are_distinct) {
  int values[] = {
#define VAL(name, value, desc) value,
      GRAPHD_STATUS_LIST(VAL)
#undef VAL
  };
  size_t n = sizeof values / sizeof values[0];
  ck_assert_uint_eq(n, 14);
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++) ck_assert_int_ne(values[i], values[j]);
}
END_TEST

START_TEST(test_status_unknown_values_are_labelled) {
  ck_assert_str_eq(graphd_status_name(1), "UNKNOWN");
  ck_assert_str_eq(graphd_status_name(99), "UNKNOWN");
  ck_assert_str_eq(graphd_strerror(2), "unknown status");
  ck_assert_int_eq(graphd_status_valid(1), 0);
  ck_assert_int_eq(graphd_status_valid(-5), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("status");
  TCase *tc = tcase_create("status");
  tcase_add_test(tc, test_status_values_match_absl_and_xla);
  tcase_add_test(tc, test_status_every_code_has_a_name_and_text);
  tcase_add_test(tc, test_status_codes_are_distinct);
  tcase_add_test(tc, test_status_unknown_values_are_labelled);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
