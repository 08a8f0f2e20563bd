/* Modules and programs on the host backend: registration, ids, memfd
 * upload, bad fds, and the device stage through PrepareProgram. */
#define _GNU_SOURCE
#include <check.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graphd/encoding.h"
#include "harness.h"
#include "graphd/frame.h"
#include "graphd/wire.h"

static gd_test_daemon d;
static uint8_t *plugin;
static size_t plugin_len;

static void setup(void) {
  td_start(&d, "--host-devices", "2", NULL);
  plugin = td_read_file(HOST_KERNELS_SO, &plugin_len);
}

static void teardown(void) {
  free(plugin);
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* scale(x, y, a, n) over 256 floats. */
static graphd_program *scale_program(const uint8_t mod[32], const char *fn, uint32_t a_size) {
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  int x = graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, 1024, 1);
  int y = graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, 1024, 1);
  uint32_t grid[3] = {1, 1, 1}, block[3] = {256, 1, 1};
  int s = graphd_program_add_launch(p, mod, fn, grid, block, 0);
  ck_assert_int_ge(s, 0);
  float a = 2.0f;
  uint64_t a8 = 0;
  uint32_t n = 256;
  ck_assert_int_eq(graphd_program_param_slot(p, (uint32_t)s, 0, (uint32_t)x, 0), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_param_slot(p, (uint32_t)s, 8, (uint32_t)y, 0), GRAPHD_OK);
  if (a_size == 4)
    ck_assert_int_eq(graphd_program_param(p, (uint32_t)s, 16, &a, 4), GRAPHD_OK);
  else
    ck_assert_int_eq(graphd_program_param(p, (uint32_t)s, 16, &a8, a_size), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_param(p, (uint32_t)s, 16 + a_size, &n, 4), GRAPHD_OK);
  return p;
}

static void status_counts(graphd_client *c, uint64_t *modules, uint64_t *programs) {
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  *modules = s->modules;
  *programs = s->programs;
  graphd_daemon_status_free(s);
}

START_TEST(test_registry_module_and_program_round_trip) {
  graphd_client *c = td_data(&d, 0);
  uint8_t mod[32], want[32];
  ck_assert_int_eq(graphd_module_id(GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, want), GRAPHD_OK);
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  ck_assert_mem_eq(mod, want, 32);
  /* Registering again is accepted and adds nothing. */
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, NULL),
                   GRAPHD_OK);
  graphd_program *p = scale_program(mod, "scale", 4);
  uint8_t pid[32];
  ck_assert_int_eq(graphd_program_finish(p, pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_OK);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_OK);
  uint64_t nm, np;
  status_counts(c, &nm, &np);
  ck_assert_uint_eq(nm, 1);
  ck_assert_uint_eq(np, 1);
  /* Programs are daemon-wide: another session sees it at once. */
  graphd_client *c1 = td_data(&d, 1);
  graphd_prepare_info info;
  ck_assert_int_eq(graphd_prepare_program(c1, pid, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.modules_loaded, 1);
  graphd_program_free(p);
  graphd_close(c1);
  graphd_close(c);
}
END_TEST

