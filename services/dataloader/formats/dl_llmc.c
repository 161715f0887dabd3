/*
 * llm.c token files: a 256 x int32 header (magic 20240520 = uint16 tokens,
 * version 1; magic 20240801 = uint32 tokens, version 7; then the token
 * count) and the tokens, every document preceded by the end-of-text token.
 * There is no document index, so a unit is a fixed block of block_tokens
 * tokens of one file. Reading drops the end-of-text delimiters and reports
 * where documents start, looking one token past the block edges so that the
 * answer does not depend on where blocks fall.
 *
 * Documents: a file's documents are its runs of tokens between delimiters
 * (a document starts at each non-delimiter token that is the file's first
 * or follows a delimiter), numbered from 0 in file order. Naming the
 * document a block's pieces belong to needs the number of document starts
 * before the block: each file gets an index of that count (and of the last
 * start) every `stride` tokens, built with one scan of the file the first
 * time a document is asked for and kept while the source is open. The
 * stride is the smallest multiple of the block size of at least 4096
 * tokens (32768 for blocks larger than that), so blocks mostly begin on an
 * entry: a lookup scans at most 4096 tokens past one for blocks up to 32768
 * tokens (none for the default), and the index takes at most 16 bytes per
 * 4096 tokens (0.1% of a uint32 file).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dl_files.h"
#include "dl_scan.h"
#include "dl_source_internal.h"
#include "stk_error.h"

#define HEADER_BYTES 1024
#define STRIDE_MIN   4096u
#define STRIDE_MAX   32768u
#define NO_START     UINT64_MAX

/* The document index of a file (built once, then read without a lock):
 * entry q describes the tokens before q * stride. */
struct doc_index {
  uint64_t *starts; /* [n] document starts before the entry's token */
  uint64_t *last;   /* [n] the last of them (NO_START: none) */
  uint64_t n;
  uint64_t docs; /* documents in the file */
};

struct lfile {
  char *path;
  struct dl_map map;
  size_t token_bytes; /* 2 or 4 */
  uint64_t n_tokens;
  uint64_t first_unit;
  struct doc_index index;
  bool indexed; /* read with acquire: index is complete */
};

struct llmc {
  struct dl_source base;
  struct lfile *files;
  size_t n_files;
  uint64_t block_tokens;
  uint32_t eot;
  uint64_t stride;          /* tokens per document index entry */
  pthread_mutex_t index_mu; /* serializes index builds */
};

static uint32_t tok_at(const struct lfile *f, uint64_t i) {
  const uint8_t *p = f->map.data + HEADER_BYTES + i * f->token_bytes;
  if (f->token_bytes == 2) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
  }
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static int check_header(struct lfile *f) {
  int32_t h[3];
  if (f->map.size < HEADER_BYTES) {
    stk_set_detail("%s: truncated header (%zu bytes)", f->path, f->map.size);
    return STK_ECORRUPT;
  }
  memcpy(h, f->map.data, sizeof h);
  if (h[0] == 20240520 && h[1] == 1)
    f->token_bytes = 2;
  else if (h[0] == 20240801 && h[1] == 7)
    f->token_bytes = 4;
  else {
    stk_set_detail("%s: bad magic/version %d/%d (want 20240520/1 or 20240801/7)", f->path, h[0],
                   h[1]);
    return STK_ECORRUPT;
  }
  if (h[2] < 0 || (uint64_t)h[2] * f->token_bytes != f->map.size - HEADER_BYTES) {
    stk_set_detail("%s: token count %d in the header does not match the file size %zu", f->path,
                   h[2], f->map.size);
    return STK_ECORRUPT;
  }
  f->n_tokens = (uint64_t)h[2];
  return 0;
}

static const struct lfile *find_file(const struct llmc *l, uint64_t u) {
  size_t lo = 0, hi = l->n_files; /* last file with first_unit <= u */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (l->files[mid].first_unit <= u)
      lo = mid;
    else
      hi = mid;
  }
  while (lo + 1 < l->n_files && l->files[lo + 1].first_unit <= u) lo++; /* skip empty files */
  return &l->files[lo];
}

static uint64_t llmc_weight(const struct dl_source *s, uint64_t u) {
  const struct llmc *l = (const struct llmc *)s;
  const struct lfile *f = find_file(l, u);
  uint64_t start = (u - f->first_unit) * l->block_tokens;
  uint64_t left = f->n_tokens - start;
  return left < l->block_tokens ? left : l->block_tokens;
}

static const void *tokens_of(const struct lfile *f) {
  return f->map.data + HEADER_BYTES; /* page-aligned map + 1024: aligned for any token size */
}

