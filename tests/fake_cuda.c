/* A stand-in libcuda for the driver-loading tests: it reports the version
 * FAKE_DRIVER_VERSION and a driver with no usable device. Never a CUDA
 * simulator: every entry point but the few below fails.
 *
 * Built with FAKE_CUDA_MEM, it has a device for the XLA handler's copies
 * of unmappable memory (tests/test_xla.c): cuMemAlloc memory is host
 * memory that graphd could map (legacy IPC); any other address is device
 * memory that nobody can map, as a compiled module's constants are, in
 * allocations of 64 KiB (aligned blocks) whose buffer ids change when
 * fake_cuda_reload() says the module was loaded again. Copies
 * run at once. An event recorded while fake_cuda_hold(1) is in force is
 * pending until fake_cuda_finish() (or a wait on it): that is a call still
 * queued on its stream. It has one device, whose context accepts the
 * legacy IPC handles of its own cuMemAlloc memory (the handle holds the
 * address and a tag); as the driver does, it opens an allocation once:
 * a second open answers CUDA_ERROR_ALREADY_MAPPED until it is closed. */
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

__attribute__((visibility("default"))) CUresult cuDriverGetVersion(int *v) {
  *v = FAKE_DRIVER_VERSION;
  return CUDA_SUCCESS;
}

static CUresult fake_init(unsigned flags) {
  (void)flags;
#ifdef FAKE_CUDA_MEM
  return CUDA_SUCCESS;
#else
  return CUDA_ERROR_NO_DEVICE;
#endif
}

#ifdef FAKE_CUDA_MEM
enum { MAX_ALLOCS = 4096 };
static struct {
  CUdeviceptr p;
  size_t bytes;
} allocs[MAX_ALLOCS];
static int nallocs, hold;
static unsigned long long recorded, finished; /* event tickets */

typedef struct fake_event {
  unsigned long long ticket; /* 0: nothing pending */
} fake_event;

static int find_alloc(CUdeviceptr p) {
  for (int i = 0; i < nallocs; i++)
    if (p >= allocs[i].p && p < allocs[i].p + allocs[i].bytes) return i;
  return -1;
}

/* Module memory: 64 KiB blocks, loaded again (new buffer ids) by
 * fake_cuda_reload; buffer id queries counted. */
#define MODULE_BLOCK 0x10000ull
static unsigned long long module_gen, id_queries;
static int module_ranges;
__attribute__((visibility("default"))) void fake_cuda_reload(void) { module_gen++; }
/* Whether cuMemGetAddressRange answers for module memory (off: only for
 * cuMemAlloc memory, as the other tests expect). */
__attribute__((visibility("default"))) void fake_cuda_module_ranges(int on) { module_ranges = on; }
__attribute__((visibility("default"))) unsigned long long fake_cuda_id_queries(void) {
  return id_queries;
}

/* Live cuMemAlloc allocations. */
__attribute__((visibility("default"))) int fake_cuda_allocs(void) { return nallocs; }

/* While on, recorded events stay pending until fake_cuda_finish. */
__attribute__((visibility("default"))) void fake_cuda_hold(int on) { hold = on; }

/* Everything recorded so far has run. */
__attribute__((visibility("default"))) void fake_cuda_finish(void) { finished = recorded; }

