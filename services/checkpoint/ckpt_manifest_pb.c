/*
 * ckpt_manifest_pb: the manifest's storage format, stoker.v1.Manifest
 * (protobuf-c). Packing borrows the manifest's memory into temporary message
 * structs; parsing bounds the input, decodes, copies only after the structural
 * limits (dims, counts) are known to fit, and then runs the full check.
 */
#include <stdlib.h>
#include <string.h>

#include "ckpt_crc.h"
#include "ckpt_manifest.h"
#include "stk_error.h"
#include "stoker/v1/checkpoint.pb-c.h"

/* Temporary message structs for packing, all borrowed from the manifest. */
struct pb_tmp {
  Stoker__V1__ObjectEntry *objects, **object_ptrs;
  Stoker__V1__ChunkEntry *chunks, **chunk_ptrs;
  Stoker__V1__Box *boxes;
};

static void tmp_free(struct pb_tmp *t) {
  free(t->objects);
  free(t->object_ptrs);
  free(t->chunks);
  free(t->chunk_ptrs);
  free(t->boxes);
}

static void fill_chunk(const struct ckpt_manifest *m, const struct ckpt_chunk *c,
                       Stoker__V1__ChunkEntry *e, Stoker__V1__Box *b) {
  stoker__v1__box__init(b);
  b->n_offsets = b->n_sizes = c->box.ndim;
  b->offsets = (uint64_t *)c->box.offsets;
  b->sizes = (uint64_t *)c->box.sizes;
  stoker__v1__chunk_entry__init(e);
  e->tensor = c->tensor;
  e->dtype = (Stoker__V1__DType)c->dtype;
  e->n_global_shape = c->shape.ndim;
  e->global_shape = (uint64_t *)c->shape.dims;
  e->box = b;
  e->object = m->objects[c->object].key;
  e->object_offset = c->object_offset;
  e->length = c->length;
}

int ckpt_manifest_pack(const struct ckpt_manifest *m, uint8_t **ret_buf, size_t *ret_len) {
  struct pb_tmp t = {0};
  size_t no = m->n_objects ? m->n_objects : 1, nc = m->n_chunks ? m->n_chunks : 1;
  t.objects = calloc(no, sizeof(*t.objects));
  t.object_ptrs = calloc(no, sizeof(*t.object_ptrs));
  t.chunks = calloc(nc, sizeof(*t.chunks));
  t.chunk_ptrs = calloc(nc, sizeof(*t.chunk_ptrs));
  t.boxes = calloc(nc, sizeof(*t.boxes));
  uint8_t *buf = NULL;
  int rc = STK_ENOMEM;
  if (!t.objects || !t.object_ptrs || !t.chunks || !t.chunk_ptrs || !t.boxes) goto out;
  Stoker__V1__Manifest pm = STOKER__V1__MANIFEST__INIT;
  pm.job = m->job;
  pm.step = m->step;
  pm.world = m->world;
  pm.attempt = m->attempt;
  pm.format_version = CKPT_MANIFEST_FORMAT;
  pm.crc_block_bytes = (uint32_t)CKPT_CRC_BLOCK_BYTES;
  pm.created_at_ms = m->created_at_ms;
  for (size_t i = 0; i < m->n_objects; i++) {
    Stoker__V1__ObjectEntry *e = &t.objects[i];
    stoker__v1__object_entry__init(e);
    e->key = m->objects[i].key;
    e->size = m->objects[i].size_bytes;
    e->n_block_crc32c = m->objects[i].n_blocks;
    e->block_crc32c = m->objects[i].block_crc32c;
    t.object_ptrs[i] = e;
  }
  for (size_t i = 0; i < m->n_chunks; i++) {
    fill_chunk(m, &m->chunks[i], &t.chunks[i], &t.boxes[i]);
    t.chunk_ptrs[i] = &t.chunks[i];
  }
  pm.n_objects = m->n_objects;
  pm.objects = t.object_ptrs;
  pm.n_chunks = m->n_chunks;
  pm.chunks = t.chunk_ptrs;
  size_t len = stoker__v1__manifest__get_packed_size(&pm);
  if (!(buf = malloc(len ? len : 1))) goto out;
  stoker__v1__manifest__pack(&pm, buf);
  *ret_buf = buf;
  *ret_len = len;
  rc = 0;
out:
  tmp_free(&t);
  return rc;
}

/* Object key -> index, by binary search over indices sorted by key. */
static _Thread_local const Stoker__V1__Manifest *sorting;

static int by_key(const void *pa, const void *pb) {
  return strcmp(sorting->objects[*(const size_t *)pa]->key,
                sorting->objects[*(const size_t *)pb]->key);
}

