/*
 * test_dl_tokenizer: a text dataset's tokenizer changed by a new version
 * (UpdateMixture from step S, the same dataset with tokenizer gpt2:...).
 * From S the lanes serve the new tokenizer's ids, and the documents go on
 * where the old version stopped: a document served in part goes on from the
 * byte where it stopped. Explain names each piece's tokenizer and the bytes
 * of the document it spells; every line is checked against the file (the
 * ids decoded), and every byte of every document is served exactly once in
 * the epoch. Batches are the same at other world sizes, after a reopen that
 * replays from the start and after one from a commit in the middle of a
 * resumed unit. An update is refused, changing nothing, with the message
 * CreateLoader gives for the same dataset fields (unknown tokenizer, missing
 * vocabulary, bad weight, bad name, ...) and when it changes what a version
 * may not (the source, a binary dataset's tokenizer).
 *
 * The GPT-2 tokenizer is a small one written here: GPT-2's file formats
 * (encoder.json spelled with its byte-to-unicode map, vocab.bpe), every
 * byte b as id 1000 + b (so its ids never look like the byte tokenizer's)
 * and a few merges of the corpus' words.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <sys/stat.h>

#include "dl_core.h"
#include "dl_source.h"
#include "dl_synthetic.h"
#include "dl_test.h"
#include "stk_error.h"

#define N_DOCS    150
#define S         6  /* the step the tokenizer changes */
#define S_BACK    11 /* the step the cover test goes back to bytes */
#define MAX_STEPS 3000

static char g_dir[256];
static char g_gpt2[1024]; /* "gpt2:VOCAB,MERGES" */
static char *g_text[N_DOCS];

/* ---- the corpus: JSONL of words, some with 2- and 3-byte characters ---- */

static const char *const words[] = {"the",
                                    "cat",
                                    "sat",
                                    "on",
                                    "mat",
                                    "h\xc3\xa9llo",
                                    "\xe2\x82\xac"
                                    "uro",
                                    "at",
                                    "then",
                                    "caf\xc3\xa9"};
#define N_WORDS (sizeof words / sizeof *words)

static char *make_doc(uint64_t d) {
  uint64_t st = d * 7919 + 1;
  size_t n = 2 + t_lcg(&st) % 60, cap = 16 * n + 1, len = 0;
  char *s = malloc(cap);
  for (size_t i = 0; i < n; i++) {
    const char *w = words[t_lcg(&st) % N_WORDS];
    len += (size_t)snprintf(s + len, cap - len, "%s%s", i ? " " : "", w);
  }
  return s;
}

static void write_corpus(void) {
  char path[400];
  snprintf(path, sizeof path, "%s/text", g_dir);
  assert_int_equal(mkdir(path, 0755), 0);
  snprintf(path, sizeof path, "%s/text/a.jsonl", g_dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (uint64_t d = 0; d < N_DOCS; d++) {
    g_text[d] = make_doc(d);
    fprintf(f, "{\"text\": \"%s\"}\n", g_text[d]);
  }
  assert_int_equal(fclose(f), 0);
}

/* ---- the GPT-2 fixture ---- */

/* GPT-2's byte-to-unicode map: the code point spelling byte b. */
static unsigned spell_cp(int b) {
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return (unsigned)b;
  unsigned extra = 0;
  for (int x = 0; x < b; x++)
    if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) extra++;
  return 256 + extra;
}

/* JSON spelling of bytes (each as \uXXXX of its code point). */
static void spell(const char *bytes, size_t n, char *out) {
  out[0] = '\0';
  for (size_t i = 0; i < n; i++) sprintf(out + strlen(out), "\\u%04x", spell_cp((uint8_t)bytes[i]));
}

/* merges.txt spelling: the code points as UTF-8. */
static void spell_utf8(const char *bytes, size_t n, char *out) {
  size_t w = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned cp = spell_cp((uint8_t)bytes[i]);
    if (cp < 0x80)
      out[w++] = (char)cp;
    else {
      out[w++] = (char)(0xc0 | (cp >> 6));
      out[w++] = (char)(0x80 | (cp & 0x3f));
    }
  }
  out[w] = '\0';
}

