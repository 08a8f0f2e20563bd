/* The thin backend interface under the shared daemon code.
 *
 * A backend enumerates its devices once at start (main thread, before the
 * loop runs) and then serves each device from that device's worker thread
 * only. Everything above this interface (sessions, validation, bookkeeping,
 * counters) is shared code; a backend stays thin.
 *
 * The ops cover what the shared code needs of a device: memory, imports,
 * modules, graphs, copies, flags and events. What is particular to one
 * backend stays behind them or shows as a capability field of gd_backend,
 * never as a comparison of names. */
#ifndef GRAPHD_BACKEND_H
#define GRAPHD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graphd/protocol.h"

/* Fixed facts about one device, learnt at enumeration. */
typedef struct gd_device_facts {
  int backend_index; /* index within the backend (CUDA ordinal for cuda) */
  char name[256];
  uint8_t uuid[16];
  char uuid_str[48]; /* "GPU-…" or "HOST-…" */
  uint64_t total_memory;
  int mps_enabled; /* CU_DEVICE_ATTRIBUTE_MPS_ENABLED; 0 for host */
} gd_device_facts;

typedef struct gd_backend_dev gd_backend_dev; /* per-device state, backend-defined */

/* What a backend knows about a function, for the device stage of
 * validation (shared code compares it with the program). */
#define GD_FUNC_MAX_PARAMS 1024 /* as many as a program launch may pass */
typedef struct gd_func_info {
  int params_known; /* 0: the backend cannot tell */
  uint32_t nparams;
  uint32_t param_offset[GD_FUNC_MAX_PARAMS];
  uint32_t param_size[GD_FUNC_MAX_PARAMS];
  uint32_t max_threads_per_block;
  uint32_t static_shared_bytes;
  uint32_t max_shared_optin;     /* dynamic + static shared a block may opt in to */
  uint32_t default_shared_limit; /* dynamic shared allowed without opting in */
} gd_func_info;

/* A region to import on a device. */
typedef struct gd_region_import {
  int kind;      /* enum graphd_region_kind (graphd/protocol.h) */
  int fd;        /* VMM and host kinds; the backend does not close it */
  uint64_t size; /* bytes the client declared */
  uint8_t ipc_handle[64];
} gd_region_import;

typedef struct gd_region_map {
  uint64_t ptr;    /* device address (host backend: host address) */
  uint64_t size;   /* usable bytes from ptr */
  uint64_t mapped; /* bytes mapped (rounded to granularity) */
  int kind;
  void *handle;    /* backend-private */
  uint64_t serial; /* the device's name for it (device.c) */
  uint64_t epoch;  /* the device epoch it was imported in */
} gd_region_map;
typedef struct gd_backend gd_backend;

/* A staging allocation: one per capture, sub-allocated by shared code. */
typedef struct gd_staging {
  uint64_t ptr;   /* device address (host: host address) */
  uint64_t bytes; /* allocated, rounded to the granularity */
  void *handle;   /* backend-private */
} gd_staging;

/* The shared flag page, mapped on a device. */
typedef struct gd_flags_map {
  volatile uint64_t *host; /* the daemon's host mapping */
  uint64_t dev;            /* device address of host[0] (host backend: same) */
  uint64_t bytes;
} gd_flags_map;

/* Opaque graph objects; the shared capture code only passes them back. */
typedef void *gd_graph;
typedef void *gd_graph_exec;
typedef void *gd_node;
typedef void *gd_stream;
typedef void *gd_event;

/* Why a host-side wait gives up (wait_value). */
enum gd_give_up { GD_GIVE_UP_GONE = 1, GD_GIVE_UP_HUNG = 2, GD_GIVE_UP_STOPPING = 3 };

enum gd_cond_kind { GD_COND_WHILE = 1, GD_COND_IF = 2 };

typedef struct gd_kernel_desc {
  void *fn; /* from function_get */
  uint32_t grid[3], block[3];
  uint32_t shared_bytes;
  void **params; /* kernelParams: one pointer per parameter */
  uint32_t nparams;
} gd_kernel_desc;

/* graphd's own kernels (util_function). */
enum gd_util { GD_UTIL_FILL = 0, GD_UTIL_COPY = 1, GD_UTIL_COUNT };