START_TEST(test_registry_module_loads_once_per_device) {
  graphd_client *c0 = td_data(&d, 0), *c1 = td_data(&d, 1);
  uint8_t mod[32], pid[32];
  ck_assert_int_eq(graphd_register_module(c0, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  graphd_program *p = scale_program(mod, "scale", 4);
  ck_assert_int_eq(graphd_register_program(c0, p), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_finish(p, pid), GRAPHD_OK);
  graphd_prepare_info info;
  ck_assert_int_eq(graphd_prepare_program(c0, pid, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.modules_loaded, 1);
  ck_assert_int_eq(graphd_prepare_program(c0, pid, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.modules_loaded, 0);
  /* A second program on the same module: no new load either. */
  graphd_program *q = scale_program(mod, "accumulate", 4);
  graphd_program_free(q);
  ck_assert_int_eq(graphd_prepare_program(c1, pid, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.modules_loaded, 1); /* the other device loads its own */
  ck_assert_int_eq(graphd_prepare_program(c1, pid, &info), GRAPHD_OK);
  ck_assert_uint_eq(info.modules_loaded, 0);
  ck_assert(td_log_contains(&d, "[host0] prepare: module"));
  ck_assert(td_log_contains(&d, "[host1] prepare: module"));
  graphd_program_free(p);
  graphd_close(c0);
  graphd_close(c1);
}
END_TEST

START_TEST(test_registry_large_module_travels_as_a_memfd) {
  graphd_client *c = td_data(&d, 0);
  /* Bytes appended to an ELF file do not change how it loads. */
  size_t big = plugin_len + (600u << 10);
  uint8_t *bytes = calloc(1, big);
  memcpy(bytes, plugin, plugin_len);
  uint8_t mod[32], pid[32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, bytes, big, mod), GRAPHD_OK);
  graphd_program *p = scale_program(mod, "scale", 4);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_finish(p, pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_OK);
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  ck_assert_uint_eq(s->module_bytes, big);
  graphd_daemon_status_free(s);
  graphd_program_free(p);
  free(bytes);
  graphd_close(c);
}
END_TEST

static Graphd__Wire__Reply *raw_register_module(int fd, const uint8_t id[32], uint32_t kind,
                                                const void *inl, size_t inl_len, uint64_t size,
                                                const int *fds, int nfds, uint32_t declared) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterModule m = GRAPHD__WIRE__REGISTER_MODULE__INIT;
  req.request_id = 77;
  req.nfds = declared;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_MODULE;
  req.register_module = &m;
  m.module_id.data = (uint8_t *)id;
  m.module_id.len = 32;
  m.kind = kind;
  m.inline_bytes.data = (uint8_t *)inl;
  m.inline_bytes.len = inl_len;
  m.size = size;
  td_raw_send_request(fd, &req, fds, nfds);
  return td_raw_recv(fd, 5000);
}

START_TEST(test_registry_refuses_wrong_ids_and_bad_fds) {
  int fd = td_raw_connect(&d);
  td_raw_hello(fd);
  uint8_t id[32];
  gd_module_id(GD_MODULE_HOST_ELF, plugin, plugin_len, id);
  uint8_t wrong[32];
  memcpy(wrong, id, 32);
  wrong[0] ^= 1;
  td_expect_reply(
      raw_register_module(fd, wrong, GD_MODULE_HOST_ELF, plugin, plugin_len, 0, NULL, 0, 0),
      GRAPHD_INVALID_ARGUMENT, "module id mismatch");
  td_expect_reply(raw_register_module(fd, id, 9, plugin, plugin_len, 0, NULL, 0, 0),
                  GRAPHD_INVALID_ARGUMENT, "kind 9");
  td_expect_reply(raw_register_module(fd, id, GD_MODULE_HOST_ELF, plugin, 10, 0, NULL, 0, 0),
                  GRAPHD_INVALID_ARGUMENT, "module id mismatch");
  /* A pipe is not a memfd. */
  int pfd[2];
  ck_assert_int_eq(pipe(pfd), 0);
  td_expect_reply(
      raw_register_module(fd, id, GD_MODULE_HOST_ELF, NULL, 0, plugin_len, &pfd[0], 1, 1),
      GRAPHD_INVALID_ARGUMENT, "not a memfd");
  /* An unsealed memfd can change after we hash it: refused. */
  int mfd = memfd_create("unsealed", MFD_CLOEXEC);
  ck_assert_int_eq(write(mfd, plugin, plugin_len), (ssize_t)plugin_len);
  td_expect_reply(raw_register_module(fd, id, GD_MODULE_HOST_ELF, NULL, 0, plugin_len, &mfd, 1, 1),
                  GRAPHD_INVALID_ARGUMENT, "must be sealed");
  /* Sealed, but the size disagrees. */
  int sfd = memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ck_assert_int_eq(write(sfd, plugin, plugin_len), (ssize_t)plugin_len);
  ck_assert_int_eq(fcntl(sfd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW), 0);
  td_expect_reply(
      raw_register_module(fd, id, GD_MODULE_HOST_ELF, NULL, 0, plugin_len + 1, &sfd, 1, 1),
      GRAPHD_INVALID_ARGUMENT, "holds");
  /* Both inline bytes and a memfd. */
  td_expect_reply(
      raw_register_module(fd, id, GD_MODULE_HOST_ELF, plugin, plugin_len, plugin_len, &sfd, 1, 1),
      GRAPHD_INVALID_ARGUMENT, "both inline bytes and a memfd");
  /* Two fds where one is allowed. */
  int two[2] = {sfd, mfd};
  td_expect_reply(raw_register_module(fd, id, GD_MODULE_HOST_ELF, NULL, 0, plugin_len, two, 2, 2),
                  GRAPHD_INVALID_ARGUMENT, "at most one file descriptor");
  /* The proper sealed memfd works. */
  td_expect_reply(raw_register_module(fd, id, GD_MODULE_HOST_ELF, NULL, 0, plugin_len, &sfd, 1, 1),
                  GRAPHD_OK, NULL);
  /* A closed fd cannot even be sent: the kernel refuses it, and nothing
   * reaches the daemon. */
  int closed = dup(sfd);
  close(closed);
  uint8_t hdr[4] = {0};
  ck_assert_int_eq(gd_frame_sendmsg(fd, hdr, 4, &closed, 1, 0), -1);
  close(mfd);
  close(sfd);
  close(pfd[0]);
  close(pfd[1]);
  /* The session survived all of it. */
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__Ping ping = GRAPHD__WIRE__PING__INIT;
  req.request_id = 99;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_PING;
  req.ping = &ping;
  td_raw_send_request(fd, &req, NULL, 0);
  td_expect_reply(td_raw_recv(fd, 5000), GRAPHD_OK, NULL);
  close(fd);
}
END_TEST

START_TEST(test_registry_program_errors_name_the_step) {
  graphd_client *c = td_data(&d, 0);
  uint8_t mod[32], pid[32];
  /* A program whose module is not registered yet. */
  graphd_module_id(GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod);
  graphd_program *p = scale_program(mod, "scale", 4);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_NOT_FOUND);
  ck_assert_msg(strstr(graphd_last_error(c), "step 0 (launch scale): module"), "%s",
                graphd_last_error(c));
  ck_assert_msg(strstr(graphd_last_error(c), "is not registered"), "%s", graphd_last_error(c));
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, NULL),
                   GRAPHD_OK);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_OK);
  /* The daemon re-hashes: a wrong id is refused. */
  const uint8_t *enc;
  size_t len;
  ck_assert_int_eq(graphd_program_finish(p, pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_encoding(p, &enc, &len), GRAPHD_OK);
  uint8_t bad[32];
  memcpy(bad, pid, 32);
  bad[31] ^= 0x80;
  ck_assert_int_eq(graphd_register_program_encoding(c, bad, enc, len), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c), "program id mismatch"), "%s", graphd_last_error(c));
  /* Structural errors come back with the step named. */
  uint8_t *mut = malloc(len);
  memcpy(mut, enc, len);
  mut[8] = 7; /* the mode field */
  uint8_t mid[32];
  gd_sha256(mut, len, mid);
  ck_assert_int_eq(graphd_register_program_encoding(c, mid, mut, len), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c), "mode 7"), "%s", graphd_last_error(c));
  free(mut);
  /* Prepare of an unknown program. */
  ck_assert_int_eq(graphd_prepare_program(c, bad, NULL), GRAPHD_NOT_FOUND);
  graphd_program_free(p);
  graphd_close(c);
}
END_TEST

