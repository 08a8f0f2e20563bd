/* The registry's limits on the host backend: per-uid and total limits on
 * programs and module bytes, unused entries freed least recently used
 * first (with their captures on every device), a refusal that names the
 * limit while every entry is held, and that clears once sessions close;
 * a freed program registered again replays exactly. */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "program3.h"

static gd_test_daemon d;
static uint8_t *plugin;
static size_t plugin_len;

static void setup(void) { plugin = td_read_file(HOST_KERNELS_SO, &plugin_len); }

static void teardown(void) {
  free(plugin);
  if (d.pid > 0) ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

/* Closes c and waits until the daemon has ended its session (a closed
 * session lets go of what it held only then). */
static void close_and_wait(graphd_client *c) {
  graphd_client *ctl = td_control(&d);
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  uint64_t before = st->sessions;
  graphd_daemon_status_free(st);
  graphd_close(c);
  for (int i = 0; i < 500; i++) {
    ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
    uint64_t now = st->sessions;
    graphd_daemon_status_free(st);
    if (now < before) break;
    usleep(2000);
  }
  graphd_close(ctl);
}

/* A data session on device 0 with the host module registered. */
static graphd_client *session(uint8_t mod[32]) {
  graphd_client *c = td_data(&d, 0);
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  return c;
}

/* Program k: the 3-kernel program over 256 (k + 1) floats. */
static graphd_status program_k(graphd_client *c, const uint8_t mod[32], int k, uint8_t pid[32]) {
  return program3_register(c, mod, GRAPHD_MODE_STAGED, 256u * (uint32_t)(k + 1), pid);
}

/* Whether program k is registered: PrepareProgram finds it or not. */
static bool registered(graphd_client *c, const uint8_t pid[32]) {
  graphd_status st = graphd_prepare_program(c, pid, NULL);
  ck_assert_msg(st == GRAPHD_OK || st == GRAPHD_NOT_FOUND, "%s", graphd_last_error(c));
  return st == GRAPHD_OK;
}

/* One replay of program k on c, checked element by element. */
static void replay_checked(graphd_client *c, const uint8_t pid[32], int k) {
  uint32_t n = 256u * (uint32_t)(k + 1);
  graphd_stream *s;
  float *x, *cc, *y;
  ck_assert_int_eq(graphd_stream_attach(c, NULL, &s), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, n * 4, (void **)&x), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, n * 4, (void **)&cc), GRAPHD_OK);
  ck_assert_int_eq(graphd_host_alloc(c, n * 4, (void **)&y), GRAPHD_OK);
  for (uint32_t i = 0; i < n; i++) {
    x[i] = (float)(i % 97);
    cc[i] = (float)(i % 5);
  }
  graphd_binding b[3] = {{0, (uint64_t)(uintptr_t)x, n * 4},
                         {3, (uint64_t)(uintptr_t)y, n * 4},
                         {1, (uint64_t)(uintptr_t)cc, n * 4}};
  ck_assert_int_eq(graphd_replay(c, s, pid, b, 3, NULL), GRAPHD_OK);
  for (uint32_t i = 0; i < n; i++) ck_assert(y[i] == (2.0f * x[i] + cc[i]) * 2.0f + 1.0f);
  graphd_stream_detach(s);
  graphd_host_free(c, x);
  graphd_host_free(c, cc);
  graphd_host_free(c, y);
}

static uint64_t programs_registered(void) {
  graphd_client *ctl = td_control(&d);
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  uint64_t n = st->programs;
  graphd_daemon_status_free(st);
  graphd_close(ctl);
  return n;
}

/* --max-programs-per-uid 4: programs of closed sessions make room for new
 * ones, the least recently used first; a freed program's capture goes with
 * it, and registered again it replays exactly. */
