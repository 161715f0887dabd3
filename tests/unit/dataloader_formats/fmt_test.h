/*
 * Helpers shared by the format tests: a temporary directory per test and
 * small writers for files in every format (so tests state their bytes).
 */
#ifndef STK_FMT_TEST_H
#define STK_FMT_TEST_H

#include <stddef.h>
#include <stdint.h>

/* A fresh directory under /tmp; the caller removes it with tmpdir_remove. */
char *tmpdir_new(void);
void tmpdir_remove(char *dir);
/* dir/name in a static rotating buffer (valid for a few calls). */
const char *path_in(const char *dir, const char *name);
void write_file(const char *path, const void *data, size_t len);
/* Writes a Megatron .idx header and arrays. */
void write_megatron_idx(const char *path, uint8_t dtype, uint64_t n_seqs, const int32_t *lengths,
                        const int64_t *pointers, uint64_t n_doc_idx, const int64_t *doc_idx);

#endif
