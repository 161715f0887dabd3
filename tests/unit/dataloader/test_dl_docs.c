/*
 * test_dl_docs: documents as the core serves them, in every format (the
 * synthetic source, Megatron, llm.c, text). Explain names each piece of a
 * line by its real document — the file holding it and its index there —
 * with one entry per piece and the piece's offsets in the document, and
 * every token of every entry is checked against the files (the corpora are
 * written so a token says which document and offset it is). Blocklists
 * name single documents: from the version's step on none of their tokens
 * is served and every other token of an epoch is served exactly once, also
 * when the block starts in the middle of a unit (llm.c blocks being read
 * without their pieces, the fast path, switch to whole reads); batches stay
 * the same at any world size, after a restart from a commit and after an
 * export/import. Stored configurations from before (DLC1) are still read.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <sys/stat.h>

#include "dl_core.h"
#include "dl_internal.h"
#include "dl_source.h"
#include "dl_synthetic.h"
#include "dl_test.h"
#include "stk_error.h"

#define SEED            7
#define LO              3
#define HI              90
#define N_SYN           300  /* synthetic / Megatron documents */
#define N_LLMC          1000 /* llm.c documents per file (two files: > 32768 tokens each) */
#define N_TEXT          120  /* text documents per file (two files) */
#define MAX_EPOCH_STEPS 4000

enum kind { SYN, MM, LLMC, TEXT, N_KINDS };

static const char *const kind_name[N_KINDS] = {"syn", "mm", "llmc", "text"};

/* Where the corpora are (one temporary directory for the whole run). */
static char g_dir[256];

/* ---- the corpora: what each (file, document, offset) holds ---- */

static uint32_t files_of(enum kind k) {
  return k == LLMC || k == TEXT ? 2 : 1;
}

static uint64_t docs_of(enum kind k) {
  return k == LLMC ? N_LLMC : k == TEXT ? N_TEXT : N_SYN;
}

/* Text documents: JSONL file 0 (some texts empty, blank lines between),
 * plain file 1 (paragraphs of one or two lines). */
static uint32_t text_len(uint32_t f, uint64_t d) {
  uint32_t n = (uint32_t)((f * 31 + d * 17) % 40);
  return f == 1 && n == 0 ? 1 : n;
}

static char text_char(uint32_t f, uint64_t d, uint32_t pos) {
  if (f == 1 && pos == 12 && text_len(f, d) > 20) return '\n';
  return (char)('a' + (f * 5 + d * 3 + pos) % 26);
}

static uint32_t doc_len(enum kind k, uint32_t f, uint64_t d) {
  if (k == TEXT) return text_len(f, d);
  return dl_synthetic_doc_len(SEED, LO, HI, k == LLMC ? f * N_LLMC + d : d);
}

static uint32_t token_at(enum kind k, uint32_t f, uint64_t d, uint32_t pos) {
  if (k == TEXT) return (uint8_t)text_char(f, d, pos);
  return dl_synthetic_token(k == LLMC ? f * N_LLMC + d : d, pos);
}

static void write_text(void) {
  char path[300];
  snprintf(path, sizeof path, "%s/text/a.jsonl", g_dir);
  FILE *a = fopen(path, "w");
  snprintf(path, sizeof path, "%s/text/b.txt", g_dir);
  FILE *b = fopen(path, "w");
  assert_non_null(a);
  assert_non_null(b);
  for (uint64_t d = 0; d < N_TEXT; d++) {
    if (d % 7 == 3) fputs("\n", a); /* a blank line is no document */
    fputs("{\"text\": \"", a);
    for (uint32_t p = 0; p < text_len(0, d); p++) fputc(text_char(0, d, p), a);
    fputs("\"}\n", a);
    for (uint32_t p = 0; p < text_len(1, d); p++) fputc(text_char(1, d, p), b);
    fputs("\n\n", b);
  }
  assert_int_equal(fclose(a), 0);
  assert_int_equal(fclose(b), 0);
}

