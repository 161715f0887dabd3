/*
 * ckpt_manifest: building a manifest in memory (the service adds objects as
 * their uploads finish and chunks as ranks stream them) and the lookups a
 * restore needs (by tensor name, through an index once the manifest is
 * finished).
 */
#include "ckpt_manifest.h"

#include <stdlib.h>
#include <string.h>

#include "ckpt_crc.h"
#include "ckpt_dtype.h"
#include "ckpt_names.h"
#include "stk_error.h"

/* A chunk's tensor name and index, sorted by both (the index keeps each
 * tensor's chunks in manifest order). */
struct named {
  const char *name;
  size_t i;
};

static int by_name_then_index(const void *pa, const void *pb);
static size_t lower_bound(const struct ckpt_manifest *m, const char *name);

int ckpt_manifest_new(const char *job, int64_t step, uint32_t world, const char *attempt,
                      struct ckpt_manifest **ret_manifest) {
  int rc = ckpt_name_check_job(job);
  if (rc == 0) rc = ckpt_name_check_step(step);
  if (rc == 0) rc = ckpt_name_check_attempt(attempt);
  if (rc == 0 && (world == 0 || world > CKPT_MANIFEST_MAX_WORLD)) {
    stk_set_detail("world %u outside 1..%u", world, CKPT_MANIFEST_MAX_WORLD);
    rc = STK_EINVAL;
  }
  if (rc != 0) return rc;
  struct ckpt_manifest *m = calloc(1, sizeof(*m));
  if (!m || !(m->job = strdup(job)) || !(m->attempt = strdup(attempt))) {
    ckpt_manifest_free(m);
    return STK_ENOMEM;
  }
  m->step = step;
  m->world = world;
  *ret_manifest = m;
  return 0;
}

void ckpt_manifest_free(struct ckpt_manifest *m) {
  if (!m) return;
  for (size_t i = 0; i < m->n_objects; i++) {
    free(m->objects[i].key);
    free(m->objects[i].block_crc32c);
  }
  for (size_t i = 0; i < m->n_chunks; i++) free(m->chunks[i].tensor);
  free(m->objects);
  free(m->chunks);
  free(m->by_tensor);
  free(m->job);
  free(m->attempt);
  free(m);
}

/* Makes room for one more element of a growable array. */
static int grow(void **v, size_t *cap, size_t count, size_t elem_size) {
  if (count < *cap) return 0;
  size_t n = *cap ? *cap * 2 : 16;
  void *p = realloc(*v, n * elem_size);
  if (!p) return STK_ENOMEM;
  *v = p;
  *cap = n;
  return 0;
}

int ckpt_manifest_add_object(struct ckpt_manifest *m, const char *key, uint64_t size_bytes,
                             const uint32_t *crcs, size_t n_crcs, uint32_t *ret_index) {
  int rc = ckpt_name_check_object(key);
  if (rc != 0) return rc;
  if (n_crcs != ckpt_crc_block_count(size_bytes) || m->n_objects >= CKPT_MANIFEST_MAX_OBJECTS) {
    stk_set_detail("object %s: %zu CRCs for %llu bytes, or too many objects", key, n_crcs,
                   (unsigned long long)size_bytes);
    return STK_EINVAL;
  }
  if (grow((void **)&m->objects, &m->cap_objects, m->n_objects, sizeof(*m->objects)) != 0)
    return STK_ENOMEM;
  struct ckpt_object o = {.key = strdup(key), .size_bytes = size_bytes, .n_blocks = n_crcs};
  o.block_crc32c = malloc((n_crcs ? n_crcs : 1) * sizeof(uint32_t));
  if (!o.key || !o.block_crc32c) {
    free(o.key);
    free(o.block_crc32c);
    return STK_ENOMEM;
  }
  if (n_crcs > 0) memcpy(o.block_crc32c, crcs, n_crcs * sizeof(uint32_t));
  if (ret_index) *ret_index = (uint32_t)m->n_objects;
  m->objects[m->n_objects++] = o;
  return 0;
}