static CUresult fake_mem_alloc(CUdeviceptr *p, size_t bytes) {
  void *m = malloc(bytes ? bytes : 1);
  if (!m || nallocs == MAX_ALLOCS) {
    free(m);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *p = (CUdeviceptr)(uintptr_t)m;
  allocs[nallocs].p = *p;
  allocs[nallocs++].bytes = bytes ? bytes : 1;
  return CUDA_SUCCESS;
}

static CUresult fake_mem_free(CUdeviceptr p) {
  int i = find_alloc(p);
  if (i < 0 || allocs[i].p != p) return CUDA_ERROR_INVALID_VALUE;
  free((void *)(uintptr_t)p);
  allocs[i] = allocs[--nallocs];
  return CUDA_SUCCESS;
}

static CUresult fake_memcpy_async(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  (void)s;
  memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
  return CUDA_SUCCESS;
}

static CUresult fake_pointer_attribute(void *data, CUpointer_attribute a, CUdeviceptr p) {
  switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = CU_MEMORYTYPE_DEVICE; return 0;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *(int *)data = find_alloc(p) >= 0;
      return 0;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      id_queries++;
      *(unsigned long long *)data =
          find_alloc(p) >= 0 ? p : ((p / MODULE_BLOCK) << 16) + module_gen + 1;
      return 0;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = 0; return 0;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

static unsigned long long events_made;
__attribute__((visibility("default"))) unsigned long long fake_cuda_events_made(void) {
  return events_made;
}

static CUresult fake_event_create(CUevent *e, unsigned flags) {
  (void)flags;
  events_made++;
  fake_event *f = calloc(1, sizeof *f);
  if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
  *e = (CUevent)f;
  return CUDA_SUCCESS;
}

static CUresult fake_event_destroy(CUevent e) {
  free(e);
  return CUDA_SUCCESS;
}

static CUresult fake_event_record(CUevent e, CUstream s) {
  (void)s;
  ((fake_event *)e)->ticket = hold ? ++recorded : 0;
  return CUDA_SUCCESS;
}

static CUresult fake_event_query(CUevent e) {
  unsigned long long t = ((fake_event *)e)->ticket;
  return t == 0 || t <= finished ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/* A sampled span takes 1 us of fake device time once its end is reached. */
static CUresult fake_event_elapsed(float *ms, CUevent start, CUevent end) {
  (void)start;
  if (fake_event_query(end) != CUDA_SUCCESS) return CUDA_ERROR_NOT_READY;
  *ms = 0.001f;
  return CUDA_SUCCESS;
}

static CUresult fake_event_sync(CUevent e) {
  if (((fake_event *)e)->ticket > finished) finished = ((fake_event *)e)->ticket;
  return CUDA_SUCCESS;
}

static CUresult fake_stream_wait_event(CUstream s, CUevent e, unsigned flags) {
  (void)s, (void)e, (void)flags;
  return CUDA_SUCCESS;
}

static CUresult fake_sync(void) {
  finished = recorded;
  return CUDA_SUCCESS;
}

static CUdeviceptr ipc_opened[MAX_ALLOCS];
static int nipc_opened;

/* Allocations open through cuIpcOpenMemHandle. */
__attribute__((visibility("default"))) int fake_cuda_ipc_open(void) { return nipc_opened; }

static CUresult fake_one(int *n) {
  *n = 1;
  return CUDA_SUCCESS;
}

static CUresult fake_device_get(CUdevice *dev, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *dev = 0;
  return CUDA_SUCCESS;
}

static CUresult fake_device_name(char *name, int len, CUdevice dev) {
  (void)dev;
  strncpy(name, "fake GPU", (size_t)len);
  return CUDA_SUCCESS;
}

static CUresult fake_device_uuid(CUuuid *u, CUdevice dev) {
  (void)dev;
  memset(u->bytes, 0x5a, sizeof u->bytes);
  return CUDA_SUCCESS;
}

static CUresult fake_total_mem(size_t *bytes, CUdevice dev) {
  (void)dev;
  *bytes = (size_t)1 << 30;
  return CUDA_SUCCESS;
}

static CUresult fake_attribute(int *v, CUdevice_attribute a, CUdevice dev) {
  (void)a, (void)dev;
  *v = 0;
  return CUDA_SUCCESS;
}

static CUresult fake_ctx_retain(CUcontext *ctx, CUdevice dev) {
  (void)dev;
  *ctx = (CUcontext)(uintptr_t)0xc0;
  return CUDA_SUCCESS;
}

static CUresult fake_ok(void) { return CUDA_SUCCESS; }

static CUresult fake_ipc_get(CUipcMemHandle *h, CUdeviceptr p) {
  if (find_alloc(p) < 0) return CUDA_ERROR_INVALID_VALUE;
  memset(h, 0, sizeof *h);
  memcpy(h->reserved, &p, sizeof p);
  return CUDA_SUCCESS;
}

static CUresult fake_ipc_open(CUdeviceptr *out, CUipcMemHandle h, unsigned flags) {
  (void)flags;
  CUdeviceptr p;
  memcpy(&p, h.reserved, sizeof p);
  if (find_alloc(p) < 0) return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < nipc_opened; i++)
    if (ipc_opened[i] == p) return CUDA_ERROR_ALREADY_MAPPED;
  ipc_opened[nipc_opened++] = p;
  *out = p; /* one address space: mapped where it lives */
  return CUDA_SUCCESS;
}

static CUresult fake_ipc_close(CUdeviceptr p) {
  for (int i = 0; i < nipc_opened; i++)
    if (ipc_opened[i] == p) {
      ipc_opened[i] = ipc_opened[--nipc_opened];
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_address_range(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  int i = find_alloc(p);
  if (i < 0 && module_ranges) {
    *base = p & ~(MODULE_BLOCK - 1);
    *size = MODULE_BLOCK;
    return CUDA_SUCCESS;
  }
  if (i < 0) return CUDA_ERROR_NOT_FOUND;
  *base = allocs[i].p;
  *size = allocs[i].bytes;
  return CUDA_SUCCESS;
}
#endif

static CUresult fake_error_name(CUresult r, const char **s) {
  *s = r == CUDA_ERROR_NO_DEVICE        ? "CUDA_ERROR_NO_DEVICE"
       : r == CUDA_ERROR_ALREADY_MAPPED ? "CUDA_ERROR_ALREADY_MAPPED"
                                        : "CUDA_ERROR_NOT_SUPPORTED";
  return CUDA_SUCCESS;
}

static CUresult fake_unsupported(void) { return CUDA_ERROR_NOT_SUPPORTED; }

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(
    const char *symbol, void **pfn, int version, cuuint64_t flags,
    CUdriverProcAddressQueryResult *status) {
  (void)version, (void)flags;
  if (strcmp(symbol, "cuInit") == 0)
    *pfn = (void *)fake_init;
  else if (strcmp(symbol, "cuGetErrorName") == 0 || strcmp(symbol, "cuGetErrorString") == 0)
    *pfn = (void *)fake_error_name;
#ifdef FAKE_CUDA_MEM
  else if (strcmp(symbol, "cuMemAlloc") == 0)
    *pfn = (void *)fake_mem_alloc;
  else if (strcmp(symbol, "cuMemFree") == 0)
    *pfn = (void *)fake_mem_free;
  else if (strcmp(symbol, "cuMemcpyDtoDAsync") == 0)
    *pfn = (void *)fake_memcpy_async;
  else if (strcmp(symbol, "cuPointerGetAttribute") == 0)
    *pfn = (void *)fake_pointer_attribute;
  else if (strcmp(symbol, "cuEventCreate") == 0)
    *pfn = (void *)fake_event_create;
  else if (strcmp(symbol, "cuEventDestroy") == 0)
    *pfn = (void *)fake_event_destroy;
  else if (strcmp(symbol, "cuEventRecord") == 0)
    *pfn = (void *)fake_event_record;
  else if (strcmp(symbol, "cuEventQuery") == 0)
    *pfn = (void *)fake_event_query;
  else if (strcmp(symbol, "cuEventElapsedTime") == 0)
    *pfn = (void *)fake_event_elapsed;
  else if (strcmp(symbol, "cuEventSynchronize") == 0)
    *pfn = (void *)fake_event_sync;
  else if (strcmp(symbol, "cuStreamWaitEvent") == 0)
    *pfn = (void *)fake_stream_wait_event;
  else if (strcmp(symbol, "cuCtxSynchronize") == 0 || strcmp(symbol, "cuStreamSynchronize") == 0)
    *pfn = (void *)fake_sync;
  else if (strcmp(symbol, "cuDeviceGetCount") == 0)
    *pfn = (void *)fake_one;
  else if (strcmp(symbol, "cuDeviceGet") == 0)
    *pfn = (void *)fake_device_get;
  else if (strcmp(symbol, "cuDeviceGetName") == 0)
    *pfn = (void *)fake_device_name;
  else if (strcmp(symbol, "cuDeviceGetUuid") == 0)
    *pfn = (void *)fake_device_uuid;
  else if (strcmp(symbol, "cuDeviceTotalMem") == 0)
    *pfn = (void *)fake_total_mem;
  else if (strcmp(symbol, "cuDeviceGetAttribute") == 0)
    *pfn = (void *)fake_attribute;
  else if (strcmp(symbol, "cuDevicePrimaryCtxRetain") == 0)
    *pfn = (void *)fake_ctx_retain;
  else if (strcmp(symbol, "cuDevicePrimaryCtxRelease") == 0 ||
           strcmp(symbol, "cuCtxSetCurrent") == 0)
    *pfn = (void *)fake_ok;
  else if (strcmp(symbol, "cuIpcGetMemHandle") == 0)
    *pfn = (void *)fake_ipc_get;
  else if (strcmp(symbol, "cuIpcOpenMemHandle") == 0)
    *pfn = (void *)fake_ipc_open;
  else if (strcmp(symbol, "cuIpcCloseMemHandle") == 0)
    *pfn = (void *)fake_ipc_close;
  else if (strcmp(symbol, "cuMemGetAddressRange") == 0)
    *pfn = (void *)fake_address_range;
#endif
  else
    *pfn = (void *)fake_unsupported;
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}