/* Merges (left, right) in rank order; merged token i has id 2000 + i. */
static const char *const merges[][2] = {
    {"t", "h"},        {"th", "e"},         {" ", "the"},         {"a", "t"},       {"c", "at"},
    {" ", "cat"},      {"s", "at"},         {" ", "sat"},         {"o", "n"},       {" ", "on"},
    {"m", "at"},       {" ", "mat"},        {"the", "n"},         {"\xc3", "\xa9"}, {"l", "l"},
    {"h", "\xc3\xa9"}, {"h\xc3\xa9", "ll"}, {"\xe2\x82", "\xac"}, {"\xe2", "\x82"}, {"u", "r"},
    {" ", "at"}};
#define N_MERGES (sizeof merges / sizeof *merges)

/* Bytes of every id the fixture has (NULL: none). */
static char *g_id_bytes[2000 + N_MERGES];

static void write_gpt2(void) {
  char vocab[400], mpath[400], sp[256], a[128], b[128];
  snprintf(vocab, sizeof vocab, "%s/encoder.json", g_dir);
  snprintf(mpath, sizeof mpath, "%s/vocab.bpe", g_dir);
  FILE *v = fopen(vocab, "w"), *m = fopen(mpath, "w");
  assert_non_null(v);
  assert_non_null(m);
  fputs("{", v);
  for (int byte = 0; byte < 256; byte++) {
    char c = (char)byte;
    spell(&c, 1, sp);
    fprintf(v, "%s\"%s\": %d", byte ? ", " : "", sp, 1000 + byte);
    g_id_bytes[1000 + byte] = strndup(&c, 1);
  }
  fputs("#version: 0.2\n", m);
  for (size_t i = 0; i < N_MERGES; i++) {
    char both[64];
    snprintf(both, sizeof both, "%s%s", merges[i][0], merges[i][1]);
    spell(both, strlen(both), sp);
    fprintf(v, ", \"%s\": %zu", sp, 2000 + i);
    g_id_bytes[2000 + i] = strdup(both);
    spell_utf8(merges[i][0], strlen(merges[i][0]), a);
    spell_utf8(merges[i][1], strlen(merges[i][1]), b);
    fprintf(m, "%s %s\n", a, b);
  }
  fputs("}\n", v);
  assert_int_equal(fclose(v), 0);
  assert_int_equal(fclose(m), 0);
  snprintf(g_gpt2, sizeof g_gpt2, "gpt2:%s,%s", vocab, mpath);
}

/* ---- the core over the corpus ---- */

/* Dataset "text" is the JSONL file, read with the spec's tokenizer;
 * "syn" the synthetic corpus (stored as tokens). */
static int open_source(void *arg, const Stoker__V1__DatasetSpec *spec, struct dl_source **ret) {
  (void)arg;
  if (strcmp(spec->name, "syn") == 0) return dl_source_open_synthetic("syn", 400, 3, 90, 5, ret);
  char path[400];
  snprintf(path, sizeof path, "%s/%s", g_dir, spec->source->uri);
  struct dl_source_opts o = {.name = spec->name,
                             .path = path,
                             .format = DL_FORMAT_TEXT,
                             .tokenizer = spec->tokenizer,
                             .block_bytes = spec->block_bytes,
                             .eot_id = -1};
  return dl_source_open(&o, ret);
}

static struct dl *open_dl(const char *sub) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s", g_dir, sub);
  struct dl_opts o = {.dir = path, .open_source = open_source};
  struct dl *dl = NULL;
  assert_int_equal(dl_open(&o, &dl), 0);
  return dl;
}

/* A dataset spec in caller storage. */
struct ds {
  Stoker__V1__DatasetSpec spec;
  Stoker__V1__StorageRef src;
  Stoker__V1__DatasetSpec *ptr[2];
};

