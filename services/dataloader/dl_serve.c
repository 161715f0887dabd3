/*
 * dl_serve: GetBatch and Explain. Step g of version v is the global lines
 * n = (g - from_step) * B + p for p in [0, B); position j of the step's
 * batch holds p = perm_{key(seed, g)}(j) (so each rank's slice mixes lanes),
 * and rank r of world R takes positions [r*B/R, (r+1)*B/R). Global line n is
 * line n / C of lane n % C. Nothing here depends on R except which slice is
 * returned, so the global batch is the same at any world size.
 *
 * A scaled-out instance (part I of P) plans the same slice and keeps only the
 * positions whose lane it serves (lane mod P == I): a partial batch, its lines
 * in slice order with their positions, which the client assembles.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl_internal.h"
#include "dl_perm.h"
#include "stk_error.h"

#define STEP_TAG UINT64_C(0x5354455053) /* keys the per-step line order */

struct item {
  uint32_t lane;
  uint64_t k;
  uint32_t out; /* line in the reply */
};

struct req {
  uint32_t vi, lines, t;
  uint32_t slice;      /* lines of the rank's slice (== lines unless partial) */
  uint32_t *positions; /* [lines] slice position of each line; partial only */
  struct item *items;  /* [lines] sorted by (lane, k) */
};

/* Orders items by (lane, k) with a counting sort on the lane and an
 * insertion sort of each lane's few lines (qsort cost more than generating
 * small batches' metadata). tmp holds lines items. */
static int sort_items(struct item *items, uint32_t lines, uint32_t lanes) {
  uint32_t *at = calloc((size_t)lanes + 1, sizeof *at);
  struct item *tmp = malloc(((size_t)lines + 1) * sizeof *tmp);
  if (!at || !tmp) {
    free(at);
    free(tmp);
    return STK_ENOMEM;
  }
  for (uint32_t i = 0; i < lines; i++) at[items[i].lane + 1]++;
  for (uint32_t c = 0; c < lanes; c++) at[c + 1] += at[c];
  for (uint32_t i = 0; i < lines; i++) tmp[at[items[i].lane]++] = items[i];
  for (uint32_t i = 1; i < lines; i++) {
    struct item x = tmp[i];
    uint32_t k = i;
    for (; k > 0 && tmp[k - 1].lane == x.lane && tmp[k - 1].k > x.k; k--) tmp[k] = tmp[k - 1];
    tmp[k] = x;
  }
  memcpy(items, tmp, (size_t)lines * sizeof *items);
  free(at);
  free(tmp);
  return 0;
}

/* Orders a batch's document starts (offsets into lines of t tokens): each
 * line's starts were pushed in order, lines in generation (lane) order, so
 * a stable counting sort on the line puts them in order. */
static int sort_starts(uint32_t *starts, size_t n, uint32_t t, uint32_t lines) {
  uint32_t *at = calloc((size_t)lines + 1, sizeof *at);
  uint32_t *tmp = malloc((n + 1) * sizeof *tmp);
  if (!at || !tmp) {
    free(at);
    free(tmp);
    return STK_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) at[starts[i] / t + 1]++;
  for (uint32_t l = 0; l < lines; l++) at[l + 1] += at[l];
  for (size_t i = 0; i < n; i++) tmp[at[starts[i] / t]++] = starts[i];
  memcpy(starts, tmp, n * sizeof *starts);
  free(at);
  free(tmp);
  return 0;
}