static uint64_t find_eot(const struct llmc *l, const struct lfile *f, uint64_t i, uint64_t end) {
  if (f->token_bytes == 4) return dl_scan_u32(tokens_of(f), i, end, l->eot);
  if (l->eot > UINT16_MAX) return end; /* No uint16 token can be it. */
  return dl_scan_u16(tokens_of(f), i, end, (uint16_t)l->eot);
}

static bool is_strip(const struct llmc *l, const struct lfile *f, uint64_t i) {
  return dl_source_is_strip_id(&l->base, tok_at(f, i));
}

/* A run of surviving tokens [b, e) of one document inside a block. */
struct piece {
  uint64_t b, e;
  bool doc_start; /* the document's first surviving token is b */
};

/* Whether the piece beginning at b (not a delimiter, first = b starts its
 * document) begins a document once edge strip ids are dropped: b is the
 * document's first token, or the second after a dropped first (which can
 * only happen when b is where a block starts). */
static bool starts_doc(const struct llmc *l, const struct lfile *f, uint64_t b, bool first) {
  if (first) return true;
  if (l->base.n_strip_ids == 0) return false;
  return is_strip(l, f, b - 1) && (b - 1 == 0 || tok_at(f, b - 2) == l->eot);
}

/* The next non-empty piece at or after *i in [*i, end): the document text
 * between delimiters, clipped to the block, with a strip id dropped where it
 * is a document's first or last token (looking past the block's edges, so
 * that the answer does not depend on where blocks fall). */
static bool next_piece(const struct llmc *l, const struct lfile *f, uint64_t *i, uint64_t end,
                       struct piece *p, uint32_t *starts_seen) {
  while (*i < end) {
    uint64_t b = *i;
    while (b < end && tok_at(f, b) == l->eot) b++;
    if (b == end) break;
    uint64_t e = find_eot(l, f, b, end);
    *i = e;
    bool first = b == 0 || tok_at(f, b - 1) == l->eot;
    *starts_seen += first; /* every document starting here counts, even one left empty */
    *p = (struct piece){b, e, starts_doc(l, f, b, first)};
    if (l->base.n_strip_ids) {
      if (first && is_strip(l, f, b)) p->b++;
      bool last = e == f->n_tokens || tok_at(f, e) == l->eot;
      if (last && p->e > p->b && is_strip(l, f, e - 1)) p->e--;
    }
    if (p->e > p->b) return true;
  }
  *i = end;
  return false;
}

/* Copies a piece's tokens to dst, widening uint16 ids. */
static void copy_piece(const struct lfile *f, const struct piece *p, uint32_t *dst) {
  size_t n = p->e - p->b;
  if (f->token_bytes == 4) {
    memcpy(dst, (const uint32_t *)tokens_of(f) + p->b, n * 4);
    return;
  }
  const uint16_t *src = (const uint16_t *)tokens_of(f) + p->b;
  for (size_t k = 0; k < n; k++) dst[k] = src[k];
}

static int llmc_read(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit) {
  const struct llmc *l = (const struct llmc *)s;
  const struct lfile *f = find_file(l, u);
  uint64_t i = (u - f->first_unit) * l->block_tokens, end = i + llmc_weight(s, u);
  size_t n = 0, cap = 0;
  uint32_t seen = 0;
  ret_unit->tokens = malloc((end - i + 1) * sizeof(uint32_t));
  if (!ret_unit->tokens) return STK_ENOMEM;
  struct piece p;
  while (next_piece(l, f, &i, end, &p, &seen)) {
    if (p.doc_start && dl_unit_add_doc_rel(ret_unit, &cap, (uint32_t)n, seen) < 0)
      return STK_ENOMEM;
    copy_piece(f, &p, ret_unit->tokens + n);
    n += p.e - p.b;
  }
  ret_unit->n_tokens = n;
  ret_unit->file = (uint32_t)(f - l->files);
  return 0;
}

/* Appends a borrowed run; *cap tracks the arrays' capacity. */
static int add_run(struct dl_unit *unit, size_t *cap, const uint8_t *src, uint32_t len) {
  if (unit->n_runs + 1 >= *cap) {
    size_t c = *cap ? *cap * 2 : 4;
    const uint8_t **s = realloc(unit->run_src, c * sizeof *s);
    if (s) unit->run_src = s;
    uint32_t *a = realloc(unit->run_at, c * sizeof *a);
    if (a) unit->run_at = a;
    if (!s || !a) return STK_ENOMEM;
    *cap = c;
  }
  unit->run_src[unit->n_runs] = src;
  unit->run_at[unit->n_runs + 1] = unit->run_at[unit->n_runs] + len;
  unit->n_runs++;
  return 0;
}

