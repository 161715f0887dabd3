/*
 * dl_source: a dataset on local disk as the dataloader core sees it — an
 * ordered list of "units", each a run of token ids (uint32) that can be read
 * at random. Units are the dataloader's unit of shuffling and provenance.
 *
 * Opening reads headers and indexes only (O(files), never a pass over the
 * tokens), so the number of units and each unit's weight are known at once:
 *   Megatron (.bin + .idx): a unit is a document (from document_indices);
 *     weight = its token count.
 *   llm.c (.bin, uint16 or uint32): the files carry no document index, so a
 *     unit is a fixed block of `block_tokens` tokens of the concatenated
 *     files (the last block of a file may be shorter); the end-of-text
 *     tokens inside mark where documents start. weight = token count.
 *   text (JSONL `text` field, or plain text): a unit is the set of lines
 *     (JSONL) or paragraphs (plain text, split at blank lines) that START in
 *     a byte block of `block_bytes` of a file; it is tokenized on the fly
 *     when read (cached). weight = the block's byte count (tokens unknown
 *     until read).
 * Reading a unit yields its tokens with the tokenizer-added BOS/EOS ids
 * (strip_ids) removed, plus the offsets where documents start inside it.
 *
 * Documents have identities of their own: (file, index of the document in
 * that file). A unit lies in one file; dl_source_unit_docs says which
 * document each of its pieces belongs to. Megatron and the synthetic source
 * know that from their units; llm.c and text files learn it from an index
 * of each file (documents counted per stride of the file), built on first
 * need with one pass over the file and kept while the source is open, so
 * serving that never asks pays nothing.
 *
 * Thread safety: after open, every function may be called from any thread.
 */
#ifndef STK_DL_SOURCE_H
#define STK_DL_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum dl_format { DL_FORMAT_MEGATRON = 1, DL_FORMAT_LLMC = 2, DL_FORMAT_TEXT = 3 };

/* The llm.c unit when a spec names none: 32768 tokens (128 KiB). Each unit
 * starts at a random place of the corpus, and that first touch, the keyed
 * permutation and the unit's bookkeeping cost about as much as copying 2,000
 * tokens; 8192-token units served 20% fewer tokens per second. */
#define DL_LLMC_BLOCK_TOKENS 32768u

struct dl_source_opts {
  const char *name; /* Dataset name (for errors and provenance). */
  const char *path; /* A file, a file prefix (Megatron: PREFIX.bin/.idx) or a directory
                       (every matching file in name order). */
  enum dl_format format;
  const char *tokenizer;     /* Text only: "bytes" (default) or "gpt2:VOCAB_JSON,MERGES_TXT". */
  uint32_t block_tokens;     /* llm.c unit size; 0: DL_LLMC_BLOCK_TOKENS. */
  uint32_t block_bytes;      /* Text unit size; 0: 65536. */
  const uint32_t *strip_ids; /* Token ids removed at document starts and ends. */
  size_t n_strip_ids;
  int64_t eot_id; /* llm.c document delimiter; < 0: 50256 (GPT-2). */
};

struct dl_source;

/* Errors: STK_EINVAL (bad options), STK_ENOENT (no such file), STK_ECORRUPT
 * (wrong magic, truncated file, sizes that disagree), STK_EIO; stk_detail()
 * names the file and what is wrong. */
int dl_source_open(const struct dl_source_opts *opts, struct dl_source **ret_source);
void dl_source_free(struct dl_source *s);

const char *dl_source_name(const struct dl_source *s);
uint64_t dl_source_units(const struct dl_source *s);
/* Token count (binary formats) or byte count (text) of unit u. O(1). */
uint64_t dl_source_unit_weight(const struct dl_source *s, uint64_t u);
/* Sum of all unit weights. */
uint64_t dl_source_total_weight(const struct dl_source *s);