/* Validates a request against the job (read lock held) and plans it. */
static int plan(struct dl *dl, struct dl_job *j, int64_t step, uint32_t rank, uint32_t world,
                struct req *q) {
  if (step < 0 || step > dl->opts.max_step || world == 0 || rank >= world) {
    stk_set_detail("need 0 <= step <= %lld and rank < world (world > 0)",
                   (long long)dl->opts.max_step);
    return STK_EINVAL;
  }
  q->vi = dl_version_of_step(j, step);
  const struct dl_version *v = &j->ver[q->vi];
  if (v->global_batch % world) {
    stk_set_detail("global_batch %u is not a multiple of world %u", v->global_batch, world);
    return STK_EINVAL;
  }
  q->slice = v->global_batch / world;
  q->t = v->seq_len + 1;
  if ((uint64_t)q->slice * q->t * 4 > dl->opts.max_batch_bytes) {
    stk_set_detail("a batch of %u x %u tokens exceeds max_batch_bytes", q->slice, q->t);
    return STK_EINVAL;
  }
  if (!(q->items = malloc(((size_t)q->slice + 1) * sizeof *q->items))) return STK_ENOMEM;
  if (dl->opts.parts > 1 && !(q->positions = malloc(((size_t)q->slice + 1) * sizeof(uint32_t))))
    return STK_ENOMEM;
  uint64_t key = dl_key(dl_key(j->seed, STEP_TAG), (uint64_t)step);
  uint64_t base = (uint64_t)(step - v->from_step) * v->global_batch;
  q->lines = 0;
  for (uint32_t i = 0; i < q->slice; i++) {
    uint64_t n = base + dl_perm(key, v->global_batch, (uint64_t)rank * q->slice + i);
    uint32_t lane = (uint32_t)(n % j->C);
    if (!dl_owns_lane(dl, lane)) continue;
    if (q->positions) q->positions[q->lines] = i;
    q->items[q->lines] = (struct item){.lane = lane, .k = n / j->C, .out = q->lines};
    q->lines++;
  }
  return sort_items(q->items, q->lines, j->C);
}

/* Generates every planned line; per line, out->tokens/starts are set by
 * the caller's hook through `line_begin`. */
struct sink {
  uint32_t *tokens; /* [lines x t] or NULL */
  uint32_t *starts; /* collected flat doc starts */
  size_t n_starts, cap_starts;
  struct dl_line_out out;
  size_t *run_begin; /* [lines + 1] per reply line: first run (explain) */
};

static int push_starts(struct sink *s, uint32_t base, const uint32_t *tmp, size_t n) {
  if (s->n_starts + n > s->cap_starts) {
    size_t cap = s->cap_starts ? s->cap_starts : 64;
    while (cap < s->n_starts + n) cap *= 2;
    uint32_t *p = realloc(s->starts, cap * sizeof *p);
    if (!p) return STK_ENOMEM;
    s->starts = p;
    s->cap_starts = cap;
  }
  for (size_t i = 0; i < n; i++) s->starts[s->n_starts++] = base + tmp[i];
  return 0;
}

/* Generates the planned items [begin, end) (whole lanes) into s; with
 * opts.replay_slice_tokens, DL_YIELDED when the replays of these lanes
 * spent that many tokens first (the lanes keep their places). */
static int run_lines(struct dl_job *j, const struct req *q, struct sink *s, uint32_t *tmp,
                     uint32_t begin, uint32_t end) {
  uint64_t budget = j->dl->opts.replay_slice_tokens;
  uint64_t *slice = budget ? &budget : NULL;
  int rc = 0;
  for (uint32_t i = begin; rc == 0 && i < end;) {
    uint32_t c = q->items[i].lane;
    struct dl_lane *l = &j->lanes[c];
    pthread_mutex_lock(&l->mu);
    for (; rc == 0 && i < end && q->items[i].lane == c; i++) {
      const struct item *it = &q->items[i];
      s->out.tokens = s->tokens ? s->tokens + (size_t)it->out * q->t : NULL;
      s->out.starts = tmp;
      s->out.n_starts = 0;
      s->out.line = it->out;
      s->out.lane = c;
      size_t runs_before = s->out.n_runs;
      rc = dl_seek(j, c, &l->live, true, q->vi, it->k, slice);
      if (rc == 0) rc = dl_gen_line(j, c, &l->live, &s->out);
      if (rc < 0) l->live_ok = false;
      if (rc == 0) rc = push_starts(s, it->out * q->t, tmp, s->out.n_starts);
      if (s->run_begin) s->run_begin[it->out] = runs_before;
    }
    pthread_mutex_unlock(&l->mu);
  }
  return rc;
}

/* Below this many tokens a call is not split: waking the helper would cost
 * more than it saves. */
#define SPLIT_MIN_TOKENS 8192

/* The helper thread's share of a call: items [begin, end) into its own
 * sink (same token array, own document starts). */
