/*
 * Stoker's error codes inside the tree: the public list, enums and
 * stk_strerror() (stoker_error.h, installed with libstoker-client) plus what
 * only Stoker's own code uses: the gRPC mapping and the failure detail.
 * Fallible functions return int: 0 on success or a negative STK_E* code.
 * Foreign errors (RocksDB, curl, gRPC status, NCCL) are translated once, in
 * the wrapper that calls them.
 *
 * A function that fails may leave a human-readable detail ("open
 * /data/x: No such file") in a thread-local buffer with stk_set_detail();
 * callers read it with stk_detail() right after the failing call.
 */
#ifndef STK_ERROR_H
#define STK_ERROR_H

#include "stoker_error.h"

/* The gRPC status code (grpc_status_code value) an error maps to; 0 for 0. */
int stk_error_to_grpc(int err);

/* The error a gRPC status code maps back to (client side); 0 for OK. */
int stk_error_from_grpc(int grpc_status);

/* Thread-local detail of the last failure on this thread. */
void stk_set_detail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *stk_detail(void);
void stk_clear_detail(void);

#endif
