/* Loading the driver at run time: none, too old, present without devices;
 * and the CUDA backend's legacy IPC imports on a fake driver with one
 * device. Fork mode gives each test a fresh process, so gd_cuda_load's
 * once-only state starts clean. */
#include <check.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda_driver.h"
#include "daemon/backend/backend.h"
#include "graphd/protocol.h"
#include "graphd/status.h"
#include "harness.h"

START_TEST(test_cuda_no_driver_is_unavailable) {
  setenv("GRAPHD_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  const gd_cuda *cu;
  char err[256];
  ck_assert_int_eq(gd_cuda_load(&cu, err, sizeof err), -GRAPHD_UNAVAILABLE);
  ck_assert_ptr_null(cu);
  ck_assert_msg(strstr(err, "no CUDA driver"), "%s", err);
  /* The answer is remembered. */
  ck_assert_int_eq(gd_cuda_load(&cu, err, sizeof err), -GRAPHD_UNAVAILABLE);
}
END_TEST

START_TEST(test_cuda_old_driver_is_too_old) {
  setenv("GRAPHD_LIBCUDA", FAKE_CUDA_DIR "/libfake_cuda_old.so", 1);
  const gd_cuda *cu;
  char err[256];
  ck_assert_int_eq(gd_cuda_load(&cu, err, sizeof err), -GRAPHD_FAILED_PRECONDITION);
  ck_assert_msg(strstr(err, "driver too old: need CUDA 13"), "%s", err);
  ck_assert_msg(strstr(err, "12.4"), "%s", err);
}
END_TEST

START_TEST(test_cuda_driver_without_devices_is_unavailable) {
  setenv("GRAPHD_LIBCUDA", FAKE_CUDA_DIR "/libfake_cuda_nodev.so", 1);
  const gd_cuda *cu;
  char err[256];
  ck_assert_int_eq(gd_cuda_load(&cu, err, sizeof err), -GRAPHD_UNAVAILABLE);
  ck_assert_msg(strstr(err, "CUDA_ERROR_NO_DEVICE"), "%s", err);
}
END_TEST

static int run_daemon(const char *libcuda, const char *backend, char *out, size_t n) {
  setenv("GRAPHD_LIBCUDA", libcuda, 1);
  /* A daemon that wrongly comes up is caught by td_run's time limit. */
  char *run[] = {GRAPHD_BIN, "--backend", (char *)backend, "--socket", "/tmp/graphd-drv-test.sock",
                 NULL};
  return td_run(run, out, n, 3000);
}

START_TEST(test_daemon_refuses_an_old_driver_even_in_auto_mode) {
  char out[4096];
  int rc = run_daemon(FAKE_CUDA_DIR "/libfake_cuda_old.so", "auto", out, sizeof out);
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "driver too old: need CUDA 13"), "%s", out);
}
END_TEST

START_TEST(test_daemon_backend_cuda_without_gpu_is_fatal) {
  char out[4096];
  int rc = run_daemon("/nonexistent/libcuda.so.1", "cuda", out, sizeof out);
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "cannot use CUDA: no CUDA driver"), "%s", out);
  rc = run_daemon(FAKE_CUDA_DIR "/libfake_cuda_nodev.so", "cuda", out, sizeof out);
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "CUDA_ERROR_NO_DEVICE"), "%s", out);
}
END_TEST

START_TEST(test_daemon_without_gpu_serves_host_devices_only_when_asked) {
  /* --backend auto on a machine without a GPU: a clear refusal that names
   * the host backend, never a silent fallback to running native code. */
  char out[4096];
  int rc = run_daemon(FAKE_CUDA_DIR "/libfake_cuda_nodev.so", "auto", out, sizeof out);
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "ask with --backend host or --host-devices N"), "%s", out);
  /* Asked for by name, host devices are served. */
  gd_test_daemon d;
  char *args[] = {"--backend", "host", NULL};
  char *env[] = {"GRAPHD_LIBCUDA=" FAKE_CUDA_DIR "/libfake_cuda_nodev.so", NULL};
  ck_assert_int_eq(td_start_env(&d, args, env, NULL), 0);
  graphd_client *c = td_control(&d);
  graphd_daemon_status *s;
  ck_assert_int_eq(graphd_get_status(c, &s), GRAPHD_OK);
  ck_assert_uint_eq(s->ndevices, 1);
  ck_assert_str_eq(s->devices[0].backend, "host");
  graphd_daemon_status_free(s);
  graphd_close(c);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