static void ds_init(struct ds *d, const char *name, const char *tokenizer, double weight) {
  stoker__v1__dataset_spec__init(&d->spec);
  stoker__v1__storage_ref__init(&d->src);
  d->src.uri = (char *)name;
  d->spec.name = (char *)name;
  d->spec.source = &d->src;
  d->spec.weight = weight;
  d->spec.block_bytes = 256; /* several documents per unit */
  if (tokenizer) d->spec.tokenizer = (char *)tokenizer;
  d->ptr[0] = &d->spec;
}

static int create(struct dl *dl, const char *job, struct ds *d, size_t n, bool eos) {
  Stoker__V1__LoaderSpec s = STOKER__V1__LOADER_SPEC__INIT;
  Stoker__V1__DatasetSpec *ptrs[2] = {&d[0].spec, n > 1 ? &d[1].spec : NULL};
  s.job = (char *)job;
  s.datasets = ptrs;
  s.n_datasets = n;
  s.seq_len = 47;
  s.global_batch = 8;
  s.seed = 3;
  s.logical_shards = 16;
  s.lanes = 4;
  s.add_eos = eos;
  s.eos_id = 99999;
  return dl_create_job(dl, &s);
}

static int update(struct dl *dl, const char *job, int64_t from, struct ds *d, uint32_t seq_len) {
  Stoker__V1__UpdateMixtureRequest r = STOKER__V1__UPDATE_MIXTURE_REQUEST__INIT;
  r.job = (char *)job;
  r.from_step = from;
  r.datasets = d->ptr;
  r.n_datasets = 1;
  r.seq_len = seq_len;
  return dl_update_mixture(dl, &r);
}

/* ---- Explain checked against the file ---- */

struct coverage {
  uint8_t *count[N_DOCS]; /* per byte of each document: times served in epoch 0 */
  uint32_t lanes_done;    /* a bit per lane that served epoch 1 */
  bool resumed;           /* a piece at S went on inside a document with gpt2 */
  bool midchar;           /* ... and inside a character (its first byte served as bytes) */
  bool back;              /* bytes again from S_BACK */
  bool resumed_back;      /* a piece at S_BACK went on inside a document with bytes */
};

/* Bytes the ids of a piece spell under its tokenizer. */
static size_t decode(const char *tokenizer, const uint32_t *ids, size_t n, char *out) {
  size_t w = 0;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(tokenizer, "bytes") == 0) {
      assert_true(ids[i] < 256);
      out[w++] = (char)ids[i];
      continue;
    }
    assert_true(ids[i] < 2000 + N_MERGES && g_id_bytes[ids[i]]);
    size_t l = strlen(g_id_bytes[ids[i]]);
    memcpy(out + w, g_id_bytes[ids[i]], l);
    w += l;
  }
  return w;
}

static void trace_step(struct dl *dl, const char *job, int64_t step, struct coverage *cov,
                       bool eos) {
  struct dl_batch b;
  Stoker__V1__ExplainResponse *e;
  assert_int_equal(dl_get_batch(dl, job, step, 0, 1, &b), 0);
  assert_int_equal(dl_explain(dl, job, step, 0, 1, &e), 0);
  static char buf[1 << 16];
  uint32_t line = UINT32_MAX, fill = 0;
  for (size_t i = 0; i < e->n_sources; i++) {
    const Stoker__V1__LineSource *s = e->sources[i];
    if (s->line != line) {
      if (line != UINT32_MAX) assert_int_equal(fill, b.line_tokens);
      line = s->line;
      fill = 0;
    }
    const char *want = step < S || (cov->back && step >= S_BACK) ? "bytes" : g_gpt2;
    if (strcmp(s->tokenizer, want) != 0)
      fail_msg("step %lld: tokenizer '%s'", (long long)step, s->tokenizer);
    assert_true(s->document < N_DOCS);
    const uint32_t *ids = b.tokens + (size_t)line * b.line_tokens + fill;
    size_t n = s->token_end - s->token_begin, nt = s->doc_token_end - s->doc_token_begin;
    assert_true(nt == n || (eos && nt + 1 == n && ids[n - 1] == 99999));
    size_t got = decode(s->tokenizer, ids, nt, buf);
    const char *text = g_text[s->document];
    assert_int_equal(got, s->doc_byte_end - s->doc_byte_begin);
    assert_true(s->doc_byte_end <= strlen(text));
    assert_memory_equal(buf, text + s->doc_byte_begin, got);
    if (step == S && s->doc_byte_begin > 0 && s->doc_token_begin == 0) {
      cov->resumed = true;
      cov->midchar |= ((uint8_t)text[s->doc_byte_begin] & 0xc0) == 0x80;
    }
    if (step == S_BACK && s->doc_byte_begin > 0 && s->doc_token_begin == 0)
      cov->resumed_back = true;
    fill += (uint32_t)n;
    if (s->epoch > 0)
      cov->lanes_done |= 1u << s->lane;
    else
      for (uint64_t x = s->doc_byte_begin; x < s->doc_byte_end; x++) cov->count[s->document][x]++;
  }
  assert_int_equal(fill, b.line_tokens);
  dl_explain_free(e);
  dl_batch_free(&b);
}

