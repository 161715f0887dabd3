/*
 * The data roots hold (issue 25, item 1): every dataset, tokenizer and
 * directory path goes through dl_map_open / dl_is_dir / dl_list_dir, which
 * open beneath a root's descriptor. Links that stay inside a root work
 * (relative, absolute, through directories, with ".."); a link that leads
 * out is PERMISSION_DENIED whether or not its target exists (no existence
 * oracle); a parent directory swapped for a link to the outside while paths
 * are opened (RENAME_EXCHANGE in a loop, as the audit did) never yields the
 * outside bytes.
 */
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "dl_files.h"
#include "dl_roots.h"
#include "dl_test.h"
#include "stk_error.h"

/* A tree: base/root (the data root) and base/outside beside it. */
struct tree {
  char *base;
  char root[PATH_MAX], outside[PATH_MAX];
};

static void path_of(char *out, const char *dir, const char *name) {
  assert_true((size_t)snprintf(out, PATH_MAX, "%s/%s", dir, name) < PATH_MAX);
}

static void write_text(const char *dir, const char *name, const char *text) {
  char p[PATH_MAX];
  path_of(p, dir, name);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  for (int i = 0; i < 64; i++) fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

static void mkdir_in(const char *dir, const char *name) {
  char p[PATH_MAX];
  path_of(p, dir, name);
  assert_int_equal(mkdir(p, 0755), 0);
}

static void link_in(const char *dir, const char *name, const char *target) {
  char p[PATH_MAX];
  path_of(p, dir, name);
  assert_int_equal(symlink(target, p), 0);
}

static void tree_make(struct tree *t) {
  t->base = t_tmpdir();
  path_of(t->root, t->base, "root");
  path_of(t->outside, t->base, "outside");
  assert_int_equal(mkdir(t->root, 0755), 0);
  assert_int_equal(mkdir(t->outside, 0755), 0);
  mkdir_in(t->root, "a");
  char a[PATH_MAX];
  path_of(a, t->root, "a");
  write_text(a, "f.txt", "INSIDE ");
  write_text(t->outside, "secret.txt", "OUTSIDE ");
  assert_int_equal(dl_roots_set(t->root), 0);
}

static void tree_free(struct tree *t) {
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->base);
  assert_int_equal(system(cmd), 0);
  free(t->base);
}

/* dl_map_open of root/rel: its return code; on success the map must hold
 * the inside text, never the outside one. */
static int open_rel(const struct tree *t, const char *rel) {
  char p[PATH_MAX];
  path_of(p, t->root, rel);
  struct dl_map m;
  int rc = dl_map_open(p, &m);
  if (rc == 0) {
    assert_true(m.size >= 7);
    assert_memory_equal(m.data, "INSIDE ", 7);
    dl_map_close(&m);
  }
  return rc;
}

static void test_links_inside_a_root_are_followed(void **state) {
  (void)state;
  struct tree t;
  tree_make(&t);
  char abs[PATH_MAX];
  path_of(abs, t.root, "a/f.txt");
  link_in(t.root, "rel", "a/f.txt");
  link_in(t.root, "abs", abs);
  link_in(t.root, "dir", "a");
  link_in(t.root, "up", "a/../a/./f.txt");
  link_in(t.root, "chain", "rel");
  const char *ok[] = {"a/f.txt", "rel", "abs", "dir/f.txt", "up", "chain", "a/../a//./f.txt"};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) assert_int_equal(open_rel(&t, ok[i]), 0);
  char dir[PATH_MAX];
  path_of(dir, t.root, "dir");
  assert_true(dl_is_dir(dir));
  char **paths;
  size_t n;
  assert_int_equal(dl_list_dir(dir, ".txt", &paths, &n), 0);
  assert_int_equal(n, 1);
  dl_paths_free(paths, n);
  assert_int_equal(open_rel(&t, "missing.txt"), STK_ENOENT);
  tree_free(&t);
}

/* Every way out answers PERMISSION_DENIED naming the rule, the same for a
 * target that exists and one that does not. */
