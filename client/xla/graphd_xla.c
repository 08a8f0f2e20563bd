/* graphd's XLA FFI handler, in plain C against jaxlib's c_api.h.
 *
 * Registered in JAX as a CUDA custom call target; each call replays one
 * registered program on the call's own buffers, ordered with XLA's stream
 * (docs/jax.md has the whole flow). Attributes:
 *   program  string, the program id in 64 hex digits
 *   slots    array of i64: the program slot of each operand, then of each
 *            result, in order
 *   sync     optional scalar (bool or integer): nonzero replays through a
 *            round trip to the daemon, as graphd_replay does; absent or zero
 *            replays asynchronously (graphd_replay_async), unless
 *            $GRAPHD_XLA_SYNC=1 asks for sync in the whole process. An
 *            asynchronous replay that fails is reported by the next call
 *            on the same device, or by graphd_xla_collect().
 * It answers XLA's metadata query with traits = 0, which keeps it out of
 * XLA's command buffers (they would replay the GPU work without the socket
 * request).
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
 * last call still using it closes it. */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/cuda_driver.h"
#include "../../proto/hex.h"
#include "graphd/graphd.h"
#include "graphd/xla.h"

/* graphd's status codes are XLA's error codes, one to one (docs/design.md, "Status codes"). */
#define GRAPHD_XLA_SAME_(name, value, desc)                                                        \
  _Static_assert((int)GRAPHD_##name == (int)XLA_FFI_Error_Code_##name, #name " differs");
GRAPHD_STATUS_LIST(GRAPHD_XLA_SAME_)
#undef GRAPHD_XLA_SAME_

#define MAX_SESSIONS 64
#define MAX_STREAMS 16
#define MAX_BUFFERS 64

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

static void read_env(void) {
  const char *v = getenv("GRAPHD_XLA_SYNC");
  env_sync = v && strcmp(v, "1") == 0;
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
  *st = graphd_connect(&o, &d->c, err, errlen);
  if (*st != GRAPHD_OK) {
    free(d);
    return NULL;
  }
  memcpy(d->uuid, uuid, 16);
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

static XLA_FFI_Error *metadata(XLA_FFI_CallFrame *cf) {
  XLA_FFI_Metadata_Extension *ext = (XLA_FFI_Metadata_Extension *)cf->extension_start;
  ext->metadata->api_version.major_version = XLA_FFI_API_MAJOR;
  ext->metadata->api_version.minor_version = XLA_FFI_API_MINOR;
  ext->metadata->traits = 0; /* never inside a command buffer */
  return NULL;
}

XLA_FFI_Error *graphd_xla_replay(XLA_FFI_CallFrame *cf) {
  /* The metadata query comes first, and its api may be NULL. */
  if (cf->extension_start && cf->extension_start->type == XLA_FFI_Extension_Metadata)
    return metadata(cf);
  const XLA_FFI_Api *api = cf->api;
  if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;

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
  pthread_once(&env_once, read_env);
  sync = sync || env_sync;
  int64_t nargs = cf->args.size, nrets = cf->rets.size;
  if ((int64_t)slots->size != nargs + nrets)
    return fail(api, GRAPHD_INVALID_ARGUMENT,
                "%lld operands and %lld results, but 'slots' names %zu slots", (long long)nargs,
                (long long)nrets, slots->size);
  if (nargs + nrets > MAX_BUFFERS)
    return fail(api, GRAPHD_INVALID_ARGUMENT, "more than %d operands and results", MAX_BUFFERS);

  graphd_binding b[MAX_BUFFERS];
  int64_t nb = 0;
  const int64_t *slot = slots->data;
  for (int64_t i = 0; i < nargs + nrets; i++) {
    bool is_arg = i < nargs;
    int64_t k = is_arg ? i : i - nargs;
    bool is_buffer = is_arg ? cf->args.types[k] == XLA_FFI_ArgType_BUFFER
                            : cf->rets.types[k] == XLA_FFI_RetType_BUFFER;
    if (!is_buffer)
      return fail(api, GRAPHD_INVALID_ARGUMENT, "%s %lld is not a buffer",
                  is_arg ? "operand" : "result", (long long)k);
    const XLA_FFI_Buffer *buf = is_arg ? cf->args.args[k] : cf->rets.rets[k];
    size_t es = dtype_size(buf->dtype);
    if (es == 0)
      return fail(api, GRAPHD_INVALID_ARGUMENT, "%s %lld has dtype %d, which graphd cannot bind",
                  is_arg ? "operand" : "result", (long long)k, (int)buf->dtype);
    uint64_t bytes = es;
    for (int64_t r = 0; r < buf->rank; r++) bytes *= (uint64_t)buf->dims[r];
    if (slot[i] < 0 || slot[i] > UINT32_MAX)
      return fail(api, GRAPHD_INVALID_ARGUMENT, "slot %lld is out of range", (long long)slot[i]);
    /* An inout slot names an operand and the result aliased to it
     * (input_output_aliases): one buffer, bound once. */
    int dup = -1;
    for (int64_t k2 = 0; k2 < nb && dup < 0; k2++)
      if (b[k2].slot == (uint32_t)slot[i]) dup = (int)k2;
    if (dup >= 0) {
      if (b[dup].ptr != (uint64_t)(uintptr_t)buf->data)
        return fail(api, GRAPHD_INVALID_ARGUMENT,
                    "slot %lld is given two different buffers (an inout slot needs its result "
                    "aliased to its operand)",
                    (long long)slot[i]);
      continue;
    }
    b[nb].slot = (uint32_t)slot[i];
    b[nb].ptr = (uint64_t)(uintptr_t)buf->data;
    b[nb].bytes = bytes;
    nb++;
  }

  XLA_FFI_Stream_Get_Args sa;
  memset(&sa, 0, sizeof sa);
  sa.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
  sa.ctx = cf->ctx;
  XLA_FFI_Error *xe = api->XLA_FFI_Stream_Get(&sa);
  if (xe) return xe;
  char err[GRAPHD_ERRMAX];
  uint8_t uuid[16];
  graphd_status st = device_uuid(sa.stream, uuid, err, sizeof err);
  if (st != GRAPHD_OK) return fail(api, st, "%s", err);

  pthread_mutex_lock(&table_lock);
  dev_session *d = session_get(uuid, err, sizeof err, &st);
  pthread_mutex_unlock(&table_lock);
  if (!d) return fail(api, st, "%s", err);
  graphd_client *c = d->c;
  /* The handle serialises its own calls; the table lock is not held over
   * round trips, so other devices' calls proceed. */
  graphd_stream *s = NULL;
  st = graphd_registry_sync(c, pid);
  if (st != GRAPHD_OK) {
    snprintf(err, sizeof err, "%s", graphd_last_error(c));
  } else {
    pthread_mutex_lock(&table_lock);
    s = stream_for(d, sa.stream, err, sizeof err, &st);
    pthread_mutex_unlock(&table_lock);
  }
  if (s) {
    uint64_t seq = 0;
    st = sync ? graphd_replay(c, s, pid, b, (size_t)nb, NULL)
              : graphd_replay_async(c, s, pid, b, (size_t)nb, &seq);
    if (st != GRAPHD_OK) snprintf(err, sizeof err, "%s", graphd_last_error(c));
    if (seq) {
      pthread_mutex_lock(&table_lock);
      for (int i = 0; i < d->nstreams; i++)
        if (d->streams[i].s == s && seq > d->streams[i].last_seq) d->streams[i].last_seq = seq;
      pthread_mutex_unlock(&table_lock);
    }
  }
  session_put(d, st == GRAPHD_UNAVAILABLE);
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
