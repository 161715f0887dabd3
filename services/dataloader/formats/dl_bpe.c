/*
 * GPT-2 byte-level BPE. The vocabulary and merges files spell bytes as
 * printable Unicode characters (GPT-2's byte-to-unicode map); at load we map
 * them back to raw bytes, so encoding works on raw bytes and token ids:
 *   1. the pre-tokenizer regex splits text into words (PCRE2, UTF + UCP);
 *   2. each word starts as its byte ids; the adjacent pair with the lowest
 *      merge rank is merged everywhere (left to right) until no pair has a
 *      rank — the reference algorithm, in id space;
 *   3. words already seen come from a cache.
 */
#define PCRE2_CODE_UNIT_WIDTH 8

#include "dl_bpe.h"

#include <cjson/cJSON.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dl_files.h"
#include "dl_hash.h"
#include "stk_error.h"

#define CACHE_MAX_WORDS (1u << 20)

static const char pretokenizer[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct dl_bpe {
  pcre2_code *re;
  bool jit;
  uint32_t byte_id[256];
  uint16_t *id_bytes; /* [n_ids] bytes each token id stands for (0: not a byte-level token) */
  uint32_t n_ids;
  struct dl_u64map merges; /* (left id << 32 | right id) -> (rank << 32 | merged id) */
  pthread_mutex_t lock;    /* guards cache */
  struct dl_strmap cache;  /* word bytes -> (uintptr_t) uint32_t[1 + n]: n, ids */
};

/* GPT-2's byte-to-unicode map, inverted: code point -> byte, or -1. */
static void unicode_to_byte(int16_t inv[324]) {
  for (int i = 0; i < 324; i++) inv[i] = -1;
  int extra = 0;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    inv[printable ? b : 256 + extra++] = (int16_t)b;
  }
}

/* Decodes a vocabulary spelling into raw bytes (out has room for strlen(s)). */
static int spelling_to_bytes(const int16_t inv[324], const char *s, char *out, size_t *ret_len) {
  size_t n = 0;
  for (const uint8_t *p = (const uint8_t *)s; *p;) {
    uint32_t cp;
    if (*p < 0x80)
      cp = *p++;
    else if ((*p & 0xe0) == 0xc0 && (p[1] & 0xc0) == 0x80) {
      cp = ((uint32_t)(*p & 0x1f) << 6) | (p[1] & 0x3f);
      p += 2;
    } else
      return STK_ECORRUPT;
    if (cp >= 324 || inv[cp] < 0) return STK_ECORRUPT;
    out[n++] = (char)inv[cp];
  }
  *ret_len = n;
  return 0;
}

/* Records that token `id` stands for len bytes (dl_bpe_token_bytes). */
static int note_bytes(struct dl_bpe *b, uint32_t id, size_t len) {
  if (id >= (1u << 24)) return STK_ECORRUPT; /* no vocabulary is that large */
  if (id >= b->n_ids) {
    uint32_t n = b->n_ids ? b->n_ids : 1024;
    while (n <= id) n *= 2;
    uint16_t *p = realloc(b->id_bytes, n * sizeof *p);
    if (!p) return STK_ENOMEM;
    memset(p + b->n_ids, 0, (n - b->n_ids) * sizeof *p);
    b->id_bytes = p;
    b->n_ids = n;
  }
  b->id_bytes[id] = (uint16_t)len;
  return 0;
}