START_TEST(test_quota_unused_programs_make_room_least_recently_used_first) {
  td_start(&d, "--host-devices", "1", "--max-programs-per-uid", "4", NULL);
  uint8_t mod[32], pid[8][32];
  graphd_client *a = session(mod);
  ck_assert_int_eq(program_k(a, mod, 0, pid[0]), GRAPHD_OK);
  ck_assert_int_eq(program_k(a, mod, 1, pid[1]), GRAPHD_OK);
  replay_checked(a, pid[0], 0); /* a capture on device 0 */
  close_and_wait(a);
  usleep(2000); /* a later last use */
  graphd_client *b = session(mod);
  ck_assert_int_eq(program_k(b, mod, 2, pid[2]), GRAPHD_OK);
  ck_assert_int_eq(program_k(b, mod, 3, pid[3]), GRAPHD_OK);
  close_and_wait(b);
  graphd_client *ctl = td_control(&d);
  graphd_device_counters before = td_device_info(ctl, 0).counters;
  ck_assert_uint_eq(before.captures, 1);

  /* Four registered; a fifth frees one of the first session's two. */
  graphd_client *c = session(mod);
  ck_assert_int_eq(program_k(c, mod, 4, pid[4]), GRAPHD_OK);
  ck_assert_uint_eq(programs_registered(), 4);
  ck_assert_int_eq(program_k(c, mod, 5, pid[5]), GRAPHD_OK);
  ck_assert_uint_eq(programs_registered(), 4);
  ck_assert(!registered(c, pid[0]));
  ck_assert(!registered(c, pid[1]));
  ck_assert(registered(c, pid[2]));
  ck_assert(registered(c, pid[3]));
  /* Program 0's capture went with it (the devices forget after the reply:
   * wait for the count). */
  graphd_device_counters after = td_device_info(ctl, 0).counters;
  for (int i = 0; i < 100 && after.captures; i++) {
    usleep(10000);
    after = td_device_info(ctl, 0).counters;
  }
  ck_assert_uint_eq(after.captures, 0);
  ck_assert_uint_eq(after.staging_bytes, 0);
  ck_assert_uint_eq(after.evictions, before.evictions + 1);

  /* This session now holds 2, 3, 4 and 5: registering 0 again is over the
   * limit with nothing to free. */
  ck_assert_int_eq(program_k(c, mod, 0, pid[0]), GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(graphd_last_error(c), "max-programs-per-uid (4)"), "%s",
                graphd_last_error(c));
  close_and_wait(c);
  /* Once it closed, program 0 comes back and replays exactly. */
  graphd_client *e = session(mod);
  ck_assert_int_eq(program_k(e, mod, 0, pid[0]), GRAPHD_OK);
  replay_checked(e, pid[0], 0);
  ck_assert_uint_eq(programs_registered(), 4);
  close_and_wait(e);
  graphd_close(ctl);
}
END_TEST

/* The limit held by open sessions: the refusal names it, and it clears
 * once the session holding them closes. */
START_TEST(test_quota_refusal_while_held_clears_when_the_holder_closes) {
  td_start(&d, "--host-devices", "1", "--max-programs-per-uid", "2", NULL);
  uint8_t mod[32], pid[3][32];
  graphd_client *a = session(mod);
  ck_assert_int_eq(program_k(a, mod, 0, pid[0]), GRAPHD_OK);
  ck_assert_int_eq(program_k(a, mod, 1, pid[1]), GRAPHD_OK);
  graphd_client *b = session(mod);
  ck_assert_int_eq(program_k(b, mod, 2, pid[2]), GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(graphd_last_error(b), "max-programs-per-uid (2)"), "%s",
                graphd_last_error(b));
  /* A program already registered costs nothing more. */
  ck_assert_int_eq(program_k(b, mod, 1, pid[1]), GRAPHD_OK);
  close_and_wait(a);
  /* 0 is unused now (b holds 1): it makes room. */
  ck_assert_int_eq(program_k(b, mod, 2, pid[2]), GRAPHD_OK);
  ck_assert(registered(b, pid[1]));
  ck_assert(!registered(b, pid[0]));
  close_and_wait(b);
}
END_TEST

/* The registry as a whole (--max-programs), with no per-uid limit: a user
 * alone holds at most its fair share, half of it (4 / (1 + 1)), and the
 * refusal names the share and the flag; the programs no session holds
 * make room, least recently used first. */
START_TEST(test_quota_total_programs_free_unused_ones) {
  td_start(&d, "--host-devices", "1", "--max-programs", "4", "--max-programs-per-uid", "0", NULL);
  uint8_t mod[32], pid[5][32];
  graphd_client *a = session(mod);
  for (int k = 0; k < 2; k++) ck_assert_int_eq(program_k(a, mod, k, pid[k]), GRAPHD_OK);
  /* Registered, but not held: a holds its share. */
  ck_assert_int_eq(program_k(a, mod, 2, pid[2]), GRAPHD_RESOURCE_EXHAUSTED);
  const char *e = graphd_last_error(a);
  ck_assert_msg(strstr(e, "fair share of programs") && strstr(e, "--max-programs 4"), "%s", e);
  close_and_wait(a);
  /* 2 is the least recently used (0 and 1 were held until a closed). */
  graphd_client *b = session(mod);
  ck_assert_int_eq(program_k(b, mod, 3, pid[3]), GRAPHD_OK);
  ck_assert_uint_eq(programs_registered(), 4);
  ck_assert_int_eq(program_k(b, mod, 4, pid[4]), GRAPHD_OK);
  ck_assert_uint_eq(programs_registered(), 4);
  close_and_wait(b);
  graphd_client *c = session(mod);
  ck_assert(!registered(c, pid[2]));
  ck_assert(registered(c, pid[0]));
  ck_assert(registered(c, pid[1]));
  close_and_wait(c);
}
END_TEST