int ckpt_manifest_add_chunk(struct ckpt_manifest *m, const char *tensor, int dtype,
                            const struct ckpt_shape *shape, const struct ckpt_box *box,
                            uint32_t object, uint64_t object_offset) {
  struct ckpt_chunk c = {.tensor = (char *)tensor,
                         .dtype = dtype,
                         .shape = *shape,
                         .box = *box,
                         .object = object,
                         .object_offset = object_offset};
  /* The length a well-formed chunk has; check_chunk reports the rest. */
  uint64_t numel, elem = ckpt_dtype_bytes(dtype);
  if (elem && ckpt_shape_check(shape, elem, &numel) == 0 && ckpt_box_check(box, shape) == 0)
    c.length = ckpt_box_numel(box) * elem;
  int rc = ckpt_manifest_check_chunk(m, &c, m->n_chunks);
  if (rc == 0 && m->n_chunks >= CKPT_MANIFEST_MAX_CHUNKS) {
    stk_set_detail("more than %zu chunks", CKPT_MANIFEST_MAX_CHUNKS);
    rc = STK_EINVAL;
  }
  if (rc != 0) return rc;
  if (grow((void **)&m->chunks, &m->cap_chunks, m->n_chunks, sizeof(*m->chunks)) != 0 ||
      !(c.tensor = strdup(tensor)))
    return STK_ENOMEM;
  m->chunks[m->n_chunks++] = c;
  free(m->by_tensor); /* Stale now. */
  m->by_tensor = NULL;
  return 0;
}

int ckpt_manifest_index(struct ckpt_manifest *m) {
  struct named *v = malloc((m->n_chunks ? m->n_chunks : 1) * sizeof(*v));
  size_t *idx = malloc((m->n_chunks ? m->n_chunks : 1) * sizeof(*idx));
  if (!v || !idx) {
    free(v);
    free(idx);
    return STK_ENOMEM;
  }
  for (size_t i = 0; i < m->n_chunks; i++) v[i] = (struct named){m->chunks[i].tensor, i};
  qsort(v, m->n_chunks, sizeof(*v), by_name_then_index);
  for (size_t i = 0; i < m->n_chunks; i++) idx[i] = v[i].i;
  free(v);
  free(m->by_tensor);
  m->by_tensor = idx;
  return 0;
}

int ckpt_manifest_tensor(const struct ckpt_manifest *m, const char *tensor,
                         struct ckpt_stored_chunk **ret_chunks, size_t *ret_count, int *ret_dtype,
                         struct ckpt_shape *ret_shape) {
  size_t first, n;
  if (m->by_tensor) {
    first = lower_bound(m, tensor);
    for (n = 0; first + n < m->n_chunks; n++)
      if (strcmp(m->chunks[m->by_tensor[first + n]].tensor, tensor) != 0) break;
  } else {
    for (first = 0; first < m->n_chunks; first++)
      if (strcmp(m->chunks[first].tensor, tensor) == 0) break;
    n = 0;
    for (size_t i = first; i < m->n_chunks; i++) n += strcmp(m->chunks[i].tensor, tensor) == 0;
  }
  if (n == 0) {
    stk_set_detail("no tensor \"%s\" in the checkpoint", tensor);
    return STK_ENOENT;
  }
  struct ckpt_stored_chunk *v = malloc(n * sizeof(*v));
  if (!v) return STK_ENOMEM;
  for (size_t k = 0, i = first; k < n; i++) {
    size_t at = m->by_tensor ? m->by_tensor[first + k] : i;
    const struct ckpt_chunk *c = &m->chunks[at];
    if (!m->by_tensor && strcmp(c->tensor, tensor) != 0) continue;
    v[k++] = (struct ckpt_stored_chunk){c->box, c->object, c->object_offset,
                                        m->objects[c->object].size_bytes};
  }
  const struct ckpt_chunk *c0 = &m->chunks[m->by_tensor ? m->by_tensor[first] : first];
  *ret_chunks = v;
  *ret_count = n;
  *ret_dtype = c0->dtype;
  *ret_shape = c0->shape;
  return 0;
}

static int by_name_then_index(const void *pa, const void *pb) {
  const struct named *a = pa, *b = pb;
  int c = strcmp(a->name, b->name);
  return c ? c : (a->i > b->i) - (a->i < b->i);
}

/* The first place in the index whose tensor is not below name. */
static size_t lower_bound(const struct ckpt_manifest *m, const char *name) {
  size_t lo = 0, hi = m->n_chunks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(m->chunks[m->by_tensor[mid]].tensor, name) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}
