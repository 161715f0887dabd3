/*
 * ckpt_manifest_json: the human rendering of a manifest (`stokerctl
 * checkpoint show`, debugging). Tensors are listed by name with their chunks;
 * 64-bit numbers above 2^53 become strings, as JSON numbers are doubles.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_dtype.h"
#include "ckpt_manifest.h"
#include "stk_error.h"

#define EXACT_DOUBLE_MAX (UINT64_C(1) << 53)

static cJSON *u64_item(uint64_t v) {
  if (v <= EXACT_DOUBLE_MAX) return cJSON_CreateNumber((double)v);
  char s[24];
  snprintf(s, sizeof(s), "%llu", (unsigned long long)v);
  return cJSON_CreateString(s);
}

static void add_u64(cJSON *obj, const char *name, uint64_t v) {
  cJSON_AddItemToObject(obj, name, u64_item(v));
}

static cJSON *u64_array(const uint64_t *v, uint32_t n) {
  cJSON *a = cJSON_CreateArray();
  for (uint32_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, u64_item(v[i]));
  return a;
}

static cJSON *chunk_json(const struct ckpt_manifest *m, const struct ckpt_chunk *c) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddItemToObject(j, "offsets", u64_array(c->box.offsets, c->box.ndim));
  cJSON_AddItemToObject(j, "sizes", u64_array(c->box.sizes, c->box.ndim));
  cJSON_AddStringToObject(j, "object", m->objects[c->object].key);
  add_u64(j, "object_offset", c->object_offset);
  add_u64(j, "length", c->length);
  return j;
}

static cJSON *object_json(const struct ckpt_object *o, bool with_crcs) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "key", o->key);
  add_u64(j, "size", o->size_bytes);
  add_u64(j, "blocks", o->n_blocks);
  if (!with_crcs) return j;
  cJSON *crcs = cJSON_AddArrayToObject(j, "block_crc32c");
  for (size_t i = 0; crcs && i < o->n_blocks; i++) {
    char hex[9];
    snprintf(hex, sizeof(hex), "%08x", o->block_crc32c[i]);
    cJSON_AddItemToArray(crcs, cJSON_CreateString(hex));
  }
  return j;
}

static _Thread_local const struct ckpt_manifest *sorting;

static int by_tensor(const void *pa, const void *pb) {
  size_t x = *(const size_t *)pa, y = *(const size_t *)pb;
  int c = strcmp(sorting->chunks[x].tensor, sorting->chunks[y].tensor);
  return c ? c : (x < y ? -1 : x > y);
}

/* Appends one tensor (chunks idx[0..n)) to the array; returns its bytes. */
static uint64_t add_tensor(cJSON *tensors, const struct ckpt_manifest *m, const size_t *idx,
                           size_t n) {
  const struct ckpt_chunk *first = &m->chunks[idx[0]];
  cJSON *t = cJSON_CreateObject();
  cJSON_AddStringToObject(t, "name", first->tensor);
  cJSON_AddStringToObject(t, "dtype", ckpt_dtype_name(first->dtype));
  cJSON_AddItemToObject(t, "shape", u64_array(first->shape.dims, first->shape.ndim));
  cJSON *chunks = cJSON_AddArrayToObject(t, "chunks");
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    bytes += m->chunks[idx[i]].length;
    cJSON_AddItemToArray(chunks, chunk_json(m, &m->chunks[idx[i]]));
  }
  add_u64(t, "bytes", bytes);
  cJSON_AddItemToArray(tensors, t);
  return bytes;
}

static uint64_t add_tensors(cJSON *root, const struct ckpt_manifest *m, size_t *idx) {
  for (size_t i = 0; i < m->n_chunks; i++) idx[i] = i;
  sorting = m;
  qsort(idx, m->n_chunks, sizeof(*idx), by_tensor);
  sorting = NULL;
  cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
  uint64_t total = 0;
  size_t start = 0;
  for (size_t i = 1; i <= m->n_chunks; i++) {
    if (i < m->n_chunks && strcmp(m->chunks[idx[i]].tensor, m->chunks[idx[start]].tensor) == 0)
      continue;
    total += add_tensor(tensors, m, idx + start, i - start);
    start = i;
  }
  return total;
}

int ckpt_manifest_to_json(const struct ckpt_manifest *m, bool with_crcs, char **ret_json) {
  size_t *idx = malloc((m->n_chunks ? m->n_chunks : 1) * sizeof(*idx));
  cJSON *root = cJSON_CreateObject();
  char *text = NULL;
  if (idx && root) {
    cJSON_AddStringToObject(root, "job", m->job);
    cJSON_AddNumberToObject(root, "step", (double)m->step);
    cJSON_AddNumberToObject(root, "world", m->world);
    cJSON_AddStringToObject(root, "attempt", m->attempt);
    cJSON_AddNumberToObject(root, "created_at_ms", (double)m->created_at_ms);
    cJSON_AddNumberToObject(root, "format_version", CKPT_MANIFEST_FORMAT);
    add_u64(root, "total_bytes", add_tensors(root, m, idx));
    cJSON *objects = cJSON_AddArrayToObject(root, "objects");
    for (size_t i = 0; objects && i < m->n_objects; i++)
      cJSON_AddItemToArray(objects, object_json(&m->objects[i], with_crcs));
    text = cJSON_Print(root);
  }
  cJSON_Delete(root);
  free(idx);
  if (!text) return STK_ENOMEM;
  *ret_json = text;
  return 0;
}
