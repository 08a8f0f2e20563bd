/* libgraphd: regions and host allocations.
 *
 * DESIGN: the region cache and the host allocation table live in the
 * handle and are guarded by its lock; every public call here takes it once.
 * CUDA is reached through the dlopen'd driver table (common/cuda_driver). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/cuda_driver.h"
#include "common/memfd.h"
#include "common/uuid.h"
#include "internal.h"

static graphd_status send_unregister(graphd_client *c, uint32_t region_id) {
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__UnregisterRegion m = GRAPHD__WIRE__UNREGISTER_REGION__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_UNREGISTER_REGION;
  req.unregister_region = &m;
  m.region_id = region_id;
  Graphd__Wire__Reply *rep = NULL;
  graphd_status st = gd_client_call(c, &req, NULL, 0, &rep);
  if (rep) graphd__wire__reply__free_unpacked(rep, NULL);
  return st;
}

/* The cache is kept in order of base, so that the entry holding an
 * address is a binary search away (a replay looks one up per binding).
 * Live allocations never overlap; a stale entry (its memory freed and the
 * addresses reused) may overlap a live one until drop_stale removes it. */
static void remove_entry(graphd_client *c, uint32_t i) {
  memmove(&c->regions[i], &c->regions[i + 1], (c->nregions - i - 1) * sizeof c->regions[0]);
  c->nregions--;
}

