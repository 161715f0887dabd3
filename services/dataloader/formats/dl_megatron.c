/*
 * Megatron indexed datasets (PREFIX.idx + PREFIX.bin, "MMIDIDX" version 1).
 * Both files are memory mapped; open checks the header and every index
 * entry (O(sequences), never touching a token page) so that reads can trust
 * the offsets. A unit is a document: document_indices[k] .. [k+1] name its
 * sequences. A directory holds several datasets, concatenated in name order.
 */
#include <stdlib.h>
#include <string.h>

#include "dl_files.h"
#include "dl_source_internal.h"
#include "stk_error.h"

#define IDX_HEADER_BYTES 34

struct part {
  char *prefix;
  struct dl_map idx, bin;
  uint8_t dtype;
  size_t token_bytes;
  uint64_t n_seqs, n_docs;
  const uint8_t *lengths, *pointers, *doc_idx; /* unaligned arrays inside idx */
  uint64_t first_unit;
};

struct megatron {
  struct dl_source base;
  struct part *parts;
  size_t n_parts;
};

static int32_t ld_i32(const uint8_t *a, uint64_t i) {
  int32_t v;
  memcpy(&v, a + i * 4, 4);
  return v;
}

static int64_t ld_i64(const uint8_t *a, uint64_t i) {
  int64_t v;
  memcpy(&v, a + i * 8, 8);
  return v;
}

/* Bytes per token of an integer dtype code; 0 for float or unknown codes. */
static size_t dtype_bytes(uint8_t code) {
  static const size_t bytes[9] = {0, 1, 1, 2, 4, 8, 0, 0, 2};
  return code < 9 ? bytes[code] : 0;
}

static int corrupt(const struct part *p, const char *ext, const char *what, uint64_t at) {
  stk_set_detail("%s%s: %s (at %llu)", p->prefix, ext, what, (unsigned long long)at);
  return STK_ECORRUPT;
}

static int check_header(struct part *p) {
  const uint8_t *h = p->idx.data;
  if (p->idx.size < IDX_HEADER_BYTES) return corrupt(p, ".idx", "truncated header", p->idx.size);
  if (memcmp(h, "MMIDIDX\0\0", 9) != 0) return corrupt(p, ".idx", "bad magic, not MMIDIDX", 0);
  uint64_t version;
  memcpy(&version, h + 9, 8);
  if (version != 1) return corrupt(p, ".idx", "unsupported version", version);
  p->dtype = h[17];
  if (p->dtype == 6 || p->dtype == 7)
    return corrupt(p, ".idx", "float dtype cannot hold token ids", p->dtype);
  p->token_bytes = dtype_bytes(p->dtype);
  if (p->token_bytes == 0) return corrupt(p, ".idx", "unknown dtype code", p->dtype);
  memcpy(&p->n_seqs, h + 18, 8);
  memcpy(&p->n_docs, h + 26, 8);
  uint64_t room = p->idx.size - IDX_HEADER_BYTES;
  if (p->n_seqs > room / 12 || p->n_docs > room / 8 || p->n_seqs * 12 + p->n_docs * 8 != room)
    return corrupt(p, ".idx", "size disagrees with the header's counts (truncated?)", p->idx.size);
  if (p->n_docs == 0) return corrupt(p, ".idx", "document_indices is empty", 0);
  p->lengths = h + IDX_HEADER_BYTES;
  p->pointers = p->lengths + p->n_seqs * 4;
  p->doc_idx = p->pointers + p->n_seqs * 8;
  p->n_docs -= 1; /* entries are boundaries */
  return 0;
}

