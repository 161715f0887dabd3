/*
 * The synthetic source (documents computed, never stored) and the writers
 * that put the same corpus on disk in the Megatron and llm.c formats, so the
 * real readers and the daemon can be tested against traceable tokens.
 */
#include "dl_synthetic.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl_source_internal.h"
#include "stk_error.h"

struct synthetic {
  struct dl_source base;
  uint64_t seed;
  uint32_t min_len, max_len;
};

static uint64_t splitmix64(uint64_t x) {
  x += UINT64_C(0x9E3779B97F4A7C15);
  x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
  return x ^ (x >> 31);
}

uint32_t dl_synthetic_doc_len(uint64_t seed, uint32_t min_len, uint32_t max_len, uint64_t doc) {
  uint64_t span = (uint64_t)max_len - min_len + 1;
  return min_len + (uint32_t)(splitmix64(seed ^ (doc * UINT64_C(0x9E3779B97F4A7C15))) % span);
}

static int check_limits(uint64_t n_docs, uint32_t min_len, uint32_t max_len) {
  if (n_docs > DL_SYNTHETIC_MAX_DOCS || max_len > DL_SYNTHETIC_MAX_LEN || min_len > max_len) {
    stk_set_detail("synthetic: need n_docs <= %llu, min_len <= max_len <= %u (got %llu, %u, %u)",
                   (unsigned long long)DL_SYNTHETIC_MAX_DOCS, DL_SYNTHETIC_MAX_LEN,
                   (unsigned long long)n_docs, min_len, max_len);
    return STK_EINVAL;
  }
  return 0;
}

static uint64_t synthetic_weight(const struct dl_source *s, uint64_t u) {
  const struct synthetic *y = (const struct synthetic *)s;
  return dl_synthetic_doc_len(y->seed, y->min_len, y->max_len, u);
}

static int synthetic_read(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit) {
  uint32_t len = (uint32_t)synthetic_weight(s, u);
  ret_unit->tokens = malloc((len ? len : 1) * sizeof(uint32_t));
  ret_unit->doc_starts = malloc(sizeof(uint32_t));
  if (!ret_unit->tokens || !ret_unit->doc_starts) return STK_ENOMEM;
  for (uint32_t p = 0; p < len; p++) ret_unit->tokens[p] = dl_synthetic_token(u, p);
  ret_unit->n_tokens = len;
  ret_unit->doc_starts[0] = 0;
  ret_unit->n_docs = 1;
  return 0;
}

/* One "file" whose document u is unit u. */
static int synthetic_unit_docs(struct dl_source *s, uint64_t u, struct dl_unit_docs *ret_docs) {
  (void)s;
  ret_docs->base = u;
  return 0;
}

static int synthetic_file_docs(struct dl_source *s, uint32_t file, uint64_t *ret_docs) {
  (void)file;
  *ret_docs = s->n_units;
  return 0;
}

static void synthetic_free(struct dl_source *s) {
  dl_source_base_close(s);
  free(s);
}

static const struct dl_source_ops synthetic_ops = {.unit_weight = synthetic_weight,
                                                   .read_unit = synthetic_read,
                                                   .free = synthetic_free,
                                                   .unit_docs = synthetic_unit_docs,
                                                   .file_docs = synthetic_file_docs};

int dl_source_open_synthetic(const char *name, uint64_t n_docs, uint32_t min_len, uint32_t max_len,
                             uint64_t seed, struct dl_source **ret) {
  int rc = check_limits(n_docs, min_len, max_len);
  if (rc < 0) return rc;
  struct synthetic *y = calloc(1, sizeof *y);
  if (!y) return STK_ENOMEM;
  struct dl_source_opts opts = {.name = name ? name : "synthetic"};
  char *file = "synthetic";
  rc = dl_source_base_init(&y->base, &synthetic_ops, &opts);
  if (rc == 0) rc = dl_source_set_files(&y->base, &file, 1, NULL);
  if (rc < 0) {
    synthetic_free(&y->base);
    return rc;
  }
  y->seed = seed;
  y->min_len = min_len;
  y->max_len = max_len;
  y->base.n_units = n_docs;
  for (uint64_t d = 0; d < n_docs; d++)
    y->base.total_weight += dl_synthetic_doc_len(seed, min_len, max_len, d);
  *ret = &y->base;
  return 0;
}

/* Buffered output that remembers the first error. */
struct out {
  FILE *f;
  const char *path;
  int err;
};

static void out_put(struct out *o, const void *p, size_t n) {
  if (o->err == 0 && fwrite(p, 1, n, o->f) != n) o->err = errno ? errno : EIO;
}

static int out_open(struct out *o, const char *path) {
  o->path = path;
  o->err = 0;
  o->f = fopen(path, "wb");
  if (!o->f) {
    stk_set_detail("%s: %s", path, strerror(errno));
    return STK_EIO;
  }
  return 0;
}

static int out_close(struct out *o) {
  if (fclose(o->f) != 0 && o->err == 0) o->err = errno;
  if (o->err == 0) return 0;
  stk_set_detail("%s: write: %s", o->path, strerror(o->err));
  return STK_EIO;
}

