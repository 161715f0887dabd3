/*
 * Raw text datasets, tokenized when read. A file is JSONL (name ends in
 * .jsonl or .json: one JSON object per line, its string field "text" is a
 * document) or plain text (documents are paragraphs separated by blank
 * lines; a paragraph's text excludes its final newline). A unit is every
 * line (JSONL) or paragraph (plain) that STARTS in a block of block_bytes
 * bytes of a file, so units are known from file sizes alone and blocks are
 * cut without reading. Recently read units are kept in a small LRU cache.
 *
 * Documents of a file are numbered from 0 in file order: every non-blank
 * JSONL line, every paragraph (also one whose text tokenizes to nothing).
 * A unit's first document number is the count of documents starting in
 * the blocks before it: an index of those counts (8 bytes per block) is
 * built with one pass over the file (line ends only, nothing tokenized) the
 * first time a document is asked for.
 *
 * A unit can also be read from a place (text_read_from: from one of its
 * documents, that one from a byte of its text): a job that changes the
 * tokenizer in the middle of a unit goes on there with the new one.
 */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dl_files.h"
#include "dl_source_internal.h"
#include "dl_tokenizer.h"
#include "stk_error.h"

#define CACHE_UNITS 16

struct tfile {
  char *path;
  struct dl_map map;
  bool jsonl;
  uint64_t first_unit;
  uint64_t *docs_before; /* [blocks + 1] documents starting before each block (index) */
  bool indexed;          /* read with acquire: docs_before is complete */
};

struct cached {
  uint64_t unit, last_use; /* last_use 0: empty slot */
  struct dl_unit copy;
};

struct text {
  struct dl_source base;
  struct tfile *files;
  size_t n_files;
  uint64_t block_bytes;
  struct dl_tokenizer *tok;
  pthread_mutex_t lock;     /* guards cache and clock */
  pthread_mutex_t index_mu; /* serializes index builds */
  struct cached cache[CACHE_UNITS];
  uint64_t clock;
};

/* What read_block builds: the unit's tokens and document starts. */
struct builder {
  struct dl_tokens toks;
  struct dl_unit *unit;
  size_t doc_cap;
  uint32_t seen; /* documents met so far (also those without tokens) */
  /* A read from a place (text_read_from): documents before from_rel are
   * passed over; when lead, document from_rel is tokenized from byte
   * from_byte of its text on, as the unit's leading piece (no start). */
  uint32_t from_rel;
  uint64_t from_byte;
  bool lead;
};

static const struct tfile *find_file(const struct text *t, uint64_t u) {
  size_t lo = 0, hi = t->n_files; /* last file with first_unit <= u */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (t->files[mid].first_unit <= u)
      lo = mid;
    else
      hi = mid;
  }
  return &t->files[lo];
}

static uint64_t text_weight(const struct dl_source *s, uint64_t u) {
  const struct text *t = (const struct text *)s;
  const struct tfile *f = find_file(t, u);
  uint64_t start = (u - f->first_unit) * t->block_bytes, left = f->map.size - start;
  return left < t->block_bytes ? left : t->block_bytes;
}

static const char *data(const struct tfile *f) {
  return (const char *)f->map.data;
}

static size_t line_end(const struct tfile *f, size_t p) {
  const char *nl = memchr(data(f) + p, '\n', f->map.size - p);
  return nl ? (size_t)(nl - data(f)) : f->map.size;
}

static bool blank(const struct tfile *f, size_t p, size_t e) {
  for (; p < e; p++)
    if (data(f)[p] != ' ' && data(f)[p] != '\t' && data(f)[p] != '\r') return false;
  return true;
}

/* Tokenizes one document into the builder. */
static int add_doc(struct text *t, struct builder *b, const char *s, size_t len) {
  size_t before = b->toks.n;
  b->seen++;
  if (b->seen < b->from_rel) return 0;
  if (b->seen == b->from_rel && b->lead) {
    size_t skip = b->from_byte < len ? (size_t)b->from_byte : len;
    return dl_tokenizer_encode(t->tok, s + skip, len - skip, &b->toks);
  }
  int rc = dl_tokenizer_encode(t->tok, s, len, &b->toks);
  if (rc < 0 || b->toks.n == before) return rc;
  return dl_unit_add_doc_rel(b->unit, &b->doc_cap, (uint32_t)before, b->seen);
}

