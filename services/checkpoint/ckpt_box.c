/*
 * ckpt_box: box geometry (checks, intersection, containment) and the walk
 * that turns a box inside two row-major layouts into contiguous byte runs,
 * the primitive both copying and ranged reads are built on.
 */
#include "ckpt_box.h"

#include <stdlib.h>

#include "stk_error.h"

int ckpt_shape_check(const struct ckpt_shape *shape, uint64_t elem_bytes, uint64_t *ret_numel) {
  if (shape->ndim > CKPT_MAX_DIMS) {
    stk_set_detail("shape has %u dims, at most %d allowed", shape->ndim, CKPT_MAX_DIMS);
    return STK_EINVAL;
  }
  if (elem_bytes == 0) {
    stk_set_detail("element size 0");
    return STK_EINVAL;
  }
  uint64_t numel = 1;
  for (uint32_t d = 0; d < shape->ndim; d++) {
    if (__builtin_mul_overflow(numel, shape->dims[d], &numel)) goto too_big;
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, elem_bytes, &bytes) || bytes > INT64_MAX) goto too_big;
  *ret_numel = numel;
  return 0;
too_big:
  stk_set_detail("shape too large: its byte size overflows 63 bits");
  return STK_ERANGE;
}

int ckpt_box_check(const struct ckpt_box *box, const struct ckpt_shape *shape) {
  if (box->ndim != shape->ndim) {
    stk_set_detail("box has %u dims, the tensor %u", box->ndim, shape->ndim);
    return STK_EINVAL;
  }
  for (uint32_t d = 0; d < box->ndim; d++) {
    uint64_t end;
    if (__builtin_add_overflow(box->offsets[d], box->sizes[d], &end) || end > shape->dims[d]) {
      stk_set_detail("box dim %u: offset %llu + size %llu outside 0..%llu", d,
                     (unsigned long long)box->offsets[d], (unsigned long long)box->sizes[d],
                     (unsigned long long)shape->dims[d]);
      return STK_EINVAL;
    }
  }
  return 0;
}

uint64_t ckpt_box_numel(const struct ckpt_box *box) {
  uint64_t n = 1;
  for (uint32_t d = 0; d < box->ndim; d++) n *= box->sizes[d];
  return n;
}

void ckpt_box_of_shape(const struct ckpt_shape *shape, struct ckpt_box *ret_box) {
  *ret_box = (struct ckpt_box){.ndim = shape->ndim};
  for (uint32_t d = 0; d < shape->ndim; d++) ret_box->sizes[d] = shape->dims[d];
}

bool ckpt_box_intersect(const struct ckpt_box *a, const struct ckpt_box *b,
                        struct ckpt_box *ret_box) {
  if (a->ndim != b->ndim) return false;
  struct ckpt_box x = {.ndim = a->ndim};
  for (uint32_t d = 0; d < a->ndim; d++) {
    uint64_t lo = a->offsets[d] > b->offsets[d] ? a->offsets[d] : b->offsets[d];
    uint64_t a_end = a->offsets[d] + a->sizes[d], b_end = b->offsets[d] + b->sizes[d];
    uint64_t hi = a_end < b_end ? a_end : b_end;
    if (hi <= lo) return false;
    x.offsets[d] = lo;
    x.sizes[d] = hi - lo;
  }
  if (ret_box) *ret_box = x;
  return true;
}

bool ckpt_box_contains(const struct ckpt_box *outer, const struct ckpt_box *inner) {
  if (outer->ndim != inner->ndim) return false;
  for (uint32_t d = 0; d < outer->ndim; d++) {
    if (inner->offsets[d] < outer->offsets[d] ||
        inner->offsets[d] + inner->sizes[d] > outer->offsets[d] + outer->sizes[d])
      return false;
  }
  return true;
}

/* Merges runs adjacent in both layouts before handing them on. */
struct run_merger {
  struct ckpt_run pending;
  ckpt_run_fn fn;
  void *ctx;
};

