/*
 * The error list's name table, texts, gRPC mapping and the thread-local
 * failure detail. See stk_error.h.
 */
#include "stk_error.h"

#include <stdarg.h>
#include <stdio.h>

static const struct {
  const char *name;
  int grpc;
  const char *text;
} error_table[STK__ERROR_COUNT] = {[0] = {"OK", 0, "success"},
#define ERROR_ROW(name, grpc, text) [STK__##name] = {#name, grpc, text},
                                   STK_ERROR_MAP(ERROR_ROW)
#undef ERROR_ROW
};

static _Thread_local char detail[512];

static int error_index(int err) {
  int i = -err;
  return (i >= 0 && i < STK__ERROR_COUNT) ? i : -1;
}

const char *stk_strerror(int err) {
  int i = error_index(err);
  return i < 0 ? "unknown error" : error_table[i].text;
}

const char *stk_errname(int err) {
  int i = error_index(err);
  return i < 0 ? "EUNKNOWN" : error_table[i].name;
}

int stk_error_to_grpc(int err) {
  int i = error_index(err);
  return i < 0 ? 2 /* UNKNOWN */ : error_table[i].grpc;
}

int stk_error_from_grpc(int grpc_status) {
  switch (grpc_status) {
  case 0:
    return 0;
  case 1:
    return STK_ECANCELED;
  case 3:
    return STK_EINVAL;
  case 4:
    return STK_ETIMEDOUT;
  case 5:
    return STK_ENOENT;
  case 6:
    return STK_EEXIST;
  case 7:
    return STK_EPERM;
  case 8:
    return STK_EBUSY;
  case 9:
    return STK_ESTATE;
  case 10:
    return STK_EABORTED;
  case 11:
    return STK_ERANGE;
  case 12:
    return STK_ENOTSUP;
  case 14:
    return STK_EUNAVAIL;
  case 15:
    return STK_ECORRUPT;
  case 16:
    return STK_EUNAUTH;
  default:
    return STK_EINTERNAL;
  }
}

void stk_set_detail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof(detail), fmt, ap);
  va_end(ap);
}

const char *stk_detail(void) {
  return detail;
}

void stk_clear_detail(void) {
  detail[0] = '\0';
}
