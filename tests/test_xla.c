/* The XLA FFI handler with synthetic call frames: the metadata answer,
 * attribute and argument errors, no daemon, and a call that reaches a
 * daemon and syncs its program. A fake XLA_FFI_Api records the errors. */
#include <check.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../client/xla/bounce.h"
#include "harness.h"
#include "graphd/xla.h"

static int err_code;
static char err_msg[4096];
static int errors_made;

static XLA_FFI_Error *fake_error_create(XLA_FFI_Error_Create_Args *a) {
  err_code = (int)a->errc;
  snprintf(err_msg, sizeof err_msg, "%s", a->message);
  errors_made++;
  return (XLA_FFI_Error *)(uintptr_t)0x1;
}

static XLA_FFI_Error *fake_stream_get(XLA_FFI_Stream_Get_Args *a) {
  a->stream = (void *)(uintptr_t)0x5eed;
  return NULL;
}

static XLA_FFI_Api api;

/* A call frame with n f32 operands of 256 elements and one f32 result. */
typedef struct frame {
  XLA_FFI_CallFrame cf;
  XLA_FFI_ArgType at[4];
  void *args[4];
  XLA_FFI_RetType rt[1];
  void *rets[1];
  XLA_FFI_Buffer bufs[5];
  int64_t dims[5];
  float data[5][256];
  XLA_FFI_AttrType attr_types[2];
  XLA_FFI_ByteSpan names[2], *name_ptrs[2];
  void *attrs[2];
  XLA_FFI_ByteSpan program;
  XLA_FFI_Array slots;
  int64_t slot_values[5];
} frame;

static const char *hex_id = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

static void frame_init(frame *f, int nargs) {
  memset(f, 0, sizeof *f);
  memset(&api, 0, sizeof api);
  api.struct_size = XLA_FFI_Api_STRUCT_SIZE;
  api.XLA_FFI_Error_Create = fake_error_create;
  api.XLA_FFI_Stream_Get = fake_stream_get;
  f->cf.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  f->cf.api = &api;
  f->cf.stage = XLA_FFI_ExecutionStage_EXECUTE;
  for (int i = 0; i < nargs + 1; i++) {
    f->bufs[i].struct_size = XLA_FFI_Buffer_STRUCT_SIZE;
    f->bufs[i].dtype = XLA_FFI_DataType_F32;
    f->bufs[i].data = f->data[i];
    f->bufs[i].rank = 1;
    f->dims[i] = 256;
    f->bufs[i].dims = &f->dims[i];
    f->slot_values[i] = i;
  }
  for (int i = 0; i < nargs; i++) {
    f->at[i] = XLA_FFI_ArgType_BUFFER;
    f->args[i] = &f->bufs[i];
  }
  f->rt[0] = XLA_FFI_RetType_BUFFER;
  f->rets[0] = &f->bufs[nargs];
  f->cf.args.struct_size = XLA_FFI_Args_STRUCT_SIZE;
  f->cf.args.size = nargs;
  f->cf.args.types = f->at;
  f->cf.args.args = f->args;
  f->cf.rets.struct_size = XLA_FFI_Rets_STRUCT_SIZE;
  f->cf.rets.size = 1;
  f->cf.rets.types = f->rt;
  f->cf.rets.rets = f->rets;
  f->program.ptr = hex_id;
  f->program.len = 64;
  f->slots.dtype = XLA_FFI_DataType_S64;
  f->slots.size = (size_t)nargs + 1;
  f->slots.data = f->slot_values;
  /* Sorted by name, as XLA passes them. */
  f->names[0] = (XLA_FFI_ByteSpan){"program", 7};
  f->names[1] = (XLA_FFI_ByteSpan){"slots", 5};
  f->name_ptrs[0] = &f->names[0];
  f->name_ptrs[1] = &f->names[1];
  f->attr_types[0] = XLA_FFI_AttrType_STRING;
  f->attr_types[1] = XLA_FFI_AttrType_ARRAY;
  f->attrs[0] = &f->program;
  f->attrs[1] = &f->slots;
  f->cf.attrs.struct_size = XLA_FFI_Attrs_STRUCT_SIZE;
  f->cf.attrs.size = 2;
  f->cf.attrs.types = f->attr_types;
  f->cf.attrs.names = f->name_ptrs;
  f->cf.attrs.attrs = f->attrs;
  err_code = 0;
  err_msg[0] = 0;
  errors_made = 0;
}

static void expect_error(frame *f, int code, const char *needle) {
  XLA_FFI_Error *e = graphd_xla_replay(&f->cf);
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(errors_made, 1);
  ck_assert_msg(err_code == code, "code %d (%s), want %d", err_code, err_msg, code);
  ck_assert_msg(strncmp(err_msg, "graphd: ", 8) == 0, "%s", err_msg);
  ck_assert_msg(strstr(err_msg, needle), "'%s' lacks '%s'", err_msg, needle);
}

START_TEST(test_xla_answers_the_metadata_query_without_an_api) {
  XLA_FFI_Metadata md;
  memset(&md, 0, sizeof md);
  md.struct_size = XLA_FFI_Metadata_STRUCT_SIZE;
  md.traits = 0xff;
  XLA_FFI_Metadata_Extension ext;
  memset(&ext, 0, sizeof ext);
  ext.extension_base.struct_size = XLA_FFI_Metadata_Extension_STRUCT_SIZE;
  ext.extension_base.type = XLA_FFI_Extension_Metadata;
  ext.metadata = &md;
  XLA_FFI_CallFrame cf;
  memset(&cf, 0, sizeof cf);
  cf.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  cf.extension_start = &ext.extension_base;
  cf.api = NULL; /* older XLA passes none */
  ck_assert_ptr_null(graphd_xla_replay(&cf));
  ck_assert_int_eq(md.api_version.major_version, XLA_FFI_API_MAJOR);
  ck_assert_int_eq(md.api_version.minor_version, XLA_FFI_API_MINOR);
  ck_assert_int_eq(md.traits, 0); /* keeps the handler out of command buffers */
}
END_TEST