/* Serves the job until every lane went past epoch 0; every byte of every
 * document was served exactly once in it. */
static void serve_epoch(struct dl *dl, const char *job, bool eos, bool back) {
  struct coverage cov = {.back = back};
  for (int d = 0; d < N_DOCS; d++) cov.count[d] = calloc(strlen(g_text[d]) + 1, 1);
  int64_t step = 0;
  for (; step < MAX_STEPS && cov.lanes_done != 0xF; step++) trace_step(dl, job, step, &cov, eos);
  assert_true(cov.lanes_done == 0xF);
  assert_true(cov.resumed); /* the switch fell inside a document */
  assert_true(cov.midchar); /* and inside a character in one lane */
  assert_true(cov.resumed_back == back);
  for (int d = 0; d < N_DOCS; d++) {
    for (size_t x = 0; x < strlen(g_text[d]); x++)
      if (cov.count[d][x] != 1)
        fail_msg("document %d byte %zu served %u times in epoch 0", d, x, cov.count[d][x]);
    free(cov.count[d]);
  }
}

/* ---- the tests ---- */

/* From S the lanes serve gpt2 ids, the documents go on where they
 * stopped, and the epoch covers every byte once (with and without EOS;
 * and going back to bytes at S_BACK, from inside gpt2 tokens' documents). */
static void test_switch_covers_each_byte_once(void **state) {
  (void)state;
  struct dl *dl = open_dl("db-cover");
  for (int run = 0; run < 3; run++) {
    bool eos = run == 1, back = run == 2;
    const char *job = run == 0 ? "cover" : run == 1 ? "cover-eos" : "cover-back";
    struct ds d;
    ds_init(&d, "text", NULL, 1);
    assert_int_equal(create(dl, job, &d, 1, eos), 0);
    ds_init(&d, "text", g_gpt2, 1);
    assert_int_equal(update(dl, job, S, &d, 31), 0);
    Stoker__V1__LoaderInfo *info;
    assert_int_equal(dl_get_info(dl, job, &info), 0);
    assert_string_equal(info->spec->datasets[0]->tokenizer, g_gpt2); /* GetLoader says so */
    assert_int_equal(info->spec->seq_len, 31);
    dl_info_free(info);
    if (back) {
      ds_init(&d, "text", "bytes", 1);
      assert_int_equal(update(dl, job, S_BACK, &d, 40), 0);
    }
    serve_epoch(dl, job, eos, back);
  }
  dl_close(dl);
}

static uint32_t *global(struct dl *dl, const char *job, int64_t step, uint32_t world,
                        size_t *ret_n) {
  return t_global(dl, job, step, world, ret_n);
}

#define N_CHECK 40

/* The same batches at other world sizes, after a reopen that replays from
 * the start, after one from a commit inside a resumed unit, and after a
 * switch back to bytes in a later version. */
