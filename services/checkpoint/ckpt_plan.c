/*
 * ckpt_plan: resharding as geometry. Each stored chunk is intersected with
 * the wanted box; the intersection's runs (ckpt_box_runs) become pieces
 * (object, byte offset, destination offset, length); pieces sorted by object
 * and offset are merged into ranged reads, and each piece becomes a copy out
 * of its read. Also the generic range coalescer for ranged reads.
 */
#include "ckpt_plan.h"

#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

struct piece {
  uint32_t object;
  uint64_t src; /* Byte offset in the object. */
  uint64_t dst; /* Byte offset in the wanted box. */
  uint64_t len;
  uint64_t object_bytes; /* Size of the object (bounds aligned reads). */
};

struct pieces {
  struct piece *v;
  size_t count, cap;
  uint32_t object;       /* Of the chunk being walked. */
  uint64_t base;         /* Its object offset. */
  uint64_t object_bytes; /* Its object's size. */
  uint64_t total_bytes;  /* Sum of all piece lengths. */
};

static int push_piece(void *ctx, const struct ckpt_run *run) {
  struct pieces *ps = ctx;
  if (ps->count == ps->cap) {
    size_t cap = ps->cap ? ps->cap * 2 : 64;
    struct piece *v = realloc(ps->v, cap * sizeof(*v));
    if (!v) return STK_ENOMEM;
    ps->v = v;
    ps->cap = cap;
  }
  ps->v[ps->count++] = (struct piece){ps->object, ps->base + run->src_offset, run->dst_offset,
                                      run->len, ps->object_bytes};
  ps->total_bytes += run->len;
  return 0;
}

static int by_object_offset(const void *pa, const void *pb) {
  const struct piece *a = pa, *b = pb;
  if (a->object != b->object) return a->object < b->object ? -1 : 1;
  return a->src < b->src ? -1 : a->src > b->src;
}

/* Walks one chunk's share of the wanted box into pieces. */
static int chunk_pieces(const struct ckpt_stored_chunk *c, size_t i, uint64_t elem_bytes,
                        const struct ckpt_box *want, struct pieces *ps) {
  if (c->box.ndim != want->ndim) {
    stk_set_detail("chunk %zu has %u dims, the wanted box %u", i, c->box.ndim, want->ndim);
    return STK_EINVAL;
  }
  uint64_t bytes = ckpt_box_numel(&c->box) * elem_bytes, end;
  if (__builtin_add_overflow(c->object_offset, bytes, &end) || end > c->object_bytes) {
    stk_set_detail("chunk %zu ends past its object's %llu bytes", i,
                   (unsigned long long)c->object_bytes);
    return STK_EINVAL;
  }
  struct ckpt_box x;
  if (!ckpt_box_intersect(&c->box, want, &x)) return 0;
  ps->object = c->object;
  ps->base = c->object_offset;
  ps->object_bytes = c->object_bytes;
  return ckpt_box_runs(&x, &c->box, want, elem_bytes, push_piece, ps);
}

/* The read range of a piece: widened to alignment, clipped to the object. */
static void piece_range(const struct piece *p, uint64_t align, uint64_t *ret_lo, uint64_t *ret_hi) {
  uint64_t lo = p->src, hi = p->src + p->len;
  if (align > 1) {
    lo -= lo % align;
    if (hi % align != 0) hi += align - hi % align;
    if (hi > p->object_bytes) hi = p->object_bytes;
  }
  *ret_lo = lo;
  *ret_hi = hi;
}

static bool joins(const struct ckpt_read *r, uint32_t object, uint64_t lo, uint64_t hi,
                  const struct ckpt_plan_opts *o) {
  uint64_t end = r->offset + r->len;
  if (r->object != object || (lo > end && lo - end > o->max_gap_bytes)) return false;
  uint64_t new_end = hi > end ? hi : end;
  return o->max_read_bytes == 0 || new_end - r->offset <= o->max_read_bytes;
}

/* Groups the sorted pieces into reads and copies (arrays sized n). */
static void coalesce(const struct piece *v, size_t n, const struct ckpt_plan_opts *o,
                     struct ckpt_plan *plan) {
  struct ckpt_read *r = NULL;
  for (size_t i = 0; i < n; i++) {
    uint64_t lo, hi;
    piece_range(&v[i], o->align_bytes, &lo, &hi);
    if (r && joins(r, v[i].object, lo, hi, o)) {
      if (hi > r->offset + r->len) r->len = hi - r->offset;
      r->n_copies++;
    } else {
      r = &plan->reads[plan->n_reads++];
      *r = (struct ckpt_read){v[i].object, lo, hi - lo, i, 1};
    }
    plan->copies[i] =
        (struct ckpt_copy){plan->n_reads - 1, v[i].src - r->offset, v[i].dst, v[i].len};
  }
  plan->n_copies = n;
  for (size_t i = 0; i < plan->n_reads; i++) plan->read_bytes += plan->reads[i].len;
}

static int check_total(const struct pieces *ps, uint64_t want_bytes) {
  if (ps->total_bytes == want_bytes) return 0;
  stk_set_detail("stored chunks give %llu of the %llu bytes wanted",
                 (unsigned long long)ps->total_bytes, (unsigned long long)want_bytes);
  return ps->total_bytes < want_bytes ? STK_ENOENT : STK_ECORRUPT;
}