/* --fair-shares no: one user may hold the whole registry; the next
 * registration is refused as the registry is full, naming the bound. */
START_TEST(test_quota_without_fair_shares_one_user_may_fill_the_registry) {
  td_start(&d, "--host-devices", "1", "--max-programs", "3", "--max-programs-per-uid", "0",
           "--fair-shares", "no", NULL);
  uint8_t mod[32], pid[4][32];
  graphd_client *a = session(mod);
  for (int k = 0; k < 3; k++) ck_assert_int_eq(program_k(a, mod, k, pid[k]), GRAPHD_OK);
  graphd_client *b = session(mod);
  ck_assert_int_eq(program_k(b, mod, 3, pid[3]), GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(graphd_last_error(b), "the program registry is full (max-programs 3)"), "%s",
                graphd_last_error(b));
  close_and_wait(a);
  ck_assert_int_eq(program_k(b, mod, 3, pid[3]), GRAPHD_OK);
  close_and_wait(b);
}
END_TEST

/* Module bytes per uid: unused modules make room, least recently used
 * first; a module a registered program launches stays. Modules are only
 * bytes to the registry (nothing loads them here), so PTX-kind blobs of
 * 1 MiB serve. */
START_TEST(test_quota_module_bytes_per_uid) {
  td_start(&d, "--host-devices", "1", "--max-module-bytes-per-uid", "3M", NULL);
  size_t mb = 1u << 20;
  uint8_t *blob = calloc(1, mb);
  uint8_t id[5][32], mod[32], pid[32];
  graphd_client *a = td_control(&d);
  for (int k = 0; k < 2; k++) {
    memset(blob, 'a' + k, mb - 1); /* PTX is text ending in a NUL */
    ck_assert_int_eq(graphd_register_module(a, GRAPHD_MODULE_PTX, blob, mb, id[k]), GRAPHD_OK);
  }
  close_and_wait(a);
  usleep(2000); /* a later last use */
  /* The host module (small) and a program that launches it, held open. */
  graphd_client *p = session(mod);
  ck_assert_int_eq(program_k(p, mod, 0, pid), GRAPHD_OK);
  graphd_client *b = td_control(&d);
  memset(blob, 'c', mb - 1);
  ck_assert_int_eq(graphd_register_module(b, GRAPHD_MODULE_PTX, blob, mb, id[2]), GRAPHD_OK);
  /* 3 MiB and the host module: one of the first two went, the older. */
  graphd_client *ctl = td_control(&d);
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  ck_assert_uint_eq(st->modules, 3);
  ck_assert_uint_le(st->module_bytes, 3u << 20);
  graphd_daemon_status_free(st);
  /* b holds one, a held none: the fourth frees the other of a's. */
  memset(blob, 'd', mb - 1);
  ck_assert_int_eq(graphd_register_module(b, GRAPHD_MODULE_PTX, blob, mb, id[3]), GRAPHD_OK);
  /* Now b holds two and the host module is launched: a fifth cannot fit. */
  memset(blob, 'e', mb - 1);
  ck_assert_int_eq(graphd_register_module(b, GRAPHD_MODULE_PTX, blob, mb, id[4]),
                   GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(graphd_last_error(b), "max-module-bytes-per-uid (3145728)"), "%s",
                graphd_last_error(b));
  /* The program still prepares: its module stayed. */
  graphd_prepare_info info;
  ck_assert_int_eq(graphd_prepare_program(p, pid, &info), GRAPHD_OK);
  free(blob);
  close_and_wait(b);
  close_and_wait(p);
  graphd_close(ctl);
}
END_TEST

/* Module bytes have a fair share too, and a program held pins the modules
 * it launches: with --max-module-bytes 4M, a user alone holds at most 2M.
 * Its session holding a program (not the module) pins the host module the
 * program launches, so a second 1 MiB module is past the share, the
 * refusal naming what the user holds, the share and the flag; once that
 * session closes, it fits. */
