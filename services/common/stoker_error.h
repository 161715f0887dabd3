/*
 * Stoker's error codes, the public part: the one list of codes, written
 * once as an X-macro that generates the enums here and the name table in
 * error.c. Fallible functions of every Stoker library return int: 0 on
 * success or a negative STK_E* code. This header is installed with
 * libstoker-client (include/stoker/) and includes nothing of Stoker's, so
 * a trainer built against the installed library sees the same codes the
 * daemons use; the internal helpers (gRPC mapping, thread-local detail)
 * are in stk_error.h.
 */
#ifndef STOKER_ERROR_H
#define STOKER_ERROR_H

/* X(name, grpc status code, text). Append-only: codes are part of the API. */
#define STK_ERROR_MAP(X)                                                                           \
  X(EINVAL, 3, "invalid argument")                                                                 \
  X(ENOENT, 5, "not found")                                                                        \
  X(EEXIST, 6, "already exists")                                                                   \
  X(ENOMEM, 8, "out of memory")                                                                    \
  X(EIO, 13, "input/output error")                                                                 \
  X(ECORRUPT, 15, "data corrupted")                                                                \
  X(ESTALE, 9, "stale generation")                                                                 \
  X(ESTATE, 9, "not allowed in the current state")                                                 \
  X(EABORTED, 10, "aborted")                                                                       \
  X(ECANCELED, 1, "cancelled")                                                                     \
  X(ETIMEDOUT, 4, "deadline exceeded")                                                             \
  X(EUNAVAIL, 14, "unavailable")                                                                   \
  X(EUNAUTH, 16, "unauthenticated")                                                                \
  X(EPERM, 7, "permission denied")                                                                 \
  X(ETOOBIG, 8, "too large")                                                                       \
  X(EBUSY, 8, "resource exhausted")                                                                \
  X(ENOTSUP, 12, "not supported")                                                                  \
  X(EINTERNAL, 13, "internal error")                                                               \
  X(ERANGE, 11, "out of range")

/* Positions in the list (STK__EINVAL is 1); STK_OK is success. */
enum stk_error {
  STK_OK = 0,
#define STK_ERROR_ENUM(name, grpc, text) STK__##name,
  STK_ERROR_MAP(STK_ERROR_ENUM)
#undef STK_ERROR_ENUM
      STK__ERROR_COUNT
};

/* The public codes are the negated positions in the list above. */
#define STK_ERROR_CODE(name, grpc, text) STK_##name = -STK__##name,
enum stk_error_code { STK_ERROR_MAP(STK_ERROR_CODE) };
#undef STK_ERROR_CODE

/* "not found" for STK_ENOENT; "unknown error" outside the list. */
const char *stk_strerror(int err);

/* "ENOENT" for STK_ENOENT. */
const char *stk_errname(int err);

#endif
