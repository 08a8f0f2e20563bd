/* A program built against libgraphd's headers of 0.1.0 (tests/abi-0.1.0,
 * main's graphd.h before its ABI could grow), run against the library of
 * this tree: what a binary built then does still works. It reads the status
 * through the arrays of that header (devices, work, launch_ns,
 * figures_age_ms), replays on host memory, lists and evicts captures and
 * frees them with free(), and reads error text.
 *
 * Usage: abi_old SOCKET HOST_KERNELS_SO. Exit 0 when every step held; else
 * the failing step is printed on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphd/graphd.h" /* tests/abi-0.1.0/graphd/graphd.h */

#define N 1024u

static int fail(const char *step, graphd_client *c, graphd_status st) {
  fprintf(stderr, "abi_old: %s: %s: %s\n", step, graphd_status_name(st),
          c ? graphd_last_error(c) : "");
  return 1;
}

static void *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *b = malloc((size_t)n);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  *len = (size_t)n;
  return b;
}

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = argv[1];
  o.client_name = "abi-0.1.0";
  char err[GRAPHD_ERRMAX];
  graphd_client *ctl = NULL;
  graphd_status st = graphd_connect(&o, &ctl, err, sizeof err);
  if (st) {
    fprintf(stderr, "abi_old: connect: %s\n", err);
    return 1;
  }
  graphd_daemon_status *s = NULL;
  if ((st = graphd_get_status(ctl, &s))) return fail("status", ctl, st);
  if (s->ndevices != 1 || strcmp(s->devices[0].backend, "host") != 0 ||
      strncmp(s->devices[0].uuid_str, "HOST-", 5) != 0 || !s->work || !s->launch_ns ||
      !s->figures_age_ms || s->nsession_info < 1 ||
      strcmp(s->session_info[s->nsession_info - 1].client_name, "abi-0.1.0") != 0) {
    fprintf(stderr, "abi_old: the status does not read as 0.1.0's header lays it out\n");
    return 1;
  }
  uint8_t uuid[16];
  memcpy(uuid, s->devices[0].uuid, 16);
  graphd_daemon_status_free(s);

  o.kind = GRAPHD_SESSION_DATA;
  memcpy(o.device_uuid, uuid, 16);
  graphd_client *c = NULL;
  if ((st = graphd_connect(&o, &c, err, sizeof err))) {
    fprintf(stderr, "abi_old: data connect: %s\n", err);
    return 1;
  }
  graphd_device_info dev;
  if ((st = graphd_session_device(c, &dev)) || strcmp(dev.state, "ok") != 0)
    return fail("session device", c, st);
  size_t len;
  void *elf = read_file(argv[2], &len);
  if (!elf) return fail("read host kernels", NULL, GRAPHD_NOT_FOUND);
  uint8_t mod[32], pid[32];
  if ((st = graphd_register_module(c, GRAPHD_MODULE_HOST_ELF, elf, len, mod)))
    return fail("register module", c, st);
  free(elf);
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  int x = graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, N * 4, 1);
  int y = graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, N * 4, 1);
  uint32_t grid[3] = {N / 256, 1, 1}, block[3] = {256, 1, 1}, n = N;
  float a = 3.0f;
  int k = graphd_program_add_launch(p, mod, "scale", grid, block, 0);
  graphd_program_param_slot(p, (uint32_t)k, 0, (uint32_t)x, 0);
  graphd_program_param_slot(p, (uint32_t)k, 8, (uint32_t)y, 0);
  graphd_program_param(p, (uint32_t)k, 16, &a, 4);
  graphd_program_param(p, (uint32_t)k, 20, &n, 4);
  if ((st = graphd_program_finish(p, pid))) return fail(graphd_program_error(p), NULL, st);
  if ((st = graphd_register_program(c, p))) return fail("register program", c, st);
  graphd_program_free(p);
  graphd_stream *gs;
  if ((st = graphd_stream_attach(c, NULL, &gs))) return fail("stream", c, st);
  float *xb, *yb;
  if ((st = graphd_host_alloc(c, N * 4, (void **)&xb)) ||
      (st = graphd_host_alloc(c, N * 4, (void **)&yb)))
    return fail("host alloc", c, st);
  for (uint32_t i = 0; i < N; i++) xb[i] = (float)i;
  graphd_binding b[2] = {{0, (uint64_t)(uintptr_t)xb, N * 4}, {1, (uint64_t)(uintptr_t)yb, N * 4}};
  graphd_replay_info info;
  if ((st = graphd_replay(c, gs, pid, b, 2, &info)) || !info.captured) return fail("replay", c, st);
  uint64_t seq = 0;
  if ((st = graphd_replay_async(c, gs, pid, b, 2, &seq)) || (st = graphd_stream_wait(gs, seq, -1)))
    return fail("async replay", c, st);
  for (uint32_t i = 0; i < N; i++)
    if (yb[i] != 3.0f * xb[i]) return fail("result", c, GRAPHD_DATA_LOSS);
  graphd_async_info ai;
  if ((st = graphd_replay_collect(c, &ai)) || ai.completed != 1) return fail("collect", c, st);

  graphd_capture_info *caps = NULL;
  size_t ncaps = 0;
  if ((st = graphd_list_captures(c, &caps, &ncaps)) || ncaps != 1 ||
      memcmp(caps[0].program_id, pid, 32) != 0 || caps[0].replays != 2 || caps[0].npids != 1 ||
      caps[0].generation != 1)
    return fail("list captures", c, st);
  free(caps);
  graphd_evict_options eo;
  graphd_evict_options_init(&eo);
  eo.client_pid = caps ? 0 : 0;
  char hex[65];
  graphd_id_hex(pid, hex);
  eo.program = hex;
  uint64_t freed = 0;
  if ((st = graphd_evict(ctl, &eo, &caps, &ncaps, &freed)) || ncaps != 1 || !freed)
    return fail("evict", ctl, st);
  free(caps);

  /* A refusal's text, read as 0.1.0 read it. */
  uint8_t unknown[32] = {7};
  st = graphd_prepare_program(c, unknown, NULL);
  if (st != GRAPHD_NOT_FOUND || !*graphd_last_error(c)) return fail("refusal", c, st);

  graphd_host_free(c, xb);
  graphd_host_free(c, yb);
  graphd_stream_detach(gs);
  graphd_close(c);
  graphd_close(ctl);
  printf("abi_old: a 0.1.0 binary ran against libgraphd %s\n", graphd_version());
  return 0;
}
