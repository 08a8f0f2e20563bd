#include "gpu_common.h"

#include "program3.h"
#include "common/file.h"

#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>

const gd_cuda *gcu;

int gpu_up(void) {
  char err[256];
  if (gd_cuda_load(&gcu, err, sizeof err) < 0) {
    fprintf(stderr, "%s\n", err);
    return -1;
  }
  CUdevice dev;
  CUcontext ctx;
  if (gcu->cuDeviceGet(&dev, 0) || gcu->cuDevicePrimaryCtxRetain(&ctx, dev) ||
      gcu->cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "cannot make a context on device 0\n");
    return -1;
  }
  return 0;
}

int gbuf_alloc(gbuf *b, size_t bytes, int vmm) {
  memset(b, 0, sizeof *b);
  b->vmm = vmm;
  if (!vmm) {
    b->size = bytes;
    return gcu->cuMemAlloc(&b->ptr, bytes) == CUDA_SUCCESS ? 0 : -1;
  }
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  if (gcu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) return -1;
  b->size = (bytes + gran - 1) / gran * gran;
  if (gcu->cuMemCreate(&b->h, b->size, &prop, 0)) return -1;
  if (gcu->cuMemAddressReserve(&b->ptr, b->size, 0, 0, 0)) return -1;
  if (gcu->cuMemMap(b->ptr, b->size, 0, b->h, 0)) return -1;
  CUmemAccessDesc ad;
  memset(&ad, 0, sizeof ad);
  ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ad.location.id = 0;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return gcu->cuMemSetAccess(b->ptr, b->size, &ad, 1) == CUDA_SUCCESS ? 0 : -1;
}

void gbuf_free(gbuf *b) {
  if (!b->ptr) return;
  if (b->vmm) {
    gcu->cuMemUnmap(b->ptr, b->size);
    gcu->cuMemAddressFree(b->ptr, b->size);
    gcu->cuMemRelease(b->h);
  } else {
    gcu->cuMemFree(b->ptr);
  }
  b->ptr = 0;
}

/* Registers the test CUBIN with c, or with c NULL puts it in the
 * client-side registry. */
static graphd_status register_cubin(graphd_client *c, const char *kdir, uint8_t mod[32]) {
  char path[512];
  snprintf(path, sizeof path, "%s/test_kernels.cubin", kdir);
  size_t len;
  void *bytes = gd_read_file(path, &len);
  if (!bytes) {
    fprintf(stderr, "cannot read %s\n", path);
    return GRAPHD_NOT_FOUND;
  }
  graphd_status st = c ? graphd_register_module(c, GRAPHD_MODULE_CUBIN, bytes, len, mod)
                       : graphd_registry_add_module(GRAPHD_MODULE_CUBIN, bytes, len, mod);
  free(bytes);
  return st;
}

graphd_status gpu_program_in_registry(graphd_client *c, const char *kdir, graphd_mode mode,
                                      uint8_t pid[32]) {
  uint8_t mod[32];
  graphd_status st = register_cubin(NULL, kdir, mod);
  if (st == GRAPHD_OK) st = program3_register(NULL, mod, mode, GN, pid);
  return st == GRAPHD_OK ? graphd_registry_sync(c, pid) : st;
}

graphd_status gpu_program_temp(graphd_client *c, const char *kdir, graphd_mode mode,
                               uint8_t pid[32]) {
  uint8_t mod[32];
  graphd_status st = register_cubin(c, kdir, mod);
  if (st != GRAPHD_OK) return st;
  return program3_temp_register(c, mod, mode, GN, pid);
}

graphd_status gpu_program(graphd_client *c, const char *kdir, graphd_mode mode, uint8_t pid[32]) {
  uint8_t mod[32];
  graphd_status st = register_cubin(c, kdir, mod);
  if (st != GRAPHD_OK) return st;
  return program3_register(c, mod, mode, GN, pid);
}

graphd_status gpu_cond_program(graphd_client *c, const char *kdir, graphd_mode mode,
                               uint8_t pid[32]) {
  uint8_t mod[32];
  graphd_status st = register_cubin(c, kdir, mod);
  if (st != GRAPHD_OK) return st;
  return cond_program_register(c, mod, mode, GN, pid);
}

graphd_status gpu_wide_program(graphd_client *c, const char *kdir, graphd_mode mode, uint32_t k,
                               uint8_t pid[32]) {
  uint8_t mod[32];
  graphd_status st = register_cubin(c, kdir, mod);
  if (st != GRAPHD_OK) return st;
  return wide_program_register(c, mod, mode, k, GN, pid);
}

graphd_status gpu_fill_copy_program(graphd_client *c, const char *kdir, graphd_mode mode,
                                    uint8_t pid[32]) {
  uint8_t mod[32];
  graphd_status st = register_cubin(c, kdir, mod);
  if (st != GRAPHD_OK) return st;
  return fill_copy_program_register(c, mod, mode, GN, pid);
}

graphd_status gpu_fault_program(graphd_client *c, const char *kdir, uint8_t pid[32]) {
  uint8_t mod[32];
  graphd_status st = register_cubin(c, kdir, mod);
  if (st != GRAPHD_OK) return st;
  return fault_program_register(c, mod, GRAPHD_SLOT_SCRATCH, 256, 32, 1, pid);
}

