/*
 * dl_tokenizer: picks the tokenizer from its spec string; the byte
 * tokenizer lives here, GPT-2 BPE in dl_bpe.c below it, and the id array
 * both write into in dl_tokens.c below that.
 */
#include "dl_tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "dl_bpe.h"
#include "stk_error.h"

struct dl_tokenizer {
  struct dl_bpe *bpe; /* NULL: bytes */
};

static int open_gpt2(const char *files, struct dl_tokenizer *tok) {
  const char *comma = strchr(files, ',');
  if (!comma || comma == files || !comma[1]) {
    stk_set_detail("tokenizer gpt2: want gpt2:VOCAB_JSON,MERGES_TXT, got gpt2:%s", files);
    return STK_EINVAL;
  }
  char *vocab = strndup(files, (size_t)(comma - files));
  if (!vocab) return STK_ENOMEM;
  int rc = dl_bpe_new(vocab, comma + 1, &tok->bpe);
  free(vocab);
  return rc;
}

int dl_tokenizer_new(const char *spec, struct dl_tokenizer **ret_tok) {
  struct dl_tokenizer *tok = calloc(1, sizeof *tok);
  if (!tok) return STK_ENOMEM;
  int rc = 0;
  if (spec && spec[0] && strcmp(spec, "bytes") != 0) {
    if (strncmp(spec, "gpt2:", 5) == 0)
      rc = open_gpt2(spec + 5, tok);
    else {
      stk_set_detail("unknown tokenizer '%s' (want bytes or gpt2:VOCAB,MERGES)", spec);
      rc = STK_EINVAL;
    }
  }
  if (rc < 0) {
    free(tok);
    return rc;
  }
  *ret_tok = tok;
  return 0;
}

void dl_tokenizer_free(struct dl_tokenizer *tok) {
  if (!tok) return;
  dl_bpe_free(tok->bpe);
  free(tok);
}

int dl_tokenizer_encode(struct dl_tokenizer *tok, const char *text, size_t len,
                        struct dl_tokens *out) {
  if (tok->bpe) return dl_bpe_encode(tok->bpe, text, len, out);
  if (out->n + len > out->cap) {
    size_t cap = out->cap ? out->cap : 256;
    while (cap < out->n + len) cap *= 2;
    uint32_t *p = realloc(out->ids, cap * sizeof *p);
    if (!p) return STK_ENOMEM;
    out->ids = p;
    out->cap = cap;
  }
  for (size_t i = 0; i < len; i++) out->ids[out->n++] = (uint8_t)text[i];
  return 0;
}

size_t dl_tokenizer_token_bytes(const struct dl_tokenizer *tok, uint32_t id) {
  if (tok->bpe) return dl_bpe_token_bytes(tok->bpe, id);
  return id < 256 ? 1 : 0;
}