START_TEST(test_registry_device_stage_checks_functions_and_parameters) {
  graphd_client *c = td_data(&d, 0);
  uint8_t mod[32], pid[32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  /* No such function. */
  graphd_program *p = scale_program(mod, "no_such_kernel", 4);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_OK);
  graphd_program_finish(p, pid);
  ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_NOT_FOUND);
  ck_assert_msg(
      strstr(graphd_last_error(c),
             "step 0 (launch no_such_kernel): the module has no function 'no_such_kernel'"),
      "%s", graphd_last_error(c));
  graphd_program_free(p);
  /* The scalar is 8 bytes where the kernel takes 4. */
  p = scale_program(mod, "scale", 8);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_OK);
  graphd_program_finish(p, pid);
  ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c),
                       "step 0 (launch scale): parameter 2 is 8 bytes at offset 16, but the "
                       "kernel's parameter 2 is 4 bytes at offset 16"),
                "%s", graphd_last_error(c));
  graphd_program_free(p);
  /* Parameter count mismatch. */
  p = scale_program(mod, "accumulate", 4);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_OK);
  graphd_program_finish(p, pid);
  ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c), "passes 4 parameters but the kernel takes 3"), "%s",
                graphd_last_error(c));
  graphd_program_free(p);
  /* Kernels without a description are not size-checked on host devices. */
  p = scale_program(mod, "undescribed", 4);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_OK);
  graphd_program_finish(p, pid);
  ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_OK);
  graphd_program_free(p);
  /* Errors count on the device. */
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  ck_assert_uint_eq(s->devices[0].counters.errors, 3);
  graphd_daemon_status_free(s);
  graphd_close(c);
}
END_TEST

