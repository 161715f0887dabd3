/*
 * stokerctl's loader parts without a network: NAME=URI[:FORMAT][@WEIGHT]
 * parsing (URIs with ':' of their own), `loader create` / `loader mixture`
 * flags landing in their fields with required ones enforced, and the
 * show / explain renderings as tables and JSON.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli_args.h"
#include "cli_loader_format.h"
#include "cli_loader_spec.h"
#include "stk_error.h"

static int parse(struct cli_args *a, const char *first, ...) {
  static char *argv[64];
  char err[256];
  int argc = 0;
  argv[argc++] = "stokerctl";
  va_list ap;
  va_start(ap, first);
  for (const char *w = first; w; w = va_arg(ap, const char *)) argv[argc++] = (char *)w;
  va_end(ap);
  return cli_parse(argc, argv, a, err, sizeof(err));
}

static void test_dataset_forms(void **state) {
  static struct cli_datasets d;
  char err[256];
  d.n = 0;
  assert_int_equal(cli_parse_dataset("web=file:///data/web:megatron@0.7", &d, err, 256), 0);
  assert_string_equal(d.ds[0].name, "web");
  assert_string_equal(d.ds[0].source->uri, "file:///data/web");
  assert_int_equal(d.ds[0].format, STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_MEGATRON);
  assert_true(d.ds[0].weight == 0.7);
  assert_int_equal(cli_parse_dataset("syn=synthetic:100:5:50:1", &d, err, 256), 0);
  assert_string_equal(d.ds[1].source->uri, "synthetic:100:5:50:1");
  assert_int_equal(d.ds[1].format, 0);
  assert_true(d.ds[1].weight == 1.0);
  assert_int_equal(cli_parse_dataset("t=/x/a.jsonl:text", &d, err, 256), 0);
  assert_int_equal(d.ds[2].format, STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_TEXT);
  assert_string_equal(d.ds[2].source->uri, "/x/a.jsonl");
  assert_int_equal(cli_parse_dataset("c=/bin/llm:llmc@3", &d, err, 256), 0);
  assert_int_equal(d.ds[3].format, STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_LLMC);
  assert_true(d.ds[3].weight == 3.0);
  assert_int_equal(d.n, 4);
  assert_int_equal(cli_parse_dataset("noequals", &d, err, 256), STK_EINVAL);
  assert_int_equal(cli_parse_dataset("=/x", &d, err, 256), STK_EINVAL);
  assert_int_equal(cli_parse_dataset("a=/x@-1", &d, err, 256), STK_EINVAL);
  assert_non_null(strstr(err, "weight"));
  assert_int_equal(cli_parse_dataset("a=/x@zero", &d, err, 256), STK_EINVAL);
  assert_int_equal(cli_parse_dataset("a=:megatron", &d, err, 256), STK_EINVAL);
  assert_int_equal(d.n, 4);
}

static void test_create_flags(void **state) {
  static struct cli_loader_spec s;
  struct cli_args a;
  char err[256];
  assert_int_equal(parse(&a, "loader", "create", "j", "--dataset", "a=/d/a:llmc@2", "--dataset",
                         "b=synthetic:10:1:5:3", "--seq-len", "1024", "--global-batch=64", "--seed",
                         "9", "--shards", "512", "--lanes", "16", "--eos", "50256",
                         "--max-doc-tokens", "8192", "--tokenizer", "b=bytes", NULL),
                   0);
  assert_int_equal(cli_loader_spec_from_args(&a, "j", &s, err, sizeof(err)), 0);
  assert_string_equal(s.spec.job, "j");
  assert_string_equal(s.spec.datasets[1]->tokenizer, "bytes");
  assert_string_equal(s.spec.datasets[0]->tokenizer, ""); /* unset: the default */
  assert_int_equal(s.spec.n_datasets, 2);
  assert_string_equal(s.spec.datasets[1]->name, "b");
  assert_true(s.spec.datasets[0]->weight == 2.0);
  assert_int_equal(s.spec.seq_len, 1024);
  assert_int_equal(s.spec.global_batch, 64);
  assert_int_equal(s.spec.seed, 9);
  assert_int_equal(s.spec.logical_shards, 512);
  assert_int_equal(s.spec.lanes, 16);
  assert_false(s.spec.add_bos);
  assert_true(s.spec.add_eos);
  assert_int_equal(s.spec.eos_id, 50256);
  assert_int_equal(s.spec.max_doc_tokens, 8192);
  assert_int_equal(s.spec.datasets[0]->block_tokens, 0); /* Not given: the service's default. */

  /* --block-tokens: the unit size of every llm.c dataset, and only theirs. */
  assert_int_equal(parse(&a, "loader", "create", "j", "--dataset", "a=/d/a:llmc", "--dataset",
                         "b=/d/b:megatron", "--dataset", "c=/d/c:llmc@2", "--block-tokens", "4096",
                         "--seq-len", "8", "--global-batch", "2", NULL),
                   0);
  assert_int_equal(cli_loader_spec_from_args(&a, "j", &s, err, sizeof(err)), 0);
  assert_int_equal(s.spec.datasets[0]->block_tokens, 4096);
  assert_int_equal(s.spec.datasets[1]->block_tokens, 0);
  assert_int_equal(s.spec.datasets[2]->block_tokens, 4096);
  assert_int_equal(parse(&a, "loader", "create", "j", "--dataset", "b=/d/b:megatron",
                         "--block-tokens", "4096", "--seq-len", "8", "--global-batch", "2", NULL),
                   0);
  assert_int_equal(cli_loader_spec_from_args(&a, "j", &s, err, sizeof(err)), STK_EINVAL);
  assert_non_null(strstr(err, "--block-tokens"));
  assert_int_equal(parse(&a, "loader", "create", "j", "--dataset", "a=/d/a:llmc", "--block-tokens",
                         "0", "--seq-len", "8", "--global-batch", "2", NULL),
                   0);
  assert_int_equal(cli_loader_spec_from_args(&a, "j", &s, err, sizeof(err)), STK_EINVAL);
  assert_non_null(strstr(err, "at least 1"));

  assert_int_equal(
      parse(&a, "loader", "create", "j", "--seq-len", "8", "--global-batch", "2", NULL), 0);
  assert_int_equal(cli_loader_spec_from_args(&a, "j", &s, err, sizeof(err)), STK_EINVAL);
  assert_non_null(strstr(err, "--dataset"));
  assert_int_equal(parse(&a, "--dataset", "a=/x", "--global-batch", "2", NULL), 0);
  assert_int_equal(cli_loader_spec_from_args(&a, "j", &s, err, sizeof(err)), STK_EINVAL);
  assert_non_null(strstr(err, "--seq-len"));
  assert_int_equal(parse(&a, "--dataset", "a=/x", "--seq-len", "0", "--global-batch", "2", NULL),
                   0);
  assert_int_equal(cli_loader_spec_from_args(&a, "j", &s, err, sizeof(err)), STK_EINVAL);
  /* A number that is none is refused as the line is parsed (the flag row
   * is an integer), naming the flag. */
  char *bad[] = {"stokerctl", "loader", "create", "j", "--bos", "x"};
  assert_int_equal(cli_parse(6, bad, &a, err, sizeof(err)), STK_EINVAL);
  assert_non_null(strstr(err, "--bos"));
}