START_TEST(test_quota_module_bytes_fair_share_counts_launched_modules) {
  td_start(&d, "--host-devices", "1", "--max-module-bytes", "4M", "--max-module-bytes-per-uid", "0",
           NULL);
  uint8_t mod[32], pid[32], id[2][32];
  graphd_client *a = session(mod);
  ck_assert_int_eq(program_k(a, mod, 0, pid), GRAPHD_OK);
  close_and_wait(a);
  graphd_client *p = td_data(&d, 0);
  ck_assert_int_eq(graphd_prepare_program(p, pid, NULL), GRAPHD_OK);
  size_t mb = 1u << 20;
  uint8_t *blob = calloc(1, mb);
  graphd_client *c = td_control(&d);
  memset(blob, 'a', mb - 1);
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_PTX, blob, mb, id[0]), GRAPHD_OK);
  memset(blob, 'b', mb - 1);
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_PTX, blob, mb, id[1]),
                   GRAPHD_RESOURCE_EXHAUSTED);
  const char *e = graphd_last_error(c);
  ck_assert_msg(strstr(e, "fair share of module bytes reached"), "%s", e);
  ck_assert_msg(strstr(e, td_fmt("hold %zu and this needs %zu", plugin_len + mb, mb)), "%s", e);
  ck_assert_msg(strstr(e, "past its share of 2097152 (--max-module-bytes 4194304"), "%s", e);
  close_and_wait(p);
  ck_assert_msg(graphd_register_module(c, GRAPHD_MODULE_PTX, blob, mb, id[1]) == GRAPHD_OK, "%s",
                graphd_last_error(c));
  free(blob);
  close_and_wait(c);
}
END_TEST

/* A large program: 8 launches of 30000 parameter bytes each (about 240 KiB
 * in the daemon's memory), told apart by k. */
static graphd_status big_program(graphd_client *c, const uint8_t mod[32], int k, uint8_t pid[32]) {
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, 1024, 1);
  uint32_t grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
  for (uint32_t i = 0; i < 8; i++) {
    int s = graphd_program_add_launch(p, mod, "scale", grid, block, 0);
    ck_assert_int_ge(s, 0);
    graphd_program_param(p, (uint32_t)s, 0, NULL, 30000);
    graphd_program_param(p, (uint32_t)s, 30000, &k, 4);
  }
  graphd_status st = graphd_program_finish(p, pid);
  ck_assert_msg(st == GRAPHD_OK, "%s", graphd_program_error(p));
  st = graphd_register_program(c, p);
  graphd_program_free(p);
  return st;
}

/* Programs are charged by the memory they take, not only counted: four
 * large programs fill a 1M budget per uid; a fifth is refused, naming the
 * limit and its flag, while all four are held, and fits once they are not
 * (the least recently used goes). The whole registry likewise. */
START_TEST(test_quota_program_bytes_per_uid_and_in_all) {
  td_start(&d, "--host-devices", "1", "--max-program-bytes-per-uid", "1M", NULL);
  uint8_t mod[32], pid[6][32];
  graphd_client *a = session(mod);
  for (int k = 0; k < 4; k++) ck_assert_int_eq(big_program(a, mod, k, pid[k]), GRAPHD_OK);
  graphd_client *b = session(mod);
  ck_assert_int_eq(big_program(b, mod, 4, pid[4]), GRAPHD_RESOURCE_EXHAUSTED);
  const char *e = graphd_last_error(b);
  ck_assert_msg(strstr(e, "max-program-bytes-per-uid (1048576) reached"), "%s", e);
  ck_assert_msg(strstr(e, "--max-program-bytes-per-uid"), "%s", e);
  /* Once a no longer holds them, its least recently used program goes. */
  close_and_wait(a);
  ck_assert_int_eq(big_program(b, mod, 4, pid[4]), GRAPHD_OK);
  ck_assert(!registered(b, pid[0]));
  close_and_wait(b);
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);

  /* In all, a user alone holds at most half (its fair share): two. */
  td_start(&d, "--host-devices", "1", "--max-program-bytes", "1M", "--max-program-bytes-per-uid",
           "0", NULL);
  a = session(mod);
  for (int k = 0; k < 2; k++) ck_assert_int_eq(big_program(a, mod, k, pid[k]), GRAPHD_OK);
  ck_assert_int_eq(big_program(a, mod, 2, pid[2]), GRAPHD_RESOURCE_EXHAUSTED);
  e = graphd_last_error(a);
  ck_assert_msg(strstr(e, "fair share of program bytes"), "%s", e);
  ck_assert_msg(strstr(e, "--max-program-bytes 1048576"), "%s", e);
  b = session(mod);
  ck_assert_int_eq(big_program(b, mod, 3, pid[3]), GRAPHD_RESOURCE_EXHAUSTED);
  close_and_wait(a);
  /* Unheld now: 3 fits beside 0, 1 and 2; 4 frees the least recent. */
  ck_assert_int_eq(big_program(b, mod, 3, pid[3]), GRAPHD_OK);
  ck_assert_int_eq(big_program(b, mod, 4, pid[4]), GRAPHD_OK);
  ck_assert(!registered(b, pid[2]));
  close_and_wait(b);
}
END_TEST