static int merge_run(struct run_merger *m, uint64_t src, uint64_t dst, uint64_t len) {
  struct ckpt_run *p = &m->pending;
  if (p->len > 0 && p->src_offset + p->len == src && p->dst_offset + p->len == dst) {
    p->len += len;
    return 0;
  }
  int rc = p->len > 0 ? m->fn(m->ctx, p) : 0;
  *p = (struct ckpt_run){src, dst, len};
  return rc;
}

/* Row-major element strides of a box's layout. */
static void strides_of(const struct ckpt_box *b, uint64_t *ret_strides) {
  uint64_t s = 1;
  for (uint32_t d = b->ndim; d-- > 0;) {
    ret_strides[d] = s;
    s *= b->sizes[d];
  }
}

/* The odometer over the outer dims [0, k) of x; each step emits one run of
 * run_bytes. All offsets are in bytes. */
static int walk(const struct ckpt_box *x, uint32_t k, const uint64_t *ss, const uint64_t *ds,
                uint64_t src, uint64_t dst, uint64_t run_bytes, struct run_merger *m) {
  uint64_t idx[CKPT_MAX_DIMS] = {0};
  for (;;) {
    int rc = merge_run(m, src, dst, run_bytes);
    if (rc != 0) return rc;
    uint32_t d = k;
    while (d > 0) {
      d--;
      src += ss[d];
      dst += ds[d];
      if (++idx[d] < x->sizes[d]) break;
      src -= ss[d] * x->sizes[d];
      dst -= ds[d] * x->sizes[d];
      idx[d] = 0;
      if (d == 0) return 0;
    }
    if (k == 0) return 0;
  }
}

int ckpt_box_runs(const struct ckpt_box *x, const struct ckpt_box *src, const struct ckpt_box *dst,
                  uint64_t elem_bytes, ckpt_run_fn fn, void *ctx) {
  if (elem_bytes == 0 || !ckpt_box_contains(src, x) || !ckpt_box_contains(dst, x)) {
    stk_set_detail("runs: box not inside its source and destination");
    return STK_EINVAL;
  }
  if (ckpt_box_numel(x) == 0) return 0;
  uint32_t n = x->ndim;
  uint64_t ss[CKPT_MAX_DIMS], ds[CKPT_MAX_DIMS];
  strides_of(src, ss);
  strides_of(dst, ds);
  uint64_t src_off = 0, dst_off = 0;
  for (uint32_t d = 0; d < n; d++) {
    ss[d] *= elem_bytes;
    ds[d] *= elem_bytes;
    src_off += (x->offsets[d] - src->offsets[d]) * ss[d];
    dst_off += (x->offsets[d] - dst->offsets[d]) * ds[d];
  }
  /* Dims [k, n) form one contiguous run in both layouts. */
  uint32_t k = n;
  uint64_t run_bytes = elem_bytes;
  while (k > 0) {
    k--;
    run_bytes *= x->sizes[k];
    if (x->sizes[k] != src->sizes[k] || x->sizes[k] != dst->sizes[k]) break;
  }
  struct run_merger m = {.fn = fn, .ctx = ctx};
  int rc = walk(x, k, ss, ds, src_off, dst_off, run_bytes, &m);
  if (rc == 0 && m.pending.len > 0) rc = fn(ctx, &m.pending);
  return rc;
}

struct run_vec {
  struct ckpt_run *v;
  size_t count, cap;
};

static int push_run(void *ctx, const struct ckpt_run *run) {
  struct run_vec *rv = ctx;
  if (rv->count == rv->cap) {
    size_t cap = rv->cap ? rv->cap * 2 : 16;
    struct ckpt_run *v = realloc(rv->v, cap * sizeof(*v));
    if (!v) return STK_ENOMEM;
    rv->v = v;
    rv->cap = cap;
  }
  rv->v[rv->count++] = *run;
  return 0;
}

int ckpt_box_runs_collect(const struct ckpt_box *x, const struct ckpt_box *src,
                          const struct ckpt_box *dst, uint64_t elem_bytes,
                          struct ckpt_run **ret_runs, size_t *ret_count) {
  struct run_vec rv = {0};
  int rc = ckpt_box_runs(x, src, dst, elem_bytes, push_run, &rv);
  if (rc != 0) {
    free(rv.v);
    return rc;
  }
  *ret_runs = rv.v;
  *ret_count = rv.count;
  return 0;
}