static void test_mixture_flags(void **state) {
  static struct cli_mixture m;
  struct cli_args a;
  char err[256];
  assert_int_equal(parse(&a, "--from-step", "100", "--dataset", "a=/x@0.25", NULL), 0);
  assert_int_equal(cli_mixture_from_args(&a, "j", &m, err, sizeof(err)), 0);
  assert_int_equal(m.req.from_step, 100);
  assert_int_equal(m.req.n_datasets, 1);
  assert_true(m.req.datasets[0]->weight == 0.25);
  assert_int_equal(m.req.seq_len, 0);
  assert_int_equal(
      parse(&a, "--from-step", "5", "--dataset", "n=/x:llmc", "--block-tokens", "512", NULL), 0);
  assert_int_equal(cli_mixture_from_args(&a, "j", &m, err, sizeof(err)), 0);
  assert_int_equal(m.req.datasets[0]->block_tokens, 512);
  assert_int_equal(parse(&a, "--from-step", "7", "--global-batch", "32", NULL), 0);
  assert_int_equal(cli_mixture_from_args(&a, "j", &m, err, sizeof(err)), 0);
  assert_int_equal(m.req.n_datasets, 0);
  assert_null(m.req.datasets);
  assert_int_equal(m.req.global_batch, 32);
  assert_int_equal(parse(&a, "--dataset", "a=/x", NULL), 0);
  assert_int_equal(cli_mixture_from_args(&a, "j", &m, err, sizeof(err)), STK_EINVAL);
  assert_non_null(strstr(err, "--from-step"));
  assert_int_equal(parse(&a, "--from-step", "3", NULL), 0);
  assert_int_equal(cli_mixture_from_args(&a, "j", &m, err, sizeof(err)), STK_EINVAL);
  assert_non_null(strstr(err, "nothing to change"));
  /* Documents blocked alone are a change; FILE is what lies between the
   * first and the last '/'. */
  assert_int_equal(parse(&a, "--from-step", "9", "--block-document", "web/part_0.bin/42",
                         "--block-document", "code/x/y.jsonl/7", NULL),
                   0);
  assert_int_equal(cli_mixture_from_args(&a, "j", &m, err, sizeof(err)), 0);
  assert_int_equal(m.req.n_block_documents, 2);
  assert_string_equal(m.req.block_documents[0]->dataset, "web");
  assert_string_equal(m.req.block_documents[0]->file, "part_0.bin");
  assert_int_equal(m.req.block_documents[0]->document, 42);
  assert_string_equal(m.req.block_documents[1]->file, "x/y.jsonl");
  assert_int_equal(m.req.block_documents[1]->document, 7);
  /* A tokenizer for a dataset of the mixture (a text dataset read the new way). */
  assert_int_equal(parse(&a, "--from-step", "9", "--dataset", "web=/d/web.jsonl:text",
                         "--tokenizer", "web=gpt2:/v/enc.json,/v/vocab.bpe", NULL),
                   0);
  assert_int_equal(cli_mixture_from_args(&a, "j", &m, err, sizeof(err)), 0);
  assert_string_equal(m.req.datasets[0]->tokenizer, "gpt2:/v/enc.json,/v/vocab.bpe");
  const char *bad_tok[] = {"other=bytes", "web=", "web", "=bytes"};
  for (size_t i = 0; i < sizeof bad_tok / sizeof bad_tok[0]; i++) {
    assert_int_equal(parse(&a, "--from-step", "9", "--dataset", "web=/d/web.jsonl:text",
                           "--tokenizer", bad_tok[i], NULL),
                     0);
    assert_int_equal(cli_mixture_from_args(&a, "j", &m, err, sizeof(err)), STK_EINVAL);
    assert_non_null(strstr(err, "--tokenizer"));
  }
  const char *bad[] = {"web/42", "/f/1", "web//1", "web/f/x", "web/f/"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(parse(&a, "--from-step", "9", "--block-document", bad[i], NULL), 0);
    assert_int_equal(cli_mixture_from_args(&a, "j", &m, err, sizeof(err)), STK_EINVAL);
    assert_non_null(strstr(err, "DATASET/FILE/DOC"));
  }
}