/* The borrowed form: runs point into the map (uint32 files, little-endian
 * hosts; otherwise a copy). */
static int llmc_read_runs(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit) {
  const struct llmc *l = (const struct llmc *)s;
  const struct lfile *f = find_file(l, u);
  if (f->token_bytes != 4 || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__)
    return llmc_read(s, u, ret_unit);
  uint64_t i = (u - f->first_unit) * l->block_tokens, end = i + llmc_weight(s, u);
  size_t doc_cap = 0, run_cap = 0;
  uint32_t seen = 0;
  if (!(ret_unit->run_at = malloc(sizeof *ret_unit->run_at))) return STK_ENOMEM;
  ret_unit->run_at[0] = 0;
  struct piece p;
  while (next_piece(l, f, &i, end, &p, &seen)) {
    uint32_t n = ret_unit->run_at[ret_unit->n_runs];
    if (p.doc_start && dl_unit_add_doc_rel(ret_unit, &doc_cap, n, seen) < 0) return STK_ENOMEM;
    const uint8_t *src = (const uint8_t *)tokens_of(f) + p.b * 4;
    if (add_run(ret_unit, &run_cap, src, (uint32_t)(p.e - p.b)) < 0) return STK_ENOMEM;
  }
  ret_unit->n_tokens = ret_unit->run_at[ret_unit->n_runs];
  ret_unit->file = (uint32_t)(f - l->files);
  return 0;
}

/* The delimited form: the block's place in the map, nothing read (uint32
 * files on little-endian hosts without strip ids; otherwise runs). */
static int llmc_read_delimited(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit) {
  const struct llmc *l = (const struct llmc *)s;
  const struct lfile *f = find_file(l, u);
  if (f->token_bytes != 4 || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__ || l->base.n_strip_ids)
    return llmc_read_runs(s, u, ret_unit);
  ret_unit->raw = tokens_of(f);
  ret_unit->raw_begin = (u - f->first_unit) * l->block_tokens;
  ret_unit->raw_end = ret_unit->raw_begin + llmc_weight(s, u);
  ret_unit->delim = l->eot;
  ret_unit->file = (uint32_t)(f - l->files);
  return 0;
}

/* Counts the document starts in [from, to) into *count, the last of them
 * into *last (left alone when there is none). */
static void count_starts(const struct llmc *l, const struct lfile *f, uint64_t from, uint64_t to,
                         uint64_t *count, uint64_t *last) {
  uint64_t p = from;
  if (p < to && tok_at(f, p) != l->eot && (p == 0 || tok_at(f, p - 1) == l->eot)) {
    ++*count;
    *last = p;
  }
  while ((p = find_eot(l, f, p, to)) < to) {
    while (p < to && tok_at(f, p) == l->eot) p++;
    if (p < to) {
      ++*count;
      *last = p;
    }
  }
}

/* Builds f's document index (one scan of the file) unless it exists. */
static int ensure_index(struct llmc *l, struct lfile *f) {
  if (__atomic_load_n(&f->indexed, __ATOMIC_ACQUIRE)) return 0;
  pthread_mutex_lock(&l->index_mu);
  int rc = 0;
  if (!f->indexed) {
    struct doc_index x = {.n = f->n_tokens / l->stride + 1};
    x.starts = malloc(x.n * sizeof *x.starts);
    x.last = malloc(x.n * sizeof *x.last);
    if (x.starts && x.last) {
      uint64_t count = 0, last = NO_START;
      for (uint64_t q = 0; q < x.n; q++) {
        x.starts[q] = count;
        x.last[q] = last;
        uint64_t b = q * l->stride, e = b + l->stride;
        count_starts(l, f, b, e < f->n_tokens ? e : f->n_tokens, &count, &last);
      }
      x.docs = count;
      f->index = x;
      __atomic_store_n(&f->indexed, true, __ATOMIC_RELEASE);
    } else {
      free(x.starts);
      free(x.last);
      rc = STK_ENOMEM;
    }
  }
  pthread_mutex_unlock(&l->index_mu);
  return rc;
}

/* Documents starting before token b of f and the last of them. */
static void starts_before(const struct llmc *l, const struct lfile *f, uint64_t b,
                          uint64_t *ret_count, uint64_t *ret_last) {
  uint64_t q = b / l->stride;
  *ret_count = f->index.starts[q];
  *ret_last = f->index.last[q];
  count_starts(l, f, q * l->stride, b, ret_count, ret_last);
}