static void write_corpora(void) {
  char path[300];
  char *tmp = t_tmpdir();
  snprintf(g_dir, sizeof g_dir, "%s", tmp);
  free(tmp);
  const char *sub[] = {"mm", "llmc", "text"};
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%s", g_dir, sub[i]);
    assert_int_equal(mkdir(path, 0755), 0);
  }
  snprintf(path, sizeof path, "%s/mm/corpus", g_dir);
  assert_int_equal(dl_synthetic_write_megatron(path, N_SYN, LO, HI, SEED, 4, 7), 0);
  for (uint32_t f = 0; f < 2; f++) {
    snprintf(path, sizeof path, "%s/llmc/part_%u.bin", g_dir, f);
    assert_int_equal(dl_synthetic_write_llmc(path, f * N_LLMC, N_LLMC, LO, HI, SEED), 0);
  }
  write_text();
}

static const char *file_name(enum kind k, uint32_t f) {
  static const char *const names[N_KINDS][2] = {
      {"synthetic"}, {"corpus"}, {"part_0.bin", "part_1.bin"}, {"a.jsonl", "b.txt"}};
  return names[k][f];
}

/* The opener: dataset names say the format. */
static int open_source(void *arg, const Stoker__V1__DatasetSpec *spec, struct dl_source **ret) {
  (void)arg;
  char path[300];
  if (strcmp(spec->name, "syn") == 0)
    return dl_source_open_synthetic("syn", N_SYN, LO, HI, SEED, ret);
  snprintf(path, sizeof path, "%s/%s", g_dir, spec->name);
  struct dl_source_opts o = {.name = spec->name,
                             .path = path,
                             .block_tokens = spec->block_tokens,
                             .block_bytes = spec->block_bytes,
                             .eot_id = (int64_t)DL_SYNTHETIC_EOT};
  o.format = strcmp(spec->name, "mm") == 0     ? DL_FORMAT_MEGATRON
             : strcmp(spec->name, "llmc") == 0 ? DL_FORMAT_LLMC
                                               : DL_FORMAT_TEXT;
  return dl_source_open(&o, ret);
}

static struct dl *open_dl(const char *sub) {
  char path[300];
  snprintf(path, sizeof path, "%s/%s", g_dir, sub);
  struct dl_opts o = {.dir = path, .open_source = open_source};
  struct dl *dl = NULL;
  assert_int_equal(dl_open(&o, &dl), 0);
  return dl;
}

/* Job `job` over the datasets of kinds[n] (equal weights); llm.c blocks of
 * block_tokens, text blocks of 64 bytes, so documents straddle units. */
static void create(struct dl *dl, const char *job, const enum kind *kinds, size_t n,
                   uint32_t block_tokens) {
  Stoker__V1__DatasetSpec ds[N_KINDS], *ptrs[N_KINDS];
  Stoker__V1__StorageRef src[N_KINDS];
  for (size_t i = 0; i < n; i++) {
    stoker__v1__dataset_spec__init(&ds[i]);
    stoker__v1__storage_ref__init(&src[i]);
    src[i].uri = (char *)kind_name[kinds[i]];
    ds[i].name = (char *)kind_name[kinds[i]];
    ds[i].source = &src[i];
    ds[i].weight = 1;
    ds[i].block_tokens = block_tokens;
    ds[i].block_bytes = 64;
    ptrs[i] = &ds[i];
  }
  Stoker__V1__LoaderSpec s = STOKER__V1__LOADER_SPEC__INIT;
  s.job = (char *)job;
  s.datasets = ptrs;
  s.n_datasets = n;
  s.seq_len = 63;
  s.global_batch = 8;
  s.seed = 11;
  s.logical_shards = 16;
  s.lanes = 4;
  assert_int_equal(dl_create_job(dl, &s), 0);
}

static enum kind kind_of(const char *dataset) {
  for (int k = 0; k < N_KINDS; k++)
    if (strcmp(kind_name[k], dataset) == 0) return (enum kind)k;
  fail_msg("unknown dataset %s", dataset);
  return SYN;
}

static uint32_t file_index(enum kind k, const char *file) {
  for (uint32_t f = 0; f < files_of(k); f++)
    if (strcmp(file_name(k, f), file) == 0) return f;
  fail_msg("dataset %s has no file %s", kind_name[k], file);
  return 0;
}

/* The documents blocked in these tests: every document d with d % 9 == 4. */
static bool is_blocked(uint64_t d) {
  return d % 9 == 4;
}

