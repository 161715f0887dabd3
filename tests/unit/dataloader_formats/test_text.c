/*
 * Tests for the text reader with the byte tokenizer: JSONL and plain text
 * give every document exactly once, in order, whatever the block size; bad
 * JSONL lines are reported as file:line; the tokenizer spec is checked. A
 * unit read from a place (a document of it, from a byte of its text: what a
 * tokenizer switch reads) holds exactly that document's rest as its leading
 * piece and the later documents whole, numbered as in the whole unit; the
 * byte tokenizer's ids spell one byte each.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dl_source.h"
#include "dl_tokenizer.h"
#include "fmt_test.h"
#include "stk_error.h"

/* Reads every unit; the documents, as NUL-separated bytes, go to out. */
static size_t read_docs(struct dl_source *s, char *out, size_t *ret_n_docs) {
  size_t n = 0, docs = 0;
  for (uint64_t u = 0; u < dl_source_units(s); u++) {
    struct dl_unit unit;
    int rc = dl_source_read_unit(s, u, &unit);
    if (rc < 0) fail_msg("read %llu: %s", (unsigned long long)u, stk_detail());
    if (unit.n_docs) assert_int_equal(unit.doc_starts[0], 0);
    assert_true(unit.n_docs > 0 || unit.n_tokens == 0);
    for (size_t d = 0; d < unit.n_docs; d++) {
      size_t end = d + 1 < unit.n_docs ? unit.doc_starts[d + 1] : unit.n_tokens;
      for (size_t i = unit.doc_starts[d]; i < end; i++) {
        assert_true(unit.tokens[i] < 256);
        out[n++] = (char)unit.tokens[i];
      }
      out[n++] = '\0';
      docs++;
    }
    dl_unit_free(&unit);
  }
  *ret_n_docs = docs;
  return n;
}

static void check_every_block_size(const char *path, const char *content, const char *want,
                                   size_t want_len, size_t want_docs) {
  write_file(path, content, strlen(content));
  for (uint32_t bb = 1; bb <= strlen(content) + 1; bb++) {
    struct dl_source_opts o = {.path = path, .format = DL_FORMAT_TEXT, .block_bytes = bb};
    struct dl_source *s = NULL;
    assert_int_equal(dl_source_open(&o, &s), 0);
    assert_int_equal(dl_source_total_weight(s), strlen(content));
    assert_int_equal(dl_source_units(s), (strlen(content) + bb - 1) / bb);
    char got[1024];
    size_t docs, n = read_docs(s, got, &docs);
    assert_int_equal(docs, want_docs);
    assert_int_equal(n, want_len);
    assert_memory_equal(got, want, want_len);
    n = read_docs(s, got, &docs); /* again, from the cache where it holds the unit */
    assert_memory_equal(got, want, want_len);
    dl_source_free(s);
  }
}

static void test_jsonl(void **state) {
  char *dir = tmpdir_new();
  const char content[] = "{\"text\": \"hello\", \"id\": 1}\n"
                         "{\"text\": \"w\\u00f6rld \\\"q\\\"\\nline2\"}\n"
                         "\n"
                         "{\"text\": \"\"}\n"
                         "   \n"
                         "{\"meta\": 5, \"text\": \"last\"}";
  const char want[] = "hello\0w\xc3\xb6rld \"q\"\nline2\0last";
  check_every_block_size(path_in(dir, "a.jsonl"), content, want, sizeof want, 3);
  tmpdir_remove(dir);
}

static void test_plain(void **state) {
  char *dir = tmpdir_new();
  const char content[] = "first para\nstill first\n\nsecond\n \n\n\nthird é\nend";
  const char want[] = "first para\nstill first\0second\0third \xc3\xa9\nend";
  check_every_block_size(path_in(dir, "a.txt"), content, want, sizeof want, 3);
  tmpdir_remove(dir);
}

static void expect_bad_line(const char *dir, const char *content, const char *where,
                            const char *what) {
  write_file(path_in(dir, "b.jsonl"), content, strlen(content));
  struct dl_source_opts o = {.path = path_in(dir, "b.jsonl"), .format = DL_FORMAT_TEXT};
  struct dl_source *s = NULL;
  assert_int_equal(dl_source_open(&o, &s), 0); /* open reads nothing */
  struct dl_unit unit;
  assert_int_equal(dl_source_read_unit(s, 0, &unit), STK_ECORRUPT);
  if (!strstr(stk_detail(), where) || !strstr(stk_detail(), what))
    fail_msg("detail '%s' lacks '%s' or '%s'", stk_detail(), where, what);
  dl_source_free(s);
}

static void test_bad_jsonl(void **state) {
  char *dir = tmpdir_new();
  expect_bad_line(dir, "{\"text\":\"a\"}\n\n{\"text\": \"b\"\n", "b.jsonl:3", "not valid JSON");
  expect_bad_line(dir, "{\"text\":\"a\"}\n{\"txt\":\"b\"}\n", "b.jsonl:2", "\"text\"");
  expect_bad_line(dir, "{\"text\": 5}\n", "b.jsonl:1", "\"text\"");
  tmpdir_remove(dir);
}

