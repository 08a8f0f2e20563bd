/* Error text read from several threads at once: each thread's own
 * failures through graphd_last_error_r, the handle's last message through
 * graphd_last_error, while other threads fail and succeed on the same
 * handle. Under ThreadSanitizer (the build-tsan run of `ctest -L unit`)
 * any unguarded access to the handle's text is a report, which fails the
 * test. */
#define _GNU_SOURCE
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

#define THREADS 4
#define ROUNDS 300

static gd_test_daemon d;
static graphd_client *shared;
static atomic_int running;

static void setup(void) { td_start(&d, "--host-devices", "1", NULL); }

static void teardown(void) {
  if (d.pid > 0) ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

typedef struct job {
  int k;
  int bad; /* 0, or the round that read another thread's text */
  char got[GRAPHD_ERRMAX + 64];
} job;

/* Fails on the shared handle with a message that names this thread's
 * program id, and reads it back; every other round succeeds (a ping, which
 * empties the handle's text). */
static void *failer(void *arg) {
  job *j = arg;
  uint8_t id[32];
  memset(id, 0xa0 + j->k, sizeof id);
  char hex[65];
  graphd_id_hex(id, hex);
  for (int r = 0; r < ROUNDS && !j->bad; r++) {
    if (r % 3 == 2) {
      if (graphd_ping(shared, NULL, 0) != GRAPHD_OK) j->bad = r + 1;
      continue;
    }
    if (graphd_registry_sync(shared, id) != GRAPHD_NOT_FOUND) {
      j->bad = r + 1;
      break;
    }
    char msg[GRAPHD_ERRMAX];
    graphd_status st = graphd_last_error_r(shared, msg, sizeof msg);
    if (st != GRAPHD_NOT_FOUND || !strstr(msg, hex)) {
      j->bad = r + 1;
      snprintf(j->got, sizeof j->got, "%s: %s", graphd_status_name(st), msg);
    }
    /* The handle's last message, whichever thread's: readable at once. */
    const char *any = graphd_last_error(shared);
    if (!any) j->bad = r + 1;
  }
  atomic_fetch_sub(&running, 1);
  return NULL;
}

/* Reads the handle's message in a loop while the others write it. */
static void *reader(void *arg) {
  size_t *seen = arg;
  while (atomic_load(&running) > 0) {
    const char *m = graphd_last_error(shared);
    char buf[64];
    (void)graphd_last_error_r(shared, buf, sizeof buf);
    *seen += strlen(m) > 0;
  }
  return NULL;
}

START_TEST(test_error_text_from_many_threads) {
  shared = td_data(&d, 0);
  job jobs[THREADS];
  pthread_t th[THREADS + 1];
  size_t seen = 0;
  atomic_store(&running, THREADS);
  for (int k = 0; k < THREADS; k++) {
    jobs[k] = (job){.k = k};
    ck_assert_int_eq(pthread_create(&th[k], NULL, failer, &jobs[k]), 0);
  }
  ck_assert_int_eq(pthread_create(&th[THREADS], NULL, reader, &seen), 0);
  for (int k = 0; k <= THREADS; k++) ck_assert_int_eq(pthread_join(th[k], NULL), 0);
  for (int k = 0; k < THREADS; k++)
    ck_assert_msg(!jobs[k].bad, "thread %d, round %d read another thread's failure: %s", k,
                  jobs[k].bad - 1, jobs[k].got);
  /* A thread that never failed on the handle gets its last message. */
  char msg[GRAPHD_ERRMAX];
  ck_assert_int_eq(graphd_registry_sync(shared, (uint8_t[32]){1}), GRAPHD_NOT_FOUND);
  ck_assert_int_eq(graphd_last_error_r(shared, msg, sizeof msg), GRAPHD_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(msg, "0100000000"));
  ck_assert_str_eq(graphd_last_error(shared), msg);
  /* A buffer too small gets a truncated, terminated copy. */
  char small[8];
  ck_assert_int_eq(graphd_last_error_r(shared, small, sizeof small), GRAPHD_NOT_FOUND);
  ck_assert_uint_eq(strlen(small), sizeof small - 1);
  graphd_close(shared);
}
END_TEST

int main(void) {
  Suite *s = suite_create("errors");
  TCase *tc = tcase_create("errors");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_error_text_from_many_threads);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