static void block_documents(struct dl *dl, const char *job, int64_t from, const enum kind *kinds,
                            size_t n_kinds, int expect) {
  size_t n = 0, cap = 0;
  for (size_t i = 0; i < n_kinds; i++) cap += files_of(kinds[i]) * docs_of(kinds[i]);
  Stoker__V1__DocumentRef *refs = calloc(cap, sizeof *refs), **ptrs = calloc(cap, sizeof *ptrs);
  for (size_t i = 0; i < n_kinds; i++)
    for (uint32_t f = 0; f < files_of(kinds[i]); f++)
      for (uint64_t d = 0; d < docs_of(kinds[i]); d++) {
        if (!is_blocked(d)) continue;
        stoker__v1__document_ref__init(&refs[n]);
        refs[n].dataset = (char *)kind_name[kinds[i]];
        refs[n].file = (char *)file_name(kinds[i], f);
        refs[n].document = d;
        ptrs[n] = &refs[n];
        n++;
      }
  Stoker__V1__UpdateMixtureRequest r = STOKER__V1__UPDATE_MIXTURE_REQUEST__INIT;
  r.job = (char *)job;
  r.from_step = from;
  r.block_documents = ptrs;
  r.n_block_documents = n;
  assert_int_equal(dl_update_mixture(dl, &r), expect);
  free(refs);
  free(ptrs);
}

/* ---- Explain checked against the files ---- */

/* Per (file, document, offset) of one dataset: times served in epoch 0. */
struct coverage {
  enum kind k;
  uint64_t *at[2]; /* [docs + 1] prefix of document lengths per file */
  uint8_t *count[2];
  int64_t block_from; /* blocked documents: none of their tokens at or after this step */
};

static void coverage_init(struct coverage *c, enum kind k, int64_t block_from) {
  *c = (struct coverage){.k = k, .block_from = block_from};
  for (uint32_t f = 0; f < files_of(k); f++) {
    c->at[f] = calloc(docs_of(k) + 1, sizeof *c->at[f]);
    for (uint64_t d = 0; d < docs_of(k); d++) c->at[f][d + 1] = c->at[f][d] + doc_len(k, f, d);
    c->count[f] = calloc(c->at[f][docs_of(k)] + 1, 1);
  }
}

static void coverage_free(struct coverage *c) {
  for (uint32_t f = 0; f < 2; f++) {
    free(c->at[f]);
    free(c->count[f]);
  }
}

/* Every token served once, blocked documents' only before block_from. */
static void coverage_check(const struct coverage *c) {
  for (uint32_t f = 0; f < files_of(c->k); f++)
    for (uint64_t d = 0; d < docs_of(c->k); d++)
      for (uint64_t x = c->at[f][d]; x < c->at[f][d + 1]; x++) {
        if (c->count[f][x] == 1 || (is_blocked(d) && c->block_from >= 0 && c->count[f][x] == 0))
          continue;
        fail_msg("%s file %u document %llu offset %llu served %u times in epoch 0", kind_name[c->k],
                 f, (unsigned long long)d, (unsigned long long)(x - c->at[f][d]), c->count[f][x]);
      }
}

/* One step: every Explain entry is one piece of one document, its tokens in
 * the batch are that document's at the offsets it names; epoch-0 entries
 * are counted in covs (by dataset); lanes_done[kind] gets a bit per lane
 * that served an epoch >= 1 of it. */