static int bad_line(const struct tfile *f, size_t p, const char *what) {
  size_t line = 1;
  for (const char *c = data(f); (c = memchr(c, '\n', (size_t)(data(f) + p - c))) != NULL; c++)
    line++;
  stk_set_detail("%s:%zu: %s", f->path, line, what);
  return STK_ECORRUPT;
}

static int jsonl_line(struct text *t, struct builder *b, const struct tfile *f, size_t p,
                      size_t e) {
  if (blank(f, p, e)) return 0;
  cJSON *j = cJSON_ParseWithLength(data(f) + p, e - p);
  if (!j) return bad_line(f, p, "not valid JSON");
  const cJSON *txt = cJSON_GetObjectItemCaseSensitive(j, "text");
  int rc = cJSON_IsString(txt) ? add_doc(t, b, txt->valuestring, strlen(txt->valuestring))
                               : bad_line(f, p, "no string field \"text\"");
  cJSON_Delete(j);
  return rc;
}

/* A paragraph starts at line p when it is not blank and follows a blank line
 * (or the start of the file); returns where the paragraph's text ends. */
static size_t paragraph(const struct tfile *f, size_t p, size_t e) {
  if (blank(f, p, e)) return 0;
  if (p > 0) {
    size_t q = p - 1;
    while (q > 0 && data(f)[q - 1] != '\n') q--;
    if (!blank(f, q, p - 1)) return 0;
  }
  while (e < f->map.size) {
    size_t next = line_end(f, e + 1);
    if (blank(f, e + 1, next)) break;
    e = next;
  }
  return e;
}

static int read_block(struct text *t, const struct tfile *f, uint64_t start, uint64_t end,
                      struct builder *b) {
  size_t p = start;
  if (p > 0 && data(f)[p - 1] != '\n') p = line_end(f, p) + 1;
  int rc = 0;
  while (p < end && rc == 0) {
    size_t e = line_end(f, p);
    if (f->jsonl)
      rc = jsonl_line(t, b, f, p, e);
    else {
      size_t pe = paragraph(f, p, e);
      if (pe > 0) {
        rc = add_doc(t, b, data(f) + p, pe - p);
        e = pe;
      }
    }
    p = e + 1;
  }
  return rc;
}

static int copy_unit(const struct dl_unit *from, struct dl_unit *to) {
  to->tokens = malloc((from->n_tokens + 1) * sizeof(uint32_t));
  to->doc_starts = malloc((from->n_docs + 1) * sizeof(uint32_t));
  to->doc_rel = malloc((from->n_docs + 1) * sizeof(uint32_t));
  if (!to->tokens || !to->doc_starts || !to->doc_rel) return STK_ENOMEM;
  /* An empty unit may carry NULL arrays: memcpy must not see them. */
  if (from->n_tokens) memcpy(to->tokens, from->tokens, from->n_tokens * sizeof(uint32_t));
  if (from->n_docs) memcpy(to->doc_starts, from->doc_starts, from->n_docs * sizeof(uint32_t));
  if (from->n_docs) memcpy(to->doc_rel, from->doc_rel, from->n_docs * sizeof(uint32_t));
  to->n_tokens = from->n_tokens;
  to->n_docs = from->n_docs;
  to->file = from->file;
  return 0;
}

/* Copies a cached unit out (1), or 0 when not cached. */
static int cache_get(struct text *t, uint64_t u, struct dl_unit *ret_unit) {
  int rc = 0;
  pthread_mutex_lock(&t->lock);
  for (int i = 0; i < CACHE_UNITS && rc == 0; i++) {
    if (!t->cache[i].last_use || t->cache[i].unit != u) continue;
    t->cache[i].last_use = ++t->clock;
    rc = copy_unit(&t->cache[i].copy, ret_unit);
    if (rc == 0) rc = 1;
  }
  pthread_mutex_unlock(&t->lock);
  return rc;
}

