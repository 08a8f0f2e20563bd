/* turns_bench: the daemon's worker time a replay by the order in which a
 * scan's steps call their programs, on a host device. A program of K
 * launches of the host kernel `scale` over 2K slots (2K bindings, 256
 * floats each) is replayed asynchronously, back to back on one stream,
 * waited for every 32 replays, for --seconds, in four orders:
 *
 *   one        one program on the same buffers every call (the anchor);
 *   programs   two programs in turn (a scan step that makes two calls,
 *              as MuJoCo MJX's does), each on its own buffers;
 *   sets       one program on two sets of buffers in turn (a scan's
 *              carry that alternates);
 *   both       two programs, each on two sets in turn (a period of four).
 *
 * Each against the same daemon, the worker's mean time a replay over the
 * order's replays from Status (worker_replay_ns over worker_replays), and
 * the ratio to the anchor's, and of it the time running the kernels
 * (worker_launch_ns: on a host device the launch is the run) and the rest. The host kernels run on the worker and count
 * in its time alike in every order; what differs is the work per binding
 * the worker does again when a replay does not name what it resolved
 * lately. Prints FIGURE lines and a RESULT line; asserts nothing. Exit 1
 * when something fails, 2 for bad arguments, 77 when the daemon's device
 * 0 is not a host device. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "graphd/graphd.h"
#include "bench_util.h"
#include "program3.h"

#ifndef GRAPHD_BENCH_KERNEL_DIR
#define GRAPHD_BENCH_KERNEL_DIR "tests/kernels"
#endif

#define FLOATS 256u /* a slot's floats: the least `scale` takes */
#define SYNC_EVERY 32

typedef struct order {
  const char *name;
  int programs, sets; /* in turn */
} order;

static const order ORDERS[] = {{"one", 1, 1}, {"programs", 2, 1}, {"sets", 1, 2}, {"both", 2, 2}};
#define NORDERS (sizeof ORDERS / sizeof ORDERS[0])

static int fail(graphd_client *c, const char *what) {
  fprintf(stderr, "turns_bench: %s: %s\n", what, c ? graphd_last_error(c) : "");
  return 1;
}

/* Device 0's worker time in the replay path, of it in launches (on a host
 * device, the kernels' run), and its replays, from Status. */
static int worker_figures(graphd_client *c, uint64_t *ns, uint64_t *launch, uint64_t *replays) {
  graphd_daemon_status *s;
  if (graphd_get_status(c, &s) != GRAPHD_OK) return fail(c, "status");
  graphd_device_record r;
  graphd_status st = graphd_daemon_status_device(s, 0, &r, sizeof r);
  graphd_daemon_status_free(s);
  if (st != GRAPHD_OK) return fail(NULL, "status: no device 0");
  *ns = r.work.replay_ns;
  *launch = r.launch_ns;
  *replays = r.work.replays;
  return 0;
}