static int load_vocab(const char *path, const int16_t inv[324], struct dl_bpe *b,
                      struct dl_strmap *vocab) {
  struct dl_map m;
  int rc = dl_map_open(path, &m);
  if (rc < 0) return rc;
  cJSON *root = cJSON_ParseWithLength((const char *)m.data, m.size);
  dl_map_close(&m);
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    stk_set_detail("%s: not a JSON object of token -> id", path);
    return STK_ECORRUPT;
  }
  for (int i = 0; i < 256; i++) b->byte_id[i] = UINT32_MAX;
  for (const cJSON *e = root->child; e && rc == 0; e = e->next) {
    char raw[1024]; /* a spelling's bytes: at most its length, so len < 1024 */
    size_t len;
    if (!cJSON_IsNumber(e) || strlen(e->string) >= sizeof raw || e->valuedouble < 0 ||
        spelling_to_bytes(inv, e->string, raw, &len) < 0)
      continue; /* not a byte-level token (e.g. added special tokens): never produced */
    uint32_t id = (uint32_t)e->valuedouble;
    rc = dl_strmap_put(vocab, raw, len, id);
    if (rc == 0) rc = note_bytes(b, id, len);
    if (len == 1) b->byte_id[(uint8_t)raw[0]] = id;
  }
  cJSON_Delete(root);
  if (rc == STK_ECORRUPT) stk_set_detail("%s: a token id over 2^24", path);
  for (int i = 0; i < 256 && rc == 0; i++) {
    if (b->byte_id[i] != UINT32_MAX) continue;
    stk_set_detail("%s: no token for byte %d", path, i);
    rc = STK_ECORRUPT;
  }
  return rc;
}

/* One merges line "A B": registers the pair with its rank. */
static int add_merge(struct dl_bpe *b, const struct dl_strmap *vocab, const int16_t inv[324],
                     char *line, uint32_t rank) {
  char *sp = strchr(line, ' ');
  if (!sp) return 0;
  *sp = '\0';
  char left[512], right[512], both[1024];
  size_t nl, nr;
  if (strlen(line) >= sizeof left || strlen(sp + 1) >= sizeof right ||
      spelling_to_bytes(inv, line, left, &nl) < 0 || spelling_to_bytes(inv, sp + 1, right, &nr) < 0)
    return STK_ECORRUPT;
  memcpy(both, left, nl);
  memcpy(both + nl, right, nr);
  uint64_t *a = dl_strmap_get(vocab, left, nl), *c = dl_strmap_get(vocab, right, nr);
  uint64_t *m = dl_strmap_get(vocab, both, nl + nr);
  if (!a || !c || !m) return 0; /* a merge whose tokens are not in the vocabulary never applies */
  return dl_u64map_put(&b->merges, *a << 32 | *c, (uint64_t)rank << 32 | *m);
}

static int load_merges(const char *path, const int16_t inv[324], struct dl_bpe *b,
                       const struct dl_strmap *vocab) {
  struct dl_map m;
  int rc = dl_map_open(path, &m);
  if (rc < 0) return rc;
  size_t size = m.size;
  char *text = malloc(size + 1);
  if (!text)
    rc = STK_ENOMEM;
  else if (size)
    memcpy(text, m.data, size);
  dl_map_close(&m);
  if (rc < 0) return rc;
  text[size] = '\0';
  uint32_t rank = 0, line_no = 0;
  for (char *line = text, *next; line && rc == 0; line = next, line_no++) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    size_t l = strlen(line);
    if (l && line[l - 1] == '\r') line[--l] = '\0';
    if (l == 0 || (line_no == 0 && strncmp(line, "#version", 8) == 0)) continue;
    rc = add_merge(b, vocab, inv, line, rank++);
    if (rc == STK_ECORRUPT) stk_set_detail("%s:%u: not a merge of two tokens", path, line_no + 1);
  }
  free(text);
  return rc;
}

static int compile_regex(struct dl_bpe *b) {
  int err;
  PCRE2_SIZE off;
  b->re = pcre2_compile((PCRE2_SPTR)pretokenizer, PCRE2_ZERO_TERMINATED,
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
  if (!b->re) {
    stk_set_detail("gpt2 pre-tokenizer regex: PCRE2 error %d at %zu", err, (size_t)off);
    return STK_EINTERNAL;
  }
  b->jit = pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE) == 0;
  return 0;
}

int dl_bpe_new(const char *vocab_json, const char *merges_txt, struct dl_bpe **ret_bpe) {
  struct dl_bpe *b = calloc(1, sizeof *b);
  if (!b) return STK_ENOMEM;
  pthread_mutex_init(&b->lock, NULL);
  int16_t inv[324];
  unicode_to_byte(inv);
  struct dl_strmap vocab = {0};
  int rc = load_vocab(vocab_json, inv, b, &vocab);
  if (rc == 0) rc = load_merges(merges_txt, inv, b, &vocab);
  if (rc == 0) rc = compile_regex(b);
  dl_strmap_clear(&vocab, NULL);
  if (rc < 0) {
    dl_bpe_free(b);
    return rc;
  }
  *ret_bpe = b;
  return 0;
}

