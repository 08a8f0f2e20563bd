/* On a real GPU: PTX and CUBIN modules from the build's nvcc step, the JIT
 * log, the device-stage checks, and VMM, legacy and stream-ordered memory
 * as regions. Timings are printed for the closing note; they are not
 * asserted (benchmarks live in bench/).
 *
 * Fork mode: the parent never calls cuInit; each test body sets up CUDA. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cuda_driver.h"
#include "harness.h"

static gd_test_daemon d;
static const gd_cuda *cu;

static void setup(void) { td_start(&d, "--backend", "cuda", NULL); }

static void teardown(void) {
  ck_assert_int_eq(td_stop(&d), 0);
  td_cleanup(&d);
}

static void cuda_up(void) {
  char err[256];
  ck_assert_msg(gd_cuda_load(&cu, err, sizeof err) == 0, "%s", err);
  CUdevice dev;
  CUcontext ctx;
  ck_assert_int_eq(cu->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  ck_assert_int_eq(cu->cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  ck_assert_int_eq(cu->cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static graphd_program *program_for(const uint8_t mod[32], const char *fn, uint32_t scalar,
                                   uint32_t shared) {
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  int x = graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, 1 << 16, 1);
  int y = graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, 1 << 16, 1);
  uint32_t grid[3] = {64, 1, 1}, block[3] = {256, 1, 1};
  int s = graphd_program_add_launch(p, mod, fn, grid, block, shared);
  ck_assert_int_ge(s, 0);
  uint64_t zero = 0;
  uint32_t n = 16384;
  if (strcmp(fn, "shared_user") == 0) {
    ck_assert_int_eq(graphd_program_param_slot(p, (uint32_t)s, 0, (uint32_t)y, 0), GRAPHD_OK);
    ck_assert_int_eq(graphd_program_param(p, (uint32_t)s, 8, &n, 4), GRAPHD_OK);
    return p;
  }
  ck_assert_int_eq(graphd_program_param_slot(p, (uint32_t)s, 0, (uint32_t)x, 0), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_param_slot(p, (uint32_t)s, 8, (uint32_t)y, 0), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_param(p, (uint32_t)s, 16, &zero, scalar), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_param(p, (uint32_t)s, 16 + scalar, &n, 4), GRAPHD_OK);
  return p;
}

static void register_and_id(graphd_client *c, graphd_program *p, uint8_t pid[32]) {
  ck_assert_msg(graphd_register_program(c, p) == GRAPHD_OK, "%s", graphd_last_error(c));
  ck_assert_int_eq(graphd_program_finish(p, pid), GRAPHD_OK);
}

START_TEST(test_gpu_ptx_and_cubin_load_once_per_device) {
  ck_assert_msg(HAVE_CUDA_KERNELS, "the build made no CUDA test kernels (no nvcc)");
  graphd_client *c = td_data(&d, 0);
  const char *files[] = {TEST_KERNEL_DIR "/test_kernels.ptx",
                         TEST_KERNEL_DIR "/test_kernels.cubin"};
  graphd_module_kind kinds[] = {GRAPHD_MODULE_PTX, GRAPHD_MODULE_CUBIN};
  for (int k = 0; k < 2; k++) {
    size_t len;
    void *bytes = td_read_file(files[k], &len);
    uint8_t mod[32], pid[32];
    ck_assert_int_eq(graphd_register_module(c, kinds[k], bytes, len, mod), GRAPHD_OK);
    graphd_program *p = program_for(mod, "scale", 4, 0);
    register_and_id(c, p, pid);
    graphd_prepare_info info;
    double t0 = now_us();
    ck_assert_msg(graphd_prepare_program(c, pid, &info) == GRAPHD_OK, "%s", graphd_last_error(c));
    double first = now_us() - t0;
    ck_assert_uint_eq(info.modules_loaded, 1);
    double load_ms = (double)info.load_ns / 1e6;
    t0 = now_us();
    ck_assert_int_eq(graphd_prepare_program(c, pid, &info), GRAPHD_OK);
    double cached = now_us() - t0;
    ck_assert_uint_eq(info.modules_loaded, 0);
    printf(
        "FIGURE module %s (%zu bytes): first load %.2f ms on the daemon (%.2f ms round trip); "
        "cached prepare %.1f us round trip\n",
        k == 0 ? "PTX" : "CUBIN", len, load_ms, first / 1e3, cached);
    /* Another program on the same module does not load it again. */
    graphd_program *q = program_for(mod, "accumulate", 4, 0);
    /* accumulate takes 3 parameters: this program passes 4 and fails the
     * device stage, without any new module load. */
    register_and_id(c, q, pid);
    ck_assert_int_eq(graphd_prepare_program(c, pid, &info), GRAPHD_INVALID_ARGUMENT);
    ck_assert_msg(strstr(graphd_last_error(c), "passes 4 parameters but the kernel takes 3"), "%s",
                  graphd_last_error(c));
    graphd_program_free(q);
    graphd_program_free(p);
    free(bytes);
  }
  graphd_close(c);
}
END_TEST