int main(int argc, char **argv) {
  const char *sock = NULL, *kdir = GRAPHD_BENCH_KERNEL_DIR;
  unsigned k = 175; /* launches: 350 bindings, MJX's step has 351 slots */
  double seconds = 2.0;
  static const struct option longopts[] = {
      {"socket", required_argument, NULL, 's'},   {"kernels", required_argument, NULL, 'k'},
      {"launches", required_argument, NULL, 'l'}, {"seconds", required_argument, NULL, 't'},
      {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0}};
  for (int ch; (ch = getopt_long(argc, argv, "", longopts, NULL)) != -1;) {
    switch (ch) {
      case 's': sock = optarg; break;
      case 'k': kdir = optarg; break;
      case 'l': k = (unsigned)strtoul(optarg, NULL, 10); break;
      case 't': seconds = strtod(optarg, NULL); break;
      default:
        fprintf(ch == 'h' ? stdout : stderr,
                "usage: turns_bench [--socket PATH] [--kernels DIR] [--launches K] "
                "[--seconds S]\n"
                "  against a daemon with a host device 0 (graphd --backend host): the worker's\n"
                "  time a replay when two programs, or two sets of buffers, take turns,\n"
                "  beside one program on the same buffers. --launches K (default 175, 2 to\n"
                "  2000): K launches over 2K slots; --seconds S (default 2, 0.1 to 600) an "
                "order.\n");
        return ch == 'h' ? 0 : 2;
    }
  }
  if (optind < argc || k < 2 || k > 2000 || !(seconds >= 0.1 && seconds <= 600)) {
    fprintf(stderr, "turns_bench: bad arguments (--help says which)\n");
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/host_kernels.so", kdir);
  size_t len;
  void *elf = gd_read_file(path, &len);
  if (!elf) {
    fprintf(stderr, "turns_bench: cannot read %s (--kernels DIR)\n", path);
    return 2;
  }
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = sock;
  o.kind = GRAPHD_SESSION_CONTROL;
  o.client_name = "turns_bench";
  graphd_client *ctl, *c;
  char err[GRAPHD_ERRMAX];
  if (graphd_connect(&o, &ctl, err, sizeof err) != GRAPHD_OK) {
    fprintf(stderr, "turns_bench: connect: %s\n", err);
    return 1;
  }
  graphd_daemon_status *s0;
  if (graphd_get_status(ctl, &s0) != GRAPHD_OK) return fail(ctl, "status");
  if (!s0->ndevices || strcmp(s0->devices[0].backend, "host") != 0) {
    fprintf(stderr, "turns_bench: device 0 is not a host device (start graphd --backend host)\n");
    graphd_daemon_status_free(s0);
    return 77;
  }
  memcpy(o.device_uuid, s0->devices[0].uuid, 16);
  graphd_daemon_status_free(s0);
  o.kind = GRAPHD_SESSION_DATA;
  if (graphd_connect(&o, &c, err, sizeof err) != GRAPHD_OK) {
    fprintf(stderr, "turns_bench: connect: %s\n", err);
    return 1;
  }
  uint8_t mod[32], pid[2][32];
  if (graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, elf, len, mod) != GRAPHD_OK)
    return fail(c, "register the host kernels");
  free(elf);
  /* Two programs of the same size: K and K launches of other factors
   * would be the same program, so the second has one launch less. */
  const unsigned ks[2] = {k, k - 1};
  for (int p = 0; p < 2; p++)
    if (wide_program_register(c, mod, GRAPHD_MODE_DIRECT, ks[p], FLOATS, pid[p]) != GRAPHD_OK)
      return fail(c, "register a program");
  graphd_stream *s;
  if (graphd_stream_attach(c, NULL, &s) != GRAPHD_OK) return fail(c, "attach a stream");
  graphd_binding *bd[2][2];
  for (int p = 0; p < 2; p++)
    for (int set = 0; set < 2; set++) {
      if (!(bd[p][set] = calloc(2 * ks[p], sizeof **bd[p]))) return fail(NULL, "out of memory");
      for (unsigned j = 0; j < 2 * ks[p]; j++) {
        void *m;
        if (graphd_host_alloc(c, FLOATS * 4, &m) != GRAPHD_OK) return fail(c, "host_alloc");
        memset(m, 0, FLOATS * 4);
        bd[p][set][j] =
            (graphd_binding){.slot = j, .ptr = (uint64_t)(uintptr_t)m, .bytes = FLOATS * 4};
      }
    }
  printf(
      "turns_bench: %u launches, %u bindings a replay, direct mode, host device; %.1f s an "
      "order\n",
      k, 2 * k, seconds);
  double us[NORDERS];
  for (size_t i = 0; i < NORDERS; i++) {
    const order *w = &ORDERS[i];
    uint64_t seq = 0, ns0, l0, n0, ns1, l1, n1;
    /* Every buffer set of the order once (captures, regions) before the
     * measurement. */
    for (int r = 0; r < 4; r++) {
      int p = r % w->programs, set = (r / w->programs) % w->sets;
      if (graphd_replay_async(c, s, pid[p], bd[p][set], 2 * ks[p], &seq) != GRAPHD_OK)
        return fail(c, "replay");
    }
    if (graphd_stream_wait(s, seq, -1) != GRAPHD_OK) return fail(c, "wait");
    if (worker_figures(ctl, &ns0, &l0, &n0)) return 1;
    double t0 = bench_now_us(), t;
    long done = 0;
    do {
      for (int j = 0; j < SYNC_EVERY; j++, done++) {
        int p = (int)(done % w->programs), set = (int)((done / w->programs) % w->sets);
        if (graphd_replay_async(c, s, pid[p], bd[p][set], 2 * ks[p], &seq) != GRAPHD_OK)
          return fail(c, "replay");
      }
      if (graphd_stream_wait(s, seq, -1) != GRAPHD_OK) return fail(c, "wait");
      t = bench_now_us();
    } while (t - t0 < seconds * 1e6);
    /* The rings' tallies reach Status within a few ms. */
    for (int tries = 0; tries < 100; tries++) {
      if (worker_figures(ctl, &ns1, &l1, &n1)) return 1;
      if (n1 - n0 >= (uint64_t)done) break;
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    double n = n1 > n0 ? (double)(n1 - n0) : 1.0;
    us[i] = (double)(ns1 - ns0) / n / 1e3;
    double run = (double)(l1 - l0) / n / 1e3;
    printf(
        "FIGURE turns %s: the worker %.2f us a replay, %.2fx the anchor's; %.2f us of it "
        "running the kernels, %.2f the rest (%ld replays, %.0f a second)\n",
        w->name, us[i], us[0] > 0 ? us[i] / us[0] : 0.0, run, us[i] - run, done,
        (double)done / (t - t0) * 1e6);
  }
  printf("RESULT turns_launches=%u", k);
  for (size_t i = 0; i < NORDERS; i++) printf(" turns_%s_us=%.2f", ORDERS[i].name, us[i]);
  printf("\n");
  graphd_stream_detach(s);
  graphd_close(c);
  graphd_close(ctl);
  for (int p = 0; p < 2; p++)
    for (int set = 0; set < 2; set++) free(bd[p][set]);
  return 0;
}
