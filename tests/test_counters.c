/* The counters Status reports, end to end on the host backend: every
 * device counter of the list (graphd/device_counters.def) reaches
 * libgraphd's graphd_device_record at the place graphd_device_metric
 * gives, and a record filled with fewer bytes reads 0 past them; the
 * replays a ring carried are counted apart from those of Replay
 * requests. And each kind of request has its row of counters (the
 * router's): its calls, those answered with a status other than OK
 * (refused by the table, by the handler, or by the worker that answered
 * itself), and the loop's time in the handler. And each session's
 * graphd_session_record: the peer's gid and admin right, its age and
 * idle time as they pass, whether it is busy, its flag page and ring
 * once it has them, at every record size. */
#define _GNU_SOURCE
#include <check.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graphd/protocol.h"
#include "harness.h"
#include "program3.h"

#define N 256u

static gd_test_daemon d;

static void setup(void) {
  td_start(&d, "--host-devices", "2", "--socket-mode", "0666", NULL);
  ck_assert_int_eq(chmod(d.dir, 0755), 0); /* for uid 65534's client */
}

static void teardown(void) {
  if (d.pid > 0) ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* Device dev's whole record, filled with `size` bytes of it. */
static graphd_device_record record(graphd_client *ctl, uint32_t dev, size_t size) {
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  graphd_device_record r;
  ck_assert_int_eq(graphd_daemon_status_device(st, dev, &r, size), GRAPHD_OK);
  graphd_daemon_status_free(st);
  return r;
}

static const graphd_metric_info *metric(const char *name) {
  const graphd_metric_info *m;
  for (uint32_t i = 0; (m = graphd_device_metric(i)); i++)
    if (strcmp(m->name, name) == 0) return m;
  ck_abort_msg("no device counter %s", name);
  return NULL;
}

START_TEST(test_counters_every_device_counter_is_read_at_its_offset) {
  graphd_client *data = td_data(&d, 1);
  graphd_client *ctl = td_control(&d);
  graphd_device_record r = record(ctl, 1, sizeof r);
  ck_assert_uint_eq(r.size, sizeof r);
  /* The list: names and field numbers once each, every place inside the
   * record, its kind and unit among the known. */
  uint32_t n = 0;
  const graphd_metric_info *m;
  for (; (m = graphd_device_metric(n)); n++) {
    ck_assert_uint_le(m->offset + sizeof(uint64_t), sizeof r);
    ck_assert_msg(strcmp(m->kind, "counter") == 0 || strcmp(m->kind, "gauge") == 0, "%s", m->name);
    ck_assert_msg(strcmp(m->unit, "ns") == 0 || strcmp(m->unit, "bytes") == 0 ||
                      strcmp(m->unit, "count") == 0,
                  "%s", m->name);
    ck_assert_msg(m->help[0] != '\0', "%s", m->name);
    ck_assert_msg(!m->prometheus_own || m->prometheus[0] != '\0', "%s", m->name);
    for (uint32_t k = 0; k < n; k++) {
      ck_assert_str_ne(graphd_device_metric(k)->name, m->name);
      ck_assert_uint_ne(graphd_device_metric(k)->field, m->field);
      ck_assert_uint_ne(graphd_device_metric(k)->offset, m->offset);
    }
  }
  ck_assert_uint_ge(n, 26);
  /* Each read where graphd.h names it. */
  ck_assert_uint_eq(graphd_device_record_value(&r, metric("sessions")), 1);
  ck_assert_uint_eq(r.info.counters.sessions, 1);
  ck_assert_uint_gt(r.worker_clock_ns, 0);
  ck_assert_uint_eq(graphd_device_record_value(&r, metric("worker_clock_ns")), r.worker_clock_ns);
  ck_assert_uint_eq(graphd_device_record_value(&r, metric("worker_busy_ns")), r.worker_busy_ns);
  ck_assert_uint_eq(graphd_device_record_value(&r, metric("worker_launch_ns")), r.launch_ns);
  ck_assert_uint_eq(graphd_device_record_value(&r, metric("worker_replays")), r.work.replays);
  ck_assert_uint_eq(graphd_device_record_value(&r, metric("replay_latency_count")),
                    r.replay_latency.count);
  /* A record of an older size holds no counter past it. */
  size_t older = offsetof(graphd_device_record, worker_busy_ns);
  graphd_device_record o = record(ctl, 1, older);
  ck_assert_uint_eq(o.size, older);
  ck_assert_uint_eq(graphd_device_record_value(&o, metric("worker_clock_ns")), 0);
  ck_assert_uint_eq(graphd_device_record_value(&o, metric("sessions")), 1);
  graphd_close(ctl);
  graphd_close(data);
}
END_TEST

/* Device dev's record once its ring_replays reaches want (the ring's
 * tally reaches the loop just after the entries ran), or after 5 s. */
static graphd_device_record record_when(graphd_client *ctl, uint32_t dev, uint64_t want) {
  graphd_device_record r;
  double deadline = td_now_s() + 5;
  do r = record(ctl, dev, sizeof r);
  while (r.ring_replays < want && td_now_s() < deadline && usleep(2000) == 0);
  return r;
}

START_TEST(test_counters_ring_replays_are_counted_apart) {
  graphd_client *c = td_data(&d, 1);
  size_t plen;
  uint8_t *plugin = td_read_file(HOST_KERNELS_SO, &plen);
  uint8_t mod[32], pid[32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plen, mod), GRAPHD_OK);
  free(plugin);
  ck_assert_int_eq(program3_register(c, mod, GRAPHD_MODE_STAGED, N, pid), GRAPHD_OK);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  float *x, *cc, *y;
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&x), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&cc), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&y), GRAPHD_OK);
  graphd_binding bd[3] = {{0, (uint64_t)(uintptr_t)x, N * 4},
                          {3, (uint64_t)(uintptr_t)y, N * 4},
                          {1, (uint64_t)(uintptr_t)cc, N * 4}};
  /* Three through the socket, five through the ring. */
  for (int i = 0; i < 3; i++) ck_assert_int_eq(graphd_replay(c, s, pid, bd, 3, NULL), GRAPHD_OK);
  uint64_t last = 0;
  for (int i = 0; i < 5; i++)
    ck_assert_int_eq(graphd_replay_async(c, s, pid, bd, 3, &last), GRAPHD_OK);
  ck_assert_int_eq(graphd_stream_wait(s, last, -1), GRAPHD_OK);
  graphd_client *ctl = td_control(&d);
  graphd_device_record r = record_when(ctl, 1, 5);
  ck_assert_uint_eq(r.ring_replays, 5);
  ck_assert_uint_eq(r.work.replays, 8);
  ck_assert_uint_eq(r.info.counters.replays, 8);
  /* The other device took none. */
  ck_assert_uint_eq(record(ctl, 0, sizeof r).ring_replays, 0);
  graphd_close(ctl);
  graphd_stream_detach(s);
  graphd_close(c);
}
END_TEST

