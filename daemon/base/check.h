/* The error-check macro family for syscalls, libuv and the CUDA driver.
 *
 * Each logs the failing call's text, file and line. The _GOTO forms set
 * `rc` to a negated graphd status and jump to a cleanup label; the _IGNORE
 * forms only log (for cleanup paths where nothing better can be done).
 * REFUSE_GOTO is the request checks' form: no log, the reason to err.
 * CUDA forms take the gd_cuda table `cu` from the enclosing scope. */
#ifndef GRAPHD_CHECK_H
#define GRAPHD_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "graphd/status.h"
#include "common/log.h"

#define SYS_CHECK_GOTO(call, status, label)                                                        \
  do {                                                                                             \
    if ((call) < 0) {                                                                              \
      GD_LOG(GD_ERROR, "sys", "%s failed: %s (%s:%d)", #call, strerror(errno), __FILE__,           \
             __LINE__);                                                                            \
      rc = -(status);                                                                              \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)

#define SYS_CHECK_IGNORE(call)                                                                     \
  do {                                                                                             \
    if ((call) < 0)                                                                                \
      GD_LOG(GD_WARN, "sys", "%s failed: %s (%s:%d)", #call, strerror(errno), __FILE__, __LINE__); \
  } while (0)

#define UV_CHECK_GOTO(call, status, label)                                                         \
  do {                                                                                             \
    int uv_rc_ = (call);                                                                           \
    if (uv_rc_ < 0) {                                                                              \
      GD_LOG(GD_ERROR, "uv", "%s failed: %s (%s:%d)", #call, uv_strerror(uv_rc_), __FILE__,        \
             __LINE__);                                                                            \
      rc = -(status);                                                                              \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)

#define UV_CHECK_IGNORE(call)                                                                      \
  do {                                                                                             \
    int uv_rc_ = (call);                                                                           \
    if (uv_rc_ < 0)                                                                                \
      GD_LOG(GD_WARN, "uv", "%s failed: %s (%s:%d)", #call, uv_strerror(uv_rc_), __FILE__,         \
             __LINE__);                                                                            \
  } while (0)

/* A request refused: err and errlen (named in the enclosing scope) get
 * why, printf-style, `rc` the negated status, and control goes to label. */
#define REFUSE_GOTO(status, label, ...)                                                            \
  do {                                                                                             \
    snprintf(err, errlen, __VA_ARGS__);                                                            \
    rc = -(status);                                                                                \
    goto label;                                                                                    \
  } while (0)

/* CUDA forms also write "call: CUDA_ERROR_X: text" into err/errlen when the
 * enclosing scope names them, so the message can travel to the client. */
#define CU_CHECK_GOTO(call, status, label)                                                         \
  do {                                                                                             \
    CUresult cu_rc_ = (call);                                                                      \
    if (cu_rc_ != CUDA_SUCCESS) {                                                                  \
      char cu_buf_[160];                                                                           \
      gd_cuda_strerror(cu, cu_rc_, cu_buf_, sizeof cu_buf_);                                       \
      GD_LOG(GD_ERROR, "cuda", "%s failed: %s (%s:%d)", #call, cu_buf_, __FILE__, __LINE__);       \
      if (err && errlen) snprintf(err, errlen, "%s failed: %s", #call, cu_buf_);                   \
      rc = -(status);                                                                              \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)

#define CU_CHECK_IGNORE(call)                                                                      \
  do {                                                                                             \
    CUresult cu_rc_ = (call);                                                                      \
    if (cu_rc_ != CUDA_SUCCESS) {                                                                  \
      char cu_buf_[160];                                                                           \
      gd_cuda_strerror(cu, cu_rc_, cu_buf_, sizeof cu_buf_);                                       \
      GD_LOG(GD_WARN, "cuda", "%s failed: %s (%s:%d)", #call, cu_buf_, __FILE__, __LINE__);        \
    }                                                                                              \
  } while (0)

#endif