/* Another user's programs: a hold costs the holder, the owner is not kept
 * at its limit by holds of others, and program ids are shown only to the
 * users charged for them (and admins). The other user is nobody (65534),
 * in a child process; root runs these checks, others skip them. */
typedef struct other_user {
  const uint8_t *pid[3];
  int ready[2], go[2]; /* pipes: the child says it holds, the parent lets it go */
} other_user;

static void start_as_other(void) {
  ck_assert_int_eq(td_start(&d, "--host-devices", "1", "--max-programs-per-uid", "2",
                            "--socket-mode", "0666", NULL),
                   0);
  ck_assert_int_eq(chmod(d.dir, 0755), 0); /* for the child */
}

/* nobody prepares root's two programs, then registers one of its own:
 * refused, since its holds are charged to it (limit 2). */
static int nobody_pins_two_then_registers(const void *arg) {
  const other_user *o = arg;
  uint8_t mod[32], q[32];
  graphd_client *c = session(mod);
  for (int i = 0; i < 2; i++)
    if (graphd_prepare_program(c, o->pid[i], NULL) != GRAPHD_OK) return 20 + i;
  graphd_status st = program_k(c, mod, 2, q);
  int out = st == GRAPHD_OK                                             ? 1
            : st != GRAPHD_RESOURCE_EXHAUSTED                           ? 2
            : !strstr(graphd_last_error(c), "max-programs-per-uid (2)") ? 3
                                                                        : 0;
  graphd_close(c);
  return out;
}

START_TEST(test_quota_holds_on_another_users_programs_cost_the_holder) {
  if (geteuid() != 0) {
    fprintf(stderr, "not root: the rule between users is not exercised here\n");
    return;
  }
  start_as_other();
  uint8_t mod[32], pid[2][32];
  graphd_client *a = session(mod);
  for (int k = 0; k < 2; k++) ck_assert_int_eq(program_k(a, mod, k, pid[k]), GRAPHD_OK);
  other_user o = {.pid = {pid[0], pid[1]}};
  /* Before, the holds cost nobody nothing and its own program fitted (1). */
  ck_assert_int_eq(td_as_nobody(nobody_pins_two_then_registers, &o), 0);
  close_and_wait(a);
}
END_TEST

/* nobody prepares program 0 and holds it until the parent says go. */
static int nobody_holds(const void *arg) {
  const other_user *o = arg;
  uint8_t mod[32];
  graphd_client *c = session(mod);
  char st = (char)graphd_prepare_program(c, o->pid[0], NULL);
  if (write(o->ready[1], &st, 1) != 1) return 40;
  char go;
  if (read(o->go[0], &go, 1) != 1) return 41;
  graphd_close(c);
  return 0;
}

START_TEST(test_quota_holds_of_another_user_do_not_keep_the_owner_at_its_limit) {
  if (geteuid() != 0) {
    fprintf(stderr, "not root: the rule between users is not exercised here\n");
    return;
  }
  start_as_other();
  uint8_t mod[32], pid[3][32];
  graphd_client *a = session(mod);
  for (int k = 0; k < 2; k++) ck_assert_int_eq(program_k(a, mod, k, pid[k]), GRAPHD_OK);
  close_and_wait(a); /* root's two programs are unused now */
  other_user o = {.pid = {pid[0]}};
  ck_assert_int_eq(pipe(o.ready), 0);
  ck_assert_int_eq(pipe(o.go), 0);
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) _exit(setgid(65534) != 0 || setuid(65534) != 0 ? 10 : nobody_holds(&o));
  close(o.ready[1]); /* a child that dies ends the read below */
  close(o.go[0]);
  char st = -1;
  ck_assert_int_eq(read(o.ready[0], &st, 1), 1);
  ck_assert_int_eq(st, GRAPHD_OK);
  /* Root needs room for two more while nobody holds program 0: program 1
   * goes (unused), and root lets go of program 0, which nobody pays for
   * now. (Before, the second was refused: program 0 was held.) */
  graphd_client *b = session(mod);
  ck_assert_int_eq(program_k(b, mod, 2, pid[2]), GRAPHD_OK);
  uint8_t p3[32];
  ck_assert_msg(program_k(b, mod, 3, p3) == GRAPHD_OK, "%s", graphd_last_error(b));
  ck_assert_int_eq(write(o.go[1], "g", 1), 1);
  int ws;
  ck_assert_int_eq(waitpid(child, &ws, 0), child);
  ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  close_and_wait(b);
  close(o.ready[0]);
  close(o.go[1]);
}
END_TEST

