/* graphd status codes: the one list used on the wire, in the C API and in
 * the XLA FFI error mapping (docs/design.md, "Status codes").
 *
 * The numeric values are absl::StatusCode's, which XLA_FFI_Error_Code also
 * uses, so the mapping to XLA is the identity. Internal daemon functions
 * return 0 or the negated code. */
#ifndef GRAPHD_STATUS_H
#define GRAPHD_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#ifndef GRAPHD_EXPORT
#define GRAPHD_EXPORT __attribute__((visibility("default")))
#endif

/* X(NAME, value, short description) */
#define GRAPHD_STATUS_LIST(X)                                                                      \
  X(OK, 0, "ok")                                                                                   \
  X(INVALID_ARGUMENT, 3, "invalid argument")                                                       \
  X(DEADLINE_EXCEEDED, 4, "deadline exceeded")                                                     \
  X(NOT_FOUND, 5, "not found")                                                                     \
  X(ALREADY_EXISTS, 6, "already exists")                                                           \
  X(PERMISSION_DENIED, 7, "permission denied")                                                     \
  X(RESOURCE_EXHAUSTED, 8, "resource exhausted")                                                   \
  X(FAILED_PRECONDITION, 9, "failed precondition")                                                 \
  X(ABORTED, 10, "aborted")                                                                        \
  X(OUT_OF_RANGE, 11, "out of range")                                                              \
  X(UNIMPLEMENTED, 12, "unimplemented")                                                            \
  X(INTERNAL, 13, "internal error")                                                                \
  X(UNAVAILABLE, 14, "unavailable")                                                                \
  X(DATA_LOSS, 15, "data loss")

typedef enum graphd_status {
#define GRAPHD_STATUS_ENUM_(name, value, desc) GRAPHD_##name = value,
  GRAPHD_STATUS_LIST(GRAPHD_STATUS_ENUM_)
#undef GRAPHD_STATUS_ENUM_
} graphd_status;

/* Short description of a status ("not found"). Accepts negated internal
 * codes too. Never NULL; unknown values give "unknown status".
 * Thread-safe. */
GRAPHD_EXPORT const char *graphd_strerror(int status);

/* Upper-case name of a status ("NOT_FOUND"), or "UNKNOWN". Thread-safe. */
GRAPHD_EXPORT const char *graphd_status_name(int status);

/* 1 if status is one of the listed codes (positive form), else 0. */
GRAPHD_EXPORT int graphd_status_valid(int status);

#ifdef __cplusplus
}
#endif
#endif