static void trace_step(struct dl *dl, const char *job, int64_t step, struct coverage *covs,
                       uint32_t *lanes_done) {
  struct dl_batch b;
  Stoker__V1__ExplainResponse *e;
  assert_int_equal(dl_get_batch(dl, job, step, 0, 1, &b), 0);
  assert_int_equal(dl_explain(dl, job, step, 0, 1, &e), 0);
  uint32_t line = UINT32_MAX, fill = 0;
  const Stoker__V1__LineSource *prev = NULL;
  for (size_t i = 0; i < e->n_sources; i++) {
    const Stoker__V1__LineSource *s = e->sources[i];
    if (s->line != line) {
      if (line != UINT32_MAX) assert_int_equal(fill, b.line_tokens);
      line = s->line;
      fill = 0;
      prev = NULL;
    }
    enum kind k = kind_of(s->dataset);
    uint32_t f = file_index(k, s->file);
    uint64_t n = s->token_end - s->token_begin;
    assert_true(n > 0);
    assert_true(s->document < docs_of(k));
    assert_int_equal(s->doc_token_end - s->doc_token_begin, n); /* no markers inserted */
    assert_true(s->doc_token_end <= doc_len(k, f, s->document));
    for (uint64_t x = 0; x < n; x++)
      assert_int_equal(b.tokens[(size_t)line * b.line_tokens + fill + x],
                       token_at(k, f, s->document, (uint32_t)(s->doc_token_begin + x)));
    /* One entry per piece: the next entry of a unit is another document. */
    if (prev && strcmp(prev->dataset, s->dataset) == 0 && prev->unit == s->unit)
      assert_true(prev->document != s->document || strcmp(prev->file, s->file) != 0);
    prev = s;
    fill += (uint32_t)n;
    if (s->epoch > 0) lanes_done[k] |= 1u << s->lane;
    struct coverage *c = &covs[k];
    if (s->epoch > 0 || !c->count[0]) continue;
    if (is_blocked(s->document) && c->block_from >= 0)
      assert_true(step < c->block_from); /* blocked from block_from on */
    uint64_t at = c->at[f][s->document] + s->doc_token_begin;
    for (uint64_t x = 0; x < n; x++) c->count[f][at + x]++;
  }
  assert_int_equal(fill, b.line_tokens);
  dl_explain_free(e);
  dl_batch_free(&b);
}

/* Serves steps until every lane of the job (4) went past epoch 0 and checks
 * that epoch's coverage of each dataset of kinds. */
static void serve_epoch(struct dl *dl, const char *job, const enum kind *kinds, size_t n,
                        int64_t block_from) {
  struct coverage covs[N_KINDS] = {0};
  for (size_t i = 0; i < n; i++) coverage_init(&covs[kinds[i]], kinds[i], block_from);
  uint32_t lanes_done[N_KINDS] = {0};
  bool done = false;
  for (int64_t step = 0; !done && step < MAX_EPOCH_STEPS; step++) {
    trace_step(dl, job, step, covs, lanes_done);
    done = true;
    for (size_t i = 0; i < n; i++) done &= lanes_done[kinds[i]] == 0xF;
  }
  assert_true(done);
  for (size_t i = 0; i < n; i++) {
    coverage_check(&covs[kinds[i]]);
    coverage_free(&covs[kinds[i]]);
  }
}

/* Explain names real documents in every format: a line spanning several
 * documents lists each piece, and each piece's tokens are its document's. */
static void test_explain_names_documents(void **state) {
  (void)state;
  struct dl *dl = open_dl("db-explain");
  char job[32];
  for (int k = 0; k < N_KINDS; k++) {
    enum kind kind = (enum kind)k;
    snprintf(job, sizeof job, "explain-%s", kind_name[k]);
    create(dl, job, &kind, 1, 37);
    serve_epoch(dl, job, &kind, 1, -1);
  }
  /* A unit of the default llm.c size (one per 32768 tokens): many
   * documents per unit, documents straddling the index's strides. */
  enum kind llmc = LLMC;
  create(dl, "explain-big", &llmc, 1, 0);
  serve_epoch(dl, "explain-big", &llmc, 1, -1);
  dl_close(dl);
}

/* Documents blocked from step 0: in no format is a token of theirs served,
 * every other token of the epoch exactly once. */
static void test_block_documents_from_start(void **state) {
  (void)state;
  struct dl *dl = open_dl("db-block0");
  char job[32];
  for (int k = 0; k < N_KINDS; k++) {
    enum kind kind = (enum kind)k;
    snprintf(job, sizeof job, "block0-%s", kind_name[k]);
    create(dl, job, &kind, 1, 37);
    block_documents(dl, job, 0, &kind, 1, 0);
    serve_epoch(dl, job, &kind, 1, 0);
  }
  dl_close(dl);
}

/* Documents blocked from a later step, in the middle of units (large llm.c
 * blocks read the fast way until then): nothing of theirs from that step
 * on, nothing else lost or repeated. */
