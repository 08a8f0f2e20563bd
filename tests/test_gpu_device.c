/* On a real GPU: the daemon lists each device as the driver sees it, warns
 * when MPS is off, and binds data sessions by UUID.
 *
 * The Check parent never calls cuInit (fork mode); each test body, which
 * runs in a child, loads the driver itself to compare. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda_driver.h"
#include "harness.h"

typedef struct truth {
  int n;
  char name[8][256];
  uint8_t uuid[8][16];
  size_t total[8];
  int mps[8];
} truth;

static void driver_truth(truth *t) {
  const gd_cuda *cu;
  char err[256];
  ck_assert_msg(gd_cuda_load(&cu, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(cu->cuDeviceGetCount(&t->n), CUDA_SUCCESS);
  if (t->n > 8) t->n = 8;
  for (int i = 0; i < t->n; i++) {
    CUdevice dev;
    CUuuid u;
    ck_assert_int_eq(cu->cuDeviceGet(&dev, i), CUDA_SUCCESS);
    ck_assert_int_eq(cu->cuDeviceGetName(t->name[i], 256, dev), CUDA_SUCCESS);
    ck_assert_int_eq(cu->cuDeviceGetUuid(&u, dev), CUDA_SUCCESS);
    memcpy(t->uuid[i], u.bytes, 16);
    ck_assert_int_eq(cu->cuDeviceTotalMem(&t->total[i], dev), CUDA_SUCCESS);
    ck_assert_int_eq(cu->cuDeviceGetAttribute(&t->mps[i], CU_DEVICE_ATTRIBUTE_MPS_ENABLED, dev),
                     CUDA_SUCCESS);
  }
}

START_TEST(test_gpu_daemon_lists_every_gpu_as_the_driver_sees_it) {
  truth t;
  driver_truth(&t);
  ck_assert_int_ge(t.n, 1);
  gd_test_daemon d;
  td_start(&d, "--backend", "cuda", NULL);
  graphd_client *c = td_control(&d);
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  ck_assert_uint_eq(s->ndevices, (uint32_t)t.n);
  const char *expect_mps = getenv("GRAPHD_EXPECT_MPS");
  for (int i = 0; i < t.n; i++) {
    graphd_device_info *g = &s->devices[i];
    ck_assert_str_eq(g->backend, "cuda");
    ck_assert_str_eq(g->state, "ok");
    ck_assert_str_eq(g->name, t.name[i]);
    ck_assert_mem_eq(g->uuid, t.uuid[i], 16);
    ck_assert_int_eq(strncmp(g->uuid_str, "GPU-", 4), 0);
    ck_assert_uint_eq(g->total_memory, t.total[i]);
    ck_assert_uint_gt(g->free_memory, 0);
    ck_assert_uint_le(g->free_memory, g->total_memory);
    ck_assert_int_eq(g->mps_enabled, t.mps[i] != 0);
    if (expect_mps) ck_assert_int_eq(g->mps_enabled, atoi(expect_mps));
    printf("device %d: %s %s total %llu free %llu MPS %s\n", i, g->name, g->uuid_str,
           (unsigned long long)g->total_memory, (unsigned long long)g->free_memory,
           g->mps_enabled ? "on" : "off");
    char line[128];
    snprintf(line, sizeof line, "MPS is off on device %d (%s)", i, g->uuid_str);
    ck_assert_msg(td_log_contains(&d, line) == !g->mps_enabled,
                  "MPS warning for device %d does not match its state", i);
  }
  graphd_daemon_status_free(s);
  graphd_close(c);
  int st = td_stop(&d);
  ck_assert_int_eq(st, 0);
  td_cleanup(&d);
}
END_TEST

START_TEST(test_gpu_data_session_by_uuid_and_unknown_uuid) {
  truth t;
  driver_truth(&t);
  gd_test_daemon d;
  td_start(&d, "--backend", "cuda", NULL);
  for (int i = 0; i < t.n; i++) {
    graphd_connect_options o;
    graphd_connect_options_init(&o);
    o.socket_path = d.socket;
    o.kind = GRAPHD_SESSION_DATA;
    memcpy(o.device_uuid, t.uuid[i], 16);
    graphd_client *c;
    char err[GRAPHD_ERRMAX];
    ck_assert_msg(graphd_connect(&o, &c, err, sizeof err) == GRAPHD_OK, "%s", err);
    graphd_device_info info;
    ck_assert_int_eq(graphd_session_device(c, &info), GRAPHD_OK);
    ck_assert_str_eq(info.name, t.name[i]);
    ck_assert_mem_eq(info.uuid, t.uuid[i], 16);
    graphd_close(c);
  }
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = d.socket;
  o.kind = GRAPHD_SESSION_DATA;
  memcpy(o.device_uuid, t.uuid[0], 16);
  o.device_uuid[15] ^= 0xff;
  graphd_client *c = NULL;
  char err[GRAPHD_ERRMAX];
  ck_assert_int_eq(graphd_connect(&o, &c, err, sizeof err), GRAPHD_NOT_FOUND);
  ck_assert_msg(strstr(err, "it serves: GPU-"), "%s", err);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

START_TEST(test_gpu_devices_flag_by_uuid) {
  truth t;
  driver_truth(&t);
  char uuid[48];
  graphd_uuid_format(t.uuid[t.n - 1], "GPU-", uuid);
  gd_test_daemon d;
  td_start(&d, "--backend", "cuda", "--devices", uuid, NULL);
  graphd_client *c = td_control(&d);
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  ck_assert_uint_eq(s->ndevices, 1);
  ck_assert_str_eq(s->devices[0].uuid_str, uuid);
  graphd_daemon_status_free(s);
  graphd_close(c);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

START_TEST(test_gpu_auto_backend_picks_cuda) {
  gd_test_daemon d;
  td_start(&d, NULL);
  graphd_client *c = td_control(&d);
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  ck_assert_str_eq(s->devices[0].backend, "cuda");
  graphd_daemon_status_free(s);
  graphd_close(c);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

int main(void) {
  td_gpu_or_skip();
  Suite *s = suite_create("gpu_device");
  TCase *tc = tcase_create("gpu_device");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_gpu_daemon_lists_every_gpu_as_the_driver_sees_it);
  tcase_add_test(tc, test_gpu_data_session_by_uuid_and_unknown_uuid);
  tcase_add_test(tc, test_gpu_devices_flag_by_uuid);
  tcase_add_test(tc, test_gpu_auto_backend_picks_cuda);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
