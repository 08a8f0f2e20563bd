/* graphd's XLA FFI handler, in plain C against jaxlib's c_api.h.
 *
 * Registered in JAX as a CUDA custom call target; each call replays one
 * registered program on the call's own buffers, ordered with XLA's stream
 * (docs/jax.md has the whole flow). Attributes:
 *   program  string, the program id in 64 hex digits
 *   slots    array of i64: the program slot of each operand, then of each
 *            result, in order; -1 for an empty buffer, which binds nothing
 *   fixed    optional array of i64, (slot, address, bytes) triples: slots
 *            bound at every call to memory of the process at a fixed
 *            address (a library's device buffers made before the call),
 *            read and written; no operand or result names them
 *   sync     optional scalar (bool or integer): nonzero replays through a
 *            round trip to the daemon, as graphd_replay does; absent or zero
 *            replays asynchronously (graphd_replay_async), unless
 *            $GRAPHD_XLA_SYNC=1 asks for sync in the whole process. An
 *            asynchronous replay that fails is reported by the next call
 *            on the same device, or by graphd_xla_collect().
 * It answers XLA's metadata query with traits = 0, which keeps it out of
 * XLA's command buffers (they would replay the GPU work without the socket
 * request). Registered for XLA's instantiate stage too (the same
 * function), it keeps a state per executable's call site there, which its
 * calls name to the copies of constants (bounce.h); registered for the
 * execute stage alone, it works as well, checking those copies every call.
 *
 * DESIGN: XLA calls handlers from several threads at once (one per device
 * under shard_map or pmap). The session table is guarded by table_lock;
 * each session handle serialises its own calls; the (handle, CUstream)
 * stream cache lives in the session entry, under table_lock. A call holds
 * a reference on its entry while it uses the handle. libgraphd itself
 * reconnects a handle whose daemon went away (a restart), gives the new
 * session the programs synced from the client-side registry and sends a
 * replay the old daemon never ran again; a call that still fails with
 * UNAVAILABLE (a replay cut off, no daemon within the reconnect bound)
 * drops its session from the table, so the next call connects afresh; the
 * last call still using it closes it. XLA may instantiate executables on
 * its compile threads while others run: the state type's id per API is
 * written under type_lock and read by calls without it (published by a
 * release store); an executable's state is never written after it is
 * made. */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cuda_driver.h"
#include "common/env.h"
#include "graphd/hex.h"
#include "bounce.h"
#include "common/env.h"
#include "graphd/graphd.h"
#include "graphd/xla.h"

