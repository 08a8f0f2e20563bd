/* Settings: one setter for flags and the config file, with clear errors. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graphd/status.h"
#include "harness.h"
#include "daemon/base/options.h"

static const char *write_tmp(const char *text) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/graphd-conf-XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  return path;
}

START_TEST(test_options_sizes_accept_binary_suffixes) {
  uint64_t v;
  ck_assert_int_eq(options_parse_size("123", &v), 0);
  ck_assert_uint_eq(v, 123);
  ck_assert_int_eq(options_parse_size("64K", &v), 0);
  ck_assert_uint_eq(v, 65536);
  ck_assert_int_eq(options_parse_size("4M", &v), 0);
  ck_assert_uint_eq(v, 4u << 20);
  ck_assert_int_eq(options_parse_size("2GiB", &v), 0);
  ck_assert_uint_eq(v, 2ull << 30);
  ck_assert_int_eq(options_parse_size("-1", &v), -1);
  ck_assert_int_eq(options_parse_size("4X", &v), -1);
  ck_assert_int_eq(options_parse_size("", &v), -1);
  ck_assert_int_eq(options_parse_size("99999999999999999999T", &v), -1);
}
END_TEST

START_TEST(test_options_set_rejects_bad_values_with_the_setting_named) {
  gd_options o;
  char err[256];
  options_defaults(&o);
  ck_assert_uint_eq(o.socket_mode, 0660);
  ck_assert_uint_eq(o.max_frame, 4u << 20);
  ck_assert_int_eq(options_set(&o, "max-frame", "12", err, sizeof err), -GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err, "max-frame"));
  ck_assert_int_eq(options_set(&o, "backend", "opencl", err, sizeof err), -GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err, "auto, cuda, host"));
  ck_assert_int_eq(options_set(&o, "socket-mode", "rw", err, sizeof err), -GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(options_set(&o, "host-devices", "0", err, sizeof err), -GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(options_set(&o, "ready-timeout", "-3", err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(options_set(&o, "no-such-thing", "1", err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err, "no-such-thing"));
  ck_assert_int_eq(options_set(&o, "socket-mode", "0600", err, sizeof err), 0);
  ck_assert_uint_eq(o.socket_mode, 0600);
  ck_assert_int_eq(options_set(&o, "host-memory", "512M", err, sizeof err), 0);
  ck_assert_uint_eq(o.host_memory, 512u << 20);
  ck_assert_uint_eq(o.device_budget, 0); /* no limit by default */
  ck_assert_int_eq(options_set(&o, "device-budget", "2G", err, sizeof err), 0);
  ck_assert_uint_eq(o.device_budget, 2ull << 30);
  ck_assert_int_eq(options_set(&o, "device-budget", "lots", err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err, "device-budget"));
}
END_TEST

/* The count and size limits: their defaults, which of them 0 turns off,
 * and their ranges. */
