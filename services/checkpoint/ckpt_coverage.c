/*
 * ckpt_coverage: proves that a tensor's chunks tile it exactly, without an
 * array per element (tensors are billions of elements). Boxes are checked
 * against the shape; a sweep along the dim with the most distinct offsets
 * finds any overlapping pair (only boxes whose ranges meet on that dim are
 * compared); with no overlaps, the elements covered are the sum of the box
 * volumes, which must equal the shape's.
 */
#include <stdlib.h>

#include "ckpt_box.h"
#include "stk_error.h"

/* The sweep's order: indices of the non-empty boxes sorted on one dim. */
struct sweep {
  const struct ckpt_box *boxes;
  uint32_t dim;
};

/* qsort has no context argument; the sweep is single-threaded per call,
 * so a thread-local pointer carries it. */
static _Thread_local const struct sweep *sorting;

static int by_offset(const void *pa, const void *pb) {
  const struct ckpt_box *a = &sorting->boxes[*(const size_t *)pa];
  const struct ckpt_box *b = &sorting->boxes[*(const size_t *)pb];
  uint64_t x = a->offsets[sorting->dim], y = b->offsets[sorting->dim];
  return x < y ? -1 : x > y;
}

static int by_value(const void *pa, const void *pb) {
  uint64_t x = *(const uint64_t *)pa, y = *(const uint64_t *)pb;
  return x < y ? -1 : x > y;
}

/* Index of the first value >= key in a sorted array. */
static size_t lower_bound(const uint64_t *v, size_t n, uint64_t key) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (v[mid] < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Pairs a sweep along dim d would compare: for each box, the boxes whose
 * start falls inside its range on d. */
static uint64_t sweep_cost(const struct ckpt_box *boxes, const size_t *order, size_t n, uint32_t d,
                           uint64_t *starts) {
  for (size_t i = 0; i < n; i++) starts[i] = boxes[order[i]].offsets[d];
  qsort(starts, n, sizeof(*starts), by_value);
  uint64_t cost = 0;
  for (size_t i = 0; i < n; i++) {
    const struct ckpt_box *b = &boxes[order[i]];
    size_t lo = lower_bound(starts, n, b->offsets[d]);
    cost += lower_bound(starts, n, b->offsets[d] + b->sizes[d]) - lo;
  }
  return cost;
}

/* The dim whose sweep compares the fewest pairs, and that number. */
static int pick_dim(const struct ckpt_box *boxes, const size_t *order, size_t n, uint32_t ndim,
                    uint32_t *ret_dim, uint64_t *ret_cost) {
  uint64_t *starts = malloc((n ? n : 1) * sizeof(*starts));
  if (!starts) return STK_ENOMEM;
  *ret_dim = 0;
  *ret_cost = 0;
  for (uint32_t d = 0; d < ndim; d++) {
    uint64_t cost = sweep_cost(boxes, order, n, d, starts);
    if (d == 0 || cost < *ret_cost) {
      *ret_dim = d;
      *ret_cost = cost;
    }
  }
  free(starts);
  return 0;
}

static int report(struct ckpt_cover_report *r, enum ckpt_cover_result result, size_t a, size_t b) {
  r->result = result;
  r->a = a;
  r->b = b;
  return result == CKPT_COVER_OK ? 0 : STK_EINVAL;
}

/* Finds an overlapping pair among the sorted boxes, if any. */
static bool find_overlap(const struct ckpt_box *boxes, const size_t *order, size_t n, uint32_t dim,
                         size_t *ret_a, size_t *ret_b) {
  for (size_t i = 0; i < n; i++) {
    const struct ckpt_box *a = &boxes[order[i]];
    uint64_t end = a->offsets[dim] + a->sizes[dim];
    for (size_t j = i + 1; j < n && boxes[order[j]].offsets[dim] < end; j++) {
      if (ckpt_box_intersect(a, &boxes[order[j]], NULL)) {
        *ret_a = order[i] < order[j] ? order[i] : order[j];
        *ret_b = order[i] < order[j] ? order[j] : order[i];
        return true;
      }
    }
  }
  return false;
}

/* Checks every box; collects the non-empty ones into order. */
static int check_boxes(const struct ckpt_shape *shape, const struct ckpt_box *boxes, size_t count,
                       size_t *order, size_t *ret_n, struct ckpt_cover_report *r) {
  size_t n = 0;
  for (size_t i = 0; i < count; i++) {
    if (ckpt_box_check(&boxes[i], shape) != 0) {
      stk_set_detail("chunk %zu does not fit the tensor's shape", i);
      return report(r, CKPT_COVER_BAD_BOX, i, i);
    }
    if (ckpt_box_numel(&boxes[i]) > 0) order[n++] = i;
  }
  *ret_n = n;
  return 0;
}

int ckpt_box_coverage(const struct ckpt_shape *shape, const struct ckpt_box *boxes, size_t count,
                      struct ckpt_cover_report *ret_report) {
  struct ckpt_cover_report scratch, *r = ret_report ? ret_report : &scratch;
  struct ckpt_box whole;
  ckpt_box_of_shape(shape, &whole);
  *r = (struct ckpt_cover_report){.total = ckpt_box_numel(&whole)};
  size_t *order = malloc((count ? count : 1) * sizeof(*order));
  if (!order) return STK_ENOMEM;
  size_t n = 0;
  uint32_t dim = 0;
  uint64_t cost = 0;
  int rc = check_boxes(shape, boxes, count, order, &n, r);
  if (rc == 0) rc = pick_dim(boxes, order, n, shape->ndim, &dim, &cost);
  if (rc == 0 && cost > CKPT_COVER_MAX_PAIRS) {
    stk_set_detail("chunk layout too complex to verify (%llu box pairs to compare)",
                   (unsigned long long)cost);
    rc = STK_ETOOBIG;
    r->result = CKPT_COVER_TOO_COMPLEX;
  }
  if (rc != 0) goto out;
  struct sweep sw = {boxes, dim};
  sorting = &sw;
  qsort(order, n, sizeof(*order), by_offset);
  sorting = NULL;
  size_t a, b;
  if (find_overlap(boxes, order, n, dim, &a, &b)) {
    stk_set_detail("chunks %zu and %zu overlap", a, b);
    rc = report(r, CKPT_COVER_OVERLAP, a, b);
    goto out;
  }
  for (size_t i = 0; i < n; i++) r->covered += ckpt_box_numel(&boxes[order[i]]);
  if (r->covered != r->total) {
    stk_set_detail("chunks cover %llu of %llu elements", (unsigned long long)r->covered,
                   (unsigned long long)r->total);
    rc = report(r, CKPT_COVER_GAP, 0, 0);
  } else {
    rc = report(r, CKPT_COVER_OK, 0, 0);
  }
out:
  free(order);
  return rc;
}