int ckpt_plan_build(const struct ckpt_stored_chunk *chunks, size_t n_chunks, uint64_t elem_bytes,
                    const struct ckpt_box *want, const struct ckpt_plan_opts *opts,
                    struct ckpt_plan *ret_plan) {
  static const struct ckpt_plan_opts defaults = {0};
  const struct ckpt_plan_opts *o = opts ? opts : &defaults;
  *ret_plan = (struct ckpt_plan){.want_bytes = ckpt_box_numel(want) * elem_bytes};
  if (elem_bytes == 0) {
    stk_set_detail("element size 0");
    return STK_EINVAL;
  }
  struct pieces ps = {0};
  int rc = 0;
  for (size_t i = 0; i < n_chunks && rc == 0; i++)
    rc = chunk_pieces(&chunks[i], i, elem_bytes, want, &ps);
  if (rc == 0) rc = check_total(&ps, ret_plan->want_bytes);
  if (rc != 0) goto out;
  qsort(ps.v, ps.count, sizeof(*ps.v), by_object_offset);
  ret_plan->reads = malloc((ps.count ? ps.count : 1) * sizeof(*ret_plan->reads));
  ret_plan->copies = malloc((ps.count ? ps.count : 1) * sizeof(*ret_plan->copies));
  if (!ret_plan->reads || !ret_plan->copies)
    rc = STK_ENOMEM;
  else
    coalesce(ps.v, ps.count, o, ret_plan);
out:
  free(ps.v);
  if (rc != 0) ckpt_plan_close(ret_plan);
  return rc;
}

void ckpt_plan_apply(const struct ckpt_plan *plan, size_t read, const void *data, void *dst) {
  const struct ckpt_read *r = &plan->reads[read];
  for (size_t i = r->first_copy; i < r->first_copy + r->n_copies; i++) {
    const struct ckpt_copy *c = &plan->copies[i];
    memcpy((char *)dst + c->dst_offset, (const char *)data + c->read_offset, c->len);
  }
}

void ckpt_plan_close(struct ckpt_plan *plan) {
  if (!plan) return;
  free(plan->reads);
  free(plan->copies);
  *plan = (struct ckpt_plan){0};
}

static int by_range_offset(const void *pa, const void *pb) {
  const struct ckpt_range *a = pa, *b = pb;
  return a->offset < b->offset ? -1 : a->offset > b->offset;
}

size_t ckpt_ranges_coalesce(struct ckpt_range *ranges, size_t count, uint64_t max_gap_bytes,
                            uint64_t max_len_bytes) {
  if (count == 0) return 0;
  qsort(ranges, count, sizeof(*ranges), by_range_offset);
  size_t out = 0;
  for (size_t i = 1; i < count; i++) {
    struct ckpt_range *cur = &ranges[out];
    uint64_t end = cur->offset + cur->len, next_end = ranges[i].offset + ranges[i].len;
    uint64_t new_end = next_end > end ? next_end : end;
    bool near = ranges[i].offset <= end || ranges[i].offset - end <= max_gap_bytes;
    if (near && (max_len_bytes == 0 || new_end - cur->offset <= max_len_bytes)) {
      cur->len = new_end - cur->offset;
    } else {
      ranges[++out] = ranges[i];
    }
  }
  return out + 1;
}

/* A read of one plan, for merging across plans. */
struct span_read {
  uint32_t object;
  uint64_t offset, len;
  size_t index; /* Among all reads of all plans, in plan order. */
};

static int by_span_read(const void *pa, const void *pb) {
  const struct span_read *a = pa, *b = pb;
  if (a->object != b->object) return a->object < b->object ? -1 : 1;
  return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Appends v[i] to the open span *s or opens the next one; v sorted. */
static void span_merge(const struct span_read *v, size_t n, uint64_t max_gap_bytes,
                       uint64_t max_span_bytes, struct ckpt_span *spans, size_t *ret_n,
                       size_t *read_span) {
  size_t ns = 0;
  for (size_t i = 0; i < n; i++) {
    struct ckpt_span *s = ns ? &spans[ns - 1] : NULL;
    uint64_t end = s ? s->offset + s->len : 0, hi = v[i].offset + v[i].len;
    uint64_t new_end = hi > end ? hi : end;
    bool near =
        s && s->object == v[i].object && (v[i].offset <= end || v[i].offset - end <= max_gap_bytes);
    if (near && (max_span_bytes == 0 || new_end - s->offset <= max_span_bytes)) {
      s->len = new_end - s->offset;
    } else {
      spans[ns++] = (struct ckpt_span){v[i].object, v[i].offset, v[i].len};
    }
    read_span[v[i].index] = ns - 1;
  }
  *ret_n = ns;
}

int ckpt_plan_spans(const struct ckpt_plan *plans, size_t n_plans, uint64_t max_gap_bytes,
                    uint64_t max_span_bytes, struct ckpt_span **ret_spans, size_t *ret_n_spans,
                    size_t **ret_read_span) {
  size_t n = 0;
  for (size_t p = 0; p < n_plans; p++) n += plans[p].n_reads;
  struct span_read *v = malloc((n ? n : 1) * sizeof(*v));
  struct ckpt_span *spans = malloc((n ? n : 1) * sizeof(*spans));
  size_t *read_span = malloc((n ? n : 1) * sizeof(*read_span));
  if (!v || !spans || !read_span) {
    free(v);
    free(spans);
    free(read_span);
    return STK_ENOMEM;
  }
  size_t k = 0;
  for (size_t p = 0; p < n_plans; p++)
    for (size_t i = 0; i < plans[p].n_reads; i++, k++) {
      const struct ckpt_read *r = &plans[p].reads[i];
      v[k] = (struct span_read){r->object, r->offset, r->len, k};
    }
  qsort(v, n, sizeof(*v), by_span_read);
  span_merge(v, n, max_gap_bytes, max_span_bytes, spans, ret_n_spans, read_span);
  free(v);
  *ret_spans = spans;
  *ret_read_span = read_span;
  return 0;
}
