/*
 * GPT-2 BPE checked against an independent implementation: gpt2_check.sh
 * encodes the test strings with npm's gpt-3-encoder and hands us its ids;
 * ours must be identical. Also: the same ids from many threads at once, and
 * the throughput (printed, not timed).
 * Usage: test_gpt2 ENCODER_JSON VOCAB_BPE STRINGS_JSON EXPECTED_JSON
 */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "dl_tokenizer.h"
#include "stk_error.h"

static const char *encoder_json, *vocab_bpe, *strings_json, *expected_json;

static cJSON *load_json(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  cJSON *j = cJSON_Parse(buf);
  assert_non_null(j);
  return j;
}

static struct dl_tokenizer *open_gpt2(void) {
  char spec[2048];
  snprintf(spec, sizeof spec, "gpt2:%s,%s", encoder_json, vocab_bpe);
  struct dl_tokenizer *t = NULL;
  int rc = dl_tokenizer_new(spec, &t);
  if (rc < 0) fail_msg("open: %s: %s", stk_strerror(rc), stk_detail());
  return t;
}

static void test_matches_reference(void **state) {
  cJSON *strings = load_json(strings_json), *expected = load_json(expected_json);
  assert_int_equal(cJSON_GetArraySize(strings), cJSON_GetArraySize(expected));
  struct dl_tokenizer *t = open_gpt2();
  for (int pass = 0; pass < 2; pass++) { /* the second pass is served by the cache */
    for (int i = 0; i < cJSON_GetArraySize(strings); i++) {
      const char *s = cJSON_GetArrayItem(strings, i)->valuestring;
      cJSON *want = cJSON_GetArrayItem(expected, i);
      struct dl_tokens got = {0};
      assert_int_equal(dl_tokenizer_encode(t, s, strlen(s), &got), 0);
      bool same = (int)got.n == cJSON_GetArraySize(want);
      for (size_t k = 0; same && k < got.n; k++)
        same = got.ids[k] == (uint32_t)cJSON_GetArrayItem(want, (int)k)->valuedouble;
      if (!same) {
        char *w = cJSON_PrintUnformatted(want);
        fprintf(stderr, "string %d '%s'\n want %s\n got ", i, s, w);
        for (size_t k = 0; k < got.n; k++) fprintf(stderr, "%u,", got.ids[k]);
        fprintf(stderr, "\n");
        free(w);
        fail_msg("ids differ from gpt-3-encoder for string %d", i);
      }
      dl_tokens_release(&got);
    }
  }
  dl_tokenizer_free(t);
  cJSON_Delete(strings);
  cJSON_Delete(expected);
}

/* A few MB of text made of the test strings with varying numbers mixed in. */
static char *make_corpus(size_t *ret_len) {
  cJSON *strings = load_json(strings_json);
  size_t cap = 4 << 20, n = 0;
  char *buf = malloc(cap + 4096);
  for (int i = 0; n < cap; i++) {
    const char *s = cJSON_GetArrayItem(strings, i % cJSON_GetArraySize(strings))->valuestring;
    n += (size_t)snprintf(buf + n, 4096, "%s %d\n", s, i * 7919 % 100003);
  }
  cJSON_Delete(strings);
  *ret_len = n;
  return buf;
}

struct job {
  struct dl_tokenizer *t;
  const char *text;
  size_t len;
  struct dl_tokens out;
};

static void *encode_job(void *arg) {
  struct job *j = arg;
  if (dl_tokenizer_encode(j->t, j->text, j->len, &j->out) < 0) abort();
  return NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void test_threads_and_throughput(void **state) {
  size_t len;
  char *text = make_corpus(&len);
  struct dl_tokenizer *t = open_gpt2();
  struct job one = {t, text, len, {0}};
  double t0 = now_s();
  encode_job(&one);
  double cold = now_s() - t0;
  struct dl_tokenizer *t2 = open_gpt2();
  struct job jobs[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    jobs[i] = (struct job){t2, text, len, {0}};
    assert_int_equal(pthread_create(&th[i], NULL, encode_job, &jobs[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(jobs[i].out.n, one.out.n);
    assert_memory_equal(jobs[i].out.ids, one.out.ids, one.out.n * sizeof(uint32_t));
    dl_tokens_release(&jobs[i].out);
  }
  t0 = now_s();
  struct job warm = {t, text, len, {0}};
  encode_job(&warm);
  double warm_s = now_s() - t0;
  printf("gpt2 bpe: %.1f MB, %zu tokens; cold %.1f MB/s, cached %.1f MB/s (one core)\n", len / 1e6,
         one.out.n, len / 1e6 / cold, len / 1e6 / warm_s);
  assert_true(one.out.n > len / 8 && one.out.n < len);
  dl_tokens_release(&one.out);
  dl_tokens_release(&warm.out);
  dl_tokenizer_free(t);
  dl_tokenizer_free(t2);
  free(text);
}

static void test_bad_files(void **state) {
  struct dl_tokenizer *t = NULL;
  char spec[2048];
  snprintf(spec, sizeof spec, "gpt2:/nonexistent/encoder.json,%s", vocab_bpe);
  assert_int_equal(dl_tokenizer_new(spec, &t), STK_ENOENT);
  assert_non_null(strstr(stk_detail(), "/nonexistent/encoder.json"));
  snprintf(spec, sizeof spec, "gpt2:%s,%s", vocab_bpe, vocab_bpe); /* merges as vocabulary */
  assert_int_equal(dl_tokenizer_new(spec, &t), STK_ECORRUPT);
  assert_non_null(strstr(stk_detail(), vocab_bpe));
  assert_null(t);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s ENCODER_JSON VOCAB_BPE STRINGS_JSON EXPECTED_JSON\n", argv[0]);
    return 2;
  }
  encoder_json = argv[1];
  vocab_bpe = argv[2];
  strings_json = argv[3];
  expected_json = argv[4];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_reference),
      cmocka_unit_test(test_threads_and_throughput),
      cmocka_unit_test(test_bad_files),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