static void free_cached(uint64_t val) {
  free((void *)(uintptr_t)val);
}

void dl_bpe_free(struct dl_bpe *b) {
  if (!b) return;
  if (b->re) pcre2_code_free(b->re);
  free(b->id_bytes);
  dl_u64map_clear(&b->merges);
  dl_strmap_clear(&b->cache, free_cached);
  pthread_mutex_destroy(&b->lock);
  free(b);
}

/* BPE of one word in place: sym[0..n) byte ids in, token ids out; returns n. */
static size_t merge_word(const struct dl_bpe *b, uint32_t *sym, size_t n) {
  while (n > 1) {
    uint64_t best = UINT64_MAX, v;
    for (size_t i = 0; i + 1 < n; i++)
      if (dl_u64map_get(&b->merges, (uint64_t)sym[i] << 32 | sym[i + 1], &v) && v < best) best = v;
    if (best == UINT64_MAX) break;
    uint32_t merged = (uint32_t)best;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
      uint64_t got;
      if (i + 1 < n && dl_u64map_get(&b->merges, (uint64_t)sym[i] << 32 | sym[i + 1], &got) &&
          got == best) {
        sym[w++] = merged;
        i++;
      } else
        sym[w++] = sym[i];
    }
    n = w;
  }
  return n;
}

static int append_ids(struct dl_tokens *out, const uint32_t *ids, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (dl_tokens_push(out, ids[i]) < 0) return STK_ENOMEM;
  return 0;
}

/* Encodes one word, through the cache. */
static int encode_word(struct dl_bpe *b, const char *w, size_t len, struct dl_tokens *out) {
  pthread_mutex_lock(&b->lock);
  uint64_t *hit = dl_strmap_get(&b->cache, w, len);
  if (hit) {
    const uint32_t *c = (const uint32_t *)(uintptr_t)*hit;
    int rc = append_ids(out, c + 1, c[0]);
    pthread_mutex_unlock(&b->lock);
    return rc;
  }
  pthread_mutex_unlock(&b->lock);
  uint32_t *sym = malloc((len + 1) * sizeof *sym);
  if (!sym) return STK_ENOMEM;
  for (size_t i = 0; i < len; i++) sym[i + 1] = b->byte_id[(uint8_t)w[i]];
  sym[0] = (uint32_t)merge_word(b, sym + 1, len);
  int rc = append_ids(out, sym + 1, sym[0]);
  pthread_mutex_lock(&b->lock);
  if (b->cache.n >= CACHE_MAX_WORDS) dl_strmap_clear(&b->cache, free_cached);
  if (rc == 0 && !dl_strmap_get(&b->cache, w, len) &&
      dl_strmap_put(&b->cache, w, len, (uintptr_t)sym) == 0)
    sym = NULL;
  pthread_mutex_unlock(&b->lock);
  free(sym);
  return rc;
}

int dl_bpe_encode(struct dl_bpe *b, const char *text, size_t len, struct dl_tokens *out) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(b->re, NULL);
  if (!md) return STK_ENOMEM;
  size_t pos = 0;
  int rc = 0;
  while (pos < len && rc == 0) {
    int m = b->jit ? pcre2_jit_match(b->re, (PCRE2_SPTR)text, len, pos, 0, md, NULL)
                   : pcre2_match(b->re, (PCRE2_SPTR)text, len, pos, 0, md, NULL);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t s = m > 0 ? ov[0] : len, e = m > 0 ? ov[1] : len;
    if (s > pos) rc = encode_word(b, text + pos, s - pos, out); /* bytes no rule matched */
    if (rc == 0 && e > s) rc = encode_word(b, text + s, e - s, out);
    pos = e > s ? e : s + 1;
  }
  pcre2_match_data_free(md);
  return rc;
}

size_t dl_bpe_token_bytes(const struct dl_bpe *b, uint32_t id) {
  return id < b->n_ids ? b->id_bytes[id] : 0;
}