void gpu_reference(const float *x, const float *cc, float *y) {
  for (uint32_t i = 0; i < GN; i++) {
    volatile float t = 2.0f * x[i];
    t = t + cc[i];
    y[i] = t * 2.0f + 1.0f;
  }
}

graphd_status gpu_replay_checked(graphd_client *c, graphd_stream *s, CUstream st,
                                 const uint8_t pid[32], gbuf *x, gbuf *y, gbuf *cc, int bind_c,
                                 unsigned seed, graphd_replay_info *info) {
  static float hx[GN], hc[GN], hy[GN], want[GN];
  for (uint32_t i = 0; i < GN; i++) {
    hx[i] = (float)((seed * 2654435761u + i * 40503u) % 20011u) / 7.0f - 1400.0f;
    hc[i] = (float)(i % 977) * 0.25f;
  }
  if (gcu->cuMemcpyHtoDAsync(x->ptr, hx, GN * 4, st) ||
      gcu->cuMemsetD32Async(y->ptr, 0x7fc00000u, GN, st))
    return GRAPHD_INTERNAL;
  if (bind_c && gcu->cuMemcpyHtoDAsync(cc->ptr, hc, GN * 4, st)) return GRAPHD_INTERNAL;
  graphd_binding b[3] = {{0, x->ptr, GN * 4}, {3, y->ptr, GN * 4}, {1, cc->ptr, GN * 4}};
  graphd_status r = graphd_replay(c, s, pid, b, bind_c ? 3 : 2, info);
  if (r != GRAPHD_OK) return r;
  if (gcu->cuMemcpyDtoHAsync(hy, y->ptr, GN * 4, st) || gcu->cuStreamSynchronize(st))
    return GRAPHD_INTERNAL;
  gpu_reference(hx, hc, want);
  if (memcmp(hy, want, sizeof hy) != 0) {
    for (uint32_t i = 0; i < GN; i++)
      if (memcmp(&hy[i], &want[i], 4)) {
        fprintf(stderr, "y[%u] = %.9g, want %.9g (seed %u)\n", i, (double)hy[i], (double)want[i],
                seed);
        break;
      }
    return GRAPHD_DATA_LOSS;
  }
  return GRAPHD_OK;
}

graphd_status gpu_async_copies_checked(graphd_client *c, graphd_stream *s, CUstream st,
                                       const uint8_t cp[32], gbuf *x, gbuf *y, int nb, int n,
                                       unsigned seed) {
  static float hx[GN], hy[GN];
  for (int i = 0; i < n; i++) {
    gbuf *xi = &x[i % nb], *yi = &y[(i + 1) % nb];
    for (uint32_t j = 0; j < GN; j++) hx[j] = (float)((seed + (unsigned)i) * 131u + j % 977u);
    /* Pageable memory: the copy is done with hx when the call returns. */
    if (gcu->cuMemcpyHtoDAsync(xi->ptr, hx, GN * 4, st)) return GRAPHD_INTERNAL;
    graphd_binding b[2] = {{0, xi->ptr, GN * 4}, {1, yi->ptr, GN * 4}};
    graphd_status r = graphd_replay_async(c, s, cp, b, 2, NULL);
    if (r != GRAPHD_OK) return r;
  }
  if (gcu->cuMemcpyDtoHAsync(hy, y[n % nb].ptr, GN * 4, st) || gcu->cuStreamSynchronize(st))
    return GRAPHD_INTERNAL;
  if (memcmp(hx, hy, sizeof hy) != 0) {
    fprintf(stderr, "the last of %d async copies (seed %u): wrong output\n", n, seed);
    return GRAPHD_DATA_LOSS;
  }
  return GRAPHD_OK;
}

graphd_client *gpu_session(const char *socket, char *err, size_t errlen) {
  CUdevice dev;
  CUuuid u;
  if (gcu->cuDeviceGet(&dev, 0) || gcu->cuDeviceGetUuid(&u, dev)) {
    snprintf(err, errlen, "no device 0");
    return NULL;
  }
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.socket_path = socket;
  o.kind = GRAPHD_SESSION_DATA;
  memcpy(o.device_uuid, u.bytes, 16);
  o.timeout_ms = 60000;
  graphd_client *c = NULL;
  if (graphd_connect(&o, &c, err, errlen) != GRAPHD_OK) return NULL;
  return c;
}

volatile uint64_t *gpu_hold_stream(CUstream st) {
  void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  CUdeviceptr dflag;
  if (gcu->cuMemHostRegister(p, 4096, CU_MEMHOSTREGISTER_DEVICEMAP) != CUDA_SUCCESS ||
      gcu->cuMemHostGetDevicePointer(&dflag, p, 0) != CUDA_SUCCESS ||
      gcu->cuStreamWaitValue64(st, dflag, 1, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) {
    munmap(p, 4096);
    return NULL;
  }
  return p;
}

void gpu_hold_free(volatile uint64_t *flag) {
  gcu->cuMemHostUnregister((void *)flag);
  munmap((void *)flag, 4096);
}