/* Every sequence within .bin; document_indices 0 .. n_seqs, non-decreasing. */
static int check_arrays(struct part *p, uint64_t *ret_tokens) {
  uint64_t tokens = 0;
  for (uint64_t i = 0; i < p->n_seqs; i++) {
    int64_t len = ld_i32(p->lengths, i), ptr = ld_i64(p->pointers, i);
    if (len < 0) return corrupt(p, ".idx", "negative sequence length", i);
    if (ptr < 0 || (uint64_t)ptr > p->bin.size ||
        (uint64_t)len * p->token_bytes > p->bin.size - (uint64_t)ptr)
      return corrupt(p, ".bin", "sequence pointer + length beyond the end of file", i);
    tokens += (uint64_t)len;
  }
  if (ld_i64(p->doc_idx, 0) != 0) return corrupt(p, ".idx", "document_indices must start at 0", 0);
  for (uint64_t k = 1; k <= p->n_docs; k++)
    if (ld_i64(p->doc_idx, k) < ld_i64(p->doc_idx, k - 1))
      return corrupt(p, ".idx", "document_indices not non-decreasing", k);
  if ((uint64_t)ld_i64(p->doc_idx, p->n_docs) != p->n_seqs)
    return corrupt(p, ".idx", "document_indices must end at the sequence count", p->n_docs);
  *ret_tokens = tokens;
  return 0;
}

static int part_open(struct part *p, uint64_t *ret_tokens) {
  char *path = dl_strcat2(p->prefix, ".idx");
  if (!path) return STK_ENOMEM;
  int rc = dl_map_open(path, &p->idx);
  free(path);
  if (rc < 0) return rc;
  if ((path = dl_strcat2(p->prefix, ".bin")) == NULL) return STK_ENOMEM;
  rc = dl_map_open(path, &p->bin);
  free(path);
  if (rc < 0) return rc;
  rc = check_header(p);
  return rc < 0 ? rc : check_arrays(p, ret_tokens);
}

static const struct part *find_part(const struct megatron *m, uint64_t u) {
  size_t lo = 0, hi = m->n_parts; /* last part with first_unit <= u */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (m->parts[mid].first_unit <= u)
      lo = mid;
    else
      hi = mid;
  }
  return &m->parts[lo];
}

static uint64_t megatron_weight(const struct dl_source *s, uint64_t u) {
  const struct part *p = find_part((const struct megatron *)s, u);
  uint64_t k = u - p->first_unit, w = 0;
  for (int64_t i = ld_i64(p->doc_idx, k); i < ld_i64(p->doc_idx, k + 1); i++)
    w += (uint64_t)ld_i32(p->lengths, (uint64_t)i);
  return w;
}

/* Widens n tokens of the part's dtype at src into dst; negative or > 2^32-1
 * ids are corrupt. */
static int widen(const struct part *p, const uint8_t *src, size_t n, uint32_t *dst) {
  int64_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    int64_t v;
    switch (p->dtype) {
    case 1:
      v = src[i];
      break;
    case 2:
      v = (int8_t)src[i];
      break;
    case 3: {
      int16_t x;
      memcpy(&x, src + 2 * i, 2);
      v = x;
    } break;
    case 8: {
      uint16_t x;
      memcpy(&x, src + 2 * i, 2);
      v = x;
    } break;
    case 4: {
      int32_t x;
      memcpy(&x, src + 4 * i, 4);
      v = x;
    } break;
    default:
      memcpy(&v, src + 8 * i, 8);
      break;
    }
    bad |= v < 0 || v > (int64_t)UINT32_MAX;
    dst[i] = (uint32_t)v;
  }
  if (!bad) return 0;
  stk_set_detail("%s.bin: token id outside 0..2^32-1", p->prefix);
  return STK_ECORRUPT;
}

/* Removes one leading and one trailing strip id from a document. */
static size_t strip_doc(const struct dl_source *s, uint32_t *t, size_t n) {
  if (n > 0 && dl_source_is_strip_id(s, t[n - 1])) n--;
  if (n > 0 && dl_source_is_strip_id(s, t[0])) memmove(t, t + 1, --n * sizeof *t);
  return n;
}

static int megatron_read(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit) {
  const struct part *p = find_part((const struct megatron *)s, u);
  uint64_t k = u - p->first_unit, n = megatron_weight(s, u), done = 0;
  ret_unit->tokens = malloc((n ? n : 1) * sizeof(uint32_t));
  ret_unit->doc_starts = malloc(sizeof(uint32_t));
  if (!ret_unit->tokens || !ret_unit->doc_starts) return STK_ENOMEM;
  for (int64_t i = ld_i64(p->doc_idx, k); i < ld_i64(p->doc_idx, k + 1); i++) {
    size_t len = (size_t)ld_i32(p->lengths, (uint64_t)i);
    const uint8_t *src = p->bin.data + ld_i64(p->pointers, (uint64_t)i);
    int rc = widen(p, src, len, ret_unit->tokens + done);
    if (rc < 0) return rc;
    done += len;
  }
  ret_unit->n_tokens = strip_doc(s, ret_unit->tokens, n);
  ret_unit->doc_starts[0] = 0;
  ret_unit->n_docs = 1;
  ret_unit->file = (uint32_t)(p - ((const struct megatron *)s)->parts);
  return 0;
}

