/*
 * rpc_log: gRPC core's own log lines go through the daemon's logger, so a
 * daemon writes one format (text or JSON lines, with timestamps and
 * levels as log.h has them) instead of gRPC's "E1125 01:09:48.98 ..."
 * lines between its own. gRPC's levels map to ours: DEBUG to debug, INFO
 * to info, ERROR to warn (gRPC reports as errors what the daemon then
 * reports itself, once, with the cause: a failed bind, say). What gRPC
 * logs at all is still chosen by GRPC_VERBOSITY and GRPC_TRACE.
 */
#include "rpc.h"

#include <grpc/support/log.h>
#include <string.h>

#include "log.h"

static void route(gpr_log_func_args *args) {
  enum log_level level = args->severity == GPR_LOG_SEVERITY_DEBUG  ? LOG_DEBUG
                         : args->severity == GPR_LOG_SEVERITY_INFO ? LOG_INFO
                                                                   : LOG_WARN;
  if (!log_enabled(level)) return;
  const char *file = args->file ? args->file : "";
  const char *base = strrchr(file, '/');
  log_event(level, "grpc", "%s (%s:%d)", args->message ? args->message : "", base ? base + 1 : file,
            args->line);
}

void rpc_log_to_daemon_log(void) {
  gpr_set_log_function(route);
}
