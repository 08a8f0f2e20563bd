/* Instances of a capture on the host backend: a program with temporaries
 * runs from an instance per concurrent stream, a program with state from
 * an instance per session, and what the daemon keeps for one session or
 * user is never seen by another. --host-busy-ms makes a replay's capture
 * look busy for a while after the worker ran it, as a GPU still running it
 * would, so that a second stream finds the first instance busy. */
#define _GNU_SOURCE
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define N 1024u /* floats per slot */

static gd_test_daemon d;
static uint8_t *plugin;
static size_t plugin_len;

static void start(const char *busy_ms, const char *budget, const char *fair) {
  td_start(&d, "--host-devices", "1", "--host-busy-ms", busy_ms, "--device-budget", budget,
           "--fair-shares", fair, "--socket-mode", "0666", NULL);
  ck_assert_int_eq(chmod(d.dir, 0755), 0); /* for uid 65534's clients */
  plugin = td_read_file(HOST_KERNELS_SO, &plugin_len);
}

static void setup(void) { start("0", "0", "yes"); }
static void setup_busy(void) { start("300", "0", "yes"); }
/* Room for two instances of these programs (a host device's staging comes
 * in 64 KiB), not three; one user may take it all. */
static void setup_busy_budget(void) { start("300", "160K", "no"); }
/* Room for four instances; each replay keeps its instance busy 2 s. */
static void setup_shares(void) { start("2000", "256K", "yes"); }

static void teardown(void) {
  free(plugin);
  if (d.pid > 0) ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* The programs, each of three slots of N floats: x (input), a daemon-owned
 * slot t, y (output). */
enum kind {
  TWICE,      /* t = 2x (temp), y = t */
  RUNNING,    /* t += x (scratch: state), y = t */
  TEMP_READS, /* t += x (temp, so read before it is written), y = t */
};

static void launch(graphd_program *p, const uint8_t mod[32], const char *fn, uint32_t in,
                   uint32_t out, const float *factor) {
  uint32_t grid[3] = {N / 256, 1, 1}, block[3] = {256, 1, 1}, n = N;
  int s = graphd_program_add_launch(p, mod, fn, grid, block, 0);
  graphd_program_param_slot(p, (uint32_t)s, 0, in, 0);
  graphd_program_param_slot(p, (uint32_t)s, 8, out, 0);
  if (factor) {
    graphd_program_param(p, (uint32_t)s, 16, factor, 4);
    graphd_program_param(p, (uint32_t)s, 20, &n, 4);
  } else {
    graphd_program_param(p, (uint32_t)s, 16, &n, 4);
  }
}

static void build(graphd_client *c, enum kind k, uint8_t pid[32]) {
  uint8_t mod[32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, N * 4, 1);
  graphd_program_add_slot(p, k == RUNNING ? GRAPHD_SLOT_SCRATCH : GRAPHD_SLOT_TEMP, N * 4, 0);
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, N * 4, 1);
  const float two = 2.0f, one = 1.0f;
  if (k == TWICE)
    launch(p, mod, "scale", 0, 1, &two);
  else
    launch(p, mod, "accumulate", 0, 1, NULL);
  launch(p, mod, "scale", 1, 2, &one);
  ck_assert_msg(graphd_program_finish(p, pid) == GRAPHD_OK, "%s", graphd_program_error(p));
  ck_assert_msg(graphd_register_program(c, p) == GRAPHD_OK, "%s", graphd_last_error(c));
  graphd_program_free(p);
}

/* A data session on device 0 with a stream and host buffers x and y. */
typedef struct sess {
  graphd_client *c;
  graphd_stream *s;
  float *x, *y;
  uint8_t pid[32];
} sess;

static graphd_status sess_open(sess *k, enum kind kind) {
  k->c = td_data(&d, 0);
  build(k->c, kind, k->pid);
  graphd_status st = graphd_stream_attach(k->c, NULL, &k->s);
  if (st == GRAPHD_OK) st = graphd_host_alloc(k->c, N * 4, (void **)&k->x);
  if (st == GRAPHD_OK) st = graphd_host_alloc(k->c, N * 4, (void **)&k->y);
  return st;
}