START_TEST(test_registry_broken_module_reports_the_loader_error_once) {
  graphd_client *c = td_data(&d, 0);
  uint8_t mod[32], pid[32];
  const char junk[] = "this is not an ELF file";
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, junk, sizeof junk, mod),
                   GRAPHD_OK);
  graphd_program *p = scale_program(mod, "scale", 4);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_OK);
  graphd_program_finish(p, pid);
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_INVALID_ARGUMENT);
    ck_assert_msg(strstr(graphd_last_error(c), "cannot load the host module"), "%s",
                  graphd_last_error(c));
  }
  /* CUDA code cannot run on a host device. */
  const char ptx[] = ".version 8.0\n.target sm_90\n";
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_PTX, ptx, sizeof ptx, mod), GRAPHD_OK);
  graphd_program_free(p);
  p = scale_program(mod, "scale", 4);
  ck_assert_int_eq(graphd_register_program(c, p), GRAPHD_OK);
  graphd_program_finish(p, pid);
  ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_FAILED_PRECONDITION);
  ck_assert_msg(strstr(graphd_last_error(c), "host devices run host ELF modules only"), "%s",
                graphd_last_error(c));
  graphd_program_free(p);
  graphd_close(c);
}
END_TEST

START_TEST(test_registry_prepare_needs_a_data_session) {
  graphd_client *c = td_control(&d);
  uint8_t id[32] = {0};
  ck_assert_int_eq(graphd_prepare_program(c, id, NULL), GRAPHD_FAILED_PRECONDITION);
  ck_assert_msg(strstr(graphd_last_error(c), "needs a data session"), "%s", graphd_last_error(c));
  graphd_close(c);
}
END_TEST

