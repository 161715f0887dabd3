/*
 * A trainer's first program against the installed libstoker-client: built by
 * install_check.sh with nothing but `pkg-config --cflags --libs
 * stoker-client` and the installed headers, run against the installed
 * shared library. It calls a few public functions that need no daemon: the
 * error texts, the dtype sizes, a client without an address (STK_EINVAL)
 * and a client whose address nobody listens on (a failed health check with
 * the last error set). Exits 0 when every check holds.
 */
#include <stdio.h>
#include <string.h>

#include <stoker_ckpt.h>
#include <stoker_client.h>
#include <stoker_error.h>
#include <stoker_loader.h>

static int failures;

static void check(int ok, const char *what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) failures++;
}

static void check_pure_calls(void) {
  check(!strcmp(stk_strerror(STK_EINVAL), "invalid argument"), "stk_strerror(STK_EINVAL)");
  check(!strcmp(stk_errname(STK_ENOENT), "ENOENT"), "stk_errname(STK_ENOENT)");
  check(stk_ckpt_dtype_size(STK_DTYPE_F32) == 4, "dtype size F32 = 4");
  check(stk_ckpt_dtype_size(STK_DTYPE_BF16) == 2, "dtype size BF16 = 2");
  check(stk_ckpt_dtype_size(STK_DTYPE_U64) == 8, "dtype size U64 = 8");
  check(stk_ckpt_dtype_size(STK_DTYPE_BYTES) == 1, "dtype size BYTES = 1");
  check(stk_ckpt_dtype_size((enum stk_dtype)99) == 0, "dtype size of an unknown dtype = 0");
  uint64_t off[2] = {0, 0}, sizes[2] = {3, 5};
  struct stk_ckpt_box box = {2, off, sizes};
  check(stk_ckpt_box_elems(&box) == 15, "box elems 3 x 5 = 15");
}

static void check_client_errors(void) {
  struct stk_client *c = NULL;
  struct stk_client_opts none = {0};
  check(stk_client_new(&none, &c) == STK_EINVAL && c == NULL, "client without address: EINVAL");

  /* Port 1 on loopback: nobody listens, the call fails fast. */
  struct stk_client_opts opts = {.address = "127.0.0.1:1", .default_timeout_ms = 2000};
  check(stk_client_new(&opts, &c) == 0 && c != NULL, "client to an unreachable address");
  if (!c) return;
  int status = -1;
  int err = stk_health_check(c, "", 2000, &status);
  int code = 0;
  const char *msg = stk_client_last_error(&code);
  printf("     health check: %s (%s), gRPC code %d: %s\n", stk_errname(err), stk_strerror(err),
         code, msg);
  check(err == STK_EUNAVAIL || err == STK_ETIMEDOUT, "health check fails UNAVAILABLE/DEADLINE");
  check(code != 0, "last error carries the gRPC code");
  check(stk_generation(c) == 0, "generation 0 before joining");
  check(stk_poll_action(c) == STK_ACTION_NONE, "no action before joining");
  stk_client_free(c);
  stk_client_free(NULL);
}

int main(void) {
  check_pure_calls();
  check_client_errors();
  return failures ? 1 : 0;
}
