/*
 * The renderings of cli_ckpt_format.h: `checkpoint list`, `checkpoint
 * show` (table or JSON) and `checkpoint verify`, as tables for people or
 * one JSON object per line for tooling.
 */
#include "cli_ckpt_format.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli_format.h"

/* The enum's own names (DTYPE_F32 -> "F32"), from the generated descriptor. */
const char *fmt_dtype(int dtype, char *buf, size_t len) {
  return fmt_enum_name(&stoker__v1__dtype__descriptor, dtype, buf, len);
}

void fmt_bytes(uint64_t bytes, char *buf, size_t len) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) {
    snprintf(buf, len, "%" PRIu64 " B", bytes);
    return;
  }
  double v = (double)bytes / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    u++;
  }
  snprintf(buf, len, "%.1f %s", v, units[u]);
}

void fmt_ckpt_list(const Stoker__V1__ListCheckpointsResponse *l, FILE *out) {
  static const char *const headers[] = {"STEP", "COMMITTED", "GENERATION", "URI"};
  struct table *t = table_new(4, headers);
  for (size_t i = 0; i < l->n_checkpoints; i++) {
    const Stoker__V1__CheckpointRef *r = l->checkpoints[i];
    char step[24], when[40], gen[24];
    snprintf(step, sizeof(step), "%" PRId64, r->step);
    fmt_time_ms(r->committed_at_ms, when, sizeof(when));
    snprintf(gen, sizeof(gen), "%" PRIu64, r->generation);
    const char *row[] = {step, when, gen, r->uri};
    table_add(t, row);
  }
  table_print(t, out);
  table_free(t);
}

cJSON *fmt_ckpt_list_json(const char *job, const Stoker__V1__ListCheckpointsResponse *l) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "job", job);
  cJSON *a = cJSON_AddArrayToObject(o, "checkpoints");
  for (size_t i = 0; i < l->n_checkpoints; i++)
    cJSON_AddItemToArray(a, fmt_message_json(&l->checkpoints[i]->base));
  return o;
}

/* ---------------------------------------------------------------- show */

/* One row of the per-tensor table. */
struct tensor_row {
  const Stoker__V1__ChunkEntry *first;
  size_t chunks;
  uint64_t bytes;
  bool *objects; /* Which objects its chunks lie in. */
};

static size_t object_index(const Stoker__V1__Manifest *m, const char *key) {
  for (size_t i = 0; i < m->n_objects; i++)
    if (strcmp(m->objects[i]->key, key) == 0) return i;
  return m->n_objects;
}

static void shape_text(const Stoker__V1__ChunkEntry *c, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (size_t i = 0; i < c->n_global_shape && at < len; i++)
    at += (size_t)snprintf(buf + at, len - at, "%s%" PRIu64, i ? ", " : "", c->global_shape[i]);
  if (at < len) snprintf(buf + at, len - at, "]");
}

/* Groups chunks per tensor in order of first appearance; returns rows. */
static struct tensor_row *group(const Stoker__V1__Manifest *m, size_t *ret_n) {
  struct tensor_row *rows = calloc(m->n_chunks + 1, sizeof(*rows));
  size_t n = 0;
  for (size_t i = 0; rows && i < m->n_chunks; i++) {
    const Stoker__V1__ChunkEntry *c = m->chunks[i];
    size_t r = 0;
    while (r < n && strcmp(rows[r].first->tensor, c->tensor) != 0) r++;
    if (r == n) {
      rows[n].first = c;
      rows[n++].objects = calloc(m->n_objects + 1, sizeof(bool));
    }
    rows[r].chunks++;
    rows[r].bytes += c->length;
    size_t o = object_index(m, c->object);
    if (rows[r].objects && o < m->n_objects) rows[r].objects[o] = true;
  }
  *ret_n = n;
  return rows;
}