START_TEST(test_registry_client_side_registry_syncs_sessions_on_demand) {
  uint8_t mod[32], pid[32];
  ck_assert_int_eq(graphd_registry_add_module(GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  graphd_program *p = scale_program(mod, "scale", 4);
  const uint8_t *enc;
  size_t len;
  ck_assert_int_eq(graphd_program_finish(p, pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_encoding(p, &enc, &len), GRAPHD_OK);
  ck_assert_int_eq(graphd_registry_add_program(pid, enc, len), GRAPHD_OK);
  /* A wrong id is refused; adding twice is fine. */
  uint8_t bad[32];
  memcpy(bad, pid, 32);
  bad[0] ^= 1;
  ck_assert_int_eq(graphd_registry_add_program(bad, enc, len), GRAPHD_INVALID_ARGUMENT);
  ck_assert_int_eq(graphd_registry_add_program(pid, enc, len), GRAPHD_OK);
  graphd_program_free(p);

  graphd_client *c = td_data(&d, 0);
  uint64_t nm, np;
  status_counts(c, &nm, &np);
  ck_assert_uint_eq(np, 0);
  ck_assert_int_eq(graphd_registry_sync(c, pid), GRAPHD_OK);
  status_counts(c, &nm, &np);
  ck_assert_uint_eq(nm, 1);
  ck_assert_uint_eq(np, 1);
  ck_assert_int_eq(graphd_registry_sync(c, pid), GRAPHD_OK); /* once per handle */
  ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_OK);
  graphd_close(c);
  graphd_client *ctl = td_control(&d);
  ck_assert_int_eq(graphd_registry_sync(ctl, bad), GRAPHD_NOT_FOUND);
  ck_assert_msg(strstr(graphd_last_error(ctl), "not in this process's registry"), "%s",
                graphd_last_error(ctl));
  graphd_close(ctl);

  /* After a daemon restart, a new handle gets everything again. */
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
  td_start(&d, "--host-devices", "2", NULL);
  c = td_data(&d, 1);
  ck_assert_int_eq(graphd_registry_sync(c, pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_OK);
  graphd_close(c);
}
END_TEST

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Hashing the largest module takes a while: it happens off the loop, so
 * other sessions are served meanwhile. A 512 MiB module under a wrong id
 * is refused, and pings on another session are answered while it hashes. */
START_TEST(test_registry_hashes_large_modules_off_the_loop) {
  size_t big = GD_MAX_MODULE_BYTES;
  int mfd = memfd_create("big-module", MFD_ALLOW_SEALING | MFD_CLOEXEC);
  ck_assert_int_ge(mfd, 0);
  ck_assert_int_eq(ftruncate(mfd, (off_t)big), 0);
  ck_assert_int_eq(fcntl(mfd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW), 0);
  graphd_client *c = td_control(&d);
  int fd = td_raw_connect(&d);
  td_raw_hello(fd);
  uint8_t wrong[32] = {0};
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterModule m = GRAPHD__WIRE__REGISTER_MODULE__INIT;
  req.request_id = 78;
  req.nfds = 1;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_MODULE;
  req.register_module = &m;
  m.module_id.data = wrong;
  m.module_id.len = 32;
  m.kind = GRAPHD_MODULE_HOST_ELF;
  m.size = big;
  td_raw_send_request(fd, &req, &mfd, 1);
  double t0 = now_ms(), worst = 0;
  int pings = 0;
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  while (poll(&pf, 1, 0) == 0 && now_ms() - t0 < 20000) {
    double p0 = now_ms();
    ck_assert_int_eq(graphd_ping(c, "x", 1), GRAPHD_OK);
    double dt = now_ms() - p0;
    if (dt > worst) worst = dt;
    pings++;
  }
  Graphd__Wire__Reply *r = td_raw_recv(fd, 20000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->code, GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(r->message, "module id mismatch"), "%s", r->message);
  printf(
      "FIGURE 512 MiB module hashed in %.0f ms; %d pings answered meanwhile, the slowest in "
      "%.2f ms\n",
      now_ms() - t0, pings, worst);
  ck_assert_msg(pings >= 5, "only %d pings were answered while the module was hashed", pings);
  graphd__wire__reply__free_unpacked(r, NULL);
  close(fd);
  close(mfd);
  graphd_close(c);
}
END_TEST

/* Host modules are native code the daemon loads: a client that is not an
 * admin may register a new one only when its id is in the allow-list, and
 * may name again one an admin registered. */
typedef struct module_bytes {
  const uint8_t *bytes;
  size_t len;
} module_bytes;

static int nobody_registers(const void *arg) {
  const module_bytes *m = arg;
  graphd_client *c = td_control(&d);
  uint8_t mod[32];
  graphd_status st = graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, m->bytes, m->len, mod);
  int out = st == GRAPHD_OK ? 0 : st == GRAPHD_PERMISSION_DENIED ? 1 : 20 + (int)st;
  if (out == 1 && !strstr(graphd_last_error(c), "--host-module-allow")) out = 30;
  graphd_close(c);
  return out;
}

static int as_nobody(const uint8_t *bytes, size_t len) {
  module_bytes m = {bytes, len};
  return td_as_nobody(nobody_registers, &m);
}

START_TEST(test_registry_host_modules_need_an_admin_or_the_allow_list) {
  if (geteuid() != 0) {
    fprintf(stderr, "not root: the host module rule is not exercised here\n");
    return;
  }
  /* A second module: the plugin with bytes after its end, another id. */
  size_t len2 = plugin_len + 64;
  uint8_t *listed = calloc(1, len2);
  memcpy(listed, plugin, plugin_len);
  uint8_t id[32];
  ck_assert_int_eq(graphd_module_id(GRAPHD_MODULE_HOST_ELF, listed, len2, id), GRAPHD_OK);
  char path[] = "/tmp/graphd-allow-XXXXXX";
  int afd = mkstemp(path);
  ck_assert_int_ge(afd, 0);
  char hex[65];
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02X", id[i]);
  dprintf(afd, "# modules anyone may bring\n\n  %s  # the listed one\n", hex);
  close(afd);
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
  td_start(&d, "--host-devices", "1", "--host-module-allow", path, "--socket-mode", "0666", NULL);
  ck_assert_int_eq(chmod(d.dir, 0755), 0);

  ck_assert_int_eq(as_nobody(plugin, plugin_len), 1);
  ck_assert_int_eq(as_nobody(listed, len2), 0);
  graphd_client *root = td_control(&d);
  uint8_t mod[32];
  ck_assert_int_eq(graphd_register_module(root, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  graphd_close(root);
  ck_assert_int_eq(as_nobody(plugin, plugin_len), 0);
  ck_assert(td_log_contains(&d, "1 host module(s) allowed"));
  unlink(path);
  free(listed);
}
END_TEST

int main(void) {
  Suite *s = suite_create("registry");
  TCase *tc = tcase_create("registry");
  tcase_set_timeout(tc, 30);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_registry_module_and_program_round_trip);
  tcase_add_test(tc, test_registry_module_loads_once_per_device);
  tcase_add_test(tc, test_registry_large_module_travels_as_a_memfd);
  tcase_add_test(tc, test_registry_refuses_wrong_ids_and_bad_fds);
  tcase_add_test(tc, test_registry_program_errors_name_the_step);
  tcase_add_test(tc, test_registry_device_stage_checks_functions_and_parameters);
  tcase_add_test(tc, test_registry_broken_module_reports_the_loader_error_once);
  tcase_add_test(tc, test_registry_prepare_needs_a_data_session);
  tcase_add_test(tc, test_registry_client_side_registry_syncs_sessions_on_demand);
  tcase_add_test(tc, test_registry_hashes_large_modules_off_the_loop);
  tcase_add_test(tc, test_registry_host_modules_need_an_admin_or_the_allow_list);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
