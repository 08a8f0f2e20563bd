/* The latency histogram behind the replay percentiles in Status and
 * graphctl stats: exact small values, quantiles within one bucket (12.5%),
 * never above the largest value seen; and the exact counts at the fixed
 * bounds of the Prometheus histogram. */
#include <check.h>
#include <string.h>

#include "daemon/base/hist.h"
#include "harness.h"

static gd_hist h;

static void reset(void) { memset(&h, 0, sizeof h); }

START_TEST(test_empty_is_zero) {
  reset();
  ck_assert_uint_eq(gd_hist_quantile(&h, 0.5), 0);
  ck_assert_uint_eq(gd_hist_quantile(&h, 0.99), 0);
}
END_TEST

START_TEST(test_small_values_are_exact) {
  reset();
  for (uint64_t v = 0; v < 8; v++) gd_hist_add(&h, v);
  ck_assert_uint_eq(h.count, 8);
  ck_assert_uint_eq(gd_hist_quantile(&h, 0.125), 0);
  ck_assert_uint_eq(gd_hist_quantile(&h, 0.5), 3);
  ck_assert_uint_eq(gd_hist_quantile(&h, 1.0), 7);
}
END_TEST

/* For a uniform 1..n, quantile q is q*n, reported within [q*n, q*n*1.125]. */
static void check_uniform(uint64_t scale) {
  reset();
  const uint64_t n = 10000;
  for (uint64_t v = 1; v <= n; v++) gd_hist_add(&h, v * scale);
  const double qs[] = {0.5, 0.9, 0.99};
  for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
    double want = qs[i] * (double)(n * scale);
    double got = (double)gd_hist_quantile(&h, qs[i]);
    ck_assert_msg(got >= want && got <= want * 1.125 + 1, "q %.2f scale %llu: %.0f for %.0f", qs[i],
                  (unsigned long long)scale, got, want);
  }
  ck_assert_uint_eq(gd_hist_quantile(&h, 1.0), n * scale);
  ck_assert_uint_eq(h.max, n * scale);
}

START_TEST(test_uniform_quantiles_within_a_bucket) {
  check_uniform(1);
  check_uniform(1000);       /* microseconds */
  check_uniform(1000000000); /* seconds: 10^13 ns at the top */
}
END_TEST

START_TEST(test_skewed_tail_and_cap_at_max) {
  reset();
  for (int i = 0; i < 990; i++) gd_hist_add(&h, 30000);  /* 30 us */
  for (int i = 0; i < 10; i++) gd_hist_add(&h, 5000000); /* 5 ms stalls */
  uint64_t p50 = gd_hist_quantile(&h, 0.5), p99 = gd_hist_quantile(&h, 0.99);
  uint64_t p999 = gd_hist_quantile(&h, 0.999);
  ck_assert_uint_ge(p50, 30000);
  ck_assert_uint_le(p50, 30000 * 9 / 8);
  ck_assert_uint_eq(p99, p50);      /* the 1% of stalls is not in p99 */
  ck_assert_uint_eq(p999, 5000000); /* the top bucket is capped at the max */
  gd_hist_add(&h, UINT64_MAX);
  ck_assert_uint_eq(gd_hist_quantile(&h, 1.0), UINT64_MAX);
}
END_TEST

/* The fixed bounds of the Prometheus histogram count exactly: a value on a
 * bound is in it, one a nanosecond over is not; past the last bound only
 * the count has it; the sum is exact. */
START_TEST(test_fixed_bounds_count_exactly) {
  reset();
  for (uint32_t k = 1; k < GD_HIST_LE_N; k++)
    ck_assert_uint_gt(gd_hist_le_ns[k], gd_hist_le_ns[k - 1]);
  ck_assert_uint_eq(gd_hist_le_ns[0], 1000);                          /* 1 us */
  ck_assert_uint_eq(gd_hist_le_ns[GD_HIST_LE_N - 1], 10000000000ull); /* 10 s */
  gd_hist_add(&h, 0);
  gd_hist_add(&h, 1000);  /* on the first bound */
  gd_hist_add(&h, 1001);  /* just over: in 2.5 us */
  gd_hist_add(&h, 30000); /* in 50 us */
  gd_hist_add(&h, 30000);
  gd_hist_add(&h, 20000000000ull); /* 20 s: over every bound */
  ck_assert_uint_eq(h.count, 6);
  ck_assert_uint_eq(h.sum, 0 + 1000 + 1001 + 30000 + 30000 + 20000000000ull);
  ck_assert_uint_eq(h.le[0], 2); /* le 1 us */
  ck_assert_uint_eq(h.le[1], 3); /* le 2.5 us */
  ck_assert_uint_eq(h.le[3], 3); /* le 10 us */
  ck_assert_uint_eq(h.le[4], 3); /* le 25 us */
  ck_assert_uint_eq(h.le[5], 5); /* le 50 us */
  ck_assert_uint_eq(h.le[GD_HIST_LE_N - 1], 5);
  /* Cumulative: never less than the bound below. */
  for (uint32_t k = 1; k < GD_HIST_LE_N; k++) ck_assert_uint_ge(h.le[k], h.le[k - 1]);
  gd_hist_add(&h, UINT64_MAX);
  ck_assert_uint_eq(h.sum, UINT64_MAX); /* saturates */
}
END_TEST

int main(void) {
  Suite *s = suite_create("hist");
  TCase *tc = tcase_create("hist");
  tcase_add_test(tc, test_empty_is_zero);
  tcase_add_test(tc, test_small_values_are_exact);
  tcase_add_test(tc, test_uniform_quantiles_within_a_bucket);
  tcase_add_test(tc, test_skewed_tail_and_cap_at_max);
  tcase_add_test(tc, test_fixed_bounds_count_exactly);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
