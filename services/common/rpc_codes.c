/*
 * rpc_codes: names of the gRPC status codes, for logs, metrics labels and
 * test messages ("NOT_FOUND" rather than 5).
 */
#include "rpc.h"

#include <stddef.h>

static const char *const code_names[] = {
    [RPC_OK] = "OK",
    [RPC_CANCELLED] = "CANCELLED",
    [RPC_UNKNOWN] = "UNKNOWN",
    [RPC_INVALID_ARGUMENT] = "INVALID_ARGUMENT",
    [RPC_DEADLINE_EXCEEDED] = "DEADLINE_EXCEEDED",
    [RPC_NOT_FOUND] = "NOT_FOUND",
    [RPC_ALREADY_EXISTS] = "ALREADY_EXISTS",
    [RPC_PERMISSION_DENIED] = "PERMISSION_DENIED",
    [RPC_RESOURCE_EXHAUSTED] = "RESOURCE_EXHAUSTED",
    [RPC_FAILED_PRECONDITION] = "FAILED_PRECONDITION",
    [RPC_ABORTED] = "ABORTED",
    [RPC_OUT_OF_RANGE] = "OUT_OF_RANGE",
    [RPC_UNIMPLEMENTED] = "UNIMPLEMENTED",
    [RPC_INTERNAL] = "INTERNAL",
    [RPC_UNAVAILABLE] = "UNAVAILABLE",
    [RPC_DATA_LOSS] = "DATA_LOSS",
    [RPC_UNAUTHENTICATED] = "UNAUTHENTICATED",
};

const char *rpc_code_name(int code) {
  if (code < 0 || (size_t)code >= sizeof(code_names) / sizeof(code_names[0])) return "UNKNOWN";
  return code_names[code];
}