static void test_same_batches_restart_world(void **state) {
  (void)state;
  const char *job = "same";
  struct dl *dl = open_dl("db-same");
  struct ds d;
  ds_init(&d, "text", NULL, 1);
  assert_int_equal(create(dl, job, &d, 1, false), 0);
  ds_init(&d, "text", g_gpt2, 1);
  assert_int_equal(update(dl, job, S, &d, 7),
                   0); /* short lines: the commit falls in resumed units */
  ds_init(&d, "text", "bytes", 1);
  assert_int_equal(update(dl, job, S + 10, &d, 0), 0);
  uint32_t *want[N_CHECK];
  size_t n[N_CHECK], m;
  for (int s = 0; s < N_CHECK; s++) want[s] = global(dl, job, s, 1, &n[s]);
  bool ids_gpt2 = false, ids_bytes = true;
  for (size_t i = 0; i < n[S]; i++) ids_gpt2 |= want[S][i] >= 1000;
  for (size_t i = 0; i < n[S + 10]; i++) ids_bytes &= want[S + 10][i] < 256;
  assert_true(ids_gpt2);
  assert_true(ids_bytes);
  for (uint32_t world = 2; world <= 8; world *= 2)
    for (int s = 0; s < N_CHECK; s++) {
      uint32_t *got = global(dl, job, s, world, &m);
      assert_int_equal(m, n[s]);
      assert_memory_equal(got, want[s], m * sizeof *got);
      free(got);
    }
  dl_close(dl);
  dl = open_dl("db-same"); /* nothing committed: every lane replays from the start */
  for (int s = N_CHECK - 1; s >= 0; s--) {
    uint32_t *got = global(dl, job, s, 2, &m);
    assert_int_equal(m, n[s]);
    assert_memory_equal(got, want[s], m * sizeof *got);
    free(got);
  }
  assert_int_equal(dl_commit(dl, job, S + 1), 0);
  dl_close(dl);
  dl = open_dl("db-same"); /* from the committed lanes (inside resumed units) */
  for (int s = S + 2; s < N_CHECK; s++) {
    uint32_t *got = global(dl, job, s, 4, &m);
    assert_int_equal(m, n[s]);
    assert_memory_equal(got, want[s], m * sizeof *got);
    free(got);
  }
  /* and exported, into another store */
  uint8_t *blob;
  size_t len;
  assert_int_equal(dl_export_state(dl, job, S + 1, &blob, &len), 0);
  assert_non_null(memmem(blob, len, "DLG2", 4)); /* a lane sat in a unit read from a place */
  struct dl *other = open_dl("db-same-import");
  int64_t step;
  assert_int_equal(dl_import_state(other, blob, len, &step), 0);
  assert_int_equal(step, S + 1);
  free(blob);
  for (int s = S + 2; s < N_CHECK; s++) {
    uint32_t *got = global(other, job, s, 1, &m);
    assert_memory_equal(got, want[s], m * sizeof *got);
    free(got);
  }
  dl_close(other);
  dl_close(dl);
  for (int s = 0; s < N_CHECK; s++) free(want[s]);
}

/* The refusal of an update and of CreateLoader with the same dataset. */
static void same_refusal(struct dl *dl, struct ds *bad, int want_rc) {
  char create_msg[512];
  int rc = create(dl, "refused-new", bad, 1, false);
  snprintf(create_msg, sizeof create_msg, "%s", stk_detail());
  assert_int_equal(rc, want_rc);
  rc = update(dl, "refuse", S, bad, 0);
  assert_int_equal(rc, want_rc);
  assert_string_equal(stk_detail(), create_msg);
}