/* nobody lists the captures: root's is not shown to it. */
static int nobody_lists(const void *arg) {
  (void)arg;
  graphd_client *c = td_control(&d);
  graphd_capture_info *ci = NULL;
  size_t n = 99;
  graphd_status st = graphd_list_captures(c, &ci, &n);
  free(ci);
  graphd_close(c);
  return st != GRAPHD_OK ? 50 : (int)n;
}

START_TEST(test_quota_program_ids_are_shown_to_their_owners_only) {
  if (geteuid() != 0) {
    fprintf(stderr, "not root: the rule between users is not exercised here\n");
    return;
  }
  start_as_other();
  uint8_t mod[32], pid[32];
  graphd_client *a = session(mod);
  ck_assert_int_eq(program_k(a, mod, 0, pid), GRAPHD_OK);
  replay_checked(a, pid, 0);
  graphd_capture_info *ci = NULL;
  size_t n = 0;
  ck_assert_int_eq(graphd_list_captures(a, &ci, &n), GRAPHD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_mem_eq(ci[0].program_id, pid, 32);
  free(ci);
  /* Before, nobody saw root's capture and its program id (1). */
  ck_assert_int_eq(td_as_nobody(nobody_lists, NULL), 0);
  close_and_wait(a);
}
END_TEST

/* A program of another user keeps root's module: nobody registers a
 * program that launches the host module root registered (without
 * registering the module itself) and holds it. Root, at its module byte
 * limit, needs room for another module: it lets go of the launched one,
 * which nobody now pays for. (Before, the module was pinned and root was
 * refused until nobody left.) */
static int nobody_launches(const void *arg) {
  const other_user *o = arg;
  graphd_client *c = td_data(&d, 0);
  uint8_t pid[32];
  char st = (char)program_k(c, o->pid[0], 5, pid);
  if (write(o->ready[1], &st, 1) != 1) return 40;
  char go;
  if (read(o->go[0], &go, 1) != 1) return 41;
  graphd_close(c);
  return 0;
}

START_TEST(test_quota_another_users_program_does_not_pin_a_module) {
  if (geteuid() != 0) {
    fprintf(stderr, "not root: the rule between users is not exercised here\n");
    return;
  }
  char lim[32];
  snprintf(lim, sizeof lim, "%zu", plugin_len + 100);
  ck_assert_int_eq(td_start(&d, "--host-devices", "1", "--max-module-bytes-per-uid", lim,
                            "--socket-mode", "0666", NULL),
                   0);
  ck_assert_int_eq(chmod(d.dir, 0755), 0);
  uint8_t mod[32];
  graphd_client *a = td_control(&d);
  ck_assert_int_eq(graphd_register_module(a, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod),
                   GRAPHD_OK);
  close_and_wait(a);
  other_user o = {.pid = {mod}};
  ck_assert_int_eq(pipe(o.ready), 0);
  ck_assert_int_eq(pipe(o.go), 0);
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) _exit(setgid(65534) != 0 || setuid(65534) != 0 ? 10 : nobody_launches(&o));
  close(o.ready[1]);
  close(o.go[0]);
  char st = -1;
  ck_assert_int_eq(read(o.ready[0], &st, 1), 1);
  ck_assert_int_eq(st, GRAPHD_OK);
  /* Another module of root's: the plugin with bytes after its end. */
  size_t len2 = plugin_len + 64;
  uint8_t *other = calloc(1, len2), id2[32];
  memcpy(other, plugin, plugin_len);
  graphd_client *b = td_control(&d);
  ck_assert_msg(graphd_register_module(b, GRAPHD_MODULE_HOST_ELF, other, len2, id2) == GRAPHD_OK,
                "%s", graphd_last_error(b));
  free(other);
  ck_assert_int_eq(write(o.go[1], "g", 1), 1);
  int ws;
  ck_assert_int_eq(waitpid(child, &ws, 0), child);
  ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  close_and_wait(b);
  close(o.ready[0]);
  close(o.go[1]);
}
END_TEST

/* --- fair shares between users ---------------------------------------------- */

/* A child process running fn(arg) as uid (and gid) `uid`: 10 when the
 * switch failed. */
static pid_t spawn_as(uid_t uid, int (*fn)(const void *arg), const void *arg) {
  pid_t p = fork();
  ck_assert_int_ge(p, 0);
  if (p == 0) _exit(setgid(uid) != 0 || setuid(uid) != 0 ? 10 : fn(arg));
  return p;
}