/* One cuMemAlloc allocation named by several regions at once (two sessions
 * of a process, or a region registered again before the release of the
 * last one ran): the driver opens a handle once per context, so the
 * backend opens it once and shares the mapping until its last region goes. */
START_TEST(test_cuda_legacy_allocation_is_opened_once_for_all_its_regions) {
  const char *lib = FAKE_CUDA_DIR "/libfake_cuda_mem.so";
  setenv("GRAPHD_LIBCUDA", lib, 1);
  gd_backend *be;
  gd_backend_dev *dev;
  char err[512];
  ck_assert_msg(backend_cuda_new(&be, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(be->ops->device_open(be, 0, &dev, err, sizeof err) == 0, "%s", err);
  const gd_cuda *cu;
  ck_assert_int_eq(gd_cuda_load(&cu, err, sizeof err), 0);
  int (*ipc_open)(void);
  *(void **)&ipc_open = dlsym(dlopen(lib, RTLD_NOW | RTLD_NOLOAD), "fake_cuda_ipc_open");
  ck_assert_ptr_nonnull(ipc_open);

  CUdeviceptr p, q;
  ck_assert_int_eq(cu->cuMemAlloc(&p, 4096), CUDA_SUCCESS);
  ck_assert_int_eq(cu->cuMemAlloc(&q, 4096), CUDA_SUCCESS);
  CUipcMemHandle hp, hq;
  ck_assert_int_eq(cu->cuIpcGetMemHandle(&hp, p), CUDA_SUCCESS);
  ck_assert_int_eq(cu->cuIpcGetMemHandle(&hq, q), CUDA_SUCCESS);
  gd_region_import in = {.kind = GRAPHD_REGION_LEGACY_IPC, .fd = -1, .size = 4096};
  memcpy(in.ipc_handle, hp.reserved, sizeof in.ipc_handle);
  gd_region_map m1, m2, m3;
  ck_assert_msg(be->ops->region_import(be, dev, &in, &m1, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(be->ops->region_import(be, dev, &in, &m2, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(m1.ptr, p);
  ck_assert_uint_eq(m2.ptr, p);
  ck_assert_int_eq(ipc_open(), 1);
  /* Another allocation is opened on its own. */
  memcpy(in.ipc_handle, hq.reserved, sizeof in.ipc_handle);
  ck_assert_msg(be->ops->region_import(be, dev, &in, &m3, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(ipc_open(), 2);
  /* A region too large for the shared allocation is refused and takes
   * nothing from the others. */
  memcpy(in.ipc_handle, hp.reserved, sizeof in.ipc_handle);
  in.size = 8192;
  gd_region_map big;
  ck_assert_int_eq(be->ops->region_import(be, dev, &in, &big, err, sizeof err),
                   -GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err, "declares 8192 bytes"), "%s", err);
  in.size = 4096;
  /* The first region goes: the second still has the mapping. */
  be->ops->region_release(be, dev, &m1);
  ck_assert_int_eq(ipc_open(), 2);
  /* Open under other handle bytes: graphd's books, not the client's memory. */
  in.ipc_handle[60] ^= 1;
  gd_region_map alias;
  ck_assert_int_eq(be->ops->region_import(be, dev, &in, &alias, err, sizeof err), -GRAPHD_INTERNAL);
  ck_assert_msg(strstr(err, "graphd bookkeeping fault"), "%s", err);
  ck_assert_msg(!strstr(err, "was the memory freed"), "%s", err);
  in.ipc_handle[60] ^= 1;
  be->ops->region_release(be, dev, &m2);
  be->ops->region_release(be, dev, &m3);
  ck_assert_int_eq(ipc_open(), 0);
  /* Opened afresh after the last release. */
  ck_assert_msg(be->ops->region_import(be, dev, &in, &m1, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(ipc_open(), 1);
  be->ops->region_release(be, dev, &m1);
  ck_assert_int_eq(ipc_open(), 0);
  be->ops->device_close(be, dev);
  be->ops->destroy(be);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cuda_driver");
  TCase *tc = tcase_create("cuda_driver");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_cuda_no_driver_is_unavailable);
  tcase_add_test(tc, test_cuda_old_driver_is_too_old);
  tcase_add_test(tc, test_cuda_driver_without_devices_is_unavailable);
  tcase_add_test(tc, test_daemon_refuses_an_old_driver_even_in_auto_mode);
  tcase_add_test(tc, test_daemon_backend_cuda_without_gpu_is_fatal);
  tcase_add_test(tc, test_daemon_without_gpu_serves_host_devices_only_when_asked);
  tcase_add_test(tc, test_cuda_legacy_allocation_is_opened_once_for_all_its_regions);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
