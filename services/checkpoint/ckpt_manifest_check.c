/*
 * ckpt_manifest_check: every rule a manifest must satisfy, in one place, run
 * before a manifest is written (commit) and after one is read (parse). Each
 * number is checked before it is used in arithmetic, and cross-chunk rules
 * (one dtype and shape per tensor, exact coverage, no shared object bytes) are
 * checked by sorting, so the cost is O(n log n) in chunks, never in elements.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_crc.h"
#include "ckpt_dtype.h"
#include "ckpt_manifest.h"
#include "ckpt_names.h"
#include "stk_error.h"

/* Prefixes the current detail with the chunk it is about. */
static int chunk_fail(size_t i, const char *tensor, int rc) {
  char inner[256];
  snprintf(inner, sizeof(inner), "%s", stk_detail());
  stk_set_detail("chunk %zu (%.128s): %s", i, tensor ? tensor : "?", inner);
  return rc;
}

int ckpt_manifest_check_chunk(const struct ckpt_manifest *m, const struct ckpt_chunk *c, size_t i) {
  uint64_t elem = ckpt_dtype_bytes(c->dtype), numel, end;
  int rc = ckpt_name_check_tensor(c->tensor);
  if (rc == 0 && elem == 0) {
    stk_set_detail("unknown dtype %d", c->dtype);
    rc = STK_EINVAL;
  }
  if (rc == 0) rc = ckpt_shape_check(&c->shape, elem, &numel);
  if (rc == 0) rc = ckpt_box_check(&c->box, &c->shape);
  if (rc == 0 && c->length != ckpt_box_numel(&c->box) * elem) {
    stk_set_detail("length %llu, but the box holds %llu bytes", (unsigned long long)c->length,
                   (unsigned long long)(ckpt_box_numel(&c->box) * elem));
    rc = STK_EINVAL;
  }
  if (rc == 0 && c->object >= m->n_objects) {
    stk_set_detail("object %u does not exist", c->object);
    rc = STK_EINVAL;
  }
  if (rc == 0 && (__builtin_add_overflow(c->object_offset, c->length, &end) ||
                  end > m->objects[c->object].size_bytes)) {
    stk_set_detail("bytes %llu+%llu past the end of %s (%llu bytes)",
                   (unsigned long long)c->object_offset, (unsigned long long)c->length,
                   m->objects[c->object].key, (unsigned long long)m->objects[c->object].size_bytes);
    rc = STK_EINVAL;
  }
  return rc == 0 ? 0 : chunk_fail(i, c->tensor, rc == STK_ERANGE ? STK_EINVAL : rc);
}

static int check_header(const struct ckpt_manifest *m) {
  int rc = ckpt_name_check_job(m->job);
  if (rc == 0) rc = ckpt_name_check_step(m->step);
  if (rc == 0) rc = ckpt_name_check_attempt(m->attempt);
  if (rc == 0 && (m->world == 0 || m->world > CKPT_MANIFEST_MAX_WORLD)) {
    stk_set_detail("world %u outside 1..%u", m->world, CKPT_MANIFEST_MAX_WORLD);
    rc = STK_EINVAL;
  }
  if (rc == 0 &&
      (m->n_chunks > CKPT_MANIFEST_MAX_CHUNKS || m->n_objects > CKPT_MANIFEST_MAX_OBJECTS)) {
    stk_set_detail("%zu chunks and %zu objects: too many", m->n_chunks, m->n_objects);
    rc = STK_EINVAL;
  }
  return rc;
}

/* Sorting indices needs the manifest; qsort has no context argument. */
static _Thread_local const struct ckpt_manifest *sorting;

static int by_key(const void *pa, const void *pb) {
  return strcmp(sorting->objects[*(const size_t *)pa].key,
                sorting->objects[*(const size_t *)pb].key);
}

static int by_object_bytes(const void *pa, const void *pb) {
  const struct ckpt_chunk *a = &sorting->chunks[*(const size_t *)pa];
  const struct ckpt_chunk *b = &sorting->chunks[*(const size_t *)pb];
  if (a->object != b->object) return a->object < b->object ? -1 : 1;
  return a->object_offset < b->object_offset ? -1 : a->object_offset > b->object_offset;
}

static int by_tensor(const void *pa, const void *pb) {
  size_t x = *(const size_t *)pa, y = *(const size_t *)pb;
  int c = strcmp(sorting->chunks[x].tensor, sorting->chunks[y].tensor);
  return c ? c : (x < y ? -1 : x > y);
}

static void sort_indices(const struct ckpt_manifest *m, size_t *idx, size_t n,
                         int (*cmp)(const void *, const void *)) {
  for (size_t i = 0; i < n; i++) idx[i] = i;
  sorting = m;
  qsort(idx, n, sizeof(*idx), cmp);
  sorting = NULL;
}