START_TEST(test_xla_refuses_bad_attributes) {
  frame f;
  frame_init(&f, 2);
  f.cf.attrs.size = 1; /* no 'slots' */
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "'slots' attribute");
  frame_init(&f, 2);
  f.names[0] = (XLA_FFI_ByteSpan){"progrum", 7};
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "'program' attribute");
  frame_init(&f, 2);
  f.program.ptr = "not-hex";
  f.program.len = 7;
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "not a 64-digit hex id");
  frame_init(&f, 2);
  f.slots.dtype = XLA_FFI_DataType_S32;
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "int64 array");
  frame_init(&f, 2);
  f.slot_values[1] = -2;
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "slot -2 is out of range");
  frame_init(&f, 2);
  f.slot_values[1] = -1; /* no slot, but 1024 bytes */
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "operand 1 has 1024 bytes but no slot");
}
END_TEST

/* Adds a third attribute, `sync`, of the given type pointing at value. */
static void frame_sync(frame *f, XLA_FFI_AttrType type, void *value) {
  static XLA_FFI_ByteSpan name = {"sync", 4};
  static XLA_FFI_ByteSpan *name_ptr = &name;
  static XLA_FFI_ByteSpan *names[3];
  static XLA_FFI_AttrType types[3];
  static void *attrs[3];
  for (int i = 0; i < 2; i++) {
    names[i] = f->name_ptrs[i];
    types[i] = f->attr_types[i];
    attrs[i] = f->attrs[i];
  }
  names[2] = name_ptr;
  types[2] = type;
  attrs[2] = value;
  f->cf.attrs.size = 3;
  f->cf.attrs.names = names;
  f->cf.attrs.types = types;
  f->cf.attrs.attrs = attrs;
}

START_TEST(test_xla_sync_attribute_is_a_bool_or_integer_scalar) {
  /* Without a daemon, a call whose attributes are all good fails later,
   * with UNAVAILABLE; a bad `sync` fails first, by name. */
  setenv("GRAPHD_SOCKET", "/nonexistent/graphd.sock", 1);
  setenv("GRAPHD_XLA_DEVICE", "GPU-00000000-0000-0000-0000-000000000000", 1);
  frame f;
  uint8_t yes = 1;
  int64_t zero = 0;
  float one = 1.0f;
  XLA_FFI_Scalar pred = {XLA_FFI_DataType_PRED, &yes}, s64 = {XLA_FFI_DataType_S64, &zero},
                 f32 = {XLA_FFI_DataType_F32, &one};
  XLA_FFI_ByteSpan str = {"yes", 3};
  frame_init(&f, 2);
  frame_sync(&f, XLA_FFI_AttrType_SCALAR, &f32);
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "'sync' attribute must be a bool or integer scalar");
  frame_init(&f, 2);
  frame_sync(&f, XLA_FFI_AttrType_STRING, &str);
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "'sync' attribute");
  frame_init(&f, 2);
  frame_sync(&f, XLA_FFI_AttrType_SCALAR, &pred);
  expect_error(&f, GRAPHD_UNAVAILABLE, "");
  frame_init(&f, 2);
  frame_sync(&f, XLA_FFI_AttrType_SCALAR, &s64);
  expect_error(&f, GRAPHD_UNAVAILABLE, "");
  /* Nothing ran, so nothing is left to report. */
  char err[256] = "x";
  ck_assert_int_eq(graphd_xla_collect(err, sizeof err), 0);
  ck_assert_str_eq(err, "");
  unsetenv("GRAPHD_XLA_DEVICE");
  unsetenv("GRAPHD_SOCKET");
}
END_TEST

START_TEST(test_xla_refuses_wrong_argument_counts_and_dtypes) {
  frame f;
  frame_init(&f, 2);
  f.slots.size = 2; /* 2 operands + 1 result need 3 */
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "2 operands and 1 results, but 'slots' names 2 slots");
  frame_init(&f, 2);
  f.bufs[1].dtype = XLA_FFI_DataType_S4;
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "operand 1 has dtype 21");
  frame_init(&f, 2);
  f.bufs[2].dtype = XLA_FFI_DataType_TOKEN;
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "result 0 has dtype 17");
}
END_TEST

/* A device named and a socket nobody listens on: a call that passes the
 * handler's checks ends in UNAVAILABLE when it connects. */
static void no_daemon(void) {
  setenv("GRAPHD_XLA_DEVICE", "GPU-00112233-4455-6677-8899-aabbccddeeff", 1);
  setenv("GRAPHD_SOCKET", "/tmp/graphd-xla-nobody.sock", 1);
}

START_TEST(test_xla_only_runs_at_execution) {
  frame f;
  frame_init(&f, 2);
  f.cf.stage = XLA_FFI_ExecutionStage_PREPARE;
  ck_assert_ptr_null(graphd_xla_replay(&f.cf));
  ck_assert_int_eq(errors_made, 0);
  /* The instantiate stage with an API that keeps no state: nothing to do,
   * and no error. */
  frame_init(&f, 2);
  f.cf.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  ck_assert_ptr_null(graphd_xla_replay(&f.cf));
  ck_assert_int_eq(errors_made, 0);
}
END_TEST

/* XLA's state per executable, as the fake API keeps it: one registered
 * type, the states set at the instantiate stage (each executable's), the
 * one the next State_Get answers with (NULL: an error, as XLA answers an
 * executable with none), and the errors the handler gave back. */
static struct {
  int registered;
  char name[64];
  void (*deleter)(void *);
  int sets, gets, destroyed;
  int64_t set_type, get_type;
  XLA_FFI_ExecutionStage set_stage, get_stage;
  void *set[4];
  void *answer;
} xs;

static XLA_FFI_Error *fake_type_register(XLA_FFI_Type_Register_Args *a) {
  ck_assert_int_eq(a->type_id->type_id, 0); /* XLA is to pick the id */
  xs.registered++;
  snprintf(xs.name, sizeof xs.name, "%.*s", (int)a->name.len, a->name.ptr);
  xs.deleter = a->type_info->deleter;
  a->type_id->type_id = 42;
  return NULL;
}

static XLA_FFI_Error *fake_state_set(XLA_FFI_State_Set_Args *a) {
  xs.set_type = a->type_id->type_id;
  xs.set_stage = a->stage;
  xs.set[xs.sets++] = a->state;
  return NULL;
}

static XLA_FFI_Error *fake_state_get(XLA_FFI_State_Get_Args *a) {
  xs.gets++;
  xs.get_type = a->type_id->type_id;
  xs.get_stage = a->stage;
  a->state = xs.answer;
  return xs.answer ? NULL : (XLA_FFI_Error *)(uintptr_t)0x2;
}