/* Renders into a string through a memory stream. */
static char *render(void (*fn)(const void *, FILE *), const void *arg) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  fn(arg, f);
  fclose(f);
  return buf;
}

static void show(const void *info, FILE *f) {
  fmt_loader_show(info, f);
}

static void explain(const void *resp, FILE *f) {
  fmt_explain_table(resp, f);
}

static void test_show_and_json(void **state) {
  Stoker__V1__StorageRef src = STOKER__V1__STORAGE_REF__INIT;
  src.uri = "file:///data/web";
  Stoker__V1__DatasetSpec ds = STOKER__V1__DATASET_SPEC__INIT, *dsp = &ds;
  ds.name = "web";
  ds.source = &src;
  ds.format = STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_MEGATRON;
  ds.weight = 0.5;
  Stoker__V1__LoaderSpec spec = STOKER__V1__LOADER_SPEC__INIT;
  spec.job = "j1";
  spec.datasets = &dsp;
  spec.n_datasets = 1;
  spec.seq_len = 2048;
  spec.global_batch = 512;
  spec.add_eos = 1;
  spec.eos_id = 50256;
  Stoker__V1__LoaderInfo info = STOKER__V1__LOADER_INFO__INIT;
  info.spec = &spec;
  info.committed_step = -1;
  char *text = render(show, &info);
  assert_non_null(strstr(text, "seq_len 2048, global batch 512 lines"));
  assert_non_null(strstr(text, "bos off, eos 50256"));
  assert_non_null(strstr(text, "Committed step:  none"));
  assert_non_null(strstr(text, "web      file:///data/web  megatron  0.5"));
  free(text);
  info.committed_step = 12;
  cJSON *o = fmt_loader_json(&info);
  char *s = cJSON_PrintUnformatted(o);
  cJSON *back = cJSON_Parse(s);
  assert_int_equal(cJSON_GetObjectItem(back, "committed_step")->valuedouble, 12);
  assert_int_equal(cJSON_GetObjectItem(back, "global_batch")->valuedouble, 512);
  cJSON *d0 = cJSON_GetArrayItem(cJSON_GetObjectItem(back, "datasets"), 0);
  assert_string_equal(cJSON_GetObjectItem(d0, "format")->valuestring, "megatron");
  assert_string_equal(cJSON_GetObjectItem(d0, "uri")->valuestring, "file:///data/web");
  cJSON_Delete(back);
  cJSON_free(s);
  cJSON_Delete(o);
}