/* A kind of request's counters, as a Status on the raw control session fd
 * reports them. */
typedef struct row {
  uint64_t calls, errors, handler_ns;
} row;

static row request_row(int fd, const char *name) {
  static uint64_t id = 100;
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__StatusRequest sreq = GRAPHD__WIRE__STATUS_REQUEST__INIT;
  req.request_id = ++id;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_STATUS;
  req.status = &sreq;
  td_raw_send_request(fd, &req, NULL, 0);
  Graphd__Wire__Reply *r = td_raw_recv(fd, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->body_case, GRAPHD__WIRE__REPLY__BODY_STATUS);
  row out = {0};
  size_t found = 0;
  for (size_t i = 0; i < r->status->n_requests; i++) {
    const Graphd__Wire__RequestCounters *c = r->status->requests[i];
    if (strcmp(c->request, name) != 0) continue;
    out = (row){c->calls, c->errors, c->handler_ns};
    found++;
  }
  ck_assert_msg(found == 1, "%zu rows named %s", found, name);
  graphd__wire__reply__free_unpacked(r, NULL);
  return out;
}

START_TEST(test_counters_each_request_kind_counts_calls_errors_and_time) {
  int raw = td_raw_connect(&d);
  td_raw_hello(raw);
  graphd_client *ctl = td_control(&d);
  /* Pings that are answered: calls, no errors, some time in the handler. */
  row p0 = request_row(raw, "Ping");
  for (int i = 0; i < 7; i++) ck_assert_int_eq(graphd_ping(ctl, "x", 1), GRAPHD_OK);
  row p1 = request_row(raw, "Ping");
  ck_assert_uint_eq(p1.calls - p0.calls, 7);
  ck_assert_uint_eq(p1.errors, p0.errors);
  ck_assert_uint_gt(p1.handler_ns, p0.handler_ns);
  /* A Ping the table refuses (it takes no fds): a call and an error. */
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Ping ping = GRAPHD__WIRE__PING__INIT;
  req.request_id = 7;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_PING;
  req.ping = &ping;
  req.nfds = 1;
  int devnull = open("/dev/null", O_RDONLY);
  td_raw_send_request(raw, &req, &devnull, 1);
  close(devnull);
  td_expect_reply(td_raw_recv(raw, 5000), GRAPHD_INVALID_ARGUMENT, "takes no file descriptors");
  row p2 = request_row(raw, "Ping");
  ck_assert_uint_eq(p2.calls - p1.calls, 1);
  ck_assert_uint_eq(p2.errors - p1.errors, 1);
  /* Status counts itself, one call per ask. */
  row s0 = request_row(raw, "Status"), s1 = request_row(raw, "Status");
  ck_assert_uint_eq(s1.calls - s0.calls, 1);
  ck_assert_uint_eq(s1.errors, 0);
  /* A Replay the worker refuses and answers itself (a binding a byte too
   * short), and one the handler refuses (no such program). */
  row r0 = request_row(raw, "Replay");
  graphd_client *c = td_data(&d, 0);
  size_t plen;
  uint8_t *plugin = td_read_file(HOST_KERNELS_SO, &plen);
  uint8_t mod[32], pid[32], none[32] = {1};
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plen, mod), GRAPHD_OK);
  free(plugin);
  ck_assert_int_eq(program3_register(c, mod, GRAPHD_MODE_STAGED, N, pid), GRAPHD_OK);
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  float *x, *cc, *y;
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&x), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&cc), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&y), GRAPHD_OK);
  graphd_binding bd[3] = {{0, (uint64_t)(uintptr_t)x, N * 4},
                          {3, (uint64_t)(uintptr_t)y, N * 4},
                          {1, (uint64_t)(uintptr_t)cc, N * 4}};
  ck_assert_int_eq(graphd_replay(c, s, pid, bd, 3, NULL), GRAPHD_OK);
  bd[1].bytes = N * 4 - 1;
  ck_assert_int_eq(graphd_replay(c, s, pid, bd, 3, NULL), GRAPHD_INVALID_ARGUMENT);
  bd[1].bytes = N * 4;
  ck_assert_int_eq(graphd_replay(c, s, none, bd, 3, NULL), GRAPHD_NOT_FOUND);
  ck_assert_int_eq(graphd_replay(c, s, pid, bd, 3, NULL), GRAPHD_OK);
  row r1 = request_row(raw, "Replay");
  ck_assert_uint_eq(r1.calls - r0.calls, 4);
  ck_assert_uint_eq(r1.errors - r0.errors, 2);
  /* Every row of the table is there, those never called too. */
  ck_assert_uint_eq(request_row(raw, "UnregisterRegion").calls, 0);
  graphd_stream_detach(s);
  graphd_close(c);
  graphd_close(ctl);
  close(raw);
}
END_TEST

