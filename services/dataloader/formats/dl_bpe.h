/*
 * The GPT-2 byte-level BPE behind dl_tokenizer (internal to formats/).
 */
#ifndef STK_DL_BPE_H
#define STK_DL_BPE_H

#include "dl_tokenizer.h"

struct dl_bpe;

int dl_bpe_new(const char *vocab_json, const char *merges_txt, struct dl_bpe **ret_bpe);
void dl_bpe_free(struct dl_bpe *b);
/* Bytes of text token `id` stands for (0: an id encode never produces). */
size_t dl_bpe_token_bytes(const struct dl_bpe *b, uint32_t id);
int dl_bpe_encode(struct dl_bpe *b, const char *text, size_t len, struct dl_tokens *out);

#endif