static void test_explain_table_and_json(void **state) {
  Stoker__V1__LineSource l[2] = {STOKER__V1__LINE_SOURCE__INIT, STOKER__V1__LINE_SOURCE__INIT};
  Stoker__V1__LineSource *lp[2] = {&l[0], &l[1]};
  l[0].line = 0;
  l[0].dataset = "web";
  l[0].document = 123456;
  l[0].file = "web-00.bin";
  l[0].doc_token_begin = 40;
  l[0].doc_token_end = 330;
  l[0].unit = 77;
  l[0].token_begin = 10;
  l[0].token_end = 300;
  l[1].line = 1;
  l[1].dataset = "code";
  l[1].document = 5;
  l[1].file = "code";
  l[1].doc_token_end = 9;
  l[1].unit = 5;
  l[1].token_end = 9;
  l[1].epoch = 2;
  l[1].lane = 3;
  l[1].tokenizer = "bytes";
  l[1].doc_byte_end = 9;
  Stoker__V1__ExplainResponse r = STOKER__V1__EXPLAIN_RESPONSE__INIT;
  r.sources = lp;
  r.n_sources = 2;
  char *text = render(explain, &r);
  assert_string_equal(text,
                      "LINE  DATASET  FILE        DOCUMENT  DOC TOKENS  UNIT  TOKENS  EPOCH  LANE\n"
                      "0     web      web-00.bin  123456    40-330      77    10-300  0      0\n"
                      "1     code     code        5         0-9         5     0-9     2      3\n");
  free(text);
  cJSON *o = fmt_explain_json("j", 4, 1, 2, &r);
  cJSON *src = cJSON_GetObjectItem(o, "sources");
  assert_int_equal(cJSON_GetArraySize(src), 2);
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(src, 0), "token_end")->valuedouble, 300);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(src, 0), "file")->valuestring,
                      "web-00.bin");
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(src, 0), "doc_token_begin")->valuedouble,
                   40);
  assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(src, 0), "tokenizer")); /* stored as tokens */
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(src, 1), "tokenizer")->valuestring,
                      "bytes");
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(src, 1), "doc_byte_end")->valuedouble, 9);
  assert_int_equal(cJSON_GetObjectItem(o, "world")->valuedouble, 2);
  cJSON_Delete(o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dataset_forms),          cmocka_unit_test(test_create_flags),
      cmocka_unit_test(test_mixture_flags),          cmocka_unit_test(test_show_and_json),
      cmocka_unit_test(test_explain_table_and_json),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