/* Its exit status; -1 when it died of a signal. */
static int child_status(pid_t p) {
  int st;
  ck_assert_int_eq(waitpid(p, &st, 0), p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int run_as(uid_t uid, int (*fn)(const void *arg), const void *arg) {
  return child_status(spawn_as(uid, fn, arg));
}

/* Waits until no session but the caller's control session is open (a
 * closed session lets go of what it held when the daemon ends it). */
static void wait_no_sessions(void) {
  graphd_client *ctl = td_control(&d);
  uint64_t n = 0;
  for (int i = 0; i < 1000; i++) {
    graphd_daemon_status *st;
    ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
    n = st->sessions;
    graphd_daemon_status_free(st);
    if (n <= 1) break;
    usleep(2000);
  }
  ck_assert_uint_le(n, 1);
  graphd_close(ctl);
}

/* One checked replay of program k, in a child: 0, or what went wrong. */
static int replay_ok(graphd_client *c, const uint8_t pid[32], int k) {
  uint32_t n = 256u * (uint32_t)(k + 1);
  graphd_stream *s;
  float *x, *cc, *y;
  if (graphd_stream_attach(c, NULL, &s) != GRAPHD_OK) return 60;
  if (graphd_host_alloc(c, n * 4, (void **)&x) != GRAPHD_OK ||
      graphd_host_alloc(c, n * 4, (void **)&cc) != GRAPHD_OK ||
      graphd_host_alloc(c, n * 4, (void **)&y) != GRAPHD_OK)
    return 61;
  for (uint32_t i = 0; i < n; i++) {
    x[i] = (float)(i % 97);
    cc[i] = (float)(i % 5);
  }
  graphd_binding b[3] = {{0, (uint64_t)(uintptr_t)x, n * 4},
                         {3, (uint64_t)(uintptr_t)y, n * 4},
                         {1, (uint64_t)(uintptr_t)cc, n * 4}};
  if (graphd_replay(c, s, pid, b, 3, NULL) != GRAPHD_OK) return 62;
  for (uint32_t i = 0; i < n; i++)
    if (y[i] != (2.0f * x[i] + cc[i]) * 2.0f + 1.0f) return 63;
  graphd_stream_detach(s);
  return 0;
}

/* What the users of the registry attack share. */
typedef struct share_test {
  uint8_t mod[32];
  uint8_t ids[30][32]; /* programs 0 to 29 (the registering children write them) */
  int first;           /* register_ten: programs first to first + 9 */
} share_test;

/* One user's session that holds what it can of the 30. */
typedef struct holder {
  const share_test *t;
  uid_t uid;
  bool reverse;        /* from program 29 down */
  int ready[2], go[2]; /* pipes: it says how it went, the parent lets it go */
  pid_t pid;
} holder;

/* Registers programs first..first+9 and leaves. */
static int register_ten(const void *arg) {
  share_test *t = (share_test *)arg; /* shared with the parent */
  uint8_t mod[32];
  graphd_client *c = td_data(&d, 0);
  if (graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod) != GRAPHD_OK)
    return 30;
  for (int k = t->first; k < t->first + 10; k++)
    if (program_k(c, mod, k, t->ids[k]) != GRAPHD_OK) return 31;
  graphd_close(c);
  return 0;
}

/* The attack: one session prepares (holds) all 30 programs of the other
 * users, reports how many it got and whether the refusal named the fair
 * share, and holds them until the parent says go. */
static int hold_thirty(const void *arg) {
  const holder *h = arg;
  graphd_client *c = td_data(&d, 0);
  char got = 0, named = 0;
  for (int i = 0; i < 30; i++) {
    graphd_status st = graphd_prepare_program(c, h->t->ids[h->reverse ? 29 - i : i], NULL);
    if (st == GRAPHD_OK) {
      got++;
    } else {
      const char *e = graphd_last_error(c);
      named = st == GRAPHD_RESOURCE_EXHAUSTED &&
              strstr(e, td_fmt("fair share of programs reached: uid %u", (unsigned)h->uid)) &&
              strstr(e, "--max-programs 30");
      if (!named) fprintf(stderr, "uid %u: %s\n", (unsigned)h->uid, e);
      break;
    }
  }
  char msg[2] = {got, named};
  if (write(h->ready[1], msg, 2) != 2) return 40;
  char go;
  if (read(h->go[0], &go, 1) != 1) return 41;
  graphd_close(c);
  return 0;
}

/* Starts h's holder and returns how many programs it got, after checking
 * that its refusal named the share. */
static int start_holder(holder *h) {
  ck_assert_int_eq(pipe(h->ready), 0);
  ck_assert_int_eq(pipe(h->go), 0);
  h->pid = spawn_as(h->uid, hold_thirty, h);
  close(h->ready[1]); /* a child that dies ends the read below */
  close(h->go[0]);
  char msg[2] = {-1, -1};
  ck_assert_int_eq(read(h->ready[0], msg, 2), 2);
  ck_assert_msg(msg[1], "uid %u's refusal did not name its share", (unsigned)h->uid);
  return msg[0];
}

static void stop_holder(holder *h) {
  ck_assert_int_eq(write(h->go[1], "g", 1), 1);
  ck_assert_int_eq(child_status(h->pid), 0);
  close(h->ready[0]);
  close(h->go[1]);
}

/* Another user, meanwhile: connects, registers a program of its own and
 * replays it. */
static int newcomer(const void *arg) {
  (void)arg;
  uint8_t mod[32], pid[32];
  graphd_client *c = td_data(&d, 0);
  if (graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, plugin, plugin_len, mod) != GRAPHD_OK)
    return 50;
  if (program_k(c, mod, 40, pid) != GRAPHD_OK) return 51;
  int rc = replay_ok(c, pid, 40);
  graphd_close(c);
  return rc;
}