/* A unit is document u - first_unit of its part. */
static int megatron_unit_docs(struct dl_source *s, uint64_t u, struct dl_unit_docs *ret_docs) {
  ret_docs->base = u - find_part((const struct megatron *)s, u)->first_unit;
  return 0;
}

static int megatron_file_docs(struct dl_source *s, uint32_t file, uint64_t *ret_docs) {
  *ret_docs = ((const struct megatron *)s)->parts[file].n_docs;
  return 0;
}

static void megatron_free(struct dl_source *s) {
  struct megatron *m = (struct megatron *)s;
  for (size_t i = 0; i < m->n_parts; i++) {
    dl_map_close(&m->parts[i].idx);
    dl_map_close(&m->parts[i].bin);
    free(m->parts[i].prefix);
  }
  free(m->parts);
  dl_source_base_close(s);
  free(m);
}

static const struct dl_source_ops megatron_ops = {.unit_weight = megatron_weight,
                                                  .read_unit = megatron_read,
                                                  .free = megatron_free,
                                                  .unit_docs = megatron_unit_docs,
                                                  .file_docs = megatron_file_docs};

/* The dataset prefixes named by path: a directory's *.idx files, or one
 * prefix (a trailing .bin or .idx is dropped). */
static int list_prefixes(const char *path, char ***ret, size_t *ret_n) {
  size_t n = 0;
  char **paths = NULL;
  if (dl_is_dir(path)) {
    int rc = dl_list_dir(path, ".idx", &paths, &n);
    if (rc < 0) return rc;
    for (size_t i = 0; i < n; i++) paths[i][strlen(paths[i]) - 4] = '\0';
  } else {
    paths = malloc(sizeof *paths);
    if (!paths || !(paths[0] = strdup(path))) {
      free(paths);
      return STK_ENOMEM;
    }
    n = 1;
    size_t l = strlen(paths[0]);
    if (l > 4 && (!strcmp(paths[0] + l - 4, ".bin") || !strcmp(paths[0] + l - 4, ".idx")))
      paths[0][l - 4] = '\0';
  }
  if (n == 0) {
    free(paths);
    stk_set_detail("%s: no Megatron datasets (*.idx) in directory", path);
    return STK_ENOENT;
  }
  *ret = paths;
  *ret_n = n;
  return 0;
}

static int open_parts(struct megatron *m, char **prefixes) {
  for (size_t i = 0; i < m->n_parts; i++) {
    struct part *p = &m->parts[i];
    p->prefix = prefixes[i];
    prefixes[i] = NULL;
    uint64_t tokens = 0;
    int rc = part_open(p, &tokens);
    if (rc < 0) return rc;
    p->first_unit = m->base.n_units;
    m->base.n_units += p->n_docs;
    m->base.total_weight += tokens;
  }
  return 0;
}

int dl_megatron_open(const struct dl_source_opts *opts, struct dl_source **ret_source) {
  char **prefixes = NULL;
  size_t n = 0;
  int rc = list_prefixes(opts->path, &prefixes, &n);
  if (rc < 0) return rc;
  struct megatron *m = calloc(1, sizeof *m);
  if (m) m->parts = calloc(n, sizeof *m->parts);
  if (!m || !m->parts) {
    free(m);
    dl_paths_free(prefixes, n);
    return STK_ENOMEM;
  }
  m->n_parts = n;
  rc = dl_source_base_init(&m->base, &megatron_ops, opts);
  if (rc == 0) rc = dl_source_set_files(&m->base, prefixes, n, NULL);
  if (rc == 0) rc = open_parts(m, prefixes);
  dl_paths_free(prefixes, n);
  if (rc < 0) {
    megatron_free(&m->base);
    return rc;
  }
  *ret_source = &m->base;
  return 0;
}