struct part {
  struct dl_job *j;
  const struct req *q;
  struct sink s;
  uint32_t *tmp;
  uint32_t begin, end;
  int rc;
  char detail[256];
};

static void part_main(void *arg) {
  struct part *w = arg;
  w->rc = run_lines(w->j, w->q, &w->s, w->tmp, w->begin, w->end);
  if (w->rc) snprintf(w->detail, sizeof w->detail, "%s", stk_detail());
}

/* The lane boundary nearest the middle of the items (0: none). */
static uint32_t split_point(const struct req *q) {
  uint32_t mid = q->lines / 2;
  for (uint32_t d = 0; d <= mid; d++) {
    uint32_t hi = mid + d, lo = mid - d;
    if (hi < q->lines && hi > 0 && q->items[hi].lane != q->items[hi - 1].lane) return hi;
    if (lo > 0 && q->items[lo].lane != q->items[lo - 1].lane) return lo;
  }
  return 0;
}

/* Generates every item: half of the lanes on the helper thread when it is
 * free and the call is worth splitting, the rest (or all) here. */
static int run_all(struct dl *dl, struct dl_job *j, const struct req *q, struct sink *s,
                   uint32_t *tmp) {
  uint32_t mid = s->out.explain || (uint64_t)q->lines * q->t < SPLIT_MIN_TOKENS || !dl->helper
                     ? 0
                     : split_point(q);
  struct part w = {.j = j, .q = q, .s.tokens = s->tokens, .begin = mid, .end = q->lines};
  if (mid > 0) w.tmp = malloc(((size_t)q->t + 1) * sizeof *w.tmp);
  if (!w.tmp || !dl_helper_start(dl->helper, part_main, &w)) {
    free(w.tmp);
    return run_lines(j, q, s, tmp, 0, q->lines);
  }
  int rc = run_lines(j, q, s, tmp, 0, mid);
  dl_helper_wait(dl->helper);
  if (rc == 0 && w.rc) {
    rc = w.rc;
    stk_set_detail("%s", w.detail);
  }
  if (rc == 0) rc = push_starts(s, 0, w.s.starts, w.s.n_starts);
  free(w.s.starts);
  free(w.tmp);
  return rc;
}

/* Tokens go to dest when they fit in dest_bytes, else to a fresh buffer. */
static int serve(struct dl *dl, const char *job, int64_t step, uint32_t rank, uint32_t world,
                 bool want_tokens, uint32_t *dest, size_t dest_bytes, struct sink *s,
                 struct req *q) {
  struct dl_job *j = NULL;
  int got = dl_job_get(dl, job, &j);
  if (got < 0) return got;
  pthread_rwlock_rdlock(&j->lock);
  int rc = dl_job_check_data(j);
  if (rc == 0) rc = plan(dl, j, step, rank, world, q);
  uint32_t *tmp = NULL;
  size_t bytes = (size_t)q->lines * q->t * 4 + 4;
  if (rc == 0 && want_tokens) s->tokens = dest && bytes <= dest_bytes ? dest : malloc(bytes);
  if (rc == 0 && want_tokens && !s->tokens) rc = STK_ENOMEM;
  if (rc == 0 && !(tmp = malloc(((size_t)q->t + 1) * sizeof *tmp))) rc = STK_ENOMEM;
  if (rc == 0 && s->out.explain && !(s->run_begin = calloc(q->lines + 1, sizeof(size_t))))
    rc = STK_ENOMEM;
  if (rc == 0) rc = run_all(dl, j, q, s, tmp);
  /* After reading: a file that shrank meanwhile left zeros in the lines. */
  if (rc == 0) rc = dl_job_check_data(j);
  pthread_rwlock_unlock(&j->lock);
  dl_job_put(dl, j);
  free(tmp);
  return rc;
}

static void sink_free(struct sink *s) {
  free(s->tokens);
  free(s->starts);
  for (size_t i = 0; i < s->out.n_runs; i++) {
    free(s->out.runs[i]->dataset);
    free(s->out.runs[i]->file);
    free(s->out.runs[i]->tokenizer);
    free(s->out.runs[i]);
  }
  free(s->out.runs);
  free(s->run_begin);
}

