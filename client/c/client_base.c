/*
 * client_base: the bottom of libstoker-client — each thread's last server
 * status (for error messages), the monotonic clock, deadlines and condition
 * variables on it, a call's timeout. It calls no file of the library; every
 * file may call it.
 */
#include "client_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static _Thread_local struct {
  int code;
  char message[512];
} last_error;

void client_set_error(int grpc_code, const char *fmt, ...) {
  va_list ap;
  last_error.code = grpc_code;
  va_start(ap, fmt);
  vsnprintf(last_error.message, sizeof(last_error.message), fmt, ap);
  va_end(ap);
}

const char *stk_client_last_error(int *ret_grpc_code) {
  if (ret_grpc_code) *ret_grpc_code = last_error.code;
  return last_error.message;
}

int client_fail(int err, const char *what) {
  client_set_error(stk_error_to_grpc(err), "%s: %s", what, stk_strerror(err));
  return err;
}

int64_t client_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t client_timeout(const struct stk_client *c, int64_t timeout_ms) {
  return timeout_ms > 0 ? timeout_ms : c->default_timeout_ms;
}

void client_cond_init(pthread_cond_t *cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

void client_deadline_after(struct timespec *ts, int64_t ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  int64_t ns = ts->tv_nsec + (ms % 1000) * 1000000;
  ts->tv_sec += ms / 1000 + ns / 1000000000;
  ts->tv_nsec = ns % 1000000000;
}

void client_sleep_ms(int64_t ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}
