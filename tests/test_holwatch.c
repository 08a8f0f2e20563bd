/* The head-of-line watch over ready waits queued on the device: which
 * waits it releases from the host and reports, and which it leaves. Driven
 * directly, as the worker drives it, over flag words in plain memory. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/device/device.h"
#include "daemon/device/session_stream.h"
#include "daemon/device/holwatch.h"
#include "graphd/protocol.h"

#define SLOTS 4
/* Long enough that a loaded machine (a sanitizer build among parallel
 * tests) does not pass it between an add and the check that follows. */
#define TIMEOUT 0.1 /* seconds */

typedef struct sess {
  gd_session_stream ds;
  uint64_t words[SLOTS * GRAPHD_FLAG_WORDS_PER_SLOT];
} sess;

static void sess_init(sess *s, uint64_t id) {
  memset(s, 0, sizeof *s);
  s->ds.session_id = id;
  s->ds.flags.host = s->words;
  s->ds.has_flags = true;
  s->ds.nslots = SLOTS;
}

static uint64_t ready(sess *s, uint32_t slot) {
  return *session_stream_word(&s->ds, slot, GRAPHD_FLAG_WORD_READY);
}

static void set_ready(sess *s, uint32_t slot, uint64_t v) {
  *session_stream_word(&s->ds, slot, GRAPHD_FLAG_WORD_READY) = v;
}

/* Past the timeout, and past the watch's own pause between full checks. */
static void wait_out(void) {
  struct timespec t = {0, (long)(TIMEOUT * 1e9) + 10 * 1000 * 1000};
  nanosleep(&t, NULL);
}

/* A device with no watch yet and three sessions, ids 1 to 3. */
typedef struct fixture {
  gd_device d;
  sess a, b, c;
} fixture;

static void fixture_init(fixture *f) {
  memset(&f->d, 0, sizeof f->d);
  sess_init(&f->a, 1);
  sess_init(&f->b, 2);
  sess_init(&f->c, 3);
}

static int check(gd_device *d, uint64_t *cut, bool *pending) {
  return holwatch_check(d, cut, 8, pending);
}

static int key_a, key_b; /* two keys: only their addresses count */

START_TEST(test_holwatch_releases_a_wait_another_session_queued_behind) {
  static fixture f;
  fixture_init(&f);
  gd_device *d = &f.d;
  sess *a = &f.a, *b = &f.b;
  holwatch_add(d, &a->ds, 1, 5, TIMEOUT, &key_a);
  holwatch_add(d, &b->ds, 0, 1, TIMEOUT, &key_a);
  uint64_t cut[8];
  bool pending;
  /* Within the timeout nothing is cut. */
  ck_assert_int_eq(check(d, cut, &pending), 0);
  ck_assert(pending);
  wait_out();
  ck_assert_int_eq(check(d, cut, &pending), 1);
  ck_assert_uint_eq(cut[0], 1);
  ck_assert(a->ds.cut_off);
  ck_assert(!b->ds.cut_off);
  ck_assert_uint_eq(ready(a, 1), 5); /* released from the host */
  ck_assert_uint_eq(ready(b, 0), 0); /* b's own wait is left */
  ck_assert(pending);                /* b is still watched */
  set_ready(b, 0, 1);
  wait_out();
  ck_assert_int_eq(check(d, cut, &pending), 0);
  ck_assert(!pending);
  holwatch_close(d);
}
END_TEST

START_TEST(test_holwatch_leaves_a_slow_session_in_nobodys_way) {
  static fixture f;
  fixture_init(&f);
  gd_device *d = &f.d;
  sess *a = &f.a, *b = &f.b;
  /* a queues twice on key_a, b only on key_b: nobody waits behind a. */
  holwatch_add(d, &a->ds, 0, 1, TIMEOUT, &key_a);
  holwatch_add(d, &a->ds, 0, 2, TIMEOUT, &key_a);
  holwatch_add(d, &b->ds, 0, 1, TIMEOUT, &key_b);
  uint64_t cut[8];
  bool pending;
  wait_out();
  ck_assert_int_eq(check(d, cut, &pending), 0);
  ck_assert(pending);
  ck_assert(!a->ds.cut_off && !b->ds.cut_off);
  ck_assert_uint_eq(ready(a, 0), 0);
  holwatch_close(d);
}
END_TEST

