/*
 * dl_synthetic: a dataset made of arithmetic, for tests and benchmarks. Every
 * token says which document it belongs to and where, so a test can trace each
 * served token back to (document, position) and prove nothing was repeated or
 * skipped.
 *
 * The rules (pure functions; the same in every process and run):
 *   length of document d = min_len + splitmix64(seed ^ (d * 0x9E3779B97F4A7C15))
 *                          % (max_len - min_len + 1)        (see dl_synthetic_doc_len)
 *   token at position p of document d = (d << 12) | p       (see dl_synthetic_token)
 * Limits that keep this unambiguous: n_docs <= DL_SYNTHETIC_MAX_DOCS (2^20 - 1) and
 * max_len <= DL_SYNTHETIC_MAX_LEN (4096), so d and p fit their bit fields and no
 * token equals DL_SYNTHETIC_EOT (0xFFFFFFFF), the delimiter of the llm.c files
 * written below.
 *
 * Units of the in-memory source are documents (unit u = document u), weight =
 * length; doc_starts = {0}; its one file, "synthetic", holds document u as unit u.
 */
#ifndef STK_DL_SYNTHETIC_H
#define STK_DL_SYNTHETIC_H

#include <stdint.h>

#include "dl_source.h"

#define DL_SYNTHETIC_MAX_DOCS ((UINT64_C(1) << 20) - 1)
#define DL_SYNTHETIC_MAX_LEN  4096u
#define DL_SYNTHETIC_EOT      UINT32_C(0xFFFFFFFF)

/* Errors: STK_EINVAL when a limit above is broken or min_len > max_len. */
int dl_source_open_synthetic(const char *name, uint64_t n_docs, uint32_t min_len, uint32_t max_len,
                             uint64_t seed, struct dl_source **ret);

static inline uint32_t dl_synthetic_token(uint64_t doc, uint32_t pos) {
  return (uint32_t)(doc << 12) | (pos & 0xfffu);
}

static inline void dl_synthetic_decode(uint32_t token, uint64_t *ret_doc, uint32_t *ret_pos) {
  *ret_doc = token >> 12;
  *ret_pos = token & 0xfffu;
}

uint32_t dl_synthetic_doc_len(uint64_t seed, uint32_t min_len, uint32_t max_len, uint64_t doc);

/* Writes documents [0, n_docs) as a Megatron dataset PREFIX.bin + PREFIX.idx with
 * dtype 4 (int32; needs n_docs <= 2^19) or 5 (int64). Each document is cut into
 * sequences of at most seq_tokens tokens (0: one sequence per document), so
 * documents span several sequences. Errors: STK_EINVAL, STK_EIO (with detail). */
int dl_synthetic_write_megatron(const char *prefix, uint64_t n_docs, uint32_t min_len,
                                uint32_t max_len, uint64_t seed, int dtype, uint32_t seq_tokens);

/* Writes documents [first_doc, first_doc + n_docs) as one llm.c file (uint32
 * tokens, magic 20240801, version 7), each document preceded by
 * DL_SYNTHETIC_EOT; open it with dl_source_opts.eot_id = DL_SYNTHETIC_EOT.
 * Several files with consecutive ranges make a directory dataset. */
int dl_synthetic_write_llmc(const char *path, uint64_t first_doc, uint64_t n_docs, uint32_t min_len,
                            uint32_t max_len, uint64_t seed);

#endif