/* Kind `name`'s record from records of `size` bytes each. */
static const graphd_request_record *find_record(const graphd_request_record *a, size_t n,
                                                size_t size, const char *name) {
  for (size_t i = 0; i < n; i++) {
    const graphd_request_record *r = (const void *)((const char *)a + i * size);
    if (strcmp(r->request, name) == 0) return r;
  }
  ck_abort_msg("no request record %s", name);
  return NULL;
}

START_TEST(test_counters_request_records_come_sized) {
  graphd_client *ctl = td_control(&d);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(graphd_ping(ctl, NULL, 0), GRAPHD_OK);
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  graphd_request_record *a;
  size_t n;
  ck_assert_int_eq(graphd_daemon_status_requests(st, sizeof *a, &a, &n), GRAPHD_OK);
  ck_assert_uint_ge(n, 14); /* a row per request kind, Hello to Replay */
  const graphd_request_record *ping = find_record(a, n, sizeof *a, "Ping");
  ck_assert_uint_eq(ping->size, sizeof *a);
  ck_assert_uint_eq(ping->calls, 3);
  ck_assert_uint_eq(ping->errors, 0);
  ck_assert_uint_gt(ping->handler_ns, 0);
  ck_assert_uint_ge(find_record(a, n, sizeof *a, "Hello")->calls, 1);
  ck_assert_uint_eq(find_record(a, n, sizeof *a, "Status")->calls, 1);
  graphd_request_records_free(a);
  /* Records of an older, shorter size: what fits, at that stride. */
  size_t older = offsetof(graphd_request_record, errors);
  ck_assert_int_eq(graphd_daemon_status_requests(st, older, &a, &n), GRAPHD_OK);
  ping = find_record(a, n, older, "Ping");
  ck_assert_uint_eq(ping->size, older);
  ck_assert_uint_eq(ping->calls, 3);
  graphd_request_records_free(a);
  ck_assert_int_eq(graphd_daemon_status_requests(st, 4, &a, &n), GRAPHD_INVALID_ARGUMENT);
  ck_assert_ptr_null(a);
  graphd_daemon_status_free(st);
  graphd_close(ctl);
}
END_TEST