static long find_object(const Stoker__V1__Manifest *pm, const size_t *idx, const char *key) {
  size_t lo = 0, hi = pm->n_objects;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(pm->objects[idx[mid]]->key, key);
    if (c == 0) return (long)idx[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return -1;
}

static int corrupt(const char *what, size_t i) {
  stk_set_detail("manifest chunk %zu: %s", i, what);
  return STK_ECORRUPT;
}

/* Copies one decoded chunk; structural limits only (values: the check). */
static int convert_chunk(const Stoker__V1__Manifest *pm, const size_t *idx, size_t i,
                         struct ckpt_chunk *c) {
  const Stoker__V1__ChunkEntry *e = pm->chunks[i];
  const Stoker__V1__Box *b = e->box;
  size_t nb = b ? b->n_offsets : 0;
  if (e->n_global_shape > CKPT_MAX_DIMS) return corrupt("too many dims", i);
  if (b && b->n_offsets != b->n_sizes) return corrupt("box offsets and sizes differ in count", i);
  if (nb > CKPT_MAX_DIMS) return corrupt("box has too many dims", i);
  long obj = find_object(pm, idx, e->object);
  if (obj < 0) return corrupt("names an object the manifest does not list", i);
  *c = (struct ckpt_chunk){.dtype = e->dtype,
                           .object = (uint32_t)obj,
                           .object_offset = e->object_offset,
                           .length = e->length};
  c->shape.ndim = (uint32_t)e->n_global_shape;
  if (e->n_global_shape > 0)
    memcpy(c->shape.dims, e->global_shape, e->n_global_shape * sizeof(uint64_t));
  c->box.ndim = (uint32_t)nb;
  if (nb > 0) {
    memcpy(c->box.offsets, b->offsets, nb * sizeof(uint64_t));
    memcpy(c->box.sizes, b->sizes, nb * sizeof(uint64_t));
  }
  return (c->tensor = strdup(e->tensor)) ? 0 : STK_ENOMEM;
}

static int convert_objects(const Stoker__V1__Manifest *pm, struct ckpt_manifest *m) {
  m->objects = calloc(pm->n_objects ? pm->n_objects : 1, sizeof(*m->objects));
  if (!m->objects) return STK_ENOMEM;
  for (size_t i = 0; i < pm->n_objects; i++) {
    const Stoker__V1__ObjectEntry *e = pm->objects[i];
    struct ckpt_object *o = &m->objects[m->n_objects++];
    o->key = strdup(e->key);
    o->size_bytes = e->size;
    o->n_blocks = e->n_block_crc32c;
    o->block_crc32c = malloc((o->n_blocks ? o->n_blocks : 1) * sizeof(uint32_t));
    if (!o->key || !o->block_crc32c) return STK_ENOMEM;
    if (o->n_blocks) memcpy(o->block_crc32c, e->block_crc32c, o->n_blocks * sizeof(uint32_t));
  }
  return 0;
}

static int convert(const Stoker__V1__Manifest *pm, struct ckpt_manifest *m) {
  if (!(m->job = strdup(pm->job)) || !(m->attempt = strdup(pm->attempt))) return STK_ENOMEM;
  m->step = pm->step;
  m->world = pm->world;
  m->created_at_ms = pm->created_at_ms;
  int rc = convert_objects(pm, m);
  size_t *idx = malloc((pm->n_objects ? pm->n_objects : 1) * sizeof(*idx));
  m->chunks = calloc(pm->n_chunks ? pm->n_chunks : 1, sizeof(*m->chunks));
  if (rc == 0 && (!idx || !m->chunks)) rc = STK_ENOMEM;
  if (m->chunks) m->n_chunks = pm->n_chunks; /* Unconverted entries stay NULL. */
  if (rc == 0) {
    for (size_t i = 0; i < pm->n_objects; i++) idx[i] = i;
    sorting = pm;
    qsort(idx, pm->n_objects, sizeof(*idx), by_key);
    sorting = NULL;
  }
  for (size_t i = 0; rc == 0 && i < pm->n_chunks; i++)
    rc = convert_chunk(pm, idx, i, &m->chunks[i]);
  free(idx);
  return rc;
}

static int check_limits(const Stoker__V1__Manifest *pm) {
  if (pm->format_version != CKPT_MANIFEST_FORMAT) {
    stk_set_detail("manifest format %u; this build reads %d", pm->format_version,
                   CKPT_MANIFEST_FORMAT);
    return pm->format_version > CKPT_MANIFEST_FORMAT ? STK_ENOTSUP : STK_ECORRUPT;
  }
  if (pm->crc_block_bytes != CKPT_CRC_BLOCK_BYTES) {
    stk_set_detail("manifest CRC block of %u bytes; expected %llu", pm->crc_block_bytes,
                   (unsigned long long)CKPT_CRC_BLOCK_BYTES);
    return STK_ECORRUPT;
  }
  if (pm->n_chunks > CKPT_MANIFEST_MAX_CHUNKS || pm->n_objects > CKPT_MANIFEST_MAX_OBJECTS) {
    stk_set_detail("manifest lists %zu chunks and %zu objects: too many", pm->n_chunks,
                   pm->n_objects);
    return STK_ECORRUPT;
  }
  return 0;
}

int ckpt_manifest_parse(const uint8_t *buf, size_t len, struct ckpt_manifest **ret_manifest) {
  if (len > CKPT_MANIFEST_MAX_BYTES) {
    stk_set_detail("manifest of %zu bytes exceeds %zu", len, CKPT_MANIFEST_MAX_BYTES);
    return STK_ETOOBIG;
  }
  Stoker__V1__Manifest *pm = stoker__v1__manifest__unpack(NULL, len, buf);
  if (!pm) {
    stk_set_detail("manifest is not a decodable stoker.v1.Manifest");
    return STK_ECORRUPT;
  }
  struct ckpt_manifest *m = calloc(1, sizeof(*m));
  int rc = m ? check_limits(pm) : STK_ENOMEM;
  if (rc == 0) rc = convert(pm, m);
  stoker__v1__manifest__free_unpacked(pm, NULL);
  if (rc == 0) rc = ckpt_manifest_check(m);
  if (rc == STK_EINVAL) rc = STK_ECORRUPT;
  if (rc != 0) {
    ckpt_manifest_free(m);
    return rc;
  }
  *ret_manifest = m;
  return 0;
}
