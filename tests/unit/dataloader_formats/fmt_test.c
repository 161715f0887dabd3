/* The helpers declared in fmt_test.h. */
#include "fmt_test.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  return remove(path);
}

char *tmpdir_new(void) {
  char *dir = strdup("/tmp/stk-dlfmt-XXXXXX");
  if (!dir || !mkdtemp(dir)) abort();
  return dir;
}

void tmpdir_remove(char *dir) {
  if (!dir) return;
  nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(dir);
}

const char *path_in(const char *dir, const char *name) {
  static char bufs[4][512];
  static int next;
  char *b = bufs[next++ % 4];
  snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
  return b;
}

void write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) abort();
}

void write_megatron_idx(const char *path, uint8_t dtype, uint64_t n_seqs, const int32_t *lengths,
                        const int64_t *pointers, uint64_t n_doc_idx, const int64_t *doc_idx) {
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  uint64_t version = 1;
  fwrite("MMIDIDX\0\0", 1, 9, f);
  fwrite(&version, 8, 1, f);
  fwrite(&dtype, 1, 1, f);
  fwrite(&n_seqs, 8, 1, f);
  fwrite(&n_doc_idx, 8, 1, f);
  if (n_seqs) fwrite(lengths, 4, n_seqs, f);
  if (n_seqs) fwrite(pointers, 8, n_seqs, f);
  if (n_doc_idx) fwrite(doc_idx, 8, n_doc_idx, f);
  if (fclose(f) != 0) abort();
}