static void test_update_refused_like_create(void **state) {
  (void)state;
  struct dl *dl = open_dl("db-refuse");
  struct ds d[2];
  ds_init(&d[0], "text", NULL, 1);
  ds_init(&d[1], "syn", NULL, 1);
  assert_int_equal(create(dl, "refuse", d, 2, false), 0);
  Stoker__V1__LoaderInfo *before;
  assert_int_equal(dl_get_info(dl, "refuse", &before), 0);
  size_t nb;
  uint32_t *batch = global(dl, "refuse", S, 1, &nb);

  struct ds bad;
  ds_init(&bad, "text", "nope", 1); /* the reported case: an unknown tokenizer */
  same_refusal(dl, &bad, STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "unknown tokenizer"));
  char missing[700];
  snprintf(missing, sizeof missing, "gpt2:%s/no-vocab.json,%s/no-merges.txt", g_dir, g_dir);
  ds_init(&bad, "text", missing, 1);
  same_refusal(dl, &bad, STK_ENOENT);
  ds_init(&bad, "text", "gpt2:only-one", 1);
  same_refusal(dl, &bad, STK_EINVAL);
  char *huge = calloc(9000, 1);
  memset(huge, 'x', 8999);
  ds_init(&bad, "text", huge, 1);
  same_refusal(dl, &bad, STK_EINVAL);
  free(huge);
  ds_init(&bad, "text", g_gpt2, -1);
  same_refusal(dl, &bad, STK_EINVAL);
  ds_init(&bad, "text", g_gpt2, 0);
  same_refusal(dl, &bad, STK_EINVAL); /* weights sum to 0 */
  ds_init(&bad, "te/xt", g_gpt2, 1);
  same_refusal(dl, &bad, STK_EINVAL);

  /* What a version may not change. */
  ds_init(&bad, "text", g_gpt2, 1);
  bad.src.uri = "elsewhere";
  assert_int_equal(update(dl, "refuse", S, &bad, 0), STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "source"));
  ds_init(&bad, "text", g_gpt2, 1);
  bad.spec.block_bytes = 512;
  assert_int_equal(update(dl, "refuse", S, &bad, 0), STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "block_bytes"));
  ds_init(&bad, "syn", g_gpt2, 1); /* stored as tokens: no tokenizer to change */
  assert_int_equal(update(dl, "refuse", S, &bad, 0), STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "only text datasets"));

  /* Nothing changed: the same spec in GetLoader and the same batch. */
  Stoker__V1__LoaderInfo *after;
  assert_int_equal(dl_get_info(dl, "refuse", &after), 0);
  size_t la = stoker__v1__loader_spec__get_packed_size(before->spec);
  assert_int_equal(stoker__v1__loader_spec__get_packed_size(after->spec), la);
  uint8_t *pa = malloc(la), *pb = malloc(la);
  stoker__v1__loader_spec__pack(before->spec, pa);
  stoker__v1__loader_spec__pack(after->spec, pb);
  assert_memory_equal(pa, pb, la);
  free(pa);
  free(pb);
  dl_info_free(before);
  dl_info_free(after);
  size_t na;
  uint32_t *again = global(dl, "refuse", S, 1, &na);
  assert_int_equal(na, nb);
  assert_memory_equal(again, batch, na * sizeof *again);
  free(again);
  free(batch);
  /* A weight-only update keeps the tokenizer in force. */
  ds_init(&bad, "text", g_gpt2, 1);
  assert_int_equal(update(dl, "refuse", S, &bad, 0), 0);
  ds_init(&bad, "text", NULL, 2);
  assert_int_equal(update(dl, "refuse", S + 1, &bad, 0), 0);
  assert_int_equal(dl_get_info(dl, "refuse", &after), 0);
  assert_string_equal(after->spec->datasets[0]->tokenizer, g_gpt2);
  dl_info_free(after);
  dl_close(dl);
}

static int setup(void **state) {
  (void)state;
  char *tmp = t_tmpdir();
  snprintf(g_dir, sizeof g_dir, "%s", tmp);
  free(tmp);
  write_corpus();
  write_gpt2();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  for (int d = 0; d < N_DOCS; d++) free(g_text[d]);
  for (size_t i = 0; i < sizeof g_id_bytes / sizeof *g_id_bytes; i++) free(g_id_bytes[i]);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_switch_covers_each_byte_once),
      cmocka_unit_test(test_same_batches_restart_world),
      cmocka_unit_test(test_update_refused_like_create),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