static void fake_error_destroy(XLA_FFI_Error_Destroy_Args *a) {
  ck_assert_ptr_eq(a->error, (XLA_FFI_Error *)(uintptr_t)0x2);
  xs.destroyed++;
}

static void state_api(void) {
  api.XLA_FFI_Type_Register = fake_type_register;
  api.XLA_FFI_State_Set = fake_state_set;
  api.XLA_FFI_State_Get = fake_state_get;
  api.XLA_FFI_Error_Destroy = fake_error_destroy;
}

/* At XLA's instantiate stage each executable gets a state of the handler's
 * own type (registered once), with its own serial; XLA frees it with the
 * type's deleter. An executed call reads its executable's state back. */
START_TEST(test_xla_instantiate_gives_each_executable_a_state) {
  no_daemon();
  setenv("GRAPHD_XLA_STATS", "1", 1);
  memset(&xs, 0, sizeof xs);
  frame f;
  for (int k = 0; k < 2; k++) {
    frame_init(&f, 0); /* attributes, no buffers, no stream */
    state_api();
    f.cf.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
    f.cf.rets.size = 0;
    ck_assert_ptr_null(graphd_xla_replay(&f.cf));
    ck_assert_int_eq(errors_made, 0);
  }
  ck_assert_int_eq(xs.registered, 1);
  ck_assert_str_eq(xs.name, "graphd_xla_executable");
  ck_assert_ptr_nonnull(xs.deleter);
  ck_assert_int_eq(xs.sets, 2);
  ck_assert_int_eq(xs.set_type, 42);
  ck_assert_int_eq(xs.set_stage, XLA_FFI_ExecutionStage_INSTANTIATE);
  xla_exec *e1 = xs.set[0], *e2 = xs.set[1];
  ck_assert(e1 && e2 && e1->serial && e2->serial && e1->serial != e2->serial);
  /* A call of the first executable asks for its state. */
  xs.answer = e1;
  frame_init(&f, 2);
  state_api();
  expect_error(&f, GRAPHD_UNAVAILABLE, "is the daemon running?");
  ck_assert_int_eq(xs.gets, 1);
  ck_assert_int_eq(xs.get_type, 42);
  ck_assert_int_eq(xs.get_stage, XLA_FFI_ExecutionStage_INSTANTIATE);
  /* A call whose executable has none (XLA answers with an error, which the
   * handler gives back) goes on without. */
  xs.answer = NULL;
  frame_init(&f, 2);
  state_api();
  expect_error(&f, GRAPHD_UNAVAILABLE, "is the daemon running?");
  ck_assert_int_eq(xs.gets, 2);
  ck_assert_int_eq(xs.destroyed, 1);
  graphd_xla_stats st;
  ck_assert_int_eq(graphd_xla_stats_read(&st, sizeof st), 1);
  ck_assert_uint_eq(st.executables, 2);
  ck_assert_uint_eq(st.calls, 2); /* instantiation is no call */
  ck_assert_uint_eq(st.stateless, 1);
  xs.deleter(e1);
  xs.deleter(e2);
  unsetenv("GRAPHD_XLA_STATS");
}
END_TEST

START_TEST(test_xla_no_daemon_is_a_clean_unavailable_error) {
  no_daemon();
  frame f;
  frame_init(&f, 2);
  expect_error(&f, GRAPHD_UNAVAILABLE, "is the daemon running?");
  /* Nothing reached a daemon: the program has no replay number. */
  uint8_t id[32];
  uint64_t seq = 1;
  for (int i = 0; i < 32; i++) ck_assert_int_eq(sscanf(hex_id + 2 * i, "%2hhx", &id[i]), 1);
  graphd_xla_last_replays(id, 1, &seq);
  ck_assert_uint_eq(seq, 0);
}
END_TEST

/* Without $GRAPHD_XLA_STATS=1 nothing is counted, and the read says so;
 * with it, every executed call is, refused ones too, with the bindings it
 * made and its host time. (Each test runs in a process of its own, so the
 * environment is read afresh.) */
START_TEST(test_xla_stats_are_read_only_when_counted) {
  no_daemon();
  unsetenv("GRAPHD_XLA_STATS");
  frame f;
  frame_init(&f, 2);
  expect_error(&f, GRAPHD_UNAVAILABLE, "is the daemon running?");
  graphd_xla_stats s;
  memset(&s, 0xff, sizeof s);
  ck_assert_int_eq(graphd_xla_stats_read(&s, sizeof s), 0);
  ck_assert_uint_eq(s.calls, 0);
  ck_assert_uint_eq(s.handler_ns, 0);
}
END_TEST

START_TEST(test_xla_stats_count_calls_bindings_and_host_time) {
  no_daemon();
  setenv("GRAPHD_XLA_STATS", "1", 1);
  graphd_xla_stats s, t;
  ck_assert_int_eq(graphd_xla_stats_read(&s, sizeof s), 1);
  ck_assert_uint_eq(s.calls, 0);
  frame f;
  for (int i = 0; i < 3; i++) {
    frame_init(&f, 2); /* two operands, one result */
    expect_error(&f, GRAPHD_UNAVAILABLE, "is the daemon running?");
  }
  frame_init(&f, 2);
  f.program.len = 10; /* refused before any binding */
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "not a 64-digit hex id");
  ck_assert_int_eq(graphd_xla_stats_read(&t, sizeof t), 1);
  ck_assert_uint_eq(t.calls, 4);
  ck_assert_uint_eq(t.buffers, 9);
  ck_assert_uint_eq(t.sync_calls, 0);
  ck_assert_uint_gt(t.handler_ns, 0);
  /* No call got as far as libgraphd's replay. */
  ck_assert_uint_eq(t.replay_ns, 0);
  ck_assert_uint_eq(t.wait_ns, 0);
  ck_assert_uint_eq(t.bounce_ns, 0);
  /* A caller that knows fewer fields gets those, and nothing past them. */
  uint64_t two[3] = {0, 0, 0xabcd};
  ck_assert_int_eq(graphd_xla_stats_read((graphd_xla_stats *)(void *)two, 2 * sizeof(uint64_t)), 1);
  ck_assert_uint_eq(two[0], 4);
  ck_assert_uint_eq(two[1], 0);
  ck_assert_uint_eq(two[2], 0xabcd);
  unsetenv("GRAPHD_XLA_STATS");
}
END_TEST