static void test_block_documents_mid_job(void **state) {
  (void)state;
  struct dl *dl = open_dl("db-block-mid");
  const enum kind all[] = {SYN, MM, LLMC, TEXT};
  create(dl, "mid", all, 4, 1000);
  block_documents(dl, "mid", 9, all, 4, 0);
  serve_epoch(dl, "mid", all, 4, 9);
  dl_close(dl);
}

/* The same with llm.c alone: every lane is inside a 1000-token block (read
 * the fast way, without its pieces) when the version starts, and the rest
 * of that block must skip the blocked documents. */
static void test_block_documents_mid_unit(void **state) {
  (void)state;
  struct dl *dl = open_dl("db-block-unit");
  enum kind llmc = LLMC;
  create(dl, "unit", &llmc, 1, 1000);
  size_t n;
  free(t_global(dl, "unit", 8, 1, &n)); /* the lanes run ahead to step 8 first */
  block_documents(dl, "unit", 9, &llmc, 1, 0);
  serve_epoch(dl, "unit", &llmc, 1, 9);
  dl_close(dl);
  /* Batches alone (Explain reads units whole, so it is left out here): from
   * step 9 on no token of a blocked document, whatever the lanes were reading. */
  dl = open_dl("db-block-unit-batches");
  create(dl, "unit", &llmc, 1, 1000);
  free(t_global(dl, "unit", 8, 1, &n));
  block_documents(dl, "unit", 9, &llmc, 1, 0);
  for (int64_t s = 0; s < 80; s++) {
    uint32_t *b = t_global(dl, "unit", s, 1, &n);
    for (size_t i = 0; s >= 9 && i < n; i++) {
      uint64_t doc;
      uint32_t pos;
      dl_synthetic_decode(b[i], &doc, &pos);
      assert_false(is_blocked(doc % N_LLMC));
    }
    free(b);
  }
  dl_close(dl);
}

/* Bad references are refused and change nothing. */
static void test_block_documents_refused(void **state) {
  (void)state;
  struct dl *dl = open_dl("db-refused");
  const enum kind kinds[] = {LLMC, TEXT};
  create(dl, "r", kinds, 2, 37);
  size_t n;
  uint32_t *before = t_global(dl, "r", 5, 1, &n);
  Stoker__V1__DocumentRef ref = STOKER__V1__DOCUMENT_REF__INIT, *p = &ref;
  Stoker__V1__UpdateMixtureRequest r = STOKER__V1__UPDATE_MIXTURE_REQUEST__INIT;
  r.job = "r";
  r.from_step = 1;
  r.block_documents = &p;
  r.n_block_documents = 1;
  const struct {
    const char *dataset, *file;
    uint64_t doc;
  } bad[] = {{"llmc", "part_2.bin", 0}, {"llmc", "part_1.bin", N_LLMC}, {"nope", "part_0.bin", 0},
             {"text", "b.txt", N_TEXT}, {"text", "a.jsonl", N_TEXT},    {"llmc", "", 0}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ref.dataset = (char *)bad[i].dataset;
    ref.file = (char *)bad[i].file;
    ref.document = bad[i].doc;
    assert_int_equal(dl_update_mixture(dl, &r), STK_EINVAL);
    assert_non_null(strstr(stk_detail(), "block_documents"));
  }
  size_t m;
  uint32_t *after = t_global(dl, "r", 5, 1, &m);
  assert_int_equal(m, n);
  assert_memory_equal(after, before, n * 4); /* nothing changed */
  free(after);
  ref.dataset = "text";
  ref.file = "a.jsonl";
  ref.document = N_TEXT - 1; /* the last document: accepted */
  assert_int_equal(dl_update_mixture(dl, &r), 0);
  free(before);
  dl_close(dl);
}

/* With documents blocked in the middle of the job: the global batch is the
 * same at world 1, 2 and 4, after a restart from a commit, after an
 * export/import, and in a second store that replays it all. */