static void sess_close(sess *k) {
  graphd_stream_detach(k->s);
  graphd_close(k->c);
}

/* Replays with x = v everywhere; returns y[0], or NAN with y not uniform
 * or the replay failed. */
static float replay_with(sess *k, float v) {
  for (uint32_t i = 0; i < N; i++) k->x[i] = v;
  memset(k->y, 0xff, N * 4);
  graphd_binding b[2] = {{0, (uint64_t)(uintptr_t)k->x, N * 4},
                         {2, (uint64_t)(uintptr_t)k->y, N * 4}};
  if (graphd_replay(k->c, k->s, k->pid, b, 2, NULL) != GRAPHD_OK) {
    fprintf(stderr, "replay: %s\n", graphd_last_error(k->c));
    return -1.0f / 0.0f;
  }
  for (uint32_t i = 1; i < N; i++)
    if (k->y[i] != k->y[0]) return 0.0f / 0.0f;
  return k->y[0];
}

/* The capture's instances and staging, from ListCaptures. */
static void listed(uint32_t *graphs, uint64_t *bytes, size_t *ncaps) {
  graphd_client *ctl = td_control(&d);
  graphd_capture_info *ci;
  size_t n;
  ck_assert_int_eq(graphd_list_captures(ctl, &ci, &n), GRAPHD_OK);
  *graphs = 0;
  *bytes = 0;
  for (size_t i = 0; i < n; i++) {
    *graphs += ci[i].graphs;
    *bytes += ci[i].staging_bytes;
  }
  *ncaps = n;
  free(ci);
  graphd_close(ctl);
}

static graphd_device_counters counters(void) {
  graphd_client *ctl = td_control(&d);
  graphd_device_counters c = td_device_info(ctl, 0).counters;
  graphd_close(ctl);
  return c;
}

/* Two sessions replay a program with temporaries while its one instance is
 * busy: the second gets an instance of its own, and each stream then goes
 * back to its own. Eviction frees them all. */
START_TEST(test_instances_a_program_with_temporaries_runs_from_two_at_once) {
  sess a, b;
  ck_assert_int_eq(sess_open(&a, TWICE), GRAPHD_OK);
  ck_assert_int_eq(sess_open(&b, TWICE), GRAPHD_OK);
  ck_assert(replay_with(&a, 3.0f) == 6.0f);
  ck_assert(replay_with(&b, 5.0f) == 10.0f); /* a's instance is still busy */
  for (int i = 0; i < 4; i++) {
    ck_assert(replay_with(&a, (float)i) == 2.0f * (float)i);
    ck_assert(replay_with(&b, (float)i + 1) == 2.0f * ((float)i + 1));
  }
  uint32_t graphs;
  uint64_t bytes;
  size_t n;
  listed(&graphs, &bytes, &n);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(graphs, 2); /* one executable graph per instance */
  ck_assert(td_log_contains(&d, "instance 2, for another stream"));
  ck_assert(!td_log_contains(&d, "instance 3"));
  ck_assert_uint_eq(counters().staging_bytes, bytes);
  /* Status counts the instances and graphs ListCaptures shows. */
  graphd_client *sc = td_control(&d);
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status(sc, &st), GRAPHD_OK);
  graphd_device_record r;
  ck_assert_int_eq(graphd_daemon_status_device(st, 0, &r, sizeof r), GRAPHD_OK);
  ck_assert_uint_eq(r.instances, 2);
  ck_assert_uint_eq(r.graphs, graphs);
  ck_assert_uint_eq(r.info.counters.captures, 1);
  graphd_daemon_status_free(st);
  graphd_close(sc);
  /* Eviction takes every instance. */
  graphd_client *ctl = td_control(&d);
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.all = 1;
  uint64_t freed;
  ck_assert_int_eq(graphd_evict(ctl, &o, NULL, &n, &freed), GRAPHD_OK);
  graphd_close(ctl);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(freed, bytes);
  graphd_device_counters k = counters();
  ck_assert_uint_eq(k.captures, 0);
  ck_assert_uint_eq(k.staging_bytes, 0);
  sess_close(&a);
  sess_close(&b);
}
END_TEST