START_TEST(test_xla_inout_slots_are_bound_once) {
  no_daemon();
  frame f;
  frame_init(&f, 2);
  /* The result aliases operand 0 and names the same slot: accepted (the
   * call gets as far as connecting). */
  f.slot_values[2] = 0;
  f.bufs[2].data = f.bufs[0].data;
  expect_error(&f, GRAPHD_UNAVAILABLE, "is the daemon running?");
  /* A result XLA did not alias to its operand: accepted too (the operand
   * is copied into the result's buffer on the stream first). */
  frame_init(&f, 2);
  f.slot_values[2] = 0;
  expect_error(&f, GRAPHD_UNAVAILABLE, "is the daemon running?");
  /* ... but not one of another size, nor two operands on one slot. */
  frame_init(&f, 2);
  f.slot_values[2] = 0;
  f.dims[2] = 128;
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "slot 0 is given two different buffers");
  frame_init(&f, 2);
  f.slot_values[1] = 0;
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "slot 0 is given two different buffers");
}
END_TEST

/* Empty buffers (slot -1) bind nothing, and a call may have far more
 * buffers than a small program: both get as far as connecting. */
START_TEST(test_xla_empty_buffers_and_many_buffers) {
  no_daemon();
  frame f;
  frame_init(&f, 2);
  f.dims[1] = 0;
  f.slot_values[1] = -1;
  expect_error(&f, GRAPHD_UNAVAILABLE, "is the daemon running?");

  enum { MANY = 700 };
  static XLA_FFI_Buffer bufs[MANY + 2];
  static XLA_FFI_ArgType at[MANY + 1];
  static void *args[MANY + 1];
  static int64_t slots[MANY + 2], one = 1;
  static float data[MANY + 1];
  for (int n = MANY; n <= MANY + 1; n++) {
    frame_init(&f, 2);
    for (int i = 0; i < n; i++) {
      bufs[i] = (XLA_FFI_Buffer){.struct_size = XLA_FFI_Buffer_STRUCT_SIZE,
                                 .dtype = XLA_FFI_DataType_F32,
                                 .data = &data[i],
                                 .rank = 1,
                                 .dims = &one};
      at[i] = XLA_FFI_ArgType_BUFFER;
      args[i] = &bufs[i];
      slots[i] = 3 * i + 1; /* spread out: the slot table hashes them */
    }
    f.cf.args.size = n;
    f.cf.args.types = at;
    f.cf.args.args = args;
    /* The result aliases operand 0. */
    f.bufs[2].data = &data[0];
    f.dims[2] = 1;
    slots[n] = slots[0];
    if (n == MANY + 1) slots[n - 1] = slots[n - 2]; /* then: two operands on one slot */
    f.slots.size = (size_t)n + 1;
    f.slots.data = slots;
    if (n == MANY)
      expect_error(&f, GRAPHD_UNAVAILABLE, "is the daemon running?");
    else
      expect_error(&f, GRAPHD_INVALID_ARGUMENT, "is given two different buffers");
  }
}
END_TEST

/* Adds a third attribute, `fixed`, an array of n int64 values (XLA passes
 * attributes sorted by name: it goes first). */
static void frame_fixed(frame *f, XLA_FFI_DataType dtype, int64_t *values, size_t n) {
  static XLA_FFI_ByteSpan name = {"fixed", 5};
  static XLA_FFI_ByteSpan *names[3];
  static XLA_FFI_AttrType types[3];
  static void *attrs[3];
  static XLA_FFI_Array arr;
  arr = (XLA_FFI_Array){.dtype = dtype, .size = n, .data = values};
  names[0] = &name;
  types[0] = XLA_FFI_AttrType_ARRAY;
  attrs[0] = &arr;
  for (int i = 0; i < 2; i++) {
    names[i + 1] = f->name_ptrs[i];
    types[i + 1] = f->attr_types[i];
    attrs[i + 1] = f->attrs[i];
  }
  f->cf.attrs.size = 3;
  f->cf.attrs.names = names;
  f->cf.attrs.types = types;
  f->cf.attrs.attrs = attrs;
}

/* Fixed bindings, (slot, address, bytes) triples on slots no operand or
 * result names: good ones get as far as connecting; a malformed
 * attribute, a bad range, or a slot named twice is refused by name. */
START_TEST(test_xla_fixed_bindings) {
  no_daemon();
  frame f;
  static float device_buffer[64];
  int64_t at = (int64_t)(uintptr_t)device_buffer;
  int64_t two[6] = {5, at, 256, 6, at + 128, 128};
  frame_init(&f, 2);
  frame_fixed(&f, XLA_FFI_DataType_S64, two, 6);
  expect_error(&f, GRAPHD_UNAVAILABLE, "is the daemon running?");
  frame_init(&f, 2);
  frame_fixed(&f, XLA_FFI_DataType_S64, two, 5);
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "'fixed' attribute must be an int64 array of");
  frame_init(&f, 2);
  frame_fixed(&f, XLA_FFI_DataType_S32, two, 6);
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "'fixed' attribute");
  int64_t on_operand[3] = {1, at, 256};
  frame_init(&f, 2);
  frame_fixed(&f, XLA_FFI_DataType_S64, on_operand, 3);
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "slot 1 has a fixed binding and another buffer");
  int64_t on_result[3] = {2, at, 256};
  frame_init(&f, 2);
  frame_fixed(&f, XLA_FFI_DataType_S64, on_result, 3);
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "slot 2 has a fixed binding and another buffer");
  int64_t twice[6] = {5, at, 256, 5, at, 256};
  frame_init(&f, 2);
  frame_fixed(&f, XLA_FFI_DataType_S64, twice, 6);
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "slot 5 has a fixed binding and another buffer");
  int64_t bad[3][3] = {{-1, at, 256}, {5, 0, 256}, {5, at, 0}};
  for (int i = 0; i < 3; i++) {
    frame_init(&f, 2);
    frame_fixed(&f, XLA_FFI_DataType_S64, bad[i], 3);
    expect_error(&f, GRAPHD_INVALID_ARGUMENT, "fixed binding 0 (slot");
  }
}
END_TEST