/* The index of the first entry whose base is above ptr. */
static uint32_t upper_bound(const graphd_client *c, uint64_t ptr) {
  uint32_t lo = 0, hi = c->nregions;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (c->regions[mid].base <= ptr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static gd_region_entry *find_entry(graphd_client *c, uint64_t base) {
  uint32_t i = upper_bound(c, base);
  return i > 0 && c->regions[i - 1].base == base ? &c->regions[i - 1] : NULL;
}

/* Unregisters least recently used entries until there is room for one. */
static graphd_status make_room(graphd_client *c) {
  while (c->nregions >= c->region_cap) {
    uint32_t lru = 0;
    for (uint32_t i = 1; i < c->nregions; i++)
      if (c->regions[i].last_use < c->regions[lru].last_use) lru = i;
    graphd_status st = send_unregister(c, c->regions[lru].region_id);
    if (st != GRAPHD_OK && st != GRAPHD_NOT_FOUND) return st;
    remove_entry(c, lru);
  }
  if (c->nregions == c->region_cap_alloc) {
    uint32_t cap = c->region_cap_alloc ? 2 * c->region_cap_alloc : 16;
    gd_region_entry *n = realloc(c->regions, cap * sizeof *n);
    if (!n) return gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
    c->regions = n;
    c->region_cap_alloc = cap;
  }
  return GRAPHD_OK;
}

/* Sends RegisterRegion and caches the result. */
static graphd_status register_new(graphd_client *c, int kind, uint64_t base, uint64_t size,
                                  uint64_t identity, int fd, const void *ipc,
                                  gd_region_entry **out) {
  graphd_status st = make_room(c);
  if (st != GRAPHD_OK) return st;
  Graphd__Wire__Request req = GRAPHD__WIRE__REQUEST__INIT;
  Graphd__Wire__RegisterRegion m = GRAPHD__WIRE__REGISTER_REGION__INIT;
  req.body_case = GRAPHD__WIRE__REQUEST__BODY_REGISTER_REGION;
  req.register_region = &m;
  m.kind = (Graphd__Wire__RegionKind)kind;
  m.size = size;
  m.client_base = base;
  if (ipc) {
    m.ipc_handle.data = (uint8_t *)ipc;
    m.ipc_handle.len = 64;
  }
  Graphd__Wire__Reply *rep = NULL;
  st = gd_client_call(c, &req, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, &rep);
  if (st != GRAPHD_OK) return st;
  uint32_t at = upper_bound(c, base);
  memmove(&c->regions[at + 1], &c->regions[at], (c->nregions - at) * sizeof c->regions[0]);
  c->nregions++;
  gd_region_entry *e = &c->regions[at];
  e->base = base;
  e->size = size;
  e->identity = identity;
  e->kind = kind;
  e->region_id = rep->register_region ? rep->register_region->region_id : 0;
  e->import_ns = rep->register_region ? rep->register_region->import_ns : 0;
  e->last_use = ++c->lru_clock;
  e->checked = c->check_serial;
  graphd__wire__reply__free_unpacked(rep, NULL);
  *out = e;
  return GRAPHD_OK;
}

static gd_host_alloc *find_host(graphd_client *c, uint64_t ptr) {
  for (uint32_t i = 0; i < c->nhost; i++) {
    uint64_t b = (uint64_t)(uintptr_t)c->host[i].ptr;
    if (ptr >= b && ptr - b < c->host[i].size) return &c->host[i];
  }
  return NULL;
}

/* The CUDA half: what kind of memory ptr is, and its handle. */
static graphd_status cuda_lookup(graphd_client *c, uint64_t ptr, uint64_t *base, uint64_t *size,
                                 uint64_t *identity) {
  const gd_cuda *cu;
  char e[256];
  CUdeviceptr b = 0;
  size_t sz = 0;
  if (gd_cuda_load(&cu, e, sizeof e) < 0)
    return gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT,
                             "0x%llx is neither graphd_host_alloc memory of this handle nor CUDA "
                             "device memory (CUDA is not usable here: %s)",
                             (unsigned long long)ptr, e);
  if (cu->cuMemGetAddressRange(&b, &sz, (CUdeviceptr)ptr) != CUDA_SUCCESS)
    return gd_client_set_err(c, GRAPHD_INVALID_ARGUMENT,
                             "0x%llx is neither graphd_host_alloc memory of this handle nor CUDA "
                             "device memory",
                             (unsigned long long)ptr);
  /* The allocation's identity: its buffer id, or, where the driver gives
   * none, its VMM allocation handle (retaining returns the same handle for
   * the same allocation). Either changes when the address is reused. */
  unsigned long long bid = gd_cuda_buffer_id(cu, b);
  if (bid == 0) {
    CUmemGenericAllocationHandle ah;
    if (cu->cuMemRetainAllocationHandle(&ah, (void *)(uintptr_t)b) == CUDA_SUCCESS) {
      bid = (unsigned long long)ah | (1ull << 63);
      cu->cuMemRelease(ah);
    }
  }
  *base = b;
  *size = sz;
  *identity = bid;
  return GRAPHD_OK;
}

static graphd_status cuda_register(graphd_client *c, uint64_t base, uint64_t size,
                                   uint64_t identity, gd_region_entry **out) {
  const gd_cuda *cu;
  char e[256];
  if (gd_cuda_load(&cu, e, sizeof e) < 0)
    return gd_client_set_err(c, GRAPHD_FAILED_PRECONDITION, "%s", e);
  CUdeviceptr b = (CUdeviceptr)base;
  /* The memory must live on this session's device. */
  int ordinal = -1;
  CUdevice dev;
  CUuuid uuid;
  if (cu->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b) != CUDA_SUCCESS ||
      cu->cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS ||
      cu->cuDeviceGetUuid(&uuid, dev) != CUDA_SUCCESS)
    return gd_client_set_err(c, GRAPHD_FAILED_PRECONDITION,
                             "cannot tell which GPU the memory at 0x%llx lives on",
                             (unsigned long long)base);
  if (memcmp(uuid.bytes, c->device.uuid, 16) != 0) {
    char want[GD_UUID_STR_MAX], have[GD_UUID_STR_MAX];
    gd_uuid_format((const uint8_t *)uuid.bytes, "GPU-", have);
    gd_uuid_format(c->device.uuid, "GPU-", want);
    return gd_client_set_err(c, GRAPHD_FAILED_PRECONDITION,
                             "the memory at 0x%llx lives on %s, but this session is bound to "
                             "%s; use the session of the memory's device",
                             (unsigned long long)base, have, want);
  }
  unsigned kind = gd_cuda_mem_kind(cu, b);
  if (kind & GD_CUDA_MEM_LEGACY_IPC) {
    CUipcMemHandle h;
    if (cu->cuIpcGetMemHandle(&h, b) == CUDA_SUCCESS)
      return register_new(c, GRAPHD__WIRE__REGION_KIND__REGION_KIND_LEGACY_IPC, base, size,
                          identity, -1, h.reserved, out);
  }
  if (kind & GD_CUDA_MEM_VMM_FD) {
    CUmemGenericAllocationHandle ah;
    int64_t t0 = gd_mono_us();
    if (cu->cuMemRetainAllocationHandle(&ah, (void *)(uintptr_t)b) == CUDA_SUCCESS) {
      int fd = -1;
      CUresult r =
          cu->cuMemExportToShareableHandle(&fd, ah, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      cu->cuMemRelease(ah);
      if (r == CUDA_SUCCESS) {
        int64_t t1 = gd_mono_us();
        graphd_status st = register_new(c, GRAPHD__WIRE__REGION_KIND__REGION_KIND_VMM_FD, base,
                                        size, identity, fd, NULL, out);
        close(fd);
        if (st == GRAPHD_OK)
          gd_client_debug(c,
                          "region %u at 0x%llx, %llu bytes: export %lld us, RegisterRegion round "
                          "trip %lld us (the daemon's import %.1f us)",
                          (*out)->region_id, (unsigned long long)base, (unsigned long long)size,
                          (long long)(t1 - t0), (long long)(gd_mono_us() - t1),
                          (double)(*out)->import_ns / 1e3);
        return st;
      }
    }
  }
  if (kind & GD_CUDA_MEM_POOL)
    return gd_client_set_err(
        c, GRAPHD_FAILED_PRECONDITION,
        "the memory at 0x%llx comes from a stream-ordered memory pool (cudaMallocAsync or "
        "cuMemAllocFromPoolAsync), which cannot be shared with graphd; allocate it with "
        "cudaMalloc/cuMemAlloc, or from a pool created with POSIX fd handle types, or with "
        "cuMemCreate using CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
        (unsigned long long)base);
  return gd_client_set_err(
      c, GRAPHD_FAILED_PRECONDITION,
      "the memory at 0x%llx is neither cuMemAlloc memory (legacy IPC) nor VMM memory exportable "
      "as a POSIX fd; allocate it with cudaMalloc/cuMemAlloc, or with cuMemCreate using "
      "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (under JAX: an array the jitted function closes "
      "over is a constant in XLA's module memory; pass it in as an argument)",
      (unsigned long long)base);
}

graphd_status graphd_region_register(graphd_client *c, uint64_t ptr, uint64_t bytes,
                                     graphd_region_ref *out) {
  GD_OWNED(c);
  pthread_mutex_lock(&c->lock);
  gd_region_batch(c);
  graphd_status st = gd_region_register_locked(c, ptr, bytes, out);
  pthread_mutex_unlock(&c->lock);
  return st;
}

void gd_region_batch(graphd_client *c) { c->check_serial++; }

/* The cached entry holding [ptr, ptr + bytes) whose allocation is still the
 * same one, checked with a single driver query (none when this batch has
 * checked it already: the allocation's buffer id holds for its whole
 * range); NULL sends the caller down the full path. This is the replay hot
 * path: XLA's buffers of one call mostly lie in a few large allocations. */
static gd_region_entry *fast_hit(graphd_client *c, uint64_t ptr, uint64_t bytes) {
  /* The entry with the highest base at or below ptr: the only live one
   * that can hold it. (A stale entry below it that also holds ptr is
   * dropped on the full path.) */
  uint32_t i = upper_bound(c, ptr);
  if (i > 0) {
    gd_region_entry *e = &c->regions[i - 1];
    if (ptr - e->base >= e->size || bytes > e->size - (ptr - e->base)) return NULL;
    if (e->kind == GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD) {
      gd_host_alloc *h = find_host(c, ptr);
      return h && h->serial == e->identity ? e : NULL;
    }
    if (e->checked == c->check_serial) return e;
    const gd_cuda *cu;
    unsigned long long bid;
    if (gd_cuda_load(&cu, NULL, 0) < 0 || (bid = gd_cuda_buffer_id(cu, (CUdeviceptr)ptr)) == 0 ||
        bid != e->identity)
      return NULL;
    e->checked = c->check_serial;
    return e;
  }
  return NULL;
}

/* Unregisters the cached regions that overlap [base, base + size) but
 * are not that allocation (base, size and identity): the memory they
 * named was freed and its addresses reused, so each is stale, and the
 * daemon would otherwise keep the old allocation open under it. Two live
 * allocations never overlap, so nothing current is dropped. */
static graphd_status drop_stale(graphd_client *c, int kind, uint64_t base, uint64_t size,
                                uint64_t identity) {
  for (uint32_t i = 0; i < c->nregions;) {
    gd_region_entry *e = &c->regions[i];
    bool host = e->kind == GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD;
    bool overlaps = e->base < base + size && base < e->base + e->size;
    if (!overlaps || host != (kind == GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD) ||
        (e->base == base && e->size == size && e->identity == identity)) {
      i++;
      continue;
    }
    graphd_status st = send_unregister(c, e->region_id);
    remove_entry(c, i);
    if (st != GRAPHD_OK && st != GRAPHD_NOT_FOUND) return st;
  }
  return GRAPHD_OK;
}

graphd_status gd_region_register_locked(graphd_client *c, uint64_t ptr, uint64_t bytes,
                                        graphd_region_ref *out) {
  graphd_status st = GRAPHD_OK;
  gd_region_entry *hit = c->has_device ? fast_hit(c, ptr, bytes) : NULL;
  if (hit) {
    hit->last_use = ++c->lru_clock;
    out->region_id = hit->region_id;
    out->offset = ptr - hit->base;
    out->size = hit->size;
    out->import_ns = hit->import_ns;
    hit->import_ns = 0;
    return GRAPHD_OK;
  }
  if (!c->has_device) {
    st = gd_client_set_err(c, GRAPHD_FAILED_PRECONDITION,
                           "regions need a data session (one bound to a device)");
    goto exit;
  }
  uint64_t base = 0, size = 0, identity = 0;
  int kind;
  gd_host_alloc *h = find_host(c, ptr);
  if (h) {
    base = (uint64_t)(uintptr_t)h->ptr;
    size = h->size;
    identity = h->serial;
    kind = GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD;
  } else {
    st = cuda_lookup(c, ptr, &base, &size, &identity);
    if (st != GRAPHD_OK) goto exit;
    kind = 0;
  }
  if (ptr - base > size || bytes > size - (ptr - base)) {
    st = gd_client_set_err(c, GRAPHD_OUT_OF_RANGE,
                           "0x%llx + %llu bytes runs past the end of its allocation (%llu "
                           "bytes at 0x%llx)",
                           (unsigned long long)ptr, (unsigned long long)bytes,
                           (unsigned long long)size, (unsigned long long)base);
    goto exit;
  }
  if ((st = drop_stale(c, kind, base, size, identity)) != GRAPHD_OK) goto exit;
  gd_region_entry *e = find_entry(c, base);
  if (!e) {
    if (kind == GRAPHD__WIRE__REGION_KIND__REGION_KIND_HOST_MEMFD)
      st = register_new(c, kind, base, size, identity, h->fd, NULL, &e);
    else
      st = cuda_register(c, base, size, identity, &e);
    if (st != GRAPHD_OK) goto exit;
  }
  e->last_use = ++c->lru_clock;
  e->checked = c->check_serial;
  out->region_id = e->region_id;
  out->offset = ptr - base;
  out->size = e->size;
  out->import_ns = e->import_ns;
  e->import_ns = 0;
exit:
  return st;
}

graphd_status graphd_region_forget(graphd_client *c, uint64_t ptr) {
  GD_OWNED(c);
  graphd_status st = GRAPHD_NOT_FOUND;
  pthread_mutex_lock(&c->lock);
  for (uint32_t i = 0; i < c->nregions; i++) {
    gd_region_entry *e = &c->regions[i];
    if (ptr >= e->base && ptr - e->base < e->size) {
      st = send_unregister(c, e->region_id);
      remove_entry(c, i);
      break;
    }
  }
  if (st == GRAPHD_NOT_FOUND)
    gd_client_set_err(c, st, "no region of this handle holds 0x%llx", (unsigned long long)ptr);
  pthread_mutex_unlock(&c->lock);
  return st;
}

graphd_status graphd_region_unregister(graphd_client *c, uint32_t region_id) {
  GD_OWNED(c);
  pthread_mutex_lock(&c->lock);
  graphd_status st = send_unregister(c, region_id);
  for (uint32_t i = 0; i < c->nregions; i++)
    if (c->regions[i].region_id == region_id) {
      remove_entry(c, i);
      break;
    }
  pthread_mutex_unlock(&c->lock);
  return st;
}

graphd_status graphd_set_region_cap(graphd_client *c, uint32_t cap) {
  GD_OWNED(c);
  if (cap == 0) return GRAPHD_INVALID_ARGUMENT;
  pthread_mutex_lock(&c->lock);
  c->region_cap = cap;
  graphd_status st = GRAPHD_OK;
  /* Shrink now so the cap holds at once. */
  while (st == GRAPHD_OK && c->nregions > cap) {
    uint32_t lru = 0;
    for (uint32_t i = 1; i < c->nregions; i++)
      if (c->regions[i].last_use < c->regions[lru].last_use) lru = i;
    st = send_unregister(c, c->regions[lru].region_id);
    remove_entry(c, lru);
  }
  pthread_mutex_unlock(&c->lock);
  return st;
}

uint32_t graphd_region_count(graphd_client *c) {
  if (gd_client_foreign(c)) return 0;
  pthread_mutex_lock(&c->lock);
  uint32_t n = c->nregions;
  pthread_mutex_unlock(&c->lock);
  return n;
}

graphd_status graphd_host_alloc(graphd_client *c, size_t bytes, void **ptr) {
  GD_OWNED(c);
  graphd_status st = GRAPHD_OK;
  *ptr = NULL;
  if (bytes == 0) return GRAPHD_INVALID_ARGUMENT;
  pthread_mutex_lock(&c->lock);
  int fd = gd_memfd_new_shared("graphd-host-region", bytes);
  if (fd < 0) {
    st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "cannot make a %zu-byte memfd: %s", bytes,
                           strerror(errno));
    goto exit;
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "cannot map %zu bytes: %s", bytes,
                           strerror(errno));
    close(fd);
    goto exit;
  }
  if (c->nhost == c->host_cap) {
    uint32_t cap = c->host_cap ? 2 * c->host_cap : 16;
    gd_host_alloc *n = realloc(c->host, cap * sizeof *n);
    if (!n) {
      munmap(p, bytes);
      close(fd);
      st = gd_client_set_err(c, GRAPHD_RESOURCE_EXHAUSTED, "out of memory");
      goto exit;
    }
    c->host = n;
    c->host_cap = cap;
  }
  c->host[c->nhost++] =
      (gd_host_alloc){.ptr = p, .size = bytes, .fd = fd, .serial = ++c->host_serial};
  *ptr = p;