START_TEST(test_gpu_jit_error_shows_its_log) {
  graphd_client *c = td_data(&d, 0);
  size_t len;
  void *bytes = td_read_file(BAD_PTX, &len);
  uint8_t mod[32], pid[32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_PTX, bytes, len, mod), GRAPHD_OK);
  graphd_program *p = program_for(mod, "broken", 4, 0);
  register_and_id(c, p, pid);
  ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_INVALID_ARGUMENT);
  const char *e = graphd_last_error(c);
  printf("JIT error as the client sees it: %s\n", e);
  ck_assert_msg(strstr(e, "step 0 (launch broken): module"), "%s", e);
  ck_assert_msg(strstr(e, "JIT log:"), "%s", e);
  ck_assert_msg(strstr(e, "undefined_register"), "%s", e);
  graphd_program_free(p);
  free(bytes);
  graphd_close(c);
}
END_TEST

START_TEST(test_gpu_device_stage_refuses_wrong_sizes_and_too_much_shared_memory) {
  ck_assert_msg(HAVE_CUDA_KERNELS, "the build made no CUDA test kernels (no nvcc)");
  graphd_client *c = td_data(&d, 0);
  size_t len;
  void *bytes = td_read_file(TEST_KERNEL_DIR "/test_kernels.cubin", &len);
  uint8_t mod[32], pid[32];
  ck_assert_int_eq(graphd_register_module(c, GRAPHD_MODULE_CUBIN, bytes, len, mod), GRAPHD_OK);
  /* scale's third parameter is a 4-byte float; pass 8 bytes. */
  graphd_program *p = program_for(mod, "scale", 8, 0);
  register_and_id(c, p, pid);
  ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_INVALID_ARGUMENT);
  ck_assert_msg(strstr(graphd_last_error(c),
                       "parameter 2 is 8 bytes at offset 16, but the "
                       "kernel's parameter 2 is 4 bytes at offset 16"),
                "%s", graphd_last_error(c));
  graphd_program_free(p);
  /* No such function. */
  p = program_for(mod, "nope", 4, 0);
  register_and_id(c, p, pid);
  ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_NOT_FOUND);
  graphd_program_free(p);
  /* 4 KiB static + 227 KiB dynamic is over the H200's per-block opt-in. */
  p = program_for(mod, "shared_user", 4, 227u << 10);
  register_and_id(c, p, pid);
  ck_assert_int_eq(graphd_prepare_program(c, pid, NULL), GRAPHD_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(graphd_last_error(c), "(4096 static + 232448 dynamic)"), "%s",
                graphd_last_error(c));
  printf("shared memory refusal: %s\n", graphd_last_error(c));
  graphd_program_free(p);
  /* 100 KiB dynamic is over the 48 KiB default: graphd opts in. */
  p = program_for(mod, "shared_user", 4, 100u << 10);
  register_and_id(c, p, pid);
  ck_assert_msg(graphd_prepare_program(c, pid, NULL) == GRAPHD_OK, "%s", graphd_last_error(c));
  graphd_program_free(p);
  free(bytes);
  graphd_close(c);
}
END_TEST