START_TEST(test_xla_call_reaches_the_daemon_and_syncs_its_program) {
  gd_test_daemon d;
  td_start(&d, "--backend", "host", NULL);
  size_t len;
  void *plugin = td_read_file(HOST_KERNELS_SO, &len);
  uint8_t mod[32], pid[32];
  ck_assert_int_eq(graphd_registry_add_module(GRAPHD_MODULE_HOST_ELF, plugin, len, mod), GRAPHD_OK);
  graphd_program *p = graphd_program_new(GRAPHD_MODE_STAGED);
  graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, 1024, 1);
  graphd_program_add_slot(p, GRAPHD_SLOT_INPUT, 1024, 1);
  graphd_program_add_slot(p, GRAPHD_SLOT_OUTPUT, 1024, 1);
  uint32_t grid[3] = {1, 1, 1}, block[3] = {256, 1, 1}, n = 256;
  int s = graphd_program_add_launch(p, mod, "accumulate", grid, block, 0);
  graphd_program_param_slot(p, (uint32_t)s, 0, 0, 0);
  graphd_program_param_slot(p, (uint32_t)s, 8, 2, 0);
  graphd_program_param(p, (uint32_t)s, 16, &n, 4);
  const uint8_t *enc;
  size_t elen;
  ck_assert_int_eq(graphd_program_finish(p, pid), GRAPHD_OK);
  ck_assert_int_eq(graphd_program_encoding(p, &enc, &elen), GRAPHD_OK);
  ck_assert_int_eq(graphd_registry_add_program(pid, enc, elen), GRAPHD_OK);
  graphd_program_free(p);
  char hex[65];
  graphd_id_hex(pid, hex);

  graphd_client *ctl = td_control(&d);
  graphd_daemon_status *st;
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  setenv("GRAPHD_XLA_DEVICE", st->devices[0].uuid_str, 1);
  ck_assert_uint_eq(st->programs, 0);
  graphd_daemon_status_free(st);
  setenv("GRAPHD_SOCKET", d.socket, 1);

  frame f;
  frame_init(&f, 2);
  f.program.ptr = hex;
  uint64_t seq[2] = {1, 1};
  uint8_t ids[64];
  memcpy(ids, pid, 32);
  memset(ids + 32, 0x5a, 32); /* a program no call named */
  graphd_xla_last_replays(ids, 2, seq);
  ck_assert_uint_eq(seq[0], 0);
  ck_assert_uint_eq(seq[1], 0);
  /* XLA's buffers are not host-backend memory, and a host device takes no
   * CUDA stream: the call fails there, after the session was made and the
   * program synced from the client-side registry. */
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "host devices take no CUDA stream");
  /* The call got the program to the daemon: it has a replay number, the
   * next call a later one; the other program still none. */
  graphd_xla_last_replays(ids, 2, seq);
  ck_assert_uint_gt(seq[0], 0);
  ck_assert_uint_eq(seq[1], 0);
  uint64_t first = seq[0];
  frame_init(&f, 2);
  f.program.ptr = hex;
  expect_error(&f, GRAPHD_INVALID_ARGUMENT, "host devices take no CUDA stream");
  graphd_xla_last_replays(ids, 2, seq);
  ck_assert_uint_gt(seq[0], first);
  ck_assert_int_eq(graphd_get_status(ctl, &st), GRAPHD_OK);
  ck_assert_uint_eq(st->programs, 1);
  ck_assert_uint_eq(st->modules, 1);
  ck_assert_uint_eq(st->devices[0].counters.sessions, 1); /* the handler's session */
  graphd_daemon_status_free(st);
  graphd_close(ctl);
  free(plugin);
  td_stop(&d);
  td_cleanup(&d);
}
END_TEST

/* --- The copies of memory graphd cannot map (client/xla/bounce.c), on a
 * fake driver (tests/fake_cuda.c) whose cuMemAlloc memory graphd maps and
 * whose other addresses it cannot. */

static void (*hold)(int);
static void (*finish)(void);
static int (*live_allocs)(void);
static void (*reload)(void);
static void (*module_ranges)(int);
static unsigned long long (*id_queries)(void);
static unsigned long long (*events_made)(void);

static void fake_driver(void) {
  const char *lib = FAKE_CUDA_DIR "/libfake_cuda_mem.so";
  setenv("GRAPHD_LIBCUDA", lib, 1);
  const gd_cuda *cu;
  char err[256];
  ck_assert_msg(gd_cuda_load(&cu, err, sizeof err) == 0, "%s", err);
  void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  ck_assert_ptr_nonnull(h);
  *(void **)&hold = dlsym(h, "fake_cuda_hold");
  *(void **)&finish = dlsym(h, "fake_cuda_finish");
  *(void **)&live_allocs = dlsym(h, "fake_cuda_allocs");
  *(void **)&reload = dlsym(h, "fake_cuda_reload");
  *(void **)&module_ranges = dlsym(h, "fake_cuda_module_ranges");
  *(void **)&id_queries = dlsym(h, "fake_cuda_id_queries");
  *(void **)&events_made = dlsym(h, "fake_cuda_events_made");
  ck_assert(hold && finish && live_allocs && reload && module_ranges && id_queries && events_made);
}

enum { NBUF = 64, NFLOAT = 11 }; /* 44 bytes, as in the field */
static float bufs[NBUF][NFLOAT];

/* A call's start and end through the table, as the handler makes them:
 * the lock taken, copies added, the copies in; the copies out, unlocked. */
static void begin_call_from(xla_bounce_table *t, uint64_t exec, const graphd_binding *b,
                            const uint64_t *from, const uint8_t *dir, int n,
                            xla_bounce_call *call) {
  char err[512] = "";
  pthread_mutex_lock(&t->lock);
  ck_assert_msg(xla_bounce_add(t, b, n, err, sizeof err) >= 0, "%s", err);
  ck_assert_int_eq(
      xla_bounce_begin(t, b, from, dir, n, (CUstream)0x5eed, exec, call, err, sizeof err),
      GRAPHD_OK);
}

static void begin_call(xla_bounce_table *t, uint64_t exec, const graphd_binding *b,
                       const uint8_t *dir, int n, xla_bounce_call *call) {
  begin_call_from(t, exec, b, NULL, dir, n, call);
}

static void end_call(xla_bounce_table *t, xla_bounce_call *call, const graphd_binding *b,
                     const uint8_t *dir, int n) {
  char err[512] = "";
  ck_assert_msg(xla_bounce_end(t, call, b, dir, n, true, err, sizeof err) == GRAPHD_OK, "%s", err);
  pthread_mutex_unlock(&t->lock);
}