static void test_block_documents_resume_rescale(void **state) {
  (void)state;
  const enum kind kinds[] = {LLMC, TEXT, MM};
  struct dl *dl = open_dl("db-resume");
  create(dl, "j", kinds, 3, 1000);
  block_documents(dl, "j", 4, kinds, 3, 0);
  enum { STEPS = 24, COMMIT = 10 };
  uint32_t *want[STEPS];
  size_t n[STEPS], m;
  for (int64_t s = 0; s < STEPS; s++) {
    want[s] = t_global(dl, "j", s, 1, &n[s]);
    for (uint32_t world = 2; world <= 4; world *= 2) {
      uint32_t *got = t_global(dl, "j", s, world, &m);
      assert_int_equal(m, n[s]);
      assert_memory_equal(got, want[s], m * 4);
      free(got);
    }
  }
  uint8_t *blob;
  size_t len;
  assert_int_equal(dl_commit(dl, "j", COMMIT), 0);
  assert_int_equal(dl_export_state(dl, "j", COMMIT, &blob, &len), 0);
  dl_close(dl);
  struct dl *again = open_dl("db-resume"), *imported = open_dl("db-imported"),
            *replay = open_dl("db-replay");
  assert_int_equal(dl_import_state(imported, blob, len, NULL), 0);
  create(replay, "j", kinds, 3, 1000);
  block_documents(replay, "j", 4, kinds, 3, 0);
  struct dl *each[] = {again, imported, replay};
  for (int64_t s = COMMIT + 1; s < STEPS; s++)
    for (int i = 0; i < 3; i++) {
      uint32_t *got = t_global(each[i], "j", s, 1u << i, &m);
      assert_int_equal(m, n[s]);
      assert_memory_equal(got, want[s], m * 4);
      free(got);
    }
  for (int64_t s = 0; s < STEPS; s++) free(want[s]);
  free(blob);
  for (int i = 0; i < 3; i++) dl_close(each[i]);
}

/* A restart keeps the blocked documents (the configuration stores them). */
static void test_block_documents_survive_restart(void **state) {
  (void)state;
  enum kind llmc = LLMC;
  struct dl *dl = open_dl("db-restart");
  create(dl, "k", &llmc, 1, 37);
  block_documents(dl, "k", 0, &llmc, 1, 0);
  dl_close(dl);
  dl = open_dl("db-restart");
  serve_epoch(dl, "k", &llmc, 1, 0);
  dl_close(dl);
}

/* Configurations stored before blocked documents existed (DLC1: the same
 * without each version's document list) are still read, with none blocked. */
static void test_config_v1_still_read(void **state) {
  (void)state;
  struct dl *dl = open_dl("db-config");
  enum kind llmc = LLMC;
  create(dl, "c", &llmc, 1, 37);
  uint8_t *v2, *again;
  size_t len, again_len;
  struct dl_job *cj = NULL;
  assert_int_equal(dl_job_get(dl, "c", &cj), 0);
  assert_int_equal(dl_config_encode(cj, &v2, &len), 0);
  dl_job_put(dl, cj);
  /* One version: its document count (0) is the last 8 bytes. */
  uint8_t *v1 = malloc(len);
  memcpy(v1, v2, len - 8);
  const uint32_t magic_v1 = 0x31434C44u; /* "DLC1" */
  memcpy(v1, &magic_v1, 4);
  struct dl_job *j = NULL;
  assert_int_equal(dl_config_decode(dl, v1, len - 8, &j), 0);
  assert_int_equal(j->ver[0].n_doc_blocked, 0);
  assert_int_equal(dl_config_encode(j, &again, &again_len), 0);
  assert_int_equal(again_len, len);
  assert_memory_equal(again, v2, len); /* written back as DLC2 */
  dl_job_free(j);
  free(v1);
  free(v2);
  free(again);
  dl_close(dl);
}

static int setup(void **state) {
  (void)state;
  write_corpora();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  return system(cmd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_explain_names_documents),
      cmocka_unit_test(test_block_documents_from_start),
      cmocka_unit_test(test_block_documents_mid_job),
      cmocka_unit_test(test_block_documents_mid_unit),
      cmocka_unit_test(test_block_documents_refused),
      cmocka_unit_test(test_block_documents_resume_rescale),
      cmocka_unit_test(test_block_documents_survive_restart),
      cmocka_unit_test(test_config_v1_still_read),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