/* The capture's one record from ListCaptures (graphd_list_capture_records). */
static graphd_capture_record listed_record(void) {
  graphd_client *ctl = td_control(&d);
  graphd_capture_record *r;
  size_t n;
  ck_assert_int_eq(graphd_list_capture_records(ctl, sizeof *r, &r, &n), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  graphd_capture_record one = r[0];
  graphd_capture_records_free(r);
  graphd_close(ctl);
  ck_assert_uint_eq(one.size, sizeof one);
  return one;
}

/* The value under column `name` of graphctl list's first capture. The
 * header and the row split into words line up up to the columns asked for
 * here: the header's "IDLE s" is two words, as the row's staging size
 * (number and unit) is. */
static long list_column(const char *out, const char *name) {
  char head[512], row[512];
  const char *nl = strchr(out, '\n');
  ck_assert_msg(nl && sscanf(nl + 1, "%511[^\n]", row) == 1, "%s", out);
  ck_assert(sscanf(out, "%511[^\n]", head) == 1);
  int col = 0, words = 0;
  bool found = false;
  for (char *save, *w = strtok_r(head, " ", &save); w; w = strtok_r(NULL, " ", &save), words++) {
    if (strcmp(w, name) == 0) {
      col = words;
      found = true;
    }
  }
  ck_assert_msg(found, "no column %s in %s", name, out);
  char *save, *w = strtok_r(row, " ", &save);
  for (int k = 0; k < col && w; k++) w = strtok_r(NULL, " ", &save);
  ck_assert_msg(w != NULL, "row too short: %s", out);
  return strtol(w, NULL, 10);
}

/* A program replayed from two sessions at once shows its two instances,
 * and the staging they hold together, wherever its capture is listed:
 * libgraphd's records (and records of the first two members only, as a
 * binary built against that much of the header would ask for), graphctl
 * list and its JSON, and the records of what an eviction took. */
START_TEST(test_instances_listings_show_a_captures_instances_and_their_staging) {
  sess a, b;
  ck_assert_int_eq(sess_open(&a, TWICE), GRAPHD_OK);
  ck_assert_int_eq(sess_open(&b, TWICE), GRAPHD_OK);
  ck_assert(replay_with(&a, 3.0f) == 6.0f);
  graphd_capture_record one = listed_record();
  ck_assert_uint_eq(one.instances, 1);
  /* The worker's time to queue a replay: on a host device its run too,
   * some microseconds at least, and far below a second. */
  ck_assert_uint_eq(one.size, sizeof one);
  ck_assert_uint_gt(one.queue_ns, 100);
  ck_assert_uint_lt(one.queue_ns, 1000000000u);
  ck_assert(replay_with(&a, 4.0f) == 8.0f);  /* a's instance is busy again */
  ck_assert(replay_with(&b, 5.0f) == 10.0f); /* so b gets one of its own */
  graphd_capture_record two = listed_record();
  ck_assert_uint_eq(two.instances, 2);
  ck_assert_uint_eq(two.info.staging_bytes, 2 * one.info.staging_bytes);
  ck_assert_uint_eq(two.info.graphs, 2);
  ck_assert_uint_eq(counters().staging_bytes, two.info.staging_bytes);

  graphd_client *ctl = td_control(&d);
  struct {
    uint32_t size, instances;
  } * small;
  size_t n;
  ck_assert_int_eq(graphd_list_capture_records(ctl, sizeof *small, (void *)&small, &n), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(small[0].size, sizeof *small);
  ck_assert_uint_eq(small[0].instances, 2);
  graphd_capture_records_free((void *)small);
  graphd_capture_record *none = (void *)1;
  ck_assert_int_eq(graphd_list_capture_records(ctl, 4, &none, &n), GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_null(none);
  graphd_close(ctl);

  /* graphctl list labels the column, and its JSON has the key. */
  char out[8192];
  char *argv[] = {GRAPHCTL_BIN, "--socket", d.socket, "list", NULL};
  ck_assert_int_eq(td_run(argv, out, sizeof out, 10000), 0);
  ck_assert_msg(strstr(out, " GEN INSTANCES GRAPHS "), "%s", out);
  ck_assert_int_eq(list_column(out, "INSTANCES"), 2);
  ck_assert_int_eq(list_column(out, "GRAPHS"), 2);
  char *argj[] = {GRAPHCTL_BIN, "--socket", d.socket, "list", "--json", NULL};
  ck_assert_int_eq(td_run(argj, out, sizeof out, 10000), 0);
  ck_assert_msg(strstr(out, "\"instances\":2") || strstr(out, "\"instances\": 2"), "%s", out);
  ck_assert_msg(
      strstr(out, td_fmt("\"staging_bytes\": %llu", (unsigned long long)two.info.staging_bytes)) ||
          strstr(out, td_fmt("\"staging_bytes\":%llu", (unsigned long long)two.info.staging_bytes)),
      "%s", out);

  /* What an eviction took, as records. */
  ctl = td_control(&d);
  graphd_evict_options o;
  graphd_evict_options_init(&o);
  o.all = 1;
  graphd_capture_record *went;
  uint64_t freed;
  ck_assert_int_eq(graphd_evict_records(ctl, &o, sizeof *went, &went, &n, &freed), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(went[0].instances, 2);
  ck_assert_uint_eq(went[0].info.staging_bytes, freed);
  graphd_capture_records_free(went);
  graphd_close(ctl);
  sess_close(&a);
  sess_close(&b);
}
END_TEST

/* Two sessions replaying one program with state each see only their own:
 * a running sum per session, from zero, and a session that comes after one
 * ended starts from zero on the instance that one held. */
START_TEST(test_instances_sessions_see_only_their_own_state) {
  sess a, b, c;
  ck_assert_int_eq(sess_open(&a, RUNNING), GRAPHD_OK);
  ck_assert_int_eq(sess_open(&b, RUNNING), GRAPHD_OK);
  ck_assert(replay_with(&a, 1.0f) == 1.0f);
  ck_assert(replay_with(&a, 1.0f) == 2.0f);
  ck_assert(replay_with(&b, 10.0f) == 10.0f);
  ck_assert(replay_with(&a, 1.0f) == 3.0f);
  ck_assert(replay_with(&b, 10.0f) == 20.0f);
  sess_close(&b);
  ck_assert_int_eq(sess_open(&c, RUNNING), GRAPHD_OK);
  ck_assert(replay_with(&c, 100.0f) == 100.0f);
  ck_assert(replay_with(&a, 1.0f) == 4.0f);
  uint32_t graphs;
  uint64_t bytes;
  size_t n;
  listed(&graphs, &bytes, &n);
  ck_assert_uint_eq(graphs, 2); /* c took the instance b held */
  sess_close(&a);
  sess_close(&c);
}
END_TEST

/* uid 65534 replays a program whose temporaries root's replays left
 * behind: it reads zeros, not root's. */
static int temp_reads_as_nobody(const void *arg) {
  (void)arg;
  sess k;
  if (sess_open(&k, TEMP_READS) != GRAPHD_OK) return 11;
  float first = replay_with(&k, 1.0f), second = replay_with(&k, 1.0f);
  sess_close(&k);
  if (first != 1.0f) return 12; /* root's 10 would make it 11 */
  return second == 2.0f ? 0 : 13;
}

START_TEST(test_instances_two_uids_never_see_each_others_temporaries) {
  sess r;
  ck_assert_int_eq(sess_open(&r, TEMP_READS), GRAPHD_OK);
  ck_assert(replay_with(&r, 5.0f) == 5.0f); /* a new instance starts zeroed */
  ck_assert(replay_with(&r, 5.0f) == 10.0f);
  ck_assert_int_eq(td_as_nobody(temp_reads_as_nobody, NULL), 0);
  ck_assert(replay_with(&r, 5.0f) == 5.0f);      /* and back to root: zeroed again */
  ck_assert(!td_log_contains(&d, "instance 2")); /* the one instance, passed on */
  sess_close(&r);
}
END_TEST

/* With the budget tight, an idle extra instance goes before any capture:
 * a second program's capture makes room by dropping the first program's
 * second instance, and both captures stay. The counters follow. */
START_TEST(test_instances_idle_ones_go_first_when_the_budget_is_tight) {
  sess a, b, c;
  ck_assert_int_eq(sess_open(&a, TWICE), GRAPHD_OK);
  ck_assert_int_eq(sess_open(&b, TWICE), GRAPHD_OK);
  ck_assert(replay_with(&a, 3.0f) == 6.0f);
  ck_assert(replay_with(&b, 5.0f) == 10.0f);
  uint32_t graphs;
  uint64_t bytes;
  size_t n;
  listed(&graphs, &bytes, &n);
  ck_assert_uint_eq(graphs, 2);
  usleep(400000); /* both instances idle */
  ck_assert_int_eq(sess_open(&c, RUNNING), GRAPHD_OK);
  ck_assert(replay_with(&c, 7.0f) == 7.0f);
  listed(&graphs, &bytes, &n);
  ck_assert_uint_eq(n, 2);
  ck_assert_uint_eq(graphs, 2); /* one instance each */
  graphd_device_counters k = counters();
  ck_assert_uint_eq(k.evictions, 0);
  ck_assert_uint_eq(k.captures, 2);
  ck_assert_uint_eq(k.staging_bytes, bytes);
  ck_assert_uint_le(bytes, 160u << 10);
  sess_close(&a);
  sess_close(&b);
  sess_close(&c);
}
END_TEST

/* uid 65534 replays the program while root's instances are all busy: it
 * gets an instance of its own. */
static int replays_on_its_own_instance(const void *arg) {
  (void)arg;
  sess k;
  if (sess_open(&k, TWICE) != GRAPHD_OK) return 11;
  float y = replay_with(&k, 4.0f);
  sess_close(&k);
  return y == 8.0f ? 0 : 12;
}

/* One user cannot take every instance: root's four streams replaying at
 * once get two instances (half the budget, its fair share while alone)
 * and share them; another user then gets one of its own, though root's
 * are all busy, rather than waiting behind them. */
START_TEST(test_instances_a_user_past_its_share_cannot_starve_another) {
  sess r[4];
  for (int i = 0; i < 4; i++) ck_assert_int_eq(sess_open(&r[i], TWICE), GRAPHD_OK);
  for (int i = 0; i < 4; i++) ck_assert(replay_with(&r[i], (float)i) == 2.0f * (float)i);
  ck_assert(td_log_contains(&d, "instance 2, for another stream"));
  ck_assert(!td_log_contains(&d, "instance 3"));
  ck_assert_int_eq(td_as_nobody(replays_on_its_own_instance, NULL), 0);
  ck_assert(td_log_contains(&d, "instance 3, for another stream"));
  for (int i = 0; i < 4; i++) sess_close(&r[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("instances");
  TCase *tp = tcase_create("plain");
  tcase_add_checked_fixture(tp, setup, teardown);
  tcase_set_timeout(tp, 60);
  tcase_add_test(tp, test_instances_sessions_see_only_their_own_state);
  tcase_add_test(tp, test_instances_two_uids_never_see_each_others_temporaries);
  suite_add_tcase(s, tp);
  TCase *tb = tcase_create("busy");
  tcase_add_checked_fixture(tb, setup_busy, teardown);
  tcase_set_timeout(tb, 60);
  tcase_add_test(tb, test_instances_a_program_with_temporaries_runs_from_two_at_once);
  tcase_add_test(tb, test_instances_listings_show_a_captures_instances_and_their_staging);
  suite_add_tcase(s, tb);
  TCase *tg = tcase_create("budget");
  tcase_add_checked_fixture(tg, setup_busy_budget, teardown);
  tcase_set_timeout(tg, 60);
  tcase_add_test(tg, test_instances_idle_ones_go_first_when_the_budget_is_tight);
  suite_add_tcase(s, tg);
  TCase *ts = tcase_create("shares");
  tcase_add_checked_fixture(ts, setup_shares, teardown);
  tcase_set_timeout(ts, 60);
  tcase_add_test(ts, test_instances_a_user_past_its_share_cannot_starve_another);
  suite_add_tcase(s, ts);
  return td_run_suite(s);
}