/* One call through the table as the handler makes it: the bindings of
 * buffers idx[0..n) (operands and results both), copies added, the copies
 * in, a "replay" that adds 1 to every element it is bound to, the copies
 * out. Fails the test unless every buffer came back incremented. */
static void bounce_call(xla_bounce_table *t, const int *idx, int n) {
  graphd_binding b[8];
  uint8_t dir[8];
  float want[8][NFLOAT];
  for (int i = 0; i < n; i++) {
    b[i] = (graphd_binding){
        .slot = (uint32_t)i, .ptr = (uint64_t)(uintptr_t)bufs[idx[i]], .bytes = sizeof bufs[0]};
    dir[i] = XLA_DIR_IN | XLA_DIR_OUT;
    for (int k = 0; k < NFLOAT; k++) want[i][k] = bufs[idx[i]][k] + 1.0f;
  }
  xla_bounce_call call;
  begin_call(t, 0, b, dir, n, &call);
  ck_assert(call.any);
  for (int i = 0; i < n; i++) {
    ck_assert_msg(call.use[i].ptr != b[i].ptr, "buffer %d is bound without a copy", idx[i]);
    float *copy = (float *)(uintptr_t)call.use[i].ptr;
    for (int k = 0; k < NFLOAT; k++) copy[k] += 1.0f;
  }
  end_call(t, &call, b, dir, n);
  for (int i = 0; i < n; i++)
    ck_assert_msg(memcmp(bufs[idx[i]], want[i], sizeof want[i]) == 0, "buffer %d", idx[i]);
}

static bool has_copy(xla_bounce_table *t, int idx) {
  return xla_bounce_find(t, (uint64_t)(uintptr_t)bufs[idx], sizeof bufs[0]) != NULL;
}

START_TEST(test_xla_copies_past_the_cap_free_the_least_recently_used) {
  fake_driver();
  xla_bounce_table t;
  xla_bounce_init(&t, 4);
  /* Buffer 0 (a constant every call binds) with one new buffer per call:
   * far more distinct buffers than the table holds, and every call works. */
  for (int k = 1; k <= 20; k++) bounce_call(&t, (int[]){0, k}, 2);
  ck_assert_int_eq(t.n, 4);
  ck_assert_int_eq(live_allocs(), 4);
  ck_assert(has_copy(&t, 0)); /* used by every call: never the least recent */
  for (int k = 1; k <= 17; k++) ck_assert_msg(!has_copy(&t, k), "buffer %d kept", k);
  for (int k = 18; k <= 20; k++) ck_assert_msg(has_copy(&t, k), "buffer %d freed", k);
  /* A full table and a call that brings several new buffers at once. */
  bounce_call(&t, (int[]){30, 31, 32, 33, 34}, 5);
  ck_assert_int_eq(t.n, 5); /* the call's own five: none freed for another */
  for (int k = 30; k <= 34; k++) ck_assert(has_copy(&t, k));
  ck_assert_int_eq(live_allocs(), 1); /* the five copies one call made share one allocation */
  bounce_call(&t, (int[]){0, 20, 40}, 3);
  ck_assert_int_eq(t.n, 4);
  /* One of the five is left, so their allocation stays, beside the new
   * one of these three. */
  ck_assert_int_eq(live_allocs(), 2);
  ck_assert(has_copy(&t, 0) && has_copy(&t, 20) && has_copy(&t, 40));
  xla_bounce_close(&t);
  ck_assert_int_eq(live_allocs(), 0);
}
END_TEST

START_TEST(test_xla_copies_a_queued_call_uses_are_not_freed) {
  fake_driver();
  xla_bounce_table t;
  xla_bounce_init(&t, 4);
  /* Buffer 1's call is still queued on the stream (its event pending);
   * the calls of 2, 3 and 4 have run. */
  hold(1);
  bounce_call(&t, (int[]){1}, 1);
  hold(0);
  for (int k = 2; k <= 4; k++) bounce_call(&t, (int[]){k}, 1);
  /* The least recently used copy is 1's, but a queued call uses it: the
   * next least recent goes instead. */
  bounce_call(&t, (int[]){5}, 1);
  ck_assert(has_copy(&t, 1) && !has_copy(&t, 2));
  bounce_call(&t, (int[]){6}, 1);
  ck_assert(has_copy(&t, 1) && !has_copy(&t, 3));
  ck_assert_int_eq(t.n, 4);
  /* Once it has run, 1's copy is the one to go. */
  finish();
  bounce_call(&t, (int[]){7}, 1);
  ck_assert(!has_copy(&t, 1));
  for (int k = 4; k <= 7; k++) ck_assert_msg(has_copy(&t, k), "buffer %d freed", k);
  ck_assert_int_eq(t.n, 4);
  ck_assert_int_eq(live_allocs(), 4);
  /* Every copy used by a queued call: the table grows rather than fail or
   * free one of them. */
  hold(1);
  for (int k = 10; k <= 15; k++) bounce_call(&t, (int[]){k}, 1);
  ck_assert_int_eq(t.n, 6);
  for (int k = 10; k <= 15; k++) ck_assert(has_copy(&t, k));
  ck_assert_int_eq(live_allocs(), 6);
  finish();
  xla_bounce_close(&t);
  ck_assert_int_eq(live_allocs(), 0);
}
END_TEST

/* One call by executable exec (its serial; 0: none) that binds buffers
 * first..first+n-1 as operands only (as a compiled module's constants are
 * bound), each copy checked against its buffer; *copies and *queries: what
 * the call queued and asked. */
static void constant_call(xla_bounce_table *t, uint64_t exec, int first, int n, uint64_t *copies,
                          uint64_t *queries) {
  graphd_binding b[NBUF];
  uint8_t dir[NBUF];
  for (int i = 0; i < n; i++) {
    b[i] = (graphd_binding){
        .slot = (uint32_t)i, .ptr = (uint64_t)(uintptr_t)bufs[first + i], .bytes = sizeof bufs[0]};
    dir[i] = XLA_DIR_IN;
  }
  xla_bounce_call call;
  begin_call(t, exec, b, dir, n, &call);
  for (int i = 0; i < n; i++)
    ck_assert_msg(memcmp((void *)(uintptr_t)call.use[i].ptr, bufs[first + i], sizeof bufs[0]) == 0,
                  "buffer %d's copy does not hold it", first + i);
  *copies = call.copies;
  *queries = call.id_queries;
  end_call(t, &call, b, dir, n);
}