/* A VMM allocation as JAX makes them: cuMemCreate with POSIX fd handles. */
static CUdeviceptr vmm_alloc(size_t size, CUdeviceptr at, CUmemGenericAllocationHandle *h,
                             size_t *mapped) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  ck_assert_int_eq(
      cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
      CUDA_SUCCESS);
  size = (size + gran - 1) / gran * gran;
  ck_assert_int_eq(cu->cuMemCreate(h, size, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = at;
  if (!va) ck_assert_int_eq(cu->cuMemAddressReserve(&va, size, 0, 0, 0), CUDA_SUCCESS);
  ck_assert_int_eq(cu->cuMemMap(va, size, 0, *h, 0), CUDA_SUCCESS);
  CUmemAccessDesc ad;
  memset(&ad, 0, sizeof ad);
  ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ad.location.id = 0;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ck_assert_int_eq(cu->cuMemSetAccess(va, size, &ad, 1), CUDA_SUCCESS);
  *mapped = size;
  return va;
}

static uint64_t device_region_bytes(graphd_client *c) {
  return td_device_info(c, 0).counters.region_bytes;
}

START_TEST(test_gpu_vmm_region_is_imported_and_reuse_is_detected) {
  cuda_up();
  graphd_client *c = td_data(&d, 0);
  CUmemGenericAllocationHandle h;
  size_t size;
  CUdeviceptr va = vmm_alloc(3u << 20, 0, &h, &size);
  graphd_region_ref r, r2;
  double t0 = now_us();
  ck_assert_msg(graphd_region_register(c, va + 4096, 1024, &r) == GRAPHD_OK, "%s",
                graphd_last_error(c));
  double first = now_us() - t0;
  ck_assert_uint_eq(r.offset, 4096);
  ck_assert_uint_eq(r.size, size);
  ck_assert_uint_gt(r.import_ns, 0);
  t0 = now_us();
  ck_assert_int_eq(graphd_region_register(c, va, 1024, &r2), GRAPHD_OK);
  double cached = now_us() - t0;
  ck_assert_uint_eq(r2.region_id, r.region_id);
  ck_assert_uint_eq(device_region_bytes(c), size);
  printf(
      "FIGURE VMM region (%zu bytes): daemon import+map %.1f us; first register %.1f us "
      "round trip; cached lookup %.2f us\n",
      size, (double)r.import_ns / 1e3, first, cached);
  /* Free it and map a new allocation at the same address without telling
   * graphd: the cache sees a new identity and registers again. */
  ck_assert_int_eq(cu->cuMemUnmap(va, size), CUDA_SUCCESS);
  ck_assert_int_eq(cu->cuMemRelease(h), CUDA_SUCCESS);
  CUmemGenericAllocationHandle h2;
  size_t size2;
  ck_assert_uint_eq(vmm_alloc(3u << 20, va, &h2, &size2), va);
  ck_assert_int_eq(graphd_region_register(c, va, 1024, &r2), GRAPHD_OK);
  ck_assert_uint_ne(r2.region_id, r.region_id);
  ck_assert_uint_eq(graphd_region_count(c), 1);
  ck_assert_uint_eq(device_region_bytes(c), size2);
  graphd_close(c);
  ck_assert_int_eq(cu->cuMemUnmap(va, size2), CUDA_SUCCESS);
  ck_assert_int_eq(cu->cuMemRelease(h2), CUDA_SUCCESS);
}
END_TEST

START_TEST(test_gpu_legacy_region_is_imported) {
  cuda_up();
  graphd_client *c = td_data(&d, 0);
  CUdeviceptr p;
  ck_assert_int_eq(cu->cuMemAlloc(&p, 1u << 20), CUDA_SUCCESS);
  graphd_region_ref r;
  double t0 = now_us();
  ck_assert_msg(graphd_region_register(c, p + 256, 256, &r) == GRAPHD_OK, "%s",
                graphd_last_error(c));
  double first = now_us() - t0;
  ck_assert_uint_eq(r.offset, 256);
  ck_assert_uint_ge(r.size, 1u << 20);
  t0 = now_us();
  graphd_region_ref r2;
  ck_assert_int_eq(graphd_region_register(c, p, 256, &r2), GRAPHD_OK);
  double cached = now_us() - t0;
  ck_assert_uint_eq(r2.region_id, r.region_id);
  printf(
      "FIGURE legacy IPC region (%llu bytes): daemon cuIpcOpenMemHandle %.1f us; first "
      "register %.1f us round trip; cached lookup %.2f us\n",
      (unsigned long long)r.size, (double)r.import_ns / 1e3, first, cached);
  /* The rule for legacy memory: unregister, then free. */
  ck_assert_int_eq(graphd_region_forget(c, p), GRAPHD_OK);
  ck_assert_uint_eq(device_region_bytes(c), 0);
  ck_assert_int_eq(cu->cuMemFree(p), CUDA_SUCCESS);
  graphd_close(c);
}
END_TEST

START_TEST(test_gpu_stream_ordered_memory_is_refused_with_the_fix) {
  cuda_up();
  graphd_client *c = td_data(&d, 0);
  CUstream st;
  ck_assert_int_eq(cu->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUdeviceptr p;
  ck_assert_int_eq(cu->cuMemAllocAsync(&p, 1u << 20, st), CUDA_SUCCESS);
  ck_assert_int_eq(cu->cuStreamSynchronize(st), CUDA_SUCCESS);
  graphd_region_ref r;
  ck_assert_int_eq(graphd_region_register(c, p, 64, &r), GRAPHD_FAILED_PRECONDITION);
  printf("cudaMallocAsync memory: %s\n", graphd_last_error(c));
  ck_assert_msg(strstr(graphd_last_error(c), "stream-ordered memory pool (cudaMallocAsync"), "%s",
                graphd_last_error(c));
  ck_assert_int_eq(cu->cuMemFreeAsync(p, st), CUDA_SUCCESS);
  ck_assert_int_eq(cu->cuStreamSynchronize(st), CUDA_SUCCESS);
  /* Host memory that CUDA does not know is refused too. */
  static char plain[64];
  ck_assert_int_eq(graphd_region_register(c, (uint64_t)(uintptr_t)plain, 8, &r),
                   GRAPHD_INVALID_ARGUMENT);
  graphd_close(c);
}
END_TEST

int main(void) {
  td_gpu_or_skip();
  td_gpu_kernels_or_skip();
  Suite *s = suite_create("gpu_registry");
  TCase *tc = tcase_create("gpu_registry");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_gpu_ptx_and_cubin_load_once_per_device);
  tcase_add_test(tc, test_gpu_jit_error_shows_its_log);
  tcase_add_test(tc, test_gpu_device_stage_refuses_wrong_sizes_and_too_much_shared_memory);
  tcase_add_test(tc, test_gpu_vmm_region_is_imported_and_reuse_is_detected);
  tcase_add_test(tc, test_gpu_legacy_region_is_imported);
  tcase_add_test(tc, test_gpu_stream_ordered_memory_is_refused_with_the_fix);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