static void test_directory(void **state) {
  char *dir = tmpdir_new();
  write_file(path_in(dir, "2.txt"), "c\n\nd", 4);
  write_file(path_in(dir, "1.jsonl"), "{\"text\":\"a\"}\n{\"text\":\"b\"}\n", 26);
  struct dl_source_opts o = {.path = dir, .format = DL_FORMAT_TEXT, .block_bytes = 5};
  struct dl_source *s = NULL;
  assert_int_equal(dl_source_open(&o, &s), 0);
  assert_int_equal(dl_source_units(s), 6 + 1);
  char got[64];
  size_t docs, n = read_docs(s, got, &docs);
  assert_int_equal(docs, 4);
  assert_memory_equal(got, "a\0b\0c\0d", n);
  dl_source_free(s);
  tmpdir_remove(dir);
}

static void test_byte_tokenizer(void **state) {
  struct dl_tokenizer *t = NULL;
  assert_int_equal(dl_tokenizer_new("bytes", &t), 0);
  struct dl_tokens out = {0};
  const char in[] = "A\xc3\xa9\xf0\x9f\x98\x80\n";
  assert_int_equal(dl_tokenizer_encode(t, in, sizeof in - 1, &out), 0);
  assert_int_equal(dl_tokenizer_encode(t, "z", 1, &out), 0); /* appends */
  const uint32_t want[] = {65, 0xc3, 0xa9, 0xf0, 0x9f, 0x98, 0x80, 10, 'z'};
  assert_int_equal(out.n, 9);
  assert_memory_equal(out.ids, want, sizeof want);
  dl_tokens_release(&out);
  dl_tokenizer_free(t);
  assert_int_equal(dl_tokenizer_new(NULL, &t), 0);
  dl_tokenizer_free(t);
  assert_int_equal(dl_tokenizer_new("wordpiece", &t), STK_EINVAL);
  assert_int_equal(dl_tokenizer_new("gpt2:only-one-file", &t), STK_EINVAL);
  assert_int_equal(dl_tokenizer_new("gpt2:/no/such/vocab.json,/no/merges.txt", &t), STK_ENOENT);
  char *dir = tmpdir_new();
  write_file(path_in(dir, "x.txt"), "x", 1);
  struct dl_source_opts o = {
      .path = path_in(dir, "x.txt"), .format = DL_FORMAT_TEXT, .tokenizer = "nope"};
  struct dl_source *s = NULL;
  assert_int_equal(dl_source_open(&o, &s), STK_EINVAL);
  o.path = path_in(dir, "missing.txt");
  o.tokenizer = NULL;
  assert_int_equal(dl_source_open(&o, &s), STK_ENOENT);
  assert_null(s);
  tmpdir_remove(dir);
}

static void test_read_from_a_place(void **state) {
  char *dir = tmpdir_new();
  const char content[] = "{\"text\": \"caf\u00e9 one\"}\n{\"text\": \"\"}\n{\"text\": \"two\"}\n";
  write_file(path_in(dir, "a.jsonl"), content, strlen(content));
  struct dl_source_opts o = {.path = path_in(dir, "a.jsonl"), .format = DL_FORMAT_TEXT};
  struct dl_source *s = NULL;
  assert_int_equal(dl_source_open(&o, &s), 0);
  assert_true(dl_source_tokenizes(s));
  assert_int_equal(dl_source_token_bytes(s, 'a'), 1);
  assert_int_equal(dl_source_token_bytes(s, 256), 0);
  struct dl_unit u;
  /* Document 1 from byte 4: the second byte of the "é" on, then document 3. */
  assert_int_equal(dl_source_read_unit_from(s, 0, 1, 4, true, &u), 0);
  assert_int_equal(u.n_tokens, 5 + 3);
  const uint32_t want[] = {0xa9, ' ', 'o', 'n', 'e', 't', 'w', 'o'};
  assert_memory_equal(u.tokens, want, sizeof want);
  assert_int_equal(u.n_docs, 1); /* the lead has no start */
  assert_int_equal(u.doc_starts[0], 5);
  assert_int_equal(u.doc_rel[0], 3); /* as numbered in the whole unit */
  dl_unit_free(&u);
  /* Document 3 afresh: it starts the unit. */
  assert_int_equal(dl_source_read_unit_from(s, 0, 3, 0, false, &u), 0);
  assert_int_equal(u.n_tokens, 3);
  assert_int_equal(u.n_docs, 1);
  assert_int_equal(u.doc_starts[0], 0);
  assert_int_equal(u.doc_rel[0], 3);
  dl_unit_free(&u);
  /* Past the end of a document's text: its rest is empty. */
  assert_int_equal(dl_source_read_unit_from(s, 0, 1, 99, true, &u), 0);
  assert_int_equal(u.n_tokens, 3);
  dl_unit_free(&u);
  dl_source_free(s);
  tmpdir_remove(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_jsonl),          cmocka_unit_test(test_plain),
      cmocka_unit_test(test_bad_jsonl),      cmocka_unit_test(test_directory),
      cmocka_unit_test(test_byte_tokenizer), cmocka_unit_test(test_read_from_a_place),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
