/* The thin backend interface under the shared daemon code.
 *
 * A backend enumerates its devices once at start (main thread, before the
 * loop runs) and then serves each device from that device's worker thread
 * only. Everything above this interface (sessions, validation, bookkeeping,
 * counters) is shared code; a backend stays thin.
 *
 * Later capabilities extend gd_backend_ops (allocation, import, modules,
 * graphs, copies, flags, events). */
#ifndef GRAPHD_BACKEND_H
#define GRAPHD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

/* Fixed facts about one device, learnt at enumeration. */
typedef struct gd_device_facts {
  int backend_index;   /* index within the backend (CUDA ordinal for cuda) */
  char name[256];
  uint8_t uuid[16];
  char uuid_str[48];   /* "GPU-…" or "HOST-…" */
  uint64_t total_memory;
  int mps_enabled;     /* CU_DEVICE_ATTRIBUTE_MPS_ENABLED; 0 for host */
} gd_device_facts;

typedef struct gd_backend_dev gd_backend_dev; /* per-device state, backend-defined */
typedef struct gd_backend gd_backend;

typedef struct gd_backend_ops {
  /* Worker thread: take the device (retain and set the primary context). */
  int (*device_open)(gd_backend *be, int backend_index, gd_backend_dev **out, char *err,
                     size_t errlen);
  /* Worker thread: give it back. */
  void (*device_close)(gd_backend *be, gd_backend_dev *dev);
  /* Worker thread: free and total bytes. */
  int (*mem_info)(gd_backend *be, gd_backend_dev *dev, uint64_t *free_bytes,
                  uint64_t *total_bytes, char *err, size_t errlen);
  /* Main thread, after every worker has stopped. */
  void (*destroy)(gd_backend *be);
} gd_backend_ops;

struct gd_backend {
  const char *name; /* "cuda" or "host" */
  const gd_backend_ops *ops;
  int ndevices;
  gd_device_facts *devices; /* ndevices entries */
  void *priv;
};

/* Host backend with n devices of mem_bytes each. Always succeeds unless out
 * of memory. */
int backend_host_new(int n, uint64_t mem_bytes, gd_backend **out, char *err, size_t errlen);

/* CUDA backend over every visible GPU. Returns -GRAPHD_UNAVAILABLE when there
 * is no driver or no GPU, -GRAPHD_FAILED_PRECONDITION when the driver is too
 * old; err says which. */
int backend_cuda_new(gd_backend **out, char *err, size_t errlen);

#endif