exit:
  pthread_mutex_unlock(&c->lock);
  return st;
}

graphd_status graphd_host_free(graphd_client *c, void *ptr) {
  GD_OWNED(c);
  graphd_status st = GRAPHD_OK;
  pthread_mutex_lock(&c->lock);
  gd_host_alloc *h = NULL;
  for (uint32_t i = 0; i < c->nhost; i++)
    if (c->host[i].ptr == ptr) h = &c->host[i];
  if (!h) {
    st = gd_client_set_err(c, GRAPHD_NOT_FOUND,
                           "%p was not allocated by graphd_host_alloc on this handle", ptr);
    goto exit;
  }
  gd_region_entry *e = find_entry(c, (uint64_t)(uintptr_t)ptr);
  if (e) {
    st = send_unregister(c, e->region_id);
    if (st == GRAPHD_NOT_FOUND) st = GRAPHD_OK;
    remove_entry(c, (uint32_t)(e - c->regions));
  }
  munmap(h->ptr, h->size);
  close(h->fd);
  *h = c->host[--c->nhost];
exit:
  pthread_mutex_unlock(&c->lock);
  return st;
}

void gd_client_regions_reset(graphd_client *c) { c->nregions = 0; }

void gd_client_regions_forget(graphd_client *c) {
  /* The mappings stay: the caller may still read them, and in a child of
   * fork they are the parent's memory too. The descriptors are this
   * process's own. */
  for (uint32_t i = 0; i < c->nhost; i++) close(c->host[i].fd);
  free(c->host);
  free(c->regions);
  c->host = NULL;
  c->regions = NULL;
  c->nhost = c->nregions = 0;
}

void gd_client_regions_close(graphd_client *c) {
  for (uint32_t i = 0; i < c->nhost; i++) munmap(c->host[i].ptr, c->host[i].size);
  gd_client_regions_forget(c);
}