/* A module's constants are copied on the first call and not again while
 * their allocation lives, which a call checks with one buffer id query for
 * each allocation they lie in, not one for each constant; once the module
 * is loaded again (new buffer ids, new contents) they are all copied
 * afresh. */
START_TEST(test_xla_constants_are_copied_once_and_checked_once_an_allocation) {
  enum { NC = 40 };
  fake_driver();
  module_ranges(1);
  xla_bounce_table t;
  xla_bounce_init(&t, 256);
  /* The 64 KiB blocks (the fake's allocations) the constants lie in. */
  uintptr_t lo = (uintptr_t)bufs[0] / 0x10000, hi = (uintptr_t)bufs[NC - 1] / 0x10000;
  uint64_t blocks = hi - lo + 1, copies, queries;
  for (int i = 0; i < NC; i++) bufs[i][0] = (float)i;
  constant_call(&t, 0, 0, NC, &copies, &queries);
  ck_assert_uint_eq(copies, NC);
  unsigned long long q0 = id_queries();
  for (int k = 0; k < 3; k++) {
    constant_call(&t, 0, 0, NC, &copies, &queries);
    ck_assert_uint_eq(copies, 0);
    ck_assert_msg(queries <= blocks, "%llu buffer id queries for %d constants in %llu allocations",
                  (unsigned long long)queries, NC, (unsigned long long)blocks);
  }
  ck_assert_uint_le(id_queries() - q0, 3 * blocks);
  /* Each call records an event after its copies; calls that follow one
   * another record spare ones again rather than make new ones. */
  unsigned long long e0 = events_made();
  for (int k = 0; k < 20; k++) constant_call(&t, 0, 0, NC, &copies, &queries);
  ck_assert_uint_le(events_made() - e0, 2);
  /* Loaded again: new ids, new contents; every copy made again. */
  for (int i = 0; i < NC; i++) bufs[i][0] = 1000.0f + (float)i;
  reload();
  constant_call(&t, 0, 0, NC, &copies, &queries);
  ck_assert_uint_eq(copies, NC);
  constant_call(&t, 0, 0, NC, &copies, &queries);
  ck_assert_uint_eq(copies, 0);
  xla_bounce_close(&t);
  module_ranges(0);
  ck_assert_int_eq(live_allocs(), 0);
}
END_TEST

/* An executable's calls check its constants' copies once on a device, on
 * its first call, and never again while it lives: its constants keep
 * their addresses and contents. Each constant lies in an allocation of its
 * own, as XLA's do, so a check is a driver query per constant. */
START_TEST(test_xla_constants_are_checked_once_an_executable) {
  enum { NC = 40 };
  fake_driver();
  xla_bounce_table t;
  xla_bounce_init(&t, 256);
  xla_exec *e1 = xla_exec_new(), *e2 = xla_exec_new();
  ck_assert(e1 && e2 && e1->serial && e2->serial && e1->serial != e2->serial);
  uint64_t copies, queries;
  for (int i = 0; i < NC; i++) bufs[i][0] = (float)i;
  constant_call(&t, e1->serial, 0, NC, &copies, &queries);
  ck_assert_uint_eq(copies, NC);
  unsigned long long q0 = id_queries();
  for (int k = 0; k < 5; k++) {
    constant_call(&t, e1->serial, 0, NC, &copies, &queries);
    ck_assert_uint_eq(copies, 0);
    ck_assert_uint_eq(queries, 0);
  }
  ck_assert_uint_eq(id_queries(), q0);
  /* Another call site binding the same constants (MJX evaluates its step
   * twice in a scan): one check of each, then none, and the first site's
   * calls still make none. */
  constant_call(&t, e2->serial, 0, NC, &copies, &queries);
  ck_assert_uint_eq(copies, 0);
  ck_assert_uint_eq(queries, NC);
  for (int k = 0; k < 3; k++) {
    constant_call(&t, e2->serial, 0, NC, &copies, &queries);
    ck_assert_uint_eq(queries, 0);
    constant_call(&t, e1->serial, 0, NC, &copies, &queries);
    ck_assert_uint_eq(queries, 0);
    ck_assert_uint_eq(copies, 0);
  }
  /* A call that names no executable (the handler registered without its
   * instantiate stage) checks every time. */
  for (int k = 0; k < 2; k++) {
    constant_call(&t, 0, 0, NC, &copies, &queries);
    ck_assert_uint_eq(copies, 0);
    ck_assert_uint_eq(queries, NC);
  }
  ck_assert_uint_eq(id_queries() - q0, 3 * NC);
  xla_exec_free(e1);
  xla_exec_free(e2);
  xla_bounce_close(&t);
  ck_assert_int_eq(live_allocs(), 0);
}
END_TEST

/* XLA frees an executable, and another is loaded with its constants at the
 * same addresses but other contents. The new executable's state may well
 * sit where the old one's did; it has another serial, so its first call
 * checks the copies, finds other allocations there and copies them
 * afresh. */
START_TEST(test_xla_a_freed_executables_constants_reused_are_copied_again) {
  enum { NC = 40 };
  fake_driver();
  xla_bounce_table t;
  xla_bounce_init(&t, 256);
  uint64_t copies, queries;
  for (int i = 0; i < NC; i++) bufs[i][0] = (float)i;
  xla_exec *e = xla_exec_new();
  constant_call(&t, e->serial, 0, NC, &copies, &queries);
  ck_assert_uint_eq(copies, NC);
  constant_call(&t, e->serial, 0, NC, &copies, &queries);
  ck_assert_uint_eq(copies + queries, 0);
  uint64_t old = e->serial;
  xla_exec_free(e);
  reload();
  for (int i = 0; i < NC; i++) bufs[i][0] = 1000.0f + (float)i;
  e = xla_exec_new();
  ck_assert_uint_ne(e->serial, old);
  /* constant_call fails unless every copy holds the new contents. */
  constant_call(&t, e->serial, 0, NC, &copies, &queries);
  ck_assert_uint_eq(copies, NC);
  constant_call(&t, e->serial, 0, NC, &copies, &queries);
  ck_assert_uint_eq(copies + queries, 0);
  /* A call of the freed executable's serial would have been wrong to
   * skip its check: nothing notes it any more. */
  constant_call(&t, old, 0, NC, &copies, &queries);
  ck_assert_uint_eq(queries, NC);
  xla_exec_free(e);
  xla_bounce_close(&t);
  ck_assert_int_eq(live_allocs(), 0);
}
END_TEST

