/*
 * ckpt_names: one strict character policy for everything that becomes part
 * of a storage key, checked before any key is built.
 */
#include "ckpt_names.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "stk_error.h"

static bool is_name_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

/* Checks a "/"-separated path (or a single segment if !slashes). */
static int check_path(const char *what, const char *s, size_t max, bool slashes, bool empty_ok) {
  if (!s) s = "";
  size_t n = strnlen(s, max + 1);
  if (n == 0 && empty_ok) return 0;
  if (n == 0 || n > max) {
    stk_set_detail("%s must be 1..%zu bytes", what, max);
    return STK_EINVAL;
  }
  size_t seg_start = 0;
  for (size_t i = 0; i <= n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '/' || c == '\0') {
      if (c == '/' && !slashes) goto bad_char;
      size_t len = i - seg_start;
      if (len == 0 || (len == 1 && s[seg_start] == '.')) {
        stk_set_detail("%s \"%s\": empty or \".\" path segment", what, s);
        return STK_EINVAL;
      }
      seg_start = i + 1;
    } else if (!is_name_char(c)) {
      goto bad_char;
    } else if (c == '.' && s[i + 1] == '.') {
      stk_set_detail("%s \"%s\": \"..\" is not allowed", what, s);
      return STK_EINVAL;
    }
    continue;
  bad_char:
    stk_set_detail("%s: byte 0x%02x at %zu is not allowed (use [A-Za-z0-9._%s-])", what, c, i,
                   slashes ? "/" : "");
    return STK_EINVAL;
  }
  return 0;
}

int ckpt_name_check_job(const char *job) {
  return check_path("job name", job, CKPT_JOB_MAX_BYTES, false, false);
}

int ckpt_name_check_tensor(const char *tensor) {
  return check_path("tensor name", tensor, CKPT_TENSOR_MAX_BYTES, true, false);
}

int ckpt_name_check_prefix(const char *prefix) {
  return check_path("key prefix", prefix, CKPT_PREFIX_MAX_BYTES, true, true);
}

int ckpt_name_check_object(const char *object) {
  return check_path("object name", object, CKPT_OBJECT_MAX_BYTES, true, false);
}

int ckpt_name_check_attempt(const char *attempt) {
  size_t n = attempt ? strnlen(attempt, CKPT_ATTEMPT_MAX_BYTES + 1) : 0;
  bool ok = n > 0 && n <= CKPT_ATTEMPT_MAX_BYTES;
  for (size_t i = 0; ok && i < n; i++)
    ok = attempt[i] != '.' && attempt[i] != '_' && is_name_char((unsigned char)attempt[i]);
  if (ok) return 0;
  stk_set_detail("attempt id must be 1..%d bytes of [A-Za-z0-9-]", CKPT_ATTEMPT_MAX_BYTES);
  return STK_EINVAL;
}

int ckpt_name_check_step(int64_t step) {
  if (step >= 0 && step <= CKPT_STEP_MAX) return 0;
  stk_set_detail("step %" PRId64 " outside 0..%" PRId64, step, CKPT_STEP_MAX);
  return STK_EINVAL;
}

int ckpt_attempt_generate(char ret_attempt[CKPT_ATTEMPT_MAX_BYTES + 1]) {
  unsigned char raw[16];
  if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
    stk_set_detail("getrandom failed");
    return STK_EIO;
  }
  for (size_t i = 0; i < sizeof(raw); i++) sprintf(ret_attempt + 2 * i, "%02x", raw[i]);
  return 0;
}

void ckpt_object_name(uint32_t rank, uint32_t n, char ret_name[CKPT_OBJECT_MAX_BYTES + 1]) {
  snprintf(ret_name, CKPT_OBJECT_MAX_BYTES + 1, "rank-%05" PRIu32 "-%04" PRIu32 ".bin", rank, n);
}

/* printf into a fresh string. */
static int key_printf(char **ret_key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int key_printf(char **ret_key, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (n < 0) return STK_ENOMEM;
  *ret_key = s;
  return 0;
}

/* Checks the parts a key of the given depth uses (NULL = not used). */
static int check_parts(const char *prefix, const char *job, const int64_t *step,
                       const char *attempt, const char *object) {
  int rc = ckpt_name_check_prefix(prefix);
  if (rc == 0) rc = ckpt_name_check_job(job);
  if (rc == 0 && step) rc = ckpt_name_check_step(*step);
  if (rc == 0 && attempt) rc = ckpt_name_check_attempt(attempt);
  if (rc == 0 && object) rc = ckpt_name_check_object(object);
  return rc;
}

/* "PREFIX/" or "" for the empty prefix. */
#define PFX(p) (p && *p ? p : ""), (p && *p ? "/" : "")

int ckpt_key_job_dir(const char *prefix, const char *job, char **ret_key) {
  int rc = check_parts(prefix, job, NULL, NULL, NULL);
  return rc ? rc : key_printf(ret_key, "%s%s%s/", PFX(prefix), job);
}

int ckpt_key_step_dir(const char *prefix, const char *job, int64_t step, char **ret_key) {
  int rc = check_parts(prefix, job, &step, NULL, NULL);
  return rc ? rc : key_printf(ret_key, "%s%s%s/step-%012" PRId64 "/", PFX(prefix), job, step);
}

int ckpt_key_attempt_dir(const char *prefix, const char *job, int64_t step, const char *attempt,
                         char **ret_key) {
  int rc = check_parts(prefix, job, &step, attempt, NULL);
  return rc ? rc
            : key_printf(ret_key, "%s%s%s/step-%012" PRId64 "/attempt-%s/", PFX(prefix), job, step,
                         attempt);
}

int ckpt_key_object(const char *prefix, const char *job, int64_t step, const char *attempt,
                    const char *object, char **ret_key) {
  int rc = check_parts(prefix, job, &step, attempt, object);
  return rc ? rc
            : key_printf(ret_key, "%s%s%s/step-%012" PRId64 "/attempt-%s/%s", PFX(prefix), job,
                         step, attempt, object);
}

int ckpt_key_manifest(const char *prefix, const char *job, int64_t step, const char *attempt,
                      char **ret_key) {
  return ckpt_key_object(prefix, job, step, attempt, "manifest.pb", ret_key);
}

int ckpt_key_parse_step(const char *segment, int64_t *ret_step) {
  size_t n = segment ? strlen(segment) : 0;
  if (n > 0 && segment[n - 1] == '/') n--;
  if (n != 17 || strncmp(segment, "step-", 5) != 0) goto bad;
  int64_t step = 0;
  for (size_t i = 5; i < n; i++) {
    if (segment[i] < '0' || segment[i] > '9') goto bad;
    step = step * 10 + (segment[i] - '0');
  }
  *ret_step = step;
  return 0;
bad:
  stk_set_detail("not a step directory: \"%s\"", segment ? segment : "");
  return STK_EINVAL;
}
