/*
 * dl_tokenizer: text to token ids for the text reader (and the benchmark).
 *   "bytes": every UTF-8 byte is its own id (0..255).
 *   "gpt2:VOCAB_JSON,MERGES_TXT": GPT-2 byte-level BPE from encoder.json /
 *     vocab.json (token -> id) and vocab.bpe / merges.txt (merge ranks), with
 *     GPT-2's pre-tokenizer regex (PCRE2, Unicode properties, JIT when
 *     available) and a cache of encoded words.
 * Thread safety: dl_tokenizer_encode may be called from any thread at once.
 */
#ifndef STK_DL_TOKENIZER_H
#define STK_DL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct dl_tokenizer;

/* A growable id array; start zeroed, release with dl_tokens_release. */
struct dl_tokens {
  uint32_t *ids;
  size_t n, cap;
};

/* spec NULL or "" means "bytes". Errors: STK_EINVAL (unknown spec),
 * STK_ENOENT / STK_ECORRUPT for the GPT-2 files (detail names the file). */
int dl_tokenizer_new(const char *spec, struct dl_tokenizer **ret_tok);
void dl_tokenizer_free(struct dl_tokenizer *tok);

/* Appends the ids of text[0..len) to out. 0 or STK_ENOMEM. */
int dl_tokenizer_encode(struct dl_tokenizer *tok, const char *text, size_t len,
                        struct dl_tokens *out);
/* Bytes of text the id stands for (byte-level tokenizers: the text of a run
 * of ids is the concatenation of theirs); 0 for an id encode never gives. */
size_t dl_tokenizer_token_bytes(const struct dl_tokenizer *tok, uint32_t id);
void dl_tokens_release(struct dl_tokens *t);
/* Appends one id; 0 or STK_ENOMEM. */
int dl_tokens_push(struct dl_tokens *t, uint32_t id);

#endif