/* The registry is a shared pool with a fair share per user: three users
 * register 10 programs each (--max-programs 30) and leave; nobody's one
 * session then prepares all 30. It gets its share, 15 (30 / (1 + 1)), and
 * is refused the 16th naming the share and the flag. A second user does
 * the same from program 29 down: it gets 7, as 8 would leave less free
 * than it holds. Another user then registers and replays a program of its
 * own, and so does root. (Before, nobody held all 30 and every
 * registration of another user was refused, the registry full.) */
START_TEST(test_quota_fair_share_of_the_registry_keeps_room_for_others) {
  if (geteuid() != 0) {
    fprintf(stderr, "not root: the rule between users is not exercised here\n");
    return;
  }
  ck_assert_int_eq(
      td_start(&d, "--host-devices", "1", "--max-programs", "30", "--socket-mode", "0666", NULL),
      0);
  ck_assert_int_eq(chmod(d.dir, 0755), 0);
  share_test *t = mmap(NULL, sizeof *t, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(t, MAP_FAILED);
  graphd_client *a = session(t->mod); /* the host module, from an admin */
  close_and_wait(a);
  for (int u = 0; u < 3; u++) {
    t->first = 10 * u;
    ck_assert_int_eq(run_as(65531 + (uid_t)u, register_ten, t), 0);
  }
  wait_no_sessions();
  ck_assert_uint_eq(programs_registered(), 30);
  holder h1 = {.t = t, .uid = 65534}, h2 = {.t = t, .uid = 65533, .reverse = true};
  int got = start_holder(&h1);
  ck_assert_msg(got == 15, "nobody's session holds %d of the 30 programs", got);
  got = start_holder(&h2);
  ck_assert_msg(got == 7, "uid 65533's session holds %d of the 30 programs", got);
  /* While they hold them: another user, and root. */
  ck_assert_int_eq(run_as(65530, newcomer, NULL), 0);
  uint8_t mod[32], pid[32];
  graphd_client *r = session(mod);
  ck_assert_msg(program_k(r, mod, 41, pid) == GRAPHD_OK, "%s", graphd_last_error(r));
  replay_checked(r, pid, 41);
  close_and_wait(r);
  stop_holder(&h1);
  stop_holder(&h2);
  munmap(t, sizeof *t);
}
END_TEST

int main(void) {
  Suite *s = suite_create("registry_quota");
  TCase *tc = tcase_create("registry_quota");
  tcase_set_timeout(tc, 60);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_quota_unused_programs_make_room_least_recently_used_first);
  tcase_add_test(tc, test_quota_refusal_while_held_clears_when_the_holder_closes);
  tcase_add_test(tc, test_quota_total_programs_free_unused_ones);
  tcase_add_test(tc, test_quota_without_fair_shares_one_user_may_fill_the_registry);
  tcase_add_test(tc, test_quota_module_bytes_per_uid);
  tcase_add_test(tc, test_quota_program_bytes_per_uid_and_in_all);
  tcase_add_test(tc, test_quota_module_bytes_fair_share_counts_launched_modules);
  tcase_add_test(tc, test_quota_holds_on_another_users_programs_cost_the_holder);
  tcase_add_test(tc, test_quota_holds_of_another_user_do_not_keep_the_owner_at_its_limit);
  tcase_add_test(tc, test_quota_program_ids_are_shown_to_their_owners_only);
  tcase_add_test(tc, test_quota_another_users_program_does_not_pin_a_module);
  tcase_add_test(tc, test_quota_fair_share_of_the_registry_keeps_room_for_others);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