static void test_links_out_answer_the_same_whether_or_not_the_target_exists(void **state) {
  (void)state;
  struct tree t;
  tree_make(&t);
  char secret[PATH_MAX], ghost[PATH_MAX];
  path_of(secret, t.outside, "secret.txt");
  path_of(ghost, t.outside, "ghost.txt");
  link_in(t.root, "abs_out.txt", secret);
  link_in(t.root, "abs_ghost.txt", ghost);
  link_in(t.root, "rel_out.txt", "../outside/secret.txt");
  link_in(t.root, "rel_ghost.txt", "../outside/ghost.txt");
  link_in(t.root, "far_ghost.txt", "/no/such/dir/at/all");
  link_in(t.root, "dir_out", t.outside);
  link_in(t.root, "back_in.txt", "../root/a/f.txt"); /* ".." above the root, even to come back */
  const char *out[] = {"abs_out.txt",   "abs_ghost.txt",      "rel_out.txt", "rel_ghost.txt",
                       "far_ghost.txt", "dir_out/secret.txt", "back_in.txt", "dir_out/ghost.txt"};
  for (size_t i = 0; i < sizeof out / sizeof *out; i++) {
    assert_int_equal(open_rel(&t, out[i]), STK_EPERM);
    assert_non_null(strstr(stk_detail(), "a link leads out of the data roots"));
  }
  assert_int_equal(open_rel(&t, "../outside/secret.txt"), STK_EPERM);
  assert_non_null(strstr(stk_detail(), "outside the data roots"));
  char dir_out[PATH_MAX];
  path_of(dir_out, t.root, "dir_out");
  assert_false(dl_is_dir(dir_out));
  /* A listing skips every link out, existing target or not. */
  char **paths;
  size_t n;
  assert_int_equal(dl_list_dir(t.root, ".txt", &paths, &n), 0);
  assert_int_equal(n, 0);
  dl_paths_free(paths, n);
  tree_free(&t);
}

static void test_link_loops_and_long_chains_end(void **state) {
  (void)state;
  struct tree t;
  tree_make(&t);
  link_in(t.root, "l1", "l2");
  link_in(t.root, "l2", "l1");
  assert_int_equal(open_rel(&t, "l1"), STK_EINVAL);
  /* c0 -> a/f.txt, cK -> c(K-1): 40 links are followed, 41 are not. */
  link_in(t.root, "c0", "a/f.txt");
  for (int k = 1; k <= 40; k++) {
    char name[16], target[16];
    snprintf(name, sizeof name, "c%d", k);
    snprintf(target, sizeof target, "c%d", k - 1);
    link_in(t.root, name, target);
  }
  assert_int_equal(open_rel(&t, "c39"), 0);
  assert_int_equal(open_rel(&t, "c40"), STK_EINVAL);
  tree_free(&t);
}

struct swapper {
  char a[PATH_MAX], b[PATH_MAX];
  atomic_bool stop;
  atomic_long swaps;
};

static void *swap_loop(void *arg) {
  struct swapper *s = arg;
  while (!atomic_load(&s->stop)) {
    if (renameat2(AT_FDCWD, s->a, AT_FDCWD, s->b, RENAME_EXCHANGE) == 0)
      atomic_fetch_add(&s->swaps, 1);
  }
  return NULL;
}

/* root/sub is a directory and root/swap a link to outside/sub; a thread
 * exchanges the two names without pause while paths under root/sub are
 * mapped. Each open either maps the inside file or is refused; both must
 * happen (the race was run), and the outside bytes never appear. */
static void race(bool absolute) {
  struct tree t;
  tree_make(&t);
  char sub_in[PATH_MAX], sub_out[PATH_MAX], target[PATH_MAX];
  mkdir_in(t.root, "sub");
  mkdir_in(t.outside, "sub");
  path_of(sub_in, t.root, "sub");
  path_of(sub_out, t.outside, "sub");
  write_text(sub_in, "data.txt", "INSIDE ");
  write_text(sub_out, "data.txt", "OUTSIDE ");
  if (absolute)
    path_of(target, t.outside, "sub");
  else
    snprintf(target, sizeof target, "../outside/sub");
  link_in(t.root, "swap", target);
  struct swapper s = {.stop = false};
  path_of(s.a, t.root, "sub");
  path_of(s.b, t.root, "swap");
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, swap_loop, &s), 0);
  int inside = 0, refused = 0;
  for (int i = 0; i < 20000 && (i < 2000 || !inside || !refused); i++) {
    int rc = open_rel(&t, "sub/data.txt"); /* asserts the inside bytes */
    if (rc == 0)
      inside++;
    else if (rc == STK_EPERM)
      refused++;
    else
      assert_int_equal(rc, STK_ENOENT); /* a name mid-exchange */
  }
  atomic_store(&s.stop, true);
  pthread_join(th, NULL);
  print_message("  %s: %d mapped inside, %d refused, %ld swaps\n", target, inside, refused,
                atomic_load(&s.swaps));
  assert_true(inside > 0);
  assert_true(refused > 0);
  tree_free(&t);
}

static void test_swapped_parent_absolute_link_never_reads_outside(void **state) {
  (void)state;
  race(true);
}

static void test_swapped_parent_relative_link_never_reads_outside(void **state) {
  (void)state;
  race(false);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_links_inside_a_root_are_followed),
      cmocka_unit_test(test_links_out_answer_the_same_whether_or_not_the_target_exists),
      cmocka_unit_test(test_link_loops_and_long_chains_end),
      cmocka_unit_test(test_swapped_parent_absolute_link_never_reads_outside),
      cmocka_unit_test(test_swapped_parent_relative_link_never_reads_outside),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