static void cache_put(struct text *t, uint64_t u, const struct dl_unit *unit) {
  pthread_mutex_lock(&t->lock);
  int victim = 0;
  for (int i = 1; i < CACHE_UNITS; i++)
    if (t->cache[i].last_use < t->cache[victim].last_use) victim = i;
  struct cached *c = &t->cache[victim];
  dl_unit_free(&c->copy);
  c->last_use = 0;
  if (copy_unit(unit, &c->copy) == 0) {
    c->unit = u;
    c->last_use = ++t->clock;
  } else
    dl_unit_free(&c->copy);
  pthread_mutex_unlock(&t->lock);
}

/* Reads unit u as the builder says (all of it, or from a place). */
static int build_unit(struct text *t, uint64_t u, struct builder *b) {
  const struct tfile *f = find_file(t, u);
  uint64_t start = (u - f->first_unit) * t->block_bytes;
  int rc = read_block(t, f, start, start + text_weight(&t->base, u), b);
  b->unit->tokens = b->toks.ids;
  b->unit->n_tokens = b->toks.n;
  b->unit->file = (uint32_t)(f - t->files);
  return rc;
}

static int text_read(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit) {
  struct text *t = (struct text *)s;
  int rc = cache_get(t, u, ret_unit);
  if (rc != 0) return rc < 0 ? rc : 0;
  struct builder b = {.unit = ret_unit};
  rc = build_unit(t, u, &b);
  if (rc == 0) cache_put(t, u, ret_unit);
  return rc;
}

/* Not cached: a unit is read from a place once, when a version changes
 * its dataset's tokenizer in the middle of it (and after a restore there). */
static int text_read_from(struct dl_source *s, uint64_t u, uint32_t doc_rel, uint64_t byte,
                          bool lead, struct dl_unit *ret_unit) {
  struct builder b = {.unit = ret_unit, .from_rel = doc_rel, .from_byte = byte, .lead = lead};
  return build_unit((struct text *)s, u, &b);
}

static size_t text_token_bytes(const struct dl_source *s, uint32_t id) {
  return dl_tokenizer_token_bytes(((const struct text *)s)->tok, id);
}

/* Documents starting in [start, end) of f, by read_block's rules. */
static uint64_t count_docs(const struct tfile *f, uint64_t start, uint64_t end) {
  uint64_t n = 0;
  size_t p = start;
  if (p > 0 && data(f)[p - 1] != '\n') p = line_end(f, p) + 1;
  while (p < end) {
    size_t e = line_end(f, p);
    if (f->jsonl) {
      n += !blank(f, p, e);
    } else {
      size_t pe = paragraph(f, p, e);
      if (pe > 0) {
        n++;
        e = pe;
      }
    }
    p = e + 1;
  }
  return n;
}

/* Builds f's index (one pass over its lines) unless it exists. */
static int ensure_index(struct text *t, struct tfile *f) {
  if (__atomic_load_n(&f->indexed, __ATOMIC_ACQUIRE)) return 0;
  pthread_mutex_lock(&t->index_mu);
  int rc = 0;
  if (!f->indexed) {
    uint64_t blocks = (f->map.size + t->block_bytes - 1) / t->block_bytes;
    uint64_t *x = malloc((blocks + 1) * sizeof *x);
    if (x) {
      x[0] = 0;
      for (uint64_t k = 0; k < blocks; k++) {
        uint64_t b = k * t->block_bytes, e = b + t->block_bytes;
        x[k + 1] = x[k] + count_docs(f, b, e < f->map.size ? e : f->map.size);
      }
      f->docs_before = x;
      __atomic_store_n(&f->indexed, true, __ATOMIC_RELEASE);
    } else {
      rc = STK_ENOMEM;
    }
  }
  pthread_mutex_unlock(&t->index_mu);
  return rc;
}

