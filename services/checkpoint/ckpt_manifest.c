/*
 * ckpt_manifest: building a manifest in memory (the service adds objects as
 * their uploads finish and chunks as ranks stream them) and the lookups a
 * restore needs.
 */
#include "ckpt_manifest.h"

#include <stdlib.h>
#include <string.h>

#include "ckpt_crc.h"
#include "ckpt_dtype.h"
#include "ckpt_names.h"
#include "stk_error.h"

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
  return 0;
}

int ckpt_manifest_tensor(const struct ckpt_manifest *m, const char *tensor,
                         struct ckpt_stored_chunk **ret_chunks, size_t *ret_count, int *ret_dtype,
                         struct ckpt_shape *ret_shape) {
  size_t n = 0;
  const struct ckpt_chunk *first = NULL;
  for (size_t i = 0; i < m->n_chunks; i++) {
    if (strcmp(m->chunks[i].tensor, tensor) != 0) continue;
    if (!first) first = &m->chunks[i];
    n++;
  }
  if (!first) {
    stk_set_detail("no tensor \"%s\" in the checkpoint", tensor);
    return STK_ENOENT;
  }
  struct ckpt_stored_chunk *v = malloc(n * sizeof(*v));
  if (!v) return STK_ENOMEM;
  n = 0;
  for (size_t i = 0; i < m->n_chunks; i++) {
    const struct ckpt_chunk *c = &m->chunks[i];
    if (strcmp(c->tensor, tensor) != 0) continue;
    v[n++] = (struct ckpt_stored_chunk){c->box, c->object, c->object_offset,
                                        m->objects[c->object].size_bytes};
  }
  *ret_chunks = v;
  *ret_count = n;
  *ret_dtype = first->dtype;
  *ret_shape = first->shape;
  return 0;
}