typedef struct gd_backend_ops {
  /* Worker thread: take the device (retain and set the primary context). */
  int (*device_open)(gd_backend *be, int backend_index, gd_backend_dev **out, char *err,
                     size_t errlen);
  /* Worker thread: give it back. */
  void (*device_close)(gd_backend *be, gd_backend_dev *dev);
  /* Worker thread: waits until every stream of the device has run what it
   * was given (a graceful stop, before anything is freed). */
  int (*device_sync)(gd_backend *be, gd_backend_dev *dev, char *err, size_t errlen);
  /* Worker thread: 0 while the device works; -GRAPHD_UNAVAILABLE, with err
   * naming the error, once a sticky error (a kernel fault: illegal
   * address, illegal instruction, ...) has made its context unusable.
   * Cheap: the worker asks after a failed job, and every 10 ms while idle
   * with work in flight. */
  int (*device_health)(gd_backend *be, gd_backend_dev *dev, char *err, size_t errlen);
  /* Worker thread: destroys the device's context, and everything made in
   * it, and makes a fresh one current. */
  int (*device_reset)(gd_backend *be, gd_backend_dev *dev, char *err, size_t errlen);
  /* Worker thread: free and total bytes. */
  int (*mem_info)(gd_backend *be, gd_backend_dev *dev, uint64_t *free_bytes, uint64_t *total_bytes,
                  char *err, size_t errlen);
  /* Worker thread: load module bytes of the given kind. err gets the JIT or
   * loader log on failure (-GRAPHD_INVALID_ARGUMENT for bad code,
   * -GRAPHD_FAILED_PRECONDITION for a kind this backend cannot run). */
  int (*module_load)(gd_backend *be, gd_backend_dev *dev, uint32_t kind, const void *bytes,
                     size_t len, void **mod, char *err, size_t errlen);
  void (*module_unload)(gd_backend *be, gd_backend_dev *dev, void *mod);
  /* Worker thread: find a function and load it (cuFuncLoad). Returns
   * -GRAPHD_NOT_FOUND when the module has no such function. */
  int (*function_get)(gd_backend *be, gd_backend_dev *dev, void *mod, const char *name, void **fn,
                      gd_func_info *info, char *err, size_t errlen);
  /* Worker thread: allow this much dynamic shared memory (opt-in past the
   * default limit). */
  int (*function_set_shared)(gd_backend *be, gd_backend_dev *dev, void *fn, uint32_t bytes,
                             char *err, size_t errlen);
  /* Worker thread: import client memory and check it lives on this device
   * (-GRAPHD_FAILED_PRECONDITION names both devices when it does not). */
  int (*region_import)(gd_backend *be, gd_backend_dev *dev, const gd_region_import *in,
                       gd_region_map *out, char *err, size_t errlen);
  void (*region_release)(gd_backend *be, gd_backend_dev *dev, gd_region_map *m);
  /* --- captures and replay (worker thread) --- */
  int (*staging_alloc)(gd_backend *be, gd_backend_dev *dev, uint64_t bytes, gd_staging *out,
                       char *err, size_t errlen);
  void (*staging_free)(gd_backend *be, gd_backend_dev *dev, gd_staging *s);
  int (*stream_create)(gd_backend *be, gd_backend_dev *dev, gd_stream *out, char *err,
                       size_t errlen);
  void (*stream_destroy)(gd_backend *be, gd_backend_dev *dev, gd_stream s);
  /* Waits on the host until everything enqueued on s has run. */
  int (*stream_sync)(gd_backend *be, gd_backend_dev *dev, gd_stream s, char *err, size_t errlen);
  int (*flags_map)(gd_backend *be, gd_backend_dev *dev, int fd, uint64_t bytes, gd_flags_map *out,
                   char *err, size_t errlen);
  void (*flags_unmap)(gd_backend *be, gd_backend_dev *dev, gd_flags_map *m);
  /* Enqueues "wait until *word >= value" (word is an address inside a
   * flag map: host and device forms). The host backend waits right here,
   * polling, and gives up with -GRAPHD_DEADLINE_EXCEEDED when
   * give_up(arg) says so: GD_GIVE_UP_GONE (the client has gone) or
   * GD_GIVE_UP_HUNG (the ready timeout passed while someone waits
   * behind); 0 to go on waiting. With GD_GIVE_UP_STOPPING (graphd is
   * stopping) it returns -GRAPHD_UNAVAILABLE instead: nothing was
   * started. */
  int (*wait_value)(gd_backend *be, gd_backend_dev *dev, gd_stream s, volatile uint64_t *host,
                    uint64_t dev_addr, uint64_t value, int (*give_up)(void *), void *arg, char *err,
                    size_t errlen);
  /* Enqueues "*word = value". */
  int (*write_value)(gd_backend *be, gd_backend_dev *dev, gd_stream s, volatile uint64_t *host,
                     uint64_t dev_addr, uint64_t value, char *err, size_t errlen);
  int (*graph_create)(gd_backend *be, gd_backend_dev *dev, gd_graph *out, char *err, size_t errlen);
  void (*graph_destroy)(gd_backend *be, gd_backend_dev *dev, gd_graph g);
  int (*graph_add_kernel)(gd_backend *be, gd_backend_dev *dev, gd_graph g, const gd_node *deps,
                          size_t ndeps, const gd_kernel_desc *k, gd_node *out, char *err,
                          size_t errlen);
  int (*graph_add_memset)(gd_backend *be, gd_backend_dev *dev, gd_graph g, const gd_node *deps,
                          size_t ndeps, uint64_t dst, uint32_t element_size, uint32_t value,
                          uint64_t count, gd_node *out, char *err, size_t errlen);
  int (*graph_add_memcpy)(gd_backend *be, gd_backend_dev *dev, gd_graph g, const gd_node *deps,
                          size_t ndeps, uint64_t dst, uint64_t src, uint64_t bytes, gd_node *out,
                          char *err, size_t errlen);
  /* Adds a conditional node after deps. Its condition is the 4-byte word
   * at device address `cond` (non-zero: true), read on the device when the
   * node is reached and, for a loop, again after each pass of its body
   * (graph_close_loop). A loop (GD_COND_WHILE) has one body, a branch
   * (GD_COND_IF) two, then and else: empty graphs, owned by the node,
   * that the caller fills. *handle names the condition for
   * graph_close_loop. *reader is the node that reads the word for the
   * conditional node, for graph_exec_condition_word. -GRAPHD_UNIMPLEMENTED
   * when the backend cannot. */
  int (*graph_add_conditional)(gd_backend *be, gd_backend_dev *dev, gd_graph g, const gd_node *deps,
                               size_t ndeps, int kind, uint64_t cond, gd_node *out, gd_node *reader,
                               gd_graph bodies[2], uint64_t *handle, char *err, size_t errlen);
  /* Ends a loop's body after deps (its last node; none when it is empty):
   * the condition is read again before the next pass. *reader is the node
   * that reads it there, or NULL when the backend adds none. */
  int (*graph_close_loop)(gd_backend *be, gd_backend_dev *dev, gd_graph body, const gd_node *deps,
                          size_t ndeps, uint64_t handle, uint64_t cond, gd_node *reader, char *err,
                          size_t errlen);
  /* Points a reader of a condition word (graph_add_conditional's or
   * graph_close_loop's, at any depth) of an instantiated graph at the word
   * at `cond`: direct mode binds a condition word's slot to the client's
   * buffer like any other. */
  int (*graph_exec_condition_word)(gd_backend *be, gd_backend_dev *dev, gd_graph_exec e,
                                   gd_node reader, uint64_t handle, uint64_t cond, char *err,
                                   size_t errlen);
  /* Instantiates and uploads on s. */
  int (*graph_instantiate)(gd_backend *be, gd_backend_dev *dev, gd_graph g, gd_stream s,
                           gd_graph_exec *out, char *err, size_t errlen);
  void (*graph_exec_destroy)(gd_backend *be, gd_backend_dev *dev, gd_graph_exec e);
  /* Re-points a memcpy node of an instantiated graph (1-D, bytes > 0) at
   * new memory. A backend may be unable to point a node at some memory
   * (CUDA re-points a memcpy node only to memory of the kind it was made
   * with, VMM or legacy IPC); it then turns the node off and sets
   * *outside, and the caller runs that copy outside the graph until a
   * later call clears *outside. *outside says on entry whether the node
   * is off now (false after the graph is built). */
  int (*graph_exec_repoint_memcpy)(gd_backend *be, gd_backend_dev *dev, gd_graph_exec e, gd_node n,
                                   uint64_t dst, uint64_t src, uint64_t bytes, bool *outside,
                                   char *err, size_t errlen);
  /* graphd's own fill or copy kernel (GD_UTIL_*), for graph_add_kernel and
   * graph_exec_kernel_params: direct mode runs a memset or copy step that
   * touches a client's buffer as a kernel node, which takes new pointers
   * where a memset or memcpy node made on other memory cannot. Parameters:
   * fill (u64 dst, u64 count, u32 value, u32 element_size), a memset of
   * count elements; copy (u64 dst, u64 src, u64 bytes). Any grid works.
   * -GRAPHD_UNIMPLEMENTED when the backend has none (the caller keeps
   * such slots staged). */
  int (*util_function)(gd_backend *be, gd_backend_dev *dev, int which, void **fn, char *err,
                       size_t errlen);
  /* Gives a kernel node of an instantiated graph new parameters (the same
   * function and shape; k->params is read during the call, or kept by the
   * host backend: it must live as long as the executable graph). */
  int (*graph_exec_kernel_params)(gd_backend *be, gd_backend_dev *dev, gd_graph_exec e, gd_node n,
                                  const gd_kernel_desc *k, char *err, size_t errlen);
  int (*graph_launch)(gd_backend *be, gd_backend_dev *dev, gd_graph_exec e, gd_stream s, char *err,
                      size_t errlen);
  int (*memcpy_async)(gd_backend *be, gd_backend_dev *dev, uint64_t dst, uint64_t src,
                      uint64_t bytes, gd_stream s, char *err, size_t errlen);
  /* Zeroes bytes (a multiple of 4, dst 4-aligned) at dst, on s. */
  int (*zero_async)(gd_backend *be, gd_backend_dev *dev, uint64_t dst, uint64_t bytes, gd_stream s,
                    char *err, size_t errlen);
  int (*event_create)(gd_backend *be, gd_backend_dev *dev, gd_event *out, char *err, size_t errlen);
  void (*event_destroy)(gd_backend *be, gd_backend_dev *dev, gd_event e);
  int (*event_record)(gd_backend *be, gd_backend_dev *dev, gd_event e, gd_stream s, char *err,
                      size_t errlen);
  int (*stream_wait_event)(gd_backend *be, gd_backend_dev *dev, gd_stream s, gd_event e, char *err,
                           size_t errlen);
  /* An event that also keeps the time it is reached (event_create's do
   * not), for event_elapsed; destroyed with event_destroy. */
  int (*event_create_timed)(gd_backend *be, gd_backend_dev *dev, gd_event *out, char *err,
                            size_t errlen);
  /* The device's time from timed event start to timed event end, both
   * recorded: 1 with *ns set once end has been reached, 0 while it has
   * not, < 0 on an error. */
  int (*event_elapsed)(gd_backend *be, gd_backend_dev *dev, gd_event start, gd_event end,
                       uint64_t *ns, char *err, size_t errlen);
  /* 1 when the work before the event's last record has finished, else 0. */
  int (*event_done)(gd_backend *be, gd_backend_dev *dev, gd_event e);
  /* Waits on the host until it has. */
  int (*event_sync)(gd_backend *be, gd_backend_dev *dev, gd_event e, char *err, size_t errlen);
  /* Main thread, after every worker has stopped. */
  void (*destroy)(gd_backend *be);
} gd_backend_ops;