static int text_unit_docs(struct dl_source *s, uint64_t u, struct dl_unit_docs *ret_docs) {
  struct text *t = (struct text *)s;
  struct tfile *f = (struct tfile *)find_file(t, u);
  int rc = ensure_index(t, f);
  if (rc == 0) ret_docs->base = f->docs_before[u - f->first_unit];
  return rc;
}

static int text_file_docs(struct dl_source *s, uint32_t file, uint64_t *ret_docs) {
  struct text *t = (struct text *)s;
  struct tfile *f = &t->files[file];
  int rc = ensure_index(t, f);
  if (rc == 0) *ret_docs = f->docs_before[(f->map.size + t->block_bytes - 1) / t->block_bytes];
  return rc;
}

static void text_free(struct dl_source *s) {
  struct text *t = (struct text *)s;
  for (size_t i = 0; i < t->n_files; i++) {
    dl_map_close(&t->files[i].map);
    free(t->files[i].path);
    free(t->files[i].docs_before);
  }
  for (int i = 0; i < CACHE_UNITS; i++) dl_unit_free(&t->cache[i].copy);
  free(t->files);
  dl_tokenizer_free(t->tok);
  pthread_mutex_destroy(&t->lock);
  pthread_mutex_destroy(&t->index_mu);
  dl_source_base_close(s);
  free(t);
}

static const struct dl_source_ops text_ops = {.unit_weight = text_weight,
                                              .read_unit = text_read,
                                              .free = text_free,
                                              .unit_docs = text_unit_docs,
                                              .file_docs = text_file_docs,
                                              .read_from = text_read_from,
                                              .token_bytes = text_token_bytes};

static bool ends_with(const char *s, const char *suffix) {
  size_t ls = strlen(s), lx = strlen(suffix);
  return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

static int open_files(struct text *t, char **paths) {
  for (size_t i = 0; i < t->n_files; i++) {
    struct tfile *f = &t->files[i];
    f->path = paths[i];
    paths[i] = NULL;
    f->jsonl = ends_with(f->path, ".jsonl") || ends_with(f->path, ".json");
    int rc = dl_map_open(f->path, &f->map);
    if (rc < 0) return rc;
    f->first_unit = t->base.n_units;
    t->base.n_units += (f->map.size + t->block_bytes - 1) / t->block_bytes;
    t->base.total_weight += f->map.size;
  }
  return 0;
}

static int list_files(const char *path, char ***ret, size_t *ret_n) {
  if (dl_is_dir(path)) return dl_list_dir(path, NULL, ret, ret_n);
  char **paths = malloc(sizeof *paths);
  if (!paths || !(paths[0] = strdup(path))) {
    free(paths);
    return STK_ENOMEM;
  }
  *ret = paths;
  *ret_n = 1;
  return 0;
}

int dl_text_open(const struct dl_source_opts *opts, struct dl_source **ret_source) {
  char **paths = NULL;
  size_t n = 0;
  int rc = list_files(opts->path, &paths, &n);
  if (rc < 0) return rc;
  struct text *t = calloc(1, sizeof *t);
  if (t) t->files = calloc(n + 1, sizeof *t->files);
  if (!t || !t->files) {
    free(t);
    dl_paths_free(paths, n);
    return STK_ENOMEM;
  }
  pthread_mutex_init(&t->lock, NULL);
  pthread_mutex_init(&t->index_mu, NULL);
  t->n_files = n;
  t->block_bytes = opts->block_bytes ? opts->block_bytes : 65536;
  rc = dl_source_base_init(&t->base, &text_ops, opts);
  if (rc == 0) rc = dl_source_set_files(&t->base, paths, n, NULL);
  if (rc == 0) rc = dl_tokenizer_new(opts->tokenizer, &t->tok);
  if (rc == 0) rc = open_files(t, paths);
  dl_paths_free(paths, n);
  if (rc < 0) {
    text_free(&t->base);
    return rc;
  }
  *ret_source = &t->base;
  return 0;
}