static void summary(const Stoker__V1__Manifest *m, FILE *out) {
  uint64_t total = 0;
  for (size_t i = 0; i < m->n_objects; i++) total += m->objects[i]->size;
  char when[40], size[32];
  fmt_time_ms(m->created_at_ms, when, sizeof(when));
  fmt_bytes(total, size, sizeof(size));
  fprintf(out,
          "checkpoint %s step %" PRId64 "\n  world %u, attempt %s, created %s\n"
          "  %zu objects, %s, %zu chunks, format %u\n\n",
          m->job, m->step, m->world, m->attempt, when, m->n_objects, size, m->n_chunks,
          m->format_version);
}

void fmt_manifest_show(const Stoker__V1__Manifest *m, FILE *out) {
  summary(m, out);
  static const char *const headers[] = {"TENSOR", "DTYPE", "SHAPE", "CHUNKS", "OBJECTS", "BYTES"};
  struct table *t = table_new(6, headers);
  size_t n = 0;
  struct tensor_row *rows = group(m, &n);
  for (size_t r = 0; rows && r < n; r++) {
    char dt[24], shape[160], chunks[24], objs[24], bytes[32];
    size_t no = 0;
    for (size_t o = 0; rows[r].objects && o < m->n_objects; o++) no += rows[r].objects[o];
    fmt_dtype(rows[r].first->dtype, dt, sizeof(dt));
    shape_text(rows[r].first, shape, sizeof(shape));
    snprintf(chunks, sizeof(chunks), "%zu", rows[r].chunks);
    snprintf(objs, sizeof(objs), "%zu", no);
    fmt_bytes(rows[r].bytes, bytes, sizeof(bytes));
    const char *row[] = {rows[r].first->tensor, dt, shape, chunks, objs, bytes};
    table_add(t, row);
    free(rows[r].objects);
  }
  free(rows);
  table_print(t, out);
  table_free(t);
}

/* ---------------------------------------------------------------- JSON */

/* The manifest as stored, every field (cli_json.c); a chunk without a box
 * (none is written so) shows an empty one, as stoker.jobs does. */
cJSON *fmt_manifest_json(const Stoker__V1__Manifest *m) {
  cJSON *o = fmt_message_json(&m->base);
  cJSON *chunks = cJSON_GetObjectItemCaseSensitive(o, "chunks");
  for (size_t i = 0; i < m->n_chunks; i++) {
    if (m->chunks[i]->box) continue;
    Stoker__V1__Box empty = STOKER__V1__BOX__INIT;
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(chunks, (int)i), "box",
                              fmt_message_json(&empty.base));
  }
  return o;
}

/* -------------------------------------------------------------- verify */

void fmt_verify_report(const char *job, int64_t step, const Stoker__V1__VerifyCheckpointResponse *v,
                       FILE *out) {
  char size[32];
  fmt_bytes(v->bytes, size, sizeof(size));
  fprintf(out, "checkpoint %s step %" PRId64 ": %s, %" PRIu64 " objects, %s, %" PRIu64 " blocks\n",
          job, step, v->n_problems ? "CORRUPT" : "OK", v->objects, size, v->blocks);
  for (size_t i = 0; i < v->n_problems; i++) fprintf(out, "  %s\n", v->problems[i]);
}

cJSON *fmt_verify_json(const char *job, int64_t step,
                       const Stoker__V1__VerifyCheckpointResponse *v) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "job", job);
  cJSON_AddNumberToObject(o, "step", (double)step);
  cJSON_AddBoolToObject(o, "ok", v->n_problems == 0);
  fmt_add_fields_json(o, &v->base);
  return o;
}

void fmt_progress(uint64_t done, uint64_t total, int width, char *buf, size_t len) {
  if (done > total) done = total;
  double frac = total ? (double)done / (double)total : 1.0;
  int fill = (int)(frac * width);
  char bar[256];
  if (width > (int)sizeof(bar) - 1) width = (int)sizeof(bar) - 1;
  for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
  bar[width] = '\0';
  char d[32], t[32];
  fmt_bytes(done, d, sizeof(d));
  fmt_bytes(total, t, sizeof(t));
  snprintf(buf, len, "[%s] %3d%%  %s / %s", bar, (int)(frac * 100), d, t);
}