/* Module memory that a call binds to be written (a fixed binding) is no
 * constant there: once written through, its copy is filled and checked
 * afresh when next bound as a constant, even by an executable that had
 * seen it hold. */
START_TEST(test_xla_a_constant_bound_for_writing_is_checked_again) {
  fake_driver();
  xla_bounce_table t;
  xla_bounce_init(&t, 256);
  xla_exec *e = xla_exec_new();
  uint64_t copies, queries;
  bufs[0][0] = 1.0f;
  constant_call(&t, e->serial, 0, 1, &copies, &queries);
  ck_assert_uint_eq(copies, 1);
  bounce_call(&t, (int[]){0}, 1); /* read and written: adds 1 */
  ck_assert(bufs[0][0] == 2.0f);
  constant_call(&t, e->serial, 0, 1, &copies, &queries);
  ck_assert_uint_eq(copies, 1);
  ck_assert_uint_gt(queries, 0);
  constant_call(&t, e->serial, 0, 1, &copies, &queries);
  ck_assert_uint_eq(copies + queries, 0);
  xla_exec_free(e);
  xla_bounce_close(&t);
}
END_TEST

/* A call's bindings that have no copy are replayed at their own address,
 * whether they lie below, between or above the buffers that have one;
 * those that have one are replayed at their copy. */
START_TEST(test_xla_bindings_without_copies_keep_their_address) {
  fake_driver();
  xla_bounce_table t;
  xla_bounce_init(&t, 256);
  bounce_call(&t, (int[]){1, 3}, 2);
  graphd_binding b[5];
  uint8_t dir[5];
  for (int i = 0; i < 5; i++) {
    b[i] = (graphd_binding){
        .slot = (uint32_t)i, .ptr = (uint64_t)(uintptr_t)bufs[i], .bytes = sizeof bufs[0]};
    dir[i] = XLA_DIR_IN | XLA_DIR_OUT;
  }
  /* Begun without adding copies: 0, 2 and 4 have none. */
  char err[256] = "";
  xla_bounce_call call;
  pthread_mutex_lock(&t.lock);
  ck_assert_int_eq(
      xla_bounce_begin(&t, b, NULL, dir, 5, (CUstream)0x5eed, 0, &call, err, sizeof err),
      GRAPHD_OK);
  for (int i = 0; i < 5; i++)
    if (i % 2)
      ck_assert_uint_eq(call.use[i].ptr, xla_bounce_find(&t, b[i].ptr, b[i].bytes)->copy);
    else
      ck_assert_uint_eq(call.use[i].ptr, b[i].ptr);
  end_call(&t, &call, b, dir, 5);
  xla_bounce_close(&t);
}
END_TEST

/* An in-out slot whose result XLA gave a buffer of its own that graphd
 * cannot map: the result's copy is filled from the operand straight, not
 * through the result's buffer, so the call makes two copies (in and out),
 * not three; the operand is left as it was. */
START_TEST(test_xla_an_unaliased_operand_goes_straight_into_the_results_copy) {
  fake_driver();
  xla_bounce_table t;
  xla_bounce_init(&t, 256);
  for (int k = 0; k < NFLOAT; k++) {
    bufs[1][k] = -1.0f;        /* the result's buffer, as XLA left it */
    bufs[2][k] = (float)k + 1; /* the operand */
  }
  graphd_binding b = {.slot = 0, .ptr = (uint64_t)(uintptr_t)bufs[1], .bytes = sizeof bufs[0]};
  uint64_t from = (uint64_t)(uintptr_t)bufs[2];
  uint8_t dir = XLA_DIR_IN | XLA_DIR_OUT;
  xla_bounce_call call;
  begin_call_from(&t, 0, &b, &from, &dir, 1, &call);
  ck_assert(call.any);
  float *copy = (float *)(uintptr_t)call.use[0].ptr;
  ck_assert_ptr_ne(copy, bufs[1]);
  for (int k = 0; k < NFLOAT; k++) {
    ck_assert(copy[k] == (float)k + 1);
    copy[k] *= 10.0f; /* the replay */
  }
  end_call(&t, &call, &b, &dir, 1);
  ck_assert_uint_eq(call.copies, 2);
  for (int k = 0; k < NFLOAT; k++) {
    ck_assert(bufs[1][k] == 10.0f * ((float)k + 1));
    ck_assert(bufs[2][k] == (float)k + 1);
  }
  xla_bounce_close(&t);
}
END_TEST

int main(void) {
  Suite *s = suite_create("xla");
  TCase *tc = tcase_create("xla");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_xla_answers_the_metadata_query_without_an_api);
  tcase_add_test(tc, test_xla_refuses_bad_attributes);
  tcase_add_test(tc, test_xla_sync_attribute_is_a_bool_or_integer_scalar);
  tcase_add_test(tc, test_xla_fixed_bindings);
  tcase_add_test(tc, test_xla_refuses_wrong_argument_counts_and_dtypes);
  tcase_add_test(tc, test_xla_only_runs_at_execution);
  tcase_add_test(tc, test_xla_instantiate_gives_each_executable_a_state);
  tcase_add_test(tc, test_xla_no_daemon_is_a_clean_unavailable_error);
  tcase_add_test(tc, test_xla_stats_are_read_only_when_counted);
  tcase_add_test(tc, test_xla_stats_count_calls_bindings_and_host_time);
  tcase_add_test(tc, test_xla_inout_slots_are_bound_once);
  tcase_add_test(tc, test_xla_empty_buffers_and_many_buffers);
  tcase_add_test(tc, test_xla_call_reaches_the_daemon_and_syncs_its_program);
  tcase_add_test(tc, test_xla_copies_past_the_cap_free_the_least_recently_used);
  tcase_add_test(tc, test_xla_copies_a_queued_call_uses_are_not_freed);
  tcase_add_test(tc, test_xla_constants_are_copied_once_and_checked_once_an_allocation);
  tcase_add_test(tc, test_xla_constants_are_checked_once_an_executable);
  tcase_add_test(tc, test_xla_a_freed_executables_constants_reused_are_copied_again);
  tcase_add_test(tc, test_xla_a_constant_bound_for_writing_is_checked_again);
  tcase_add_test(tc, test_xla_bindings_without_copies_keep_their_address);
  tcase_add_test(tc, test_xla_an_unaliased_operand_goes_straight_into_the_results_copy);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