/* graphd's status codes are XLA's error codes, one to one (docs/design.md, "Status codes"). */
#define GRAPHD_XLA_SAME_(name, value, desc)                                                        \
  _Static_assert((int)GRAPHD_##name == (int)XLA_FFI_Error_Code_##name, #name " differs");
GRAPHD_STATUS_LIST(GRAPHD_XLA_SAME_)
#undef GRAPHD_XLA_SAME_

#define MAX_SESSIONS 64
#define MAX_STREAMS 16
/* Operands and results of one call: a program has at most 4096 slots
 * (graphd/encoding.h), each named at most once among the operands and once
 * among the results. */
#define MAX_BUFFERS 8192
/* Copies of unmappable buffers a device keeps before it frees the least
 * recently used idle ones (bounce.h): a soft cap, never a wall. */
#define BOUNCE_CAP 256

typedef struct dev_session {
  uint8_t uuid[16];
  graphd_client *c;
  struct {
    void *cu_stream;
    graphd_stream *s;
    uint64_t last_seq; /* of its last asynchronous replay; 0: none */
  } streams[MAX_STREAMS];
  int nstreams;
  int refs;     /* calls using c now */
  bool dropped; /* out of the table; the last call closes it */
  /* Buffers of this device that graphd cannot map, each with a copy of
   * its own (bounce.h); guarded by bounces.lock. */
  xla_bounce_table bounces;
} dev_session;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static dev_session *sessions[MAX_SESSIONS]; /* guarded by table_lock */
static int nsessions;                       /* guarded by table_lock */

static XLA_FFI_Error *fail(const XLA_FFI_Api *api, graphd_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* An XLA error with graphd's status code (the numbering is shared) and a
 * message that starts with "graphd: ". */
static XLA_FFI_Error *fail(const XLA_FFI_Api *api, graphd_status code, const char *fmt, ...) {
  char msg[GRAPHD_ERRMAX + 256];
  int n = snprintf(msg, sizeof msg, "graphd: ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
  va_end(ap);
  XLA_FFI_Error_Create_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  a.message = msg;
  a.errc = (XLA_FFI_Error_Code)code;
  return api->XLA_FFI_Error_Create(&a);
}

static size_t dtype_size(XLA_FFI_DataType t) {
  switch (t) {
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_S8:
    case XLA_FFI_DataType_U8:
    case XLA_FFI_DataType_F8E5M2:
    case XLA_FFI_DataType_F8E4M3:
    case XLA_FFI_DataType_F8E4M3FN:
    case XLA_FFI_DataType_F8E3M4:
    case XLA_FFI_DataType_F8E4M3B11FNUZ:
    case XLA_FFI_DataType_F8E5M2FNUZ:
    case XLA_FFI_DataType_F8E4M3FNUZ:
    case XLA_FFI_DataType_F8E8M0FNU: return 1;
    case XLA_FFI_DataType_S16:
    case XLA_FFI_DataType_U16:
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16: return 2;
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32:
    case XLA_FFI_DataType_F32: return 4;
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64:
    case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_C64: return 8;
    case XLA_FFI_DataType_C128: return 16;
    default: return 0; /* sub-byte and token types cannot be bound */
  }
}

/* The attribute `name`, or NULL. XLA sorts attributes by name; there are few. */
static void *find_attr(const XLA_FFI_Attrs *attrs, const char *name, XLA_FFI_AttrType *type) {
  size_t len = strlen(name);
  for (int64_t i = 0; i < attrs->size; i++) {
    const XLA_FFI_ByteSpan *n = attrs->names[i];
    if (n->len == len && memcmp(n->ptr, name, len) == 0) {
      *type = attrs->types[i];
      return attrs->attrs[i];
    }
  }
  return NULL;
}

/* A flag attribute (`sync`): *out is false when absent. A scalar of any
 * integer or bool type; anything else is refused (false returned). */
static bool scalar_attr(const XLA_FFI_Attrs *attrs, const char *name, bool *out) {
  XLA_FFI_AttrType t;
  const XLA_FFI_Scalar *sc = find_attr(attrs, name, &t);
  *out = false;
  if (!sc) return true;
  if (t != XLA_FFI_AttrType_SCALAR) return false;
  switch (sc->dtype) {
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_S8:
    case XLA_FFI_DataType_U8: *out = *(const uint8_t *)sc->value != 0; return true;
    case XLA_FFI_DataType_S16:
    case XLA_FFI_DataType_U16: *out = *(const uint16_t *)sc->value != 0; return true;
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32: *out = *(const uint32_t *)sc->value != 0; return true;
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64: *out = *(const uint64_t *)sc->value != 0; return true;
    default: return false;
  }
}

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static bool env_sync; /* $GRAPHD_XLA_SYNC=1: every call is synchronous */

/* $GRAPHD_XLA_STATS=1: what the process's calls did, counted (atomics)
 * and printed to stderr at exit, to see where a step's host time goes. */
static bool env_stats;
static graphd_xla_stats stats;

static void print_stats(void) {
  uint64_t n = __atomic_load_n(&stats.calls, __ATOMIC_RELAXED);
  double per = n ? 1e-3 / (double)n : 0.0;
  fprintf(stderr,
          "graphd_xla: %llu calls (%llu synchronous), %llu buffers bound, %llu in-out operands "
          "copied into results XLA did not alias, %llu calls binding copies of unmappable "
          "buffers (%llu copies queued, %llu driver queries checking constants' copies); a call: "
          "%.2f us of host time in the handler, of which "
          "%.2f us in libgraphd's replay call, of which %.2f us waiting for room in the ring, and "
          "%.2f us on the copies of unmappable buffers; "
          "the handler's and libgraphd's own work: %.2f us; %llu executables given the "
          "handler's state, %llu calls without it\n",
          (unsigned long long)n, (unsigned long long)stats.sync_calls,
          (unsigned long long)stats.buffers, (unsigned long long)stats.unaliased,
          (unsigned long long)stats.bounced, (unsigned long long)stats.bounce_copies,
          (unsigned long long)stats.id_queries, (double)stats.handler_ns * per,
          (double)stats.replay_ns * per, (double)stats.wait_ns * per, (double)stats.bounce_ns * per,
          (double)(stats.handler_ns - stats.wait_ns) * per, (unsigned long long)stats.executables,
          (unsigned long long)stats.stateless);
}

static void read_env(void) {
  env_sync = gd_env_flag("GRAPHD_XLA_SYNC");
  env_stats = gd_env_flag("GRAPHD_XLA_STATS");
  if (env_stats) atexit(print_stats);
}

int graphd_xla_stats_read(graphd_xla_stats *out, size_t size) {
  pthread_once(&env_once, read_env);
  graphd_xla_stats now = {0};
  if (env_stats) {
    const uint64_t *from = (const uint64_t *)&stats;
    uint64_t *to = (uint64_t *)&now;
    for (size_t i = 0; i < sizeof now / sizeof(uint64_t); i++)
      to[i] = __atomic_load_n(&from[i], __ATOMIC_RELAXED);
  }
  memcpy(out, &now, size < sizeof now ? size : sizeof now);
  return env_stats;
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void count(uint64_t *counter, uint64_t n) {
  if (env_stats) __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

/* The device behind an XLA stream, by UUID: the same GPU has other ordinals
 * in other processes. $GRAPHD_XLA_DEVICE names it instead (tests, or a
 * process whose stream lookup should be skipped). */
static graphd_status device_uuid(void *stream, uint8_t uuid[16], char *err, size_t errlen) {
  const char *env = getenv("GRAPHD_XLA_DEVICE");
  if (env && *env) {
    if (graphd_uuid_parse(env, uuid) == GRAPHD_OK) return GRAPHD_OK;
    snprintf(err, errlen, "GRAPHD_XLA_DEVICE=%s is not a device UUID", env);
    return GRAPHD_INVALID_ARGUMENT;
  }
  const gd_cuda *cu;
  char e[256];
  if (gd_cuda_load(&cu, e, sizeof e) < 0) {
    snprintf(err, errlen, "%s", e);
    return GRAPHD_FAILED_PRECONDITION;
  }
  CUdevice dev;
  CUuuid u;
  if (cu->cuStreamGetDevice((CUstream)stream, &dev) != CUDA_SUCCESS ||
      cu->cuDeviceGetUuid(&u, dev) != CUDA_SUCCESS) {
    snprintf(err, errlen, "cannot find the device of XLA's stream");
    return GRAPHD_INTERNAL;
  }
  memcpy(uuid, u.bytes, 16);
  return GRAPHD_OK;
}

/* The session for a device, connected on first use, with a reference
 * taken. Caller holds table_lock (the connect is local and quick). */
/* The daemon's socket for new sessions ("": libgraphd's default);
 * guarded by table_lock. */
static char socket_path[108];

int graphd_xla_set_socket_path(const char *path, char *err, size_t errlen) {
  const char *p = path ? path : "";
  int st = 0;
  pthread_mutex_lock(&table_lock);
  if (strlen(p) >= sizeof socket_path) {
    snprintf(err, errlen, "socket path %s is longer than %zu bytes", p, sizeof socket_path - 1);
    st = GRAPHD_INVALID_ARGUMENT;
  } else if (strcmp(p, socket_path) != 0 && nsessions > 0) {
    snprintf(err, errlen,
             "the handler has sessions with the daemon at %s already: one daemon a process",
             socket_path[0] ? socket_path : "the default socket");
    st = GRAPHD_FAILED_PRECONDITION;
  } else {
    snprintf(socket_path, sizeof socket_path, "%s", p);
  }
  pthread_mutex_unlock(&table_lock);
  if (!st && err && errlen) err[0] = '\0';
  return st;
}

static dev_session *session_get(const uint8_t uuid[16], char *err, size_t errlen,
                                graphd_status *st) {
  for (int i = 0; i < nsessions; i++)
    if (memcmp(sessions[i]->uuid, uuid, 16) == 0) {
      sessions[i]->refs++;
      return sessions[i];
    }
  if (nsessions == MAX_SESSIONS) {
    snprintf(err, errlen, "more than %d devices", MAX_SESSIONS);
    *st = GRAPHD_RESOURCE_EXHAUSTED;
    return NULL;
  }
  dev_session *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of memory");
    *st = GRAPHD_RESOURCE_EXHAUSTED;
    return NULL;
  }
  graphd_connect_options o;
  graphd_connect_options_init(&o);
  o.kind = GRAPHD_SESSION_DATA;
  memcpy(o.device_uuid, uuid, 16);
  o.client_name = "jax";
  o.socket_path = socket_path[0] ? socket_path : NULL;
  *st = graphd_connect(&o, &d->c, err, errlen);
  if (*st != GRAPHD_OK) {
    free(d);
    return NULL;
  }
  memcpy(d->uuid, uuid, 16);
  xla_bounce_init(&d->bounces, BOUNCE_CAP);
  d->refs = 1;
  sessions[nsessions++] = d;
  return d;
}

/* Gives a call's reference back. A session whose daemon went away
 * (unavailable) leaves the table now, and the last call closes it. */
static void session_put(dev_session *d, bool unavailable) {
  pthread_mutex_lock(&table_lock);
  if (unavailable && !d->dropped) {
    d->dropped = true;
    for (int i = 0; i < nsessions; i++)
      if (sessions[i] == d) {
        sessions[i] = sessions[--nsessions];
        break;
      }
  }
  bool last = --d->refs == 0 && d->dropped;
  pthread_mutex_unlock(&table_lock);
  if (!last) return;
  for (int i = 0; i < d->nstreams; i++) graphd_stream_detach(d->streams[i].s);
  graphd_close(d->c);
  xla_bounce_close(&d->bounces);
  free(d);
}

static graphd_stream *stream_for(dev_session *d, void *cu_stream, char *err, size_t errlen,
                                 graphd_status *st) {
  for (int i = 0; i < d->nstreams; i++)
    if (d->streams[i].cu_stream == cu_stream) return d->streams[i].s;
  if (d->nstreams == MAX_STREAMS) {
    snprintf(err, errlen, "more than %d XLA streams on one device", MAX_STREAMS);
    *st = GRAPHD_RESOURCE_EXHAUSTED;
    return NULL;
  }
  graphd_stream *s;
  *st = graphd_stream_attach(d->c, cu_stream, &s);
  if (*st != GRAPHD_OK) {
    snprintf(err, errlen, "%s", graphd_last_error(d->c));
    return NULL;
  }
  d->streams[d->nstreams].cu_stream = cu_stream;
  d->streams[d->nstreams++].s = s;
  return s;
}

/* --- State per executable -------------------------------------------------
 * XLA calls the handler at its instantiate stage once for each call site
 * of it in an executable, when the executable is made, with the
 * attributes but no buffers or stream. The handler keeps an xla_exec there
 * as XLA's state of a type of its own (XLA_FFI_State_Set), which XLA frees
 * with the type's deleter when it destroys the executable, and which each
 * executed call reads back (XLA_FFI_State_Get) to name its executable to
 * the copies of constants (bounce.h says why that is safe). Each XLA FFI
 * implementation keeps its own type registry (a PJRT plugin carries one),
 * so the type is registered once per XLA_FFI_Api a call comes with.
 * Without it (no instantiate stage, an older XLA, a refused registration)
 * a call names no executable and its constants are checked every call. */

#define MAX_APIS 4
#define EXEC_TYPE_NAME "graphd_xla_executable"

/* Whether api has the table entry fn, and it is set. */
#define API_HAS(api, fn)                                                                           \
  ((api)->struct_size >= offsetof(XLA_FFI_Api, fn) + sizeof(void *) && (api)->fn != NULL)

static pthread_mutex_t type_lock = PTHREAD_MUTEX_INITIALIZER;
/* Each API's id of the state type: entries written under type_lock, then
 * published by a release store of ntypes, so that calls read them without
 * the lock. */
static struct {
  const XLA_FFI_Api *api;
  int64_t id;
} exec_types[MAX_APIS];
static int ntypes;

static void drop_error(const XLA_FFI_Api *api, XLA_FFI_Error *e) {
  if (!e || !API_HAS(api, XLA_FFI_Error_Destroy)) return;
  XLA_FFI_Error_Destroy_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  a.error = e;
  api->XLA_FFI_Error_Destroy(&a);
}

/* The id api gave the state type, or 0 while it has given none. */
static int64_t exec_type_known(const XLA_FFI_Api *api) {
  int n = __atomic_load_n(&ntypes, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (exec_types[i].api == api) return exec_types[i].id;
  return 0;
}

/* The id of the state type in api, registered on first use; 0 when api
 * cannot register it. */
static int64_t exec_type(const XLA_FFI_Api *api) {
  int64_t id = exec_type_known(api);
  if (id) return id;
  pthread_mutex_lock(&type_lock);
  id = exec_type_known(api);
  if (!id && ntypes < MAX_APIS && API_HAS(api, XLA_FFI_Type_Register)) {
    static const XLA_FFI_TypeInfo info = {.struct_size = XLA_FFI_TypeInfo_STRUCT_SIZE,
                                          .deleter = xla_exec_free};
    XLA_FFI_TypeId tid;
    memset(&tid, 0, sizeof tid); /* unknown: XLA assigns one */
    XLA_FFI_Type_Register_Args a;
    memset(&a, 0, sizeof a);
    a.struct_size = XLA_FFI_Type_Register_Args_STRUCT_SIZE;
    a.name.ptr = EXEC_TYPE_NAME;
    a.name.len = sizeof EXEC_TYPE_NAME - 1;
    a.type_id = &tid;
    a.type_info = &info;
    XLA_FFI_Error *e = api->XLA_FFI_Type_Register(&a);
    if (e) {
      drop_error(api, e);
    } else if (tid.type_id > 0) {
      exec_types[ntypes].api = api;
      exec_types[ntypes].id = id = tid.type_id;
      __atomic_store_n(&ntypes, ntypes + 1, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&type_lock);
  return id;
}

/* The instantiate stage: a new executable's call site gets its xla_exec.
 * What cannot be set up is no error: its calls then check every time. */
static XLA_FFI_Error *instantiate(XLA_FFI_CallFrame *cf) {
  const XLA_FFI_Api *api = cf->api;
  int64_t type = api ? exec_type(api) : 0;
  if (!type || !API_HAS(api, XLA_FFI_State_Set)) return NULL;
  xla_exec *e = xla_exec_new();
  if (!e) return NULL;
  XLA_FFI_TypeId tid = {.type_id = type};
  XLA_FFI_State_Set_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = XLA_FFI_State_Set_Args_STRUCT_SIZE;
  a.ctx = cf->ctx;
  a.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  a.type_id = &tid;
  a.state = e;
  XLA_FFI_Error *xe = api->XLA_FFI_State_Set(&a);
  if (xe) {
    drop_error(api, xe);
    xla_exec_free(e);
    return NULL;
  }
  count(&stats.executables, 1);
  return NULL;
}

/* The serial of the executable making an executed call, from the state
 * its instantiate stage set; 0 when it has none. */
static uint64_t exec_serial(const XLA_FFI_CallFrame *cf) {
  const XLA_FFI_Api *api = cf->api;
  int64_t type = exec_type_known(api);
  if (!type || !API_HAS(api, XLA_FFI_State_Get)) return 0;
  XLA_FFI_TypeId tid = {.type_id = type};
  XLA_FFI_State_Get_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = XLA_FFI_State_Get_Args_STRUCT_SIZE;
  a.ctx = cf->ctx;
  a.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  a.type_id = &tid;
  XLA_FFI_Error *e = api->XLA_FFI_State_Get(&a);
  if (e) {
    drop_error(api, e);
    return 0;
  }
  return a.state ? ((const xla_exec *)a.state)->serial : 0;
}

static XLA_FFI_Error *metadata(XLA_FFI_CallFrame *cf) {
  XLA_FFI_Metadata_Extension *ext = (XLA_FFI_Metadata_Extension *)cf->extension_start;
  ext->metadata->api_version.major_version = XLA_FFI_API_MAJOR;
  ext->metadata->api_version.minor_version = XLA_FFI_API_MINOR;
  ext->metadata->traits = 0; /* never inside a command buffer */
  return NULL;
}

/* The bindings of a call's buffers: slot[i] for operand i, then for each
 * result. A result aliased to an operand (an in-out slot) is the same
 * buffer, bound once; slot -1 names an empty buffer, bound to nothing.
 * Then the nfixed (slot, address, bytes) triples of `fixed`, read and
 * written, on slots nothing else names.
 * Where XLA gave an in-out slot's result a buffer of its own rather than
 * the operand's, the result's buffer is bound and from[] holds the
 * operand's address, to be copied into it first (the operand is left as it
 * is). *out is malloc'd (the caller frees it) and holds the n bindings,
 * then from[] and dir[] (XLA_DIR_IN and XLA_DIR_OUT) for each; *from is
 * NULL when XLA aliased every in-out result. NULL or the error. */
static XLA_FFI_Error *bind_buffers(const XLA_FFI_Api *api, const XLA_FFI_CallFrame *cf,
                                   const int64_t *slot, int64_t nargs, int64_t nrets,
                                   const int64_t *fixed, int64_t nfixed, graphd_binding **out,
                                   uint64_t **from, uint8_t **dir, int64_t *nout) {
  int64_t n = nargs + nrets + nfixed;
  /* An open-addressing table from slot to binding, at most half full. */
  uint32_t cap = 16;
  while (cap < 2 * (uint64_t)n) cap *= 2;
  size_t m = (size_t)(n ? n : 1);
  graphd_binding *b = malloc(m * (sizeof *b + sizeof(uint64_t) + 1));
  uint64_t *f = (uint64_t *)(b + m);
  uint8_t *d = (uint8_t *)(f + m);
  int32_t *at = malloc(cap * sizeof *at);
  if (!b || !at) {
    free(b);
    free(at);
    return fail(api, GRAPHD_RESOURCE_EXHAUSTED, "out of memory for %lld bindings", (long long)n);
  }
  memset(at, 0xff, cap * sizeof *at);
  int64_t nb = 0, nfrom = 0;
  XLA_FFI_Error *e = NULL;
  for (int64_t i = 0; i < n && !e; i++) {
    if (i >= nargs + nrets) {
      const int64_t *fx = fixed + 3 * (i - nargs - nrets);
      if (fx[0] < 0 || fx[0] > UINT32_MAX || fx[1] <= 0 || fx[2] <= 0) {
        e = fail(api, GRAPHD_INVALID_ARGUMENT,
                 "fixed binding %lld (slot %lld, address 0x%llx, %lld bytes) is not a slot and "
                 "a memory range",
                 (long long)(i - nargs - nrets), (long long)fx[0], (unsigned long long)fx[1],
                 (long long)fx[2]);
        break;
      }
      uint32_t h = ((uint32_t)fx[0] * 2654435761u) & (cap - 1);
      while (at[h] >= 0 && b[at[h]].slot != (uint32_t)fx[0]) h = (h + 1) & (cap - 1);
      if (at[h] >= 0) {
        e = fail(api, GRAPHD_INVALID_ARGUMENT,
                 "slot %lld has a fixed binding and another buffer (an operand, a result or "
                 "another fixed binding)",
                 (long long)fx[0]);
        break;
      }
      at[h] = (int32_t)nb;
      f[nb] = 0;
      d[nb] = XLA_DIR_IN | XLA_DIR_OUT;
      b[nb].slot = (uint32_t)fx[0];
      b[nb].ptr = (uint64_t)fx[1];
      b[nb].bytes = (uint64_t)fx[2];
      nb++;
      continue;
    }
    bool is_arg = i < nargs;
    int64_t k = is_arg ? i : i - nargs;
    const char *what = is_arg ? "operand" : "result";
    bool is_buffer = is_arg ? cf->args.types[k] == XLA_FFI_ArgType_BUFFER
                            : cf->rets.types[k] == XLA_FFI_RetType_BUFFER;
    if (!is_buffer) {
      e = fail(api, GRAPHD_INVALID_ARGUMENT, "%s %lld is not a buffer", what, (long long)k);
      break;
    }
    const XLA_FFI_Buffer *buf = is_arg ? cf->args.args[k] : cf->rets.rets[k];
    size_t es = dtype_size(buf->dtype);
    if (es == 0) {
      e = fail(api, GRAPHD_INVALID_ARGUMENT, "%s %lld has dtype %d, which graphd cannot bind", what,
               (long long)k, (int)buf->dtype);
      break;
    }
    uint64_t bytes = es;
    for (int64_t r = 0; r < buf->rank; r++) bytes *= (uint64_t)buf->dims[r];
    if (slot[i] == -1) {
      if (bytes)
        e = fail(api, GRAPHD_INVALID_ARGUMENT,
                 "%s %lld has %llu bytes but no slot (slot -1 is for empty buffers)", what,
                 (long long)k, (unsigned long long)bytes);
      continue;
    }
    if (slot[i] < 0 || slot[i] > UINT32_MAX) {
      e = fail(api, GRAPHD_INVALID_ARGUMENT, "slot %lld is out of range", (long long)slot[i]);
      break;
    }
    uint32_t h = ((uint32_t)slot[i] * 2654435761u) & (cap - 1);
    while (at[h] >= 0 && b[at[h]].slot != (uint32_t)slot[i]) h = (h + 1) & (cap - 1);
    if (at[h] >= 0) {
      /* An inout slot names an operand and the result aliased to it
       * (input_output_aliases): one buffer, bound once. */
      int32_t j = at[h];
      uint64_t ptr = (uint64_t)(uintptr_t)buf->data;
      if (b[j].ptr != ptr) {
        if (is_arg || d[j] != XLA_DIR_IN || b[j].bytes != bytes) {
          e = fail(api, GRAPHD_INVALID_ARGUMENT,
                   "slot %lld is given two different buffers (an inout slot takes one operand "
                   "and one result of its size)",
                   (long long)slot[i]);
          continue;
        }
        f[j] = b[j].ptr;
        b[j].ptr = ptr;
        nfrom++;
      }
      d[j] |= is_arg ? XLA_DIR_IN : XLA_DIR_OUT;
      continue;
    }
    at[h] = (int32_t)nb;
    f[nb] = 0;
    d[nb] = is_arg ? XLA_DIR_IN : XLA_DIR_OUT;
    b[nb].slot = (uint32_t)slot[i];
    b[nb].ptr = (uint64_t)(uintptr_t)buf->data;
    b[nb].bytes = bytes;
    nb++;
  }
  free(at);
  if (e) {
    free(b);
    return e;
  }
  count(&stats.unaliased, (uint64_t)nfrom);
  *out = b;
  *from = nfrom ? f : NULL;
  *dir = d;
  *nout = nb;
  return NULL;
}

/* --- Bounce copies ---------------------------------------------------------
 * XLA may hand the handler memory that no other process can map: the
 * constants of a compiled module (an array the jitted function closes
 * over, or one a library makes inside it), and stream-ordered pool memory.
 * A replay that binds such a buffer is refused by libgraphd before
 * anything is queued. The handler then gives each such buffer a copy of
 * its own and binds the copy from then on (bounce.h: the copies, when
 * one is freed, and why that is safe). Buffers that graphd maps cost
 * nothing here. */

/* Copies, on the stream, each in-out operand that XLA did not alias into
 * its result's buffer (bind_buffers' from[]), but for those whose result
 * has a copy (x[i]: xla_bounce_begin filled the copy from the operand
 * straight, and the result gets the copy's contents after the replay). */
static graphd_status copy_unaliased(const graphd_binding *b, const uint64_t *from,
                                    xla_bounce *const *x, int64_t nb, CUstream st, char *err,
                                    size_t errlen) {
  const gd_cuda *cu = NULL;
  for (int64_t i = 0; i < nb; i++) {
    if (!from[i] || (x && x[i])) continue;
    if ((!cu && gd_cuda_load(&cu, NULL, 0) < 0) ||
        cu->cuMemcpyDtoDAsync((CUdeviceptr)b[i].ptr, (CUdeviceptr)from[i], b[i].bytes, st) !=
            CUDA_SUCCESS) {
      snprintf(err, errlen, "cannot queue the copy of in-out slot %u's operand into its result",
               b[i].slot);
      return GRAPHD_INTERNAL;
    }
  }
  return GRAPHD_OK;
}

/* One replay of the call's bindings, with its bounce copies; add: first
 * gives the buffers graphd cannot map copies (when none is added, the
 * replay was refused for something else and that answer stands). */
static graphd_status replay_once(dev_session *d, graphd_stream *s, void *cu_stream, uint64_t exec,
                                 const uint8_t pid[32], const graphd_binding *b,
                                 const uint64_t *from, const uint8_t *dir, int64_t nb, bool sync,
                                 bool add, uint64_t *seq, char *err, size_t errlen) {
  xla_bounce_table *t = &d->bounces;
  graphd_status st = GRAPHD_OK;
  uint64_t b0 = env_stats ? now_ns() : 0, t0 = 0, t1 = 0;
  /* Held to the end: another call on this device must not see the copies
   * change under it (a new copy may free an idle one). */
  pthread_mutex_lock(&t->lock);
  if (add) {
    int added = xla_bounce_add(t, b, nb, err, errlen);
    if (added <= 0) {
      pthread_mutex_unlock(&t->lock);
      return added < 0 ? GRAPHD_RESOURCE_EXHAUSTED : GRAPHD_FAILED_PRECONDITION;
    }
  }
  xla_bounce_call call;
  st = xla_bounce_begin(t, b, from, dir, nb, (CUstream)cu_stream, exec, &call, err, errlen);
  if (st == GRAPHD_OK && from)
    st = copy_unaliased(b, from, call.x, nb, (CUstream)cu_stream, err, errlen);
  bool replayed = false;
  if (st == GRAPHD_OK) {
    if (call.any) count(&stats.bounced, 1);
    uint64_t w0 = env_stats ? graphd_ring_wait_ns(d->c) : 0;
    t0 = env_stats ? now_ns() : 0;
    st = sync ? graphd_replay(d->c, s, pid, call.use, (size_t)nb, NULL)
              : graphd_replay_async(d->c, s, pid, call.use, (size_t)nb, seq);
    if (env_stats) {
      t1 = now_ns();
      count(&stats.replay_ns, t1 - t0);
      count(&stats.wait_ns, graphd_ring_wait_ns(d->c) - w0);
    }
    if (st != GRAPHD_OK) snprintf(err, errlen, "%s", graphd_last_error(d->c));
    replayed = st == GRAPHD_OK;
  }
  graphd_status end = xla_bounce_end(t, &call, b, dir, nb, replayed, err, errlen);
  if (st == GRAPHD_OK) st = end;
  count(&stats.bounce_copies, call.copies);
  count(&stats.id_queries, call.id_queries);
  pthread_mutex_unlock(&t->lock);
  /* The time under the lock but outside libgraphd's call (the whole of
   * it when the call was not made). */
  if (env_stats) count(&stats.bounce_ns, now_ns() - b0 - (t1 - t0));
  return st;
}

/* --- Which programs this process's calls replayed, and when --------------
 * A process-wide sequence number per call that got its program to the
 * daemon; graphd.warp reads it to learn which programs the daemon holds
 * captured again after it asked for their eviction (a compiled call
 * replays without passing through Python). Open addressing on the id,
 * grown by doubling; bookkeeping only, so running out of memory skips it. */
typedef struct seen_program {
  uint8_t id[32];
  uint64_t seq; /* 0: a free entry */
} seen_program;

static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;
static seen_program *seen_tab; /* guarded by seen_lock */
static size_t seen_cap, seen_n;
static uint64_t seen_seq;

static size_t seen_slot(const seen_program *tab, size_t cap, const uint8_t id[32]) {
  uint64_t h;
  memcpy(&h, id, sizeof h);
  size_t i = (size_t)(h * 0x9E3779B97F4A7C15ull) & (cap - 1);
  while (tab[i].seq && memcmp(tab[i].id, id, 32) != 0) i = (i + 1) & (cap - 1);
  return i;
}

static void note_replay(const uint8_t pid[32]) {
  pthread_mutex_lock(&seen_lock);
  if (2 * (seen_n + 1) > seen_cap) {
    size_t cap = seen_cap ? 2 * seen_cap : 64;
    seen_program *t = calloc(cap, sizeof *t);
    if (!t) {
      pthread_mutex_unlock(&seen_lock);
      return;
    }
    for (size_t i = 0; i < seen_cap; i++)
      if (seen_tab[i].seq) t[seen_slot(t, cap, seen_tab[i].id)] = seen_tab[i];
    free(seen_tab);
    seen_tab = t;
    seen_cap = cap;
  }
  size_t i = seen_slot(seen_tab, seen_cap, pid);
  if (!seen_tab[i].seq) {
    memcpy(seen_tab[i].id, pid, 32);
    seen_n++;
  }
  seen_tab[i].seq = ++seen_seq;
  pthread_mutex_unlock(&seen_lock);
}

void graphd_xla_last_replays(const uint8_t *ids, size_t n, uint64_t *seq) {
  pthread_mutex_lock(&seen_lock);
  for (size_t k = 0; k < n; k++)
    seq[k] = seen_cap ? seen_tab[seen_slot(seen_tab, seen_cap, ids + 32 * k)].seq : 0;
  pthread_mutex_unlock(&seen_lock);
}

static XLA_FFI_Error *replay_call(XLA_FFI_CallFrame *cf);

XLA_FFI_Error *graphd_xla_replay(XLA_FFI_CallFrame *cf) {
  /* The metadata query comes first, and its api may be NULL. */
  if (cf->extension_start && cf->extension_start->type == XLA_FFI_Extension_Metadata)
    return metadata(cf);
  pthread_once(&env_once, read_env);
  if (cf->stage == XLA_FFI_ExecutionStage_INSTANTIATE) return instantiate(cf);
  if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
  uint64_t t0 = env_stats ? now_ns() : 0;
  XLA_FFI_Error *xe = replay_call(cf);
  if (env_stats) {
    count(&stats.calls, 1);
    count(&stats.handler_ns, now_ns() - t0);
  }
  return xe;
}

/* One call, executed. */
static XLA_FFI_Error *replay_call(XLA_FFI_CallFrame *cf) {
  const XLA_FFI_Api *api = cf->api;
  XLA_FFI_AttrType t;
  const XLA_FFI_ByteSpan *prog = find_attr(&cf->attrs, "program", &t);
  if (!prog || t != XLA_FFI_AttrType_STRING)
    return fail(api, GRAPHD_INVALID_ARGUMENT,
                "the 'program' attribute (a 64-digit hex id) is missing");
  uint8_t pid[32];
  if (gd_hex_decode(prog->ptr, prog->len, pid, sizeof pid, NULL, 0) < 0)
    return fail(api, GRAPHD_INVALID_ARGUMENT, "the 'program' attribute is not a 64-digit hex id");
  const XLA_FFI_Array *slots = find_attr(&cf->attrs, "slots", &t);
  if (!slots || t != XLA_FFI_AttrType_ARRAY || slots->dtype != XLA_FFI_DataType_S64)
    return fail(api, GRAPHD_INVALID_ARGUMENT, "the 'slots' attribute (an int64 array) is missing");
  bool sync;
  if (!scalar_attr(&cf->attrs, "sync", &sync))
    return fail(api, GRAPHD_INVALID_ARGUMENT,
                "the 'sync' attribute must be a bool or integer scalar");
  sync = sync || env_sync;
  if (sync) count(&stats.sync_calls, 1);
  const XLA_FFI_Array *fixed = find_attr(&cf->attrs, "fixed", &t);
  int64_t nfixed = 0;
  if (fixed) {
    if (t != XLA_FFI_AttrType_ARRAY || fixed->dtype != XLA_FFI_DataType_S64 || fixed->size % 3)
      return fail(api, GRAPHD_INVALID_ARGUMENT,
                  "the 'fixed' attribute must be an int64 array of (slot, address, bytes) triples");
    nfixed = (int64_t)fixed->size / 3;
  }
  int64_t nargs = cf->args.size, nrets = cf->rets.size;
  if ((int64_t)slots->size != nargs + nrets)
    return fail(api, GRAPHD_INVALID_ARGUMENT,
                "%lld operands and %lld results, but 'slots' names %zu slots", (long long)nargs,
                (long long)nrets, slots->size);
  if (nargs + nrets + nfixed > MAX_BUFFERS)
    return fail(api, GRAPHD_INVALID_ARGUMENT,
                "%lld operands, results and fixed bindings: at most %d",
                (long long)(nargs + nrets + nfixed), MAX_BUFFERS);
  graphd_binding *b = NULL;
  uint64_t *from = NULL;
  uint8_t *dir = NULL;
  int64_t nb = 0;
  XLA_FFI_Error *xe =
      bind_buffers(api, cf, slots->data, nargs, nrets, fixed ? (const int64_t *)fixed->data : NULL,
                   nfixed, &b, &from, &dir, &nb);
  if (xe) return xe;
  count(&stats.buffers, (uint64_t)nb);

  uint64_t exec = exec_serial(cf);
  if (!exec) count(&stats.stateless, 1);
  XLA_FFI_Stream_Get_Args sa;
  memset(&sa, 0, sizeof sa);
  sa.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
  sa.ctx = cf->ctx;
  if ((xe = api->XLA_FFI_Stream_Get(&sa))) {
    free(b);
    return xe;
  }
  char err[GRAPHD_ERRMAX];
  uint8_t uuid[16];
  graphd_status st = device_uuid(sa.stream, uuid, err, sizeof err);
  if (st != GRAPHD_OK) {
    free(b);
    return fail(api, st, "%s", err);
  }

  pthread_mutex_lock(&table_lock);
  dev_session *d = session_get(uuid, err, sizeof err, &st);
  pthread_mutex_unlock(&table_lock);
  if (!d) {
    free(b);
    return fail(api, st, "%s", err);
  }
  graphd_client *c = d->c;
  /* The handle serialises its own calls; the table lock is not held over
   * round trips, so other devices' calls proceed. */
  graphd_stream *s = NULL;
  st = graphd_registry_sync(c, pid);
  if (st != GRAPHD_OK) {
    snprintf(err, sizeof err, "%s", graphd_last_error(c));
  } else {
    note_replay(pid);
    pthread_mutex_lock(&table_lock);
    s = stream_for(d, sa.stream, err, sizeof err, &st);
    pthread_mutex_unlock(&table_lock);
  }
  if (s) {
    uint64_t seq = 0;
    st = replay_once(d, s, sa.stream, exec, pid, b, from, dir, nb, sync, false, &seq, err,
                     sizeof err);
    /* Refused before anything was queued because of memory graphd cannot
     * map: once more, with copies of those buffers. */
    if (st == GRAPHD_FAILED_PRECONDITION)
      st = replay_once(d, s, sa.stream, exec, pid, b, from, dir, nb, sync, true, &seq, err,
                       sizeof err);
    if (seq) {
      pthread_mutex_lock(&table_lock);
      for (int i = 0; i < d->nstreams; i++)
        if (d->streams[i].s == s && seq > d->streams[i].last_seq) d->streams[i].last_seq = seq;
      pthread_mutex_unlock(&table_lock);
    }
  }
  session_put(d, st == GRAPHD_UNAVAILABLE);
  free(b);
  return st == GRAPHD_OK ? NULL : fail(api, st, "%s", err);
}

/* Keeps the first failure, with d's message, in *first and err. */
static void keep_first(graphd_status *first, graphd_status st, dev_session *d, char *err,
                       size_t errlen) {
  if (st == GRAPHD_OK || *first != GRAPHD_OK) return;
  *first = st;
  if (err && errlen) snprintf(err, errlen, "%s", graphd_last_error(d->c));
}

int graphd_xla_collect(char *err, size_t errlen) {
  /* The sessions and their streams' last replays, held by a reference so
   * that the waits run without the table lock. */
  struct {
    dev_session *d;
    graphd_stream *s;
    uint64_t seq;
  } w[MAX_SESSIONS * MAX_STREAMS];
  dev_session *held[MAX_SESSIONS];
  int nw = 0, nheld = 0;
  pthread_mutex_lock(&table_lock);
  for (int i = 0; i < nsessions; i++) {
    dev_session *d = sessions[i];
    d->refs++;
    held[nheld++] = d;
    for (int k = 0; k < d->nstreams; k++)
      if (d->streams[k].last_seq) {
        w[nw].d = d;
        w[nw].s = d->streams[k].s;
        w[nw++].seq = d->streams[k].last_seq;
      }
  }
  pthread_mutex_unlock(&table_lock);
  graphd_status first = GRAPHD_OK;
  if (err && errlen) err[0] = '\0';
  /* Each stream's last asynchronous replay has finished with its buffers
   * (the wait also collects), then each handle reports the first failure
   * it has not reported yet. */
  for (int i = 0; i < nw; i++)
    keep_first(&first, graphd_stream_wait(w[i].s, w[i].seq, -1), w[i].d, err, errlen);
  for (int i = 0; i < nheld; i++)
    keep_first(&first, graphd_replay_collect(held[i]->c, NULL), held[i], err, errlen);
  for (int i = 0; i < nheld; i++) session_put(held[i], first == GRAPHD_UNAVAILABLE);
  return (int)first;
}