/* The record of session id in st into *r, checked against session_info
 * at its index; false when st has no such session. */
static bool session_record(const graphd_daemon_status *st, uint64_t id, graphd_session_record *r) {
  for (uint32_t i = 0; i < st->nsession_info; i++) {
    if (st->session_info[i].id != id) continue;
    ck_assert_int_eq(graphd_daemon_status_session(st, i, r, sizeof *r), GRAPHD_OK);
    ck_assert_uint_eq(r->size, sizeof *r);
    ck_assert_uint_eq(r->index, i);
    ck_assert_mem_eq(&r->info, &st->session_info[i], sizeof r->info);
    return true;
  }
  return false;
}

/* Session id's record in a new status asked on ctl. */
static graphd_session_record session_now(graphd_client *ctl, uint64_t id) {
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  graphd_session_record r;
  ck_assert_msg(session_record(st, id, &r), "no session %llu in the status",
                (unsigned long long)id);
  graphd_daemon_status_free(st);
  return r;
}

START_TEST(test_counters_session_records_follow_the_session) {
  graphd_client *ctl = td_control(&d);
  graphd_client *c = td_data(&d, 1);
  graphd_session_record r = session_now(ctl, graphd_session_id(c));
  ck_assert_int_eq(r.info.data, 1);
  ck_assert_int_eq(r.info.device, 1);
  ck_assert_uint_eq(r.info.uid, getuid());
  ck_assert_uint_eq(r.gid, getgid());
  ck_assert_int_eq(r.admin, 1); /* the daemon's own user */
  ck_assert_int_eq(r.busy, 0);
  ck_assert_uint_eq(r.flag_slots, 0);
  ck_assert_int_eq(r.has_ring, 0);
  ck_assert_uint_ge(r.age_ms, r.idle_ms);
  /* The asker is busy with its own Status, and a control session. */
  graphd_session_record me = session_now(ctl, graphd_session_id(ctl));
  ck_assert_int_eq(me.info.data, 0);
  ck_assert_int_eq(me.info.device, -1);
  ck_assert_int_eq(me.busy, 1);
  ck_assert_uint_eq(me.gid, getgid());
  /* Left alone, the data session idles and ages by the time slept. */
  graphd_session_record before = session_now(ctl, graphd_session_id(c));
  usleep(400 * 1000);
  graphd_session_record after = session_now(ctl, graphd_session_id(c));
  ck_assert_uint_ge(after.idle_ms, before.idle_ms + 390);
  ck_assert_uint_ge(after.age_ms, before.age_ms + 390);
  ck_assert_uint_ge(after.age_ms, after.idle_ms);
  /* A request of its own starts its idle time again; its age goes on. */
  ck_assert_int_eq(graphd_ping(c, NULL, 0), GRAPHD_OK);
  r = session_now(ctl, graphd_session_id(c));
  ck_assert_uint_lt(r.idle_ms, after.idle_ms);
  ck_assert_uint_ge(r.age_ms, after.age_ms);
  /* A stream gives it the flag page, an asynchronous replay its ring. */
  graphd_stream *s;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  r = session_now(ctl, graphd_session_id(c));
  ck_assert_uint_eq(r.flag_slots, 4096 / GRAPHD_FLAG_STRIDE); /* libgraphd's page */
  ck_assert_int_eq(r.has_ring, 0);
  size_t plen;
  uint8_t *plugin = td_read_file(HOST_KERNELS_SO, &plen);
  uint8_t mod[32], pid[32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plen, mod), GRAPHD_OK);
  free(plugin);
  ck_assert_int_eq(program3_register(c, mod, GRAPHD_MODE_STAGED, N, pid), GRAPHD_OK);
  float *x, *cc, *y;
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&x), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&cc), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, N * 4, (void **)&y), GRAPHD_OK);
  graphd_binding bd[3] = {{0, (uint64_t)(uintptr_t)x, N * 4},
                          {3, (uint64_t)(uintptr_t)y, N * 4},
                          {1, (uint64_t)(uintptr_t)cc, N * 4}};
  uint64_t last = 0;
  ck_assert_int_eq(graphd_replay_async(c, s, pid, bd, 3, &last), GRAPHD_OK);
  ck_assert_int_eq(graphd_stream_wait(s, last, -1), GRAPHD_OK);
  r = session_now(ctl, graphd_session_id(c));
  ck_assert_int_eq(r.has_ring, 1);
  ck_assert_uint_eq(r.info.regions, 3);
  graphd_stream_detach(s);
  graphd_close(c);
  graphd_close(ctl);
}
END_TEST