/* A unit's tokens, read. The caller frees with dl_unit_free. */
struct dl_unit {
  uint32_t *tokens; /* [n_tokens]; NULL in the borrowed form (below) */
  size_t n_tokens;
  uint32_t *doc_starts; /* [n_docs] offsets in tokens where documents start; first is 0 unless
                           the unit begins mid-document (llm.c blocks). */
  size_t n_docs;
  uint32_t file;     /* The file holding the unit (dl_source_file_name). */
  uint32_t *doc_rel; /* [n_docs] or NULL (then doc_rel[i] = i + 1): which document
                        starts at doc_starts[i], counted from the unit's first one, as
                        dl_source_unit_docs explains; readers that drop documents
                        left empty (strip ids, empty text) set it. */
  /* Borrowed form (dl_source_read_unit_runs only; tokens == NULL): the tokens
   * are n_runs runs of little-endian uint32 inside the reader's memory map,
   * valid while the source is open. Run i holds tokens [run_at[i],
   * run_at[i + 1]) and starts at byte address run_src[i] (4-byte aligned);
   * run_at[0] == 0 and run_at[n_runs] == n_tokens. dl_unit_free frees the
   * two arrays, never the map. */
  const uint8_t **run_src; /* [n_runs] */
  uint32_t *run_at;        /* [n_runs + 1] */
  size_t n_runs;
  /* Delimited form (dl_source_read_unit_delimited only; raw != NULL): nothing
   * has been read yet. The unit's tokens are raw[raw_begin, raw_end) with
   * every `delim` token dropped, and a document starts at each kept token
   * that is raw[0] or follows a delim (dl_take.h reads it that way). raw is
   * the file's first token in the reader's map, valid while the source is
   * open; n_tokens, doc_starts and the runs are unset (0 / NULL). */
  const uint32_t *raw;
  uint64_t raw_begin, raw_end;
  uint32_t delim;
};
int dl_source_read_unit(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit);
/* Like dl_source_read_unit, but a reader that can (llm.c files of uint32
 * tokens on a little-endian host) returns the borrowed form instead of a
 * copy: the serve path then copies tokens once, from the map into the batch.
 * Other readers return the copied form. Either form has the same tokens. */
int dl_source_read_unit_runs(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit);
/* Like dl_source_read_unit_runs, but a reader that can (llm.c uint32 files,
 * little-endian host, no strip ids) returns the delimited form: no token is
 * read until the caller takes them (dl_take.h), once, into a batch. */
int dl_source_read_unit_delimited(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit);
/* Where a unit's documents are in its file (unit.file): the document
 * starting at doc_starts[i] is document base + doc_rel[i] - 1 of the file,
 * and tokens before doc_starts[0] (or every token when n_docs is 0) are
 * tokens lead_offset, lead_offset + 1, ... of document base - 1 (the unit
 * began inside it). Offsets count the document's tokens as read (strip ids
 * removed). llm.c and text sources build their file's index on the first
 * call (one pass over the file; at most 16 bytes per 4096 tokens, or 8
 * bytes per text block, kept); later calls read at most 4096 tokens
 * (32768 for llm.c blocks larger than that) past an index entry. */
struct dl_unit_docs {
  uint64_t base;
  uint64_t lead_offset;
};
int dl_source_unit_docs(struct dl_source *s, uint64_t u, struct dl_unit_docs *ret_docs);
/* The dataset's files, in unit order; names are the file names inside the
 * dataset's directory (or the file's own name; a Megatron prefix's). */
uint32_t dl_source_files(const struct dl_source *s);
const char *dl_source_file_name(const struct dl_source *s, uint32_t file);
/* Index of the file with that name; STK_ENOENT when none. */
int dl_source_find_file(const struct dl_source *s, const char *name, uint32_t *ret_file);
/* Number of documents in a file (builds its index where needed). */
int dl_source_file_docs(struct dl_source *s, uint32_t file, uint64_t *ret_docs);

/* Readers that tokenize text (text datasets) can start a unit anywhere in
 * it, so a job that changes a dataset's tokenizer in the middle of a unit
 * goes on from the byte where the old tokenizer stopped.
 * dl_source_tokenizes: whether s is such a reader. dl_source_token_bytes:
 * the bytes of text token `id` stands for (the tokenizers are byte-level:
 * a run of ids spells exactly the bytes it was encoded from); 0 for other
 * readers and ids never produced.
 * dl_source_read_unit_from: unit u without its documents before doc_rel
 * (counted as doc_rel in dl_unit: the unit's first document is 1); when
 * lead, document doc_rel is tokenized from byte `byte` of its text and is
 * the unit's leading fragment (no entry in doc_starts), else it starts
 * fresh. Copied form; STK_EINVAL for readers that do not tokenize. */
bool dl_source_tokenizes(const struct dl_source *s);
size_t dl_source_token_bytes(const struct dl_source *s, uint32_t id);
int dl_source_read_unit_from(struct dl_source *s, uint64_t u, uint32_t doc_rel, uint64_t byte,
                             bool lead, struct dl_unit *ret_unit);

/* Copies tokens [off, off + n) of a unit of the copied or borrowed form to dst. */
void dl_unit_copy(const struct dl_unit *unit, size_t off, size_t n, uint32_t *dst);
void dl_unit_free(struct dl_unit *unit);

#endif