int dl_get_batch(struct dl *dl, const char *job, int64_t step, uint32_t rank, uint32_t world,
                 struct dl_batch *ret_batch) {
  return dl_get_batch_into(dl, job, step, rank, world, NULL, 0, ret_batch);
}

int dl_get_batch_into(struct dl *dl, const char *job, int64_t step, uint32_t rank, uint32_t world,
                      uint32_t *dest, size_t dest_bytes, struct dl_batch *ret_batch) {
  struct sink s = {0};
  struct req q = {0};
  int rc = serve(dl, job, step, rank, world, true, dest, dest_bytes, &s, &q);
  free(q.items);
  if (rc == 0 && s.n_starts > 1) rc = sort_starts(s.starts, s.n_starts, q.t, q.lines);
  if (rc != 0) { /* An error, or DL_YIELDED: nothing to return yet. */
    free(q.positions);
    if (s.tokens == dest) s.tokens = NULL;
    sink_free(&s);
    return rc;
  }
  *ret_batch = (struct dl_batch){.step = step,
                                 .lines = q.lines,
                                 .line_tokens = q.t,
                                 .tokens = s.tokens,
                                 .doc_starts = s.starts,
                                 .n_doc_starts = s.n_starts,
                                 .positions = q.positions,
                                 .slice_lines = q.positions ? q.slice : 0,
                                 .part = dl->opts.part,
                                 .parts = dl->opts.parts,
                                 .tokens_borrowed = s.tokens == dest};
  return 0;
}

void dl_batch_free(struct dl_batch *b) {
  if (!b) return;
  if (!b->tokens_borrowed) free(b->tokens);
  free(b->doc_starts);
  free(b->positions);
  memset(b, 0, sizeof *b);
}

/* Reorders runs by reply line (they were produced in lane order); a
 * partial reply names each line by its position in the slice. */
static int explain_reply(struct sink *s, const struct req *q, Stoker__V1__ExplainResponse **ret) {
  uint32_t lines = q->lines;
  Stoker__V1__ExplainResponse *r = malloc(sizeof *r);
  Stoker__V1__LineSource **v = malloc((s->out.n_runs + 1) * sizeof *v);
  uint32_t *order = malloc(((size_t)lines + 1) * sizeof *order);
  if (!r || !v || !order) {
    free(r);
    free(v);
    free(order);
    return STK_ENOMEM;
  }
  stoker__v1__explain_response__init(r);
  size_t n = 0;
  for (size_t i = 0; i < s->out.n_runs; i++) {
    uint32_t line = s->out.runs[i]->line;
    size_t b = s->run_begin[line];
    if (b == i) order[line] = (uint32_t)i; /* runs of one line are contiguous */
  }
  for (uint32_t line = 0; line < lines; line++)
    for (size_t i = order[line]; i < s->out.n_runs && s->out.runs[i]->line == line; i++)
      v[n++] = s->out.runs[i];
  for (size_t i = 0; q->positions && i < n; i++) v[i]->line = q->positions[v[i]->line];
  free(order);
  free(s->out.runs);
  s->out.runs = NULL;
  s->out.n_runs = 0;
  r->sources = v;
  r->n_sources = n;
  *ret = r;
  return 0;
}

int dl_explain(struct dl *dl, const char *job, int64_t step, uint32_t rank, uint32_t world,
               Stoker__V1__ExplainResponse **ret_resp) {
  struct sink s = {.out.explain = true};
  struct req q = {0};
  int rc = serve(dl, job, step, rank, world, false, NULL, 0, &s, &q);
  free(q.items);
  if (rc == 0) rc = explain_reply(&s, &q, ret_resp);
  free(q.positions);
  sink_free(&s);
  return rc;
}

void dl_explain_free(Stoker__V1__ExplainResponse *resp) {
  if (!resp) return;
  for (size_t i = 0; i < resp->n_sources; i++) {
    free(resp->sources[i]->dataset);
    free(resp->sources[i]->file);
    free(resp->sources[i]->tokenizer);
    free(resp->sources[i]);
  }
  free(resp->sources);
  free(resp);
}