START_TEST(test_counters_session_records_come_sized) {
  graphd_client *ctl = td_control(&d);
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  ck_assert_uint_eq(st->nsession_info, 1);
  graphd_session_record full;
  ck_assert(session_record(st, graphd_session_id(ctl), &full));
  /* A record of 0.1.0's figures only (an older header's): those, and not
   * a byte past them. */
  size_t older = offsetof(graphd_session_record, age_ms);
  graphd_session_record r;
  memset(&r, 0xa5, sizeof r);
  ck_assert_int_eq(graphd_daemon_status_session(st, 0, &r, older), GRAPHD_OK);
  ck_assert_uint_eq(r.size, older);
  ck_assert_uint_eq(r.index, 0);
  ck_assert_mem_eq(&r.info, &st->session_info[0], sizeof r.info);
  for (size_t k = older; k < sizeof r; k++) ck_assert_uint_eq(((uint8_t *)&r)[k], 0xa5);
  /* A newer header's larger record: what this library knows, the rest
   * zeroed. */
  uint8_t big[sizeof r + 16];
  memset(big, 0xa5, sizeof big);
  ck_assert_int_eq(graphd_daemon_status_session(st, 0, (graphd_session_record *)big, sizeof big),
                   GRAPHD_OK);
  ck_assert_mem_eq(big + sizeof(uint32_t), (uint8_t *)&full + sizeof(uint32_t),
                   sizeof r - sizeof(uint32_t));
  uint32_t size;
  memcpy(&size, big, sizeof size);
  ck_assert_uint_eq(size, sizeof r);
  for (size_t k = sizeof r; k < sizeof big; k++) ck_assert_uint_eq(big[k], 0);
  /* Refused: too small for size and index, no such session, no status. */
  size_t least = offsetof(graphd_session_record, info);
  ck_assert_int_eq(graphd_daemon_status_session(st, 0, &r, least), GRAPHD_OK);
  ck_assert_uint_eq(r.size, least);
  ck_assert_int_eq(graphd_daemon_status_session(st, 0, &r, least - 1), GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(graphd_daemon_status_session(st, 1, &r, sizeof r), GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(graphd_daemon_status_session(NULL, 0, &r, sizeof r), GRAPHD_INVALID_ARGUMENT);
  graphd_daemon_status_free(st);
  graphd_close(ctl);
}
END_TEST

/* In a child as nobody: its own session is nobody's, and no admin's. */
static int nobody_sees_itself(const void *arg) {
  const gd_test_daemon *td = arg;
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = td->socket;
  graphd_client *c;
  if (graphd_connect(&o, &c, NULL, 0) != GRAPHD_OK) return 20;
  graphd_daemon_status *st;
  if (graphd_get_status(c, &st) != GRAPHD_OK) return 21;
  int rc = 22;
  for (uint32_t i = 0; i < st->nsession_info; i++) {
    graphd_session_record r;
    if (st->session_info[i].id != graphd_session_id(c)) continue;
    if (graphd_daemon_status_session(st, i, &r, sizeof r) != GRAPHD_OK)
      rc = 23;
    else if (r.info.uid != 65534 || r.gid != 65534)
      rc = 24;
    else if (r.admin)
      rc = 25;
    else
      rc = 0;
  }
  graphd_daemon_status_free(st);
  graphd_close(c);
  return rc;
}

START_TEST(test_counters_session_records_name_the_peer) {
  if (geteuid() != 0) {
    fprintf(stderr, "not root: another user's session is not seen here\n");
    return;
  }
  ck_assert_int_eq(td_as_nobody(nobody_sees_itself, &d), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("counters");
  TCase *tc = tcase_create("status");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_counters_every_device_counter_is_read_at_its_offset);
  tcase_add_test(tc, test_counters_ring_replays_are_counted_apart);
  tcase_add_test(tc, test_counters_each_request_kind_counts_calls_errors_and_time);
  tcase_add_test(tc, test_counters_request_records_come_sized);
  tcase_add_test(tc, test_counters_session_records_follow_the_session);
  tcase_add_test(tc, test_counters_session_records_come_sized);
  tcase_add_test(tc, test_counters_session_records_name_the_peer);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
