/*
 * fs_fixture: see fs_fixture.h.
 */
#include "fs_fixture.h"

#include <stdio.h>
#include <stdlib.h>

int fs_setup(void **state) {
  struct fs_fixture *f = calloc(1, sizeof(*f));
  if (!f) return -1;
  snprintf(f->dir, sizeof(f->dir), "/tmp/stk-fs-XXXXXX");
  if (!mkdtemp(f->dir)) return -1;
  char url[96];
  snprintf(url, sizeof(url), "file://%s/root", f->dir);
  if (storage_open(url, &f->st) != 0) return -1;
  *state = f;
  return 0;
}

int fs_teardown(void **state) {
  struct fs_fixture *f = *state;
  storage_free(f->st);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
  if (system(cmd) != 0) return -1;
  free(f);
  return 0;
}
