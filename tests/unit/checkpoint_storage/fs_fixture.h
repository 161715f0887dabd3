/*
 * fs_fixture: the file:// storage backend on a fresh temporary directory,
 * as a cmocka setup/teardown pair, for the file backend's tests.
 */
#ifndef STK_FS_FIXTURE_H
#define STK_FS_FIXTURE_H

#include "storage.h"

struct fs_fixture {
  char dir[64];       /* The temporary directory; the store is dir/root. */
  struct storage *st; /* file://dir/root */
};

int fs_setup(void **state);    /* *state: a struct fs_fixture. */
int fs_teardown(void **state); /* Frees it and removes the directory. */

#endif