START_TEST(test_holwatch_counts_work_queued_behind_whose_wait_was_met) {
  static fixture f;
  fixture_init(&f);
  gd_device *d = &f.d;
  sess *a = &f.a, *b = &f.b;
  holwatch_add(d, &a->ds, 0, 3, TIMEOUT, &key_a);
  /* b's flag is up already: its wait is not watched, but its replay still
   * queues behind a's on the capture. */
  set_ready(b, 2, 7);
  holwatch_add(d, &b->ds, 2, 7, TIMEOUT, &key_a);
  /* a queues again after b: a's first wait still blocks b. */
  holwatch_add(d, &a->ds, 0, 4, TIMEOUT, &key_a);
  uint64_t cut[8];
  bool pending;
  wait_out();
  ck_assert_int_eq(check(d, cut, &pending), 1);
  ck_assert_uint_eq(cut[0], 1);
  ck_assert_uint_eq(ready(a, 0), 4); /* both of a's waits released */
  ck_assert(!pending);               /* a's waits went with its session */
  holwatch_close(d);
}
END_TEST

START_TEST(test_holwatch_forgets_a_key_and_a_stream) {
  static fixture f;
  fixture_init(&f);
  gd_device *d = &f.d;
  sess *a = &f.a, *b = &f.b, *c = &f.c;
  holwatch_add(d, &a->ds, 0, 1, TIMEOUT, &key_a);
  holwatch_add(d, &b->ds, 0, 1, TIMEOUT, &key_a);
  holwatch_add(d, &c->ds, 0, 1, TIMEOUT, &key_b);
  holwatch_drop_key(d, &key_a); /* evicted: its waits are not watched */
  uint64_t cut[8];
  bool pending;
  wait_out();
  ck_assert_int_eq(check(d, cut, &pending), 0);
  ck_assert(pending); /* c's */
  holwatch_drop_stream(d, &c->ds);
  wait_out();
  ck_assert_int_eq(check(d, cut, &pending), 0);
  ck_assert(!pending);
  /* A key watched afresh after it went: only adds from then on count. */
  holwatch_add(d, &a->ds, 1, 2, TIMEOUT, &key_a);
  wait_out();
  ck_assert_int_eq(check(d, cut, &pending), 0);
  holwatch_add(d, &b->ds, 1, 2, TIMEOUT, &key_a);
  wait_out();
  ck_assert_int_eq(check(d, cut, &pending), 1); /* a, with b behind it; nobody behind b */
  ck_assert_uint_eq(cut[0], 1);
  ck_assert(pending);
  holwatch_close(d);
}
END_TEST

START_TEST(test_holwatch_never_watches_what_cannot_hang) {
  static fixture f;
  fixture_init(&f);
  gd_device *d = &f.d;
  sess *a = &f.a, *b = &f.b;
  holwatch_add(d, &a->ds, 0, 1, 0, &key_a); /* timeout 0: never */
  b->ds.cut_off = true;
  holwatch_add(d, &b->ds, 0, 1, TIMEOUT, &key_a); /* cut off already */
  uint64_t cut[8];
  bool pending;
  wait_out();
  ck_assert_int_eq(check(d, cut, &pending), 0);
  ck_assert(!pending);
  holwatch_close(d);
}
END_TEST

/* A ready word 2^63 ahead of the awaited seq is behind it for the GPU's
 * cyclic compare: the host must see it so too, keep watching, and its
 * release must write a value the GPU takes as met. */
START_TEST(test_holwatch_watches_a_ready_word_two_to_the_63_ahead) {
  static fixture f;
  fixture_init(&f);
  gd_device *d = &f.d;
  sess *a = &f.a, *b = &f.b;
  set_ready(a, 0, 5 + (1ull << 63));
  holwatch_add(d, &a->ds, 0, 5, TIMEOUT, &key_a);
  holwatch_add(d, &b->ds, 0, 1, TIMEOUT, &key_a);
  uint64_t cut[8];
  bool pending;
  ck_assert_int_eq(check(d, cut, &pending), 0);
  ck_assert(pending);
  wait_out();
  ck_assert_int_eq(check(d, cut, &pending), 1);
  ck_assert_uint_eq(cut[0], 1);
  ck_assert(graphd_seq_reached(ready(a, 0), 5));
  ck_assert_uint_eq(ready(a, 0), 5);
  holwatch_close(d);
}
END_TEST

/* Seqs may wrap past 2^64: a ready word just past the wrap has reached a
 * seq just below it, and nothing is watched. */