/* The .bin: every document's tokens, in the dtype's width. */
static int write_megatron_bin(const char *path, uint64_t n_docs, uint32_t min_len, uint32_t max_len,
                              uint64_t seed, int dtype) {
  struct out o;
  int rc = out_open(&o, path);
  if (rc < 0) return rc;
  for (uint64_t d = 0; d < n_docs; d++) {
    uint32_t len = dl_synthetic_doc_len(seed, min_len, max_len, d);
    for (uint32_t p = 0; p < len; p++) {
      uint32_t t = dl_synthetic_token(d, p);
      int32_t t32 = (int32_t)t;
      int64_t t64 = t;
      if (dtype == 4)
        out_put(&o, &t32, 4);
      else
        out_put(&o, &t64, 8);
    }
  }
  return out_close(&o);
}

/* Counts the sequences a document is cut into (at least one). */
static uint64_t doc_seqs(uint32_t len, uint32_t seq_tokens) {
  if (seq_tokens == 0 || len == 0) return 1;
  return (len + seq_tokens - 1) / seq_tokens;
}

static void put_idx_arrays(struct out *o, uint64_t n_docs, uint32_t min_len, uint32_t max_len,
                           uint64_t seed, int dtype, uint32_t seq_tokens, int which) {
  int64_t ptr = 0, seq = 0;
  if (which == 2) out_put(o, &seq, 8);
  for (uint64_t d = 0; d < n_docs; d++) {
    uint32_t len = dl_synthetic_doc_len(seed, min_len, max_len, d), done = 0;
    for (uint64_t k = doc_seqs(len, seq_tokens); k > 0; k--) {
      int32_t n = (int32_t)(seq_tokens && len - done > seq_tokens ? seq_tokens : len - done);
      if (which == 0) out_put(o, &n, 4);
      if (which == 1) out_put(o, &ptr, 8);
      ptr += (int64_t)n * (dtype == 4 ? 4 : 8);
      done += (uint32_t)n;
      seq++;
    }
    if (which == 2) out_put(o, &seq, 8);
  }
}

static int write_megatron_idx(const char *path, uint64_t n_docs, uint32_t min_len, uint32_t max_len,
                              uint64_t seed, int dtype, uint32_t seq_tokens) {
  uint64_t n_seqs = 0;
  for (uint64_t d = 0; d < n_docs; d++)
    n_seqs += doc_seqs(dl_synthetic_doc_len(seed, min_len, max_len, d), seq_tokens);
  struct out o;
  int rc = out_open(&o, path);
  if (rc < 0) return rc;
  uint64_t version = 1, n_doc_idx = n_docs + 1;
  uint8_t code = (uint8_t)dtype;
  out_put(&o, "MMIDIDX\0\0", 9);
  out_put(&o, &version, 8);
  out_put(&o, &code, 1);
  out_put(&o, &n_seqs, 8);
  out_put(&o, &n_doc_idx, 8);
  for (int which = 0; which < 3; which++)
    put_idx_arrays(&o, n_docs, min_len, max_len, seed, dtype, seq_tokens, which);
  return out_close(&o);
}

int dl_synthetic_write_megatron(const char *prefix, uint64_t n_docs, uint32_t min_len,
                                uint32_t max_len, uint64_t seed, int dtype, uint32_t seq_tokens) {
  int rc = check_limits(n_docs, min_len, max_len);
  if (rc < 0) return rc;
  if ((dtype != 4 && dtype != 5) || (dtype == 4 && n_docs > (UINT64_C(1) << 19))) {
    stk_set_detail("synthetic megatron: dtype must be 4 (n_docs <= 2^19) or 5, got %d", dtype);
    return STK_EINVAL;
  }
  size_t n = strlen(prefix) + 5;
  char *path = malloc(n);
  if (!path) return STK_ENOMEM;
  snprintf(path, n, "%s.bin", prefix);
  rc = write_megatron_bin(path, n_docs, min_len, max_len, seed, dtype);
  if (rc == 0) {
    snprintf(path, n, "%s.idx", prefix);
    rc = write_megatron_idx(path, n_docs, min_len, max_len, seed, dtype, seq_tokens);
  }
  free(path);
  return rc;
}

int dl_synthetic_write_llmc(const char *path, uint64_t first_doc, uint64_t n_docs, uint32_t min_len,
                            uint32_t max_len, uint64_t seed) {
  int rc = check_limits(first_doc + n_docs, min_len, max_len);
  if (rc < 0) return rc;
  uint64_t n_tokens = 0;
  for (uint64_t d = first_doc; d < first_doc + n_docs; d++)
    n_tokens += 1 + dl_synthetic_doc_len(seed, min_len, max_len, d);
  if (n_tokens > INT32_MAX) {
    stk_set_detail("synthetic llm.c: %llu tokens do not fit the header's int32 count",
                   (unsigned long long)n_tokens);
    return STK_EINVAL;
  }
  int32_t header[256] = {20240801, 7, (int32_t)n_tokens};
  struct out o;
  rc = out_open(&o, path);
  if (rc < 0) return rc;
  out_put(&o, header, sizeof header);
  for (uint64_t d = first_doc; d < first_doc + n_docs; d++) {
    uint32_t eot = DL_SYNTHETIC_EOT, len = dl_synthetic_doc_len(seed, min_len, max_len, d);
    out_put(&o, &eot, 4);
    for (uint32_t p = 0; p < len; p++) {
      uint32_t t = dl_synthetic_token(d, p);
      out_put(&o, &t, 4);
    }
  }
  return out_close(&o);
}