static int llmc_unit_docs(struct dl_source *s, uint64_t u, struct dl_unit_docs *ret_docs) {
  struct llmc *l = (struct llmc *)s;
  struct lfile *f = (struct lfile *)find_file(l, u);
  int rc = ensure_index(l, f);
  if (rc < 0) return rc;
  uint64_t b = (u - f->first_unit) * l->block_tokens, last;
  starts_before(l, f, b, &ret_docs->base, &last);
  /* The block may begin inside document base - 1, which started at last:
   * its tokens before b, less a stripped first token, come first. */
  ret_docs->lead_offset = 0;
  if (last != NO_START) ret_docs->lead_offset = b - last - (s->n_strip_ids && is_strip(l, f, last));
  return 0;
}

static int llmc_file_docs(struct dl_source *s, uint32_t file, uint64_t *ret_docs) {
  struct llmc *l = (struct llmc *)s;
  int rc = ensure_index(l, &l->files[file]);
  if (rc == 0) *ret_docs = l->files[file].index.docs;
  return rc;
}

static void llmc_free(struct dl_source *s) {
  struct llmc *l = (struct llmc *)s;
  for (size_t i = 0; i < l->n_files; i++) {
    dl_map_close(&l->files[i].map);
    free(l->files[i].path);
    free(l->files[i].index.starts);
    free(l->files[i].index.last);
  }
  free(l->files);
  pthread_mutex_destroy(&l->index_mu);
  dl_source_base_close(s);
  free(l);
}

static const struct dl_source_ops llmc_ops = {.unit_weight = llmc_weight,
                                              .read_unit = llmc_read,
                                              .free = llmc_free,
                                              .read_runs = llmc_read_runs,
                                              .read_delimited = llmc_read_delimited,
                                              .unit_docs = llmc_unit_docs,
                                              .file_docs = llmc_file_docs};

static int list_files(const char *path, char ***ret, size_t *ret_n) {
  if (dl_is_dir(path)) {
    int rc = dl_list_dir(path, ".bin", ret, ret_n);
    if (rc == 0 && *ret_n == 0) {
      free(*ret);
      stk_set_detail("%s: no llm.c token files (*.bin) in directory", path);
      return STK_ENOENT;
    }
    return rc;
  }
  char **paths = malloc(sizeof *paths);
  if (!paths || !(paths[0] = strdup(path))) {
    free(paths);
    return STK_ENOMEM;
  }
  *ret = paths;
  *ret_n = 1;
  return 0;
}

static int open_files(struct llmc *l, char **paths) {
  for (size_t i = 0; i < l->n_files; i++) {
    struct lfile *f = &l->files[i];
    f->path = paths[i];
    paths[i] = NULL;
    int rc = dl_map_open(f->path, &f->map);
    if (rc == 0) rc = check_header(f);
    if (rc < 0) return rc;
    f->first_unit = l->base.n_units;
    l->base.n_units += (f->n_tokens + l->block_tokens - 1) / l->block_tokens;
    l->base.total_weight += f->n_tokens;
  }
  return 0;
}

int dl_llmc_open(const struct dl_source_opts *opts, struct dl_source **ret_source) {
  char **paths = NULL;
  size_t n = 0;
  int rc = list_files(opts->path, &paths, &n);
  if (rc < 0) return rc;
  struct llmc *l = calloc(1, sizeof *l);
  if (l) l->files = calloc(n, sizeof *l->files);
  if (!l || !l->files) {
    free(l);
    dl_paths_free(paths, n);
    return STK_ENOMEM;
  }
  l->n_files = n;
  pthread_mutex_init(&l->index_mu, NULL);
  l->block_tokens = opts->block_tokens ? opts->block_tokens : DL_LLMC_BLOCK_TOKENS;
  l->eot = opts->eot_id < 0 ? 50256u : (uint32_t)opts->eot_id;
  l->stride = l->block_tokens > STRIDE_MAX
                  ? STRIDE_MAX
                  : (STRIDE_MIN + l->block_tokens - 1) / l->block_tokens * l->block_tokens;
  rc = dl_source_base_init(&l->base, &llmc_ops, opts);
  if (rc == 0) rc = dl_source_set_files(&l->base, paths, n, NULL);
  if (rc == 0) rc = open_files(l, paths);
  dl_paths_free(paths, n);
  if (rc < 0) {
    llmc_free(&l->base);
    return rc;
  }
  *ret_source = &l->base;
  return 0;
}