START_TEST(test_holwatch_takes_a_wrapped_ready_word_as_met) {
  static fixture f;
  fixture_init(&f);
  gd_device *d = &f.d;
  sess *a = &f.a, *b = &f.b;
  set_ready(a, 0, 2);
  holwatch_add(d, &a->ds, 0, UINT64_MAX - 1, TIMEOUT, &key_a);
  holwatch_add(d, &b->ds, 0, 1, TIMEOUT, &key_a);
  uint64_t cut[8];
  bool pending;
  wait_out();
  ck_assert_int_eq(check(d, cut, &pending), 0);
  ck_assert(!a->ds.cut_off);
  holwatch_close(d);
}
END_TEST

/* What the worker accepts as a slot's next seq, and what the release at a
 * session's end writes into its ready words. */
START_TEST(test_session_stream_seq_steps_and_release) {
  static sess a;
  sess_init(&a, 1);
  uint64_t seen[SLOTS] = {0};
  uint32_t used[SLOTS];
  a.ds.seen = seen;
  a.ds.used = used;
  /* A slot's first seq: any but 0. */
  ck_assert(!session_stream_seq_next(&a.ds, 0, 0));
  ck_assert(session_stream_seq_next(&a.ds, 0, UINT64_MAX - 1));
  ck_assert(!session_stream_seq_next(&a.ds, SLOTS, 1)); /* no such slot */
  session_stream_saw(&a.ds, 0, UINT64_MAX - 1);
  /* Later ones: above the last, by at most GRAPHD_SEQ_MAX_STEP, cyclically
   * (through the wrap, skipping 0). */
  ck_assert(!session_stream_seq_next(&a.ds, 0, UINT64_MAX - 1));
  ck_assert(!session_stream_seq_next(&a.ds, 0, UINT64_MAX - 2));
  ck_assert(session_stream_seq_next(&a.ds, 0, UINT64_MAX));
  ck_assert(!session_stream_seq_next(&a.ds, 0, 0));
  ck_assert(session_stream_seq_next(&a.ds, 0, 5));
  ck_assert(!session_stream_seq_next(&a.ds, 0, UINT64_MAX - 1 + (1ull << 63)));
  ck_assert(session_stream_seq_next(&a.ds, 0, UINT64_MAX - 1 + GRAPHD_SEQ_MAX_STEP));
  ck_assert(!session_stream_seq_next(&a.ds, 0, UINT64_MAX + GRAPHD_SEQ_MAX_STEP));
  session_stream_saw(&a.ds, 0, 5);
  session_stream_saw(&a.ds, 2, 100);
  /* The client left slot 0's word 2^63 ahead (behind, for the GPU) and
   * slot 2's past its last seq; slot 1 was never used. */
  set_ready(&a, 0, 5 + (1ull << 63));
  set_ready(&a, 1, 7);
  set_ready(&a, 2, 101);
  uint64_t written[SLOTS];
  session_stream_release(&a.ds, GRAPHD_FLAG_WORD_READY, written);
  ck_assert_uint_eq(ready(&a, 0), 5);
  ck_assert_uint_eq(ready(&a, 1), 7);
  ck_assert_uint_eq(ready(&a, 2), 101);
  ck_assert_uint_eq(written[0], 5);
  /* The done word, which the client's own streams wait on, jumps ahead. */
  *session_stream_word(&a.ds, 3, GRAPHD_FLAG_WORD_DONE) = 9;
  session_stream_release(&a.ds, GRAPHD_FLAG_WORD_DONE, NULL);
  ck_assert(
      graphd_seq_reached(*session_stream_word(&a.ds, 3, GRAPHD_FLAG_WORD_DONE), 9 + (1ull << 61)));
}
END_TEST

int main(void) {
  Suite *s = suite_create("holwatch");
  TCase *tc = tcase_create("holwatch");
  tcase_add_test(tc, test_holwatch_releases_a_wait_another_session_queued_behind);
  tcase_add_test(tc, test_holwatch_leaves_a_slow_session_in_nobodys_way);
  tcase_add_test(tc, test_holwatch_counts_work_queued_behind_whose_wait_was_met);
  tcase_add_test(tc, test_holwatch_forgets_a_key_and_a_stream);
  tcase_add_test(tc, test_holwatch_never_watches_what_cannot_hang);
  tcase_add_test(tc, test_holwatch_watches_a_ready_word_two_to_the_63_ahead);
  tcase_add_test(tc, test_holwatch_takes_a_wrapped_ready_word_as_met);
  tcase_add_test(tc, test_session_stream_seq_steps_and_release);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