START_TEST(test_options_limits_take_their_ranges) {
  gd_options o;
  char err[256];
  options_defaults(&o);
  ck_assert_uint_eq(o.max_programs_per_uid, 8192);
  ck_assert_uint_eq(o.max_module_bytes_per_uid, 2ull << 30);
  ck_assert_uint_eq(o.max_regions_per_session, 4096);
  ck_assert_uint_eq(o.max_inflight_replays, 1024);
  ck_assert_int_eq(options_set(&o, "max-programs-per-uid", "0", err, sizeof err), 0);
  ck_assert_uint_eq(o.max_programs_per_uid, 0);
  ck_assert_int_eq(options_set(&o, "max-programs", "0", err, sizeof err), -GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err, "max-programs: '0' is not a number from 1 to 65536"));
  ck_assert_int_eq(options_set(&o, "max-programs", "65537", err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(options_set(&o, "max-module-bytes", "512K", err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(options_set(&o, "max-module-bytes", "16G", err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(options_set(&o, "max-module-bytes-per-uid", "1G", err, sizeof err), 0);
  ck_assert_uint_eq(o.max_module_bytes_per_uid, 1ull << 30);
  ck_assert_int_eq(options_set(&o, "max-region-bytes-per-session", "3M", err, sizeof err), 0);
  ck_assert_uint_eq(o.max_region_bytes_per_session, 3u << 20);
  ck_assert_int_eq(options_set(&o, "max-inflight-replays", "0", err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(options_set(&o, "max-regions-per-uid", "x", err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err, "(0 = no limit)"));
  ck_assert_uint_eq(o.gpu_time_sample, 16);
  ck_assert_int_eq(options_set(&o, "gpu-time-sample", "1", err, sizeof err), 0);
  ck_assert_uint_eq(o.gpu_time_sample, 1);
  ck_assert_int_eq(options_set(&o, "gpu-time-sample", "-1", err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err, "(1 = every replay, 0 = none)"));
  ck_assert_uint_eq(o.ready_hold_rings, 2);
  ck_assert_int_eq(options_set(&o, "ready-hold-rings", "0", err, sizeof err), 0);
  ck_assert_uint_eq(o.ready_hold_rings, 0);
  ck_assert_int_eq(options_set(&o, "ready-hold-rings", "70000", err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err, "from 0 to 65536 (0 = even a ring alone on its device)"));
  ck_assert_uint_eq(o.ready_hold_rings, 0);
  ck_assert_uint_eq(o.ready_hold_max_us, 10);
  ck_assert_int_eq(options_set(&o, "ready-hold-max-us", "0", err, sizeof err), 0);
  ck_assert_uint_eq(o.ready_hold_max_us, 0);
  ck_assert_int_eq(options_set(&o, "ready-hold-max-us", "250", err, sizeof err), 0);
  ck_assert_uint_eq(o.ready_hold_max_us, 250);
  ck_assert_int_eq(options_set(&o, "ready-hold-max-us", "1000001", err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err, "from 0 to 1000000 (0 = hold no replay)"));
  ck_assert_uint_eq(o.ready_hold_max_us, 250);
  ck_assert_int_eq(o.fair_shares, 1);
  ck_assert_int_eq(options_set(&o, "fair-shares", "no", err, sizeof err), 0);
  ck_assert_int_eq(o.fair_shares, 0);
  ck_assert_int_eq(options_set(&o, "fair-shares", "maybe", err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err, "fair-shares: 'maybe' is not yes or no"));
  ck_assert_int_eq(options_set(&o, "fair-shares", "yes", err, sizeof err), 0);
  ck_assert_int_eq(o.fair_shares, 1);
}
END_TEST

START_TEST(test_options_config_file_is_read_in_its_section) {
  gd_options o;
  char err[256];
  options_defaults(&o);
  const char *p = write_tmp(
      "# comment\n[graphd]\nsocket = /tmp/conf.sock\nmax-frame = 1M\n"
      "host-devices = 3\nlog-level = debug\n");
  ck_assert_int_eq(options_load_file(&o, p, err, sizeof err), 0);
  ck_assert_str_eq(o.socket_path, "/tmp/conf.sock");
  ck_assert_uint_eq(o.max_frame, 1u << 20);
  ck_assert_int_eq(o.host_devices, 3);
  unlink(p);
}
END_TEST

START_TEST(test_options_config_errors_name_file_and_line) {
  gd_options o;
  char err[256];
  options_defaults(&o);
  const char *p = write_tmp("[graphd]\nsocket = /tmp/a.sock\nmax-frame = lots\n");
  ck_assert_int_eq(options_load_file(&o, p, err, sizeof err), -GRAPHD_INVALID_ARGUMENT);
  char want[96];
  snprintf(want, sizeof want, "%s:3: max-frame", p);
  ck_assert_msg(strstr(err, want), "err was: %s", err);
  unlink(p);
  p = write_tmp("[other]\nsocket = /tmp/a.sock\n");
  ck_assert_int_eq(options_load_file(&o, p, err, sizeof err), -GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err, "unknown section [other]"));
  unlink(p);
  ck_assert_int_eq(options_load_file(&o, "/nonexistent/graphd.conf", err, sizeof err),
                   -GRAPHD_NOT_FOUND);
}
END_TEST

int main(void) {
  Suite *s = suite_create("options");
  TCase *tc = tcase_create("options");
  tcase_add_test(tc, test_options_sizes_accept_binary_suffixes);
  tcase_add_test(tc, test_options_set_rejects_bad_values_with_the_setting_named);
  tcase_add_test(tc, test_options_limits_take_their_ranges);
  tcase_add_test(tc, test_options_config_file_is_read_in_its_section);
  tcase_add_test(tc, test_options_config_errors_name_file_and_line);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
