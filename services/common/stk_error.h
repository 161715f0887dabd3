/*
 * Stoker's error codes: one list, written once as an X-macro, that generates
 * the enum, the name table and stk_strerror(). Fallible functions return int:
 * 0 on success or a negative STK_E* code. Foreign errors (RocksDB, curl, gRPC
 * status, NCCL) are translated once, in the wrapper that calls them.
 *
 * A function that fails may leave a human-readable detail ("open
 * /data/x: No such file") in a thread-local buffer with stk_set_detail();
 * callers read it with stk_detail() right after the failing call.
 */
#ifndef STK_ERROR_H
#define STK_ERROR_H

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

/* The gRPC status code (grpc_status_code value) an error maps to; 0 for 0. */
int stk_error_to_grpc(int err);

/* The error a gRPC status code maps back to (client side); 0 for OK. */
int stk_error_from_grpc(int grpc_status);

/* Thread-local detail of the last failure on this thread. */
void stk_set_detail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *stk_detail(void);
void stk_clear_detail(void);

#endif