static int check_objects(const struct ckpt_manifest *m, size_t *idx) {
  for (size_t i = 0; i < m->n_objects; i++) {
    const struct ckpt_object *o = &m->objects[i];
    int rc = ckpt_name_check_object(o->key);
    if (rc != 0) return rc;
    if (strcmp(o->key, "manifest.pb") == 0) {
      stk_set_detail("object %zu is named like the manifest", i);
      return STK_EINVAL;
    }
    if (o->n_blocks != ckpt_crc_block_count(o->size_bytes)) {
      stk_set_detail("object %s: %zu block CRCs for %llu bytes (needs %llu)", o->key, o->n_blocks,
                     (unsigned long long)o->size_bytes,
                     (unsigned long long)ckpt_crc_block_count(o->size_bytes));
      return STK_EINVAL;
    }
  }
  sort_indices(m, idx, m->n_objects, by_key);
  for (size_t i = 1; i < m->n_objects; i++) {
    if (strcmp(m->objects[idx[i]].key, m->objects[idx[i - 1]].key) == 0) {
      stk_set_detail("object %s listed twice", m->objects[idx[i]].key);
      return STK_EINVAL;
    }
  }
  return 0;
}

/* No two chunks share bytes of an object (empty chunks share nothing). */
static int check_object_bytes(const struct ckpt_manifest *m, size_t *idx) {
  sort_indices(m, idx, m->n_chunks, by_object_bytes);
  const struct ckpt_chunk *prev = NULL;
  for (size_t i = 0; i < m->n_chunks; i++) {
    const struct ckpt_chunk *c = &m->chunks[idx[i]];
    if (c->length == 0) continue;
    if (prev && prev->object == c->object &&
        prev->object_offset + prev->length > c->object_offset) {
      stk_set_detail("chunks of %s and %s share bytes of object %s", prev->tensor, c->tensor,
                     m->objects[c->object].key);
      return STK_EINVAL;
    }
    prev = c;
  }
  return 0;
}

/* One tensor: chunks idx[0..n) agree on dtype and shape and tile it. */
static int check_tensor(const struct ckpt_manifest *m, const size_t *idx, size_t n,
                        struct ckpt_box *boxes) {
  const struct ckpt_chunk *first = &m->chunks[idx[0]];
  for (size_t i = 0; i < n; i++) {
    const struct ckpt_chunk *c = &m->chunks[idx[i]];
    if (c->dtype != first->dtype || c->shape.ndim != first->shape.ndim ||
        memcmp(c->shape.dims, first->shape.dims, c->shape.ndim * sizeof(uint64_t)) != 0) {
      stk_set_detail("tensor %s: chunks disagree on dtype or shape", c->tensor);
      return STK_EINVAL;
    }
    boxes[i] = c->box;
  }
  int rc = ckpt_box_coverage(&first->shape, boxes, n, NULL);
  if (rc == STK_EINVAL) {
    char inner[256];
    snprintf(inner, sizeof(inner), "%s", stk_detail());
    stk_set_detail("tensor %.128s: %s (chunk numbers within the tensor)", first->tensor, inner);
  }
  return rc;
}

static int check_tensors(const struct ckpt_manifest *m, size_t *idx, struct ckpt_box *boxes) {
  sort_indices(m, idx, m->n_chunks, by_tensor);
  size_t start = 0;
  for (size_t i = 1; i <= m->n_chunks; i++) {
    if (i < m->n_chunks && strcmp(m->chunks[idx[i]].tensor, m->chunks[idx[start]].tensor) == 0)
      continue;
    int rc = check_tensor(m, idx + start, i - start, boxes);
    if (rc != 0) return rc;
    start = i;
  }
  return 0;
}

int ckpt_manifest_check(const struct ckpt_manifest *m) {
  int rc = check_header(m);
  for (size_t i = 0; rc == 0 && i < m->n_chunks; i++)
    rc = ckpt_manifest_check_chunk(m, &m->chunks[i], i);
  if (rc != 0) return rc;
  size_t n = m->n_chunks > m->n_objects ? m->n_chunks : m->n_objects;
  size_t *idx = malloc((n ? n : 1) * sizeof(*idx));
  struct ckpt_box *boxes = malloc((m->n_chunks ? m->n_chunks : 1) * sizeof(*boxes));
  if (!idx || !boxes) rc = STK_ENOMEM;
  if (rc == 0) rc = check_objects(m, idx);
  if (rc == 0) rc = check_object_bytes(m, idx);
  if (rc == 0) rc = check_tensors(m, idx, boxes);
  free(idx);
  free(boxes);
  return rc;
}