struct gd_backend {
  const char *name;          /* "cuda" or "host", for people */
  const char *thread_prefix; /* "gpu" or "host": worker threads are <prefix><index> */
  bool runs_under_mps;       /* MPS matters for its speed: say when it is off */
  const gd_backend_ops *ops;
  int ndevices;
  gd_device_facts *devices; /* ndevices entries */
  void *priv;
  /* Ready waits block the worker itself (host backend); otherwise they are
   * queued on the device and the worker watches them from the host. */
  bool waits_on_worker;
};

/* Host backend with n devices of mem_bytes each. Always succeeds unless out
 * of memory. */
int backend_host_new(int n, uint64_t mem_bytes, gd_backend **out, char *err, size_t errlen);
/* Models a GPU still running a replay on host devices: its events stay not
 * done for busy_ns after the worker ran it, so captures look busy as they
 * would on a GPU and further instances get built (--host-busy-ms; 0 to
 * stop). Call before the workers start. */
int backend_host_set_busy(gd_backend *be, uint64_t busy_ns);

/* CUDA backend over every visible GPU. Returns -GRAPHD_UNAVAILABLE when there
 * is no driver or no GPU, -GRAPHD_FAILED_PRECONDITION when the driver is too
 * old; err says which. */
int backend_cuda_new(gd_backend **out, char *err, size_t errlen);

#endif
