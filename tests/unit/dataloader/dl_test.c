/*
 * dl_test: helpers for the dataloader core tests (see dl_test.h).
 */
#include "dl_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dl_synthetic.h"
#include "stk_error.h"

void t_write_llmc(const char *path, const void *tokens, uint32_t n, int token_bytes) {
  int32_t h[256] = {token_bytes == 2 ? 20240520 : 20240801, token_bytes == 2 ? 1 : 7, (int32_t)n};
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(h, sizeof h, 1, f), 1);
  assert_int_equal(fwrite(tokens, (size_t)token_bytes, n, f), n);
  assert_int_equal(fclose(f), 0);
}

uint32_t t_lcg(uint64_t *state) {
  *state = *state * 6364136223846793005u + 1442695040888963407u;
  return (uint32_t)(*state >> 33);
}

char *t_tmpdir(void) {
  char *p = strdup("/tmp/dl-core-XXXXXX");
  assert_non_null(mkdtemp(p));
  return p;
}

struct dl *t_open(const char *dir, uint64_t max_batch_bytes) {
  struct dl_opts o = {.dir = dir, .max_batch_bytes = max_batch_bytes};
  struct dl *dl = NULL;
  assert_int_equal(dl_open(&o, &dl), 0);
  return dl;
}

static void fill_ds(const struct tspec *t, Stoker__V1__DatasetSpec *ds, Stoker__V1__StorageRef *src,
                    Stoker__V1__DatasetSpec **ptrs) {
  for (size_t i = 0; i < t->n_ds; i++) {
    stoker__v1__dataset_spec__init(&ds[i]);
    stoker__v1__storage_ref__init(&src[i]);
    src[i].uri = (char *)t->uris[i];
    ds[i].name = (char *)t->names[i];
    ds[i].source = &src[i];
    ds[i].weight = t->weights[i];
    ptrs[i] = &ds[i];
  }
}

int t_create(struct dl *dl, const struct tspec *t) {
  Stoker__V1__DatasetSpec ds[4], *ptrs[4];
  Stoker__V1__StorageRef src[4];
  fill_ds(t, ds, src, ptrs);
  Stoker__V1__LoaderSpec s = STOKER__V1__LOADER_SPEC__INIT;
  s.job = (char *)t->job;
  s.datasets = ptrs;
  s.n_datasets = t->n_ds;
  s.seq_len = t->seq_len;
  s.global_batch = t->global_batch;
  s.seed = t->seed;
  s.logical_shards = t->shards;
  s.lanes = t->lanes;
  return dl_create_job(dl, &s);
}

int t_update(struct dl *dl, const char *job, int64_t from, const struct tspec *mix,
             uint32_t seq_len, uint32_t global_batch) {
  Stoker__V1__DatasetSpec ds[4], *ptrs[4];
  Stoker__V1__StorageRef src[4];
  Stoker__V1__UpdateMixtureRequest r = STOKER__V1__UPDATE_MIXTURE_REQUEST__INIT;
  if (mix) {
    fill_ds(mix, ds, src, ptrs);
    r.datasets = ptrs;
    r.n_datasets = mix->n_ds;
  }
  r.job = (char *)job;
  r.from_step = from;
  r.seq_len = seq_len;
  r.global_batch = global_batch;
  return dl_update_mixture(dl, &r);
}

uint32_t *t_global(struct dl *dl, const char *job, int64_t step, uint32_t world, size_t *ret_n) {
  uint32_t *all = NULL;
  size_t n = 0;
  for (uint32_t r = 0; r < world; r++) {
    struct dl_batch b;
    int rc = dl_get_batch(dl, job, step, r, world, &b);
    if (rc) fprintf(stderr, "get_batch step %lld: %d %s\n", (long long)step, rc, stk_detail());
    assert_int_equal(rc, 0);
    size_t m = (size_t)b.lines * b.line_tokens;
    all = realloc(all, (n + m) * sizeof *all);
    memcpy(all + n, b.tokens, m * sizeof *all);
    n += m;
    dl_batch_free(&b);
  }
  *ret_n = n;
  return all;
}

void cover_init(struct cover *c, uint64_t docs, uint32_t lo, uint32_t hi, uint64_t seed,
                uint32_t epochs) {
  *c = (struct cover){.docs = docs, .lo = lo, .hi = hi, .seed = seed, .epochs = epochs};
  c->start = calloc(docs + 1, sizeof *c->start);
  for (uint64_t d = 0; d < docs; d++)
    c->start[d + 1] = c->start[d] + dl_synthetic_doc_len(seed, lo, hi, d);
  c->count = calloc(c->start[docs] * epochs, 1);
}

void cover_free(struct cover *c) {
  free(c->start);
  free(c->count);
}

static void check_run(const struct dl_batch *b, const Stoker__V1__LineSource *s, uint32_t *fill) {
  for (uint64_t t = s->token_begin; t < s->token_end; t++) {
    uint32_t tok = b->tokens[(size_t)s->line * b->line_tokens + (*fill)++];
    assert_int_equal(tok, dl_synthetic_token(s->unit, (uint32_t)t));
  }
}

static void mark(struct cover *cv, const Stoker__V1__LineSource *s) {
  if (!cv || s->epoch >= cv->epochs) return;
  uint64_t total = cv->start[cv->docs];
  for (uint64_t t = s->token_begin; t < s->token_end; t++) {
    uint8_t *slot = &cv->count[s->epoch * total + cv->start[s->unit] + t];
    assert_int_equal(*slot, 0); /* never twice within an epoch */
    *slot = 1;
  }
}

void t_trace_step(struct dl *dl, const char *job, int64_t step, const char *const *names,
                  size_t n_names, struct cover **covers, uint64_t *tokens_by_ds) {
  struct dl_batch b;
  Stoker__V1__ExplainResponse *e;
  assert_int_equal(dl_get_batch(dl, job, step, 0, 1, &b), 0);
  assert_int_equal(dl_explain(dl, job, step, 0, 1, &e), 0);
  uint32_t line = UINT32_MAX, fill = 0;
  for (size_t i = 0; i < e->n_sources; i++) {
    const Stoker__V1__LineSource *s = e->sources[i];
    if (s->line != line) {
      if (line != UINT32_MAX) assert_int_equal(fill, b.line_tokens);
      line = s->line;
      fill = 0;
    }
    check_run(&b, s, &fill);
    for (size_t k = 0; k < n_names; k++) {
      if (strcmp(names[k], s->dataset) != 0) continue;
      if (tokens_by_ds) tokens_by_ds[k] += s->token_end - s->token_begin;
      if (covers) mark(covers[k], s);
    }
  }
  assert_int_equal(fill, b.line_tokens);
  assert_int_equal(line, b.lines - 1);
  dl_explain_free(e);
  dl_batch_free(&b);
}
