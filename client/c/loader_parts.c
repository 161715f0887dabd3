/*
 * The loader of a scaled-out job (struct stk_loader): one client per
 * dataloader process, the i-th address of the list being part i of P.
 * Configuration and state calls (commit, import; create and mixture in
 * loader_admin.c) go to every part, in part order, stopping at the first
 * failure; a batch is
 * fetched from every part at once and assembled (loader_assemble.c); the
 * state of all parts travels as one blob. With one address every call is
 * the single-process call, byte for byte.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "loader_internal.h"

void stk_loader_close(struct stk_loader *l) {
  if (!l) return;
  for (uint32_t i = 0; i < l->n; i++) stk_client_free(l->parts[i]);
  free(l->parts);
  free(l);
}

/* Connects part n of the list to the address [a, a + len). */
static int add_part(struct stk_loader *l, const struct stk_client_opts *opts, const char *a,
                    size_t len) {
  while (len && (*a == ' ' || *a == '\t')) a++, len--;
  while (len && (a[len - 1] == ' ' || a[len - 1] == '\t')) len--;
  char *addr = len ? strndup(a, len) : NULL;
  if (!addr) return client_fail(len ? STK_ENOMEM : STK_EINVAL, "loader address list");
  struct stk_client_opts o = *opts;
  o.address = addr;
  int err = stk_loader_connect(&o, &l->parts[l->n]);
  if (err == 0) l->n++;
  free(addr);
  return err;
}

int stk_loader_open(const struct stk_client_opts *opts, struct stk_loader **ret_loader) {
  struct stk_client_opts o = {0};
  if (opts) o = *opts;
  const char *list = o.address && o.address[0] ? o.address : getenv(STK_LOADER_ENV);
  if (!list || !list[0]) list = STK_LOADER_DEFAULT_ADDRESS;
  size_t max = 1;
  for (const char *p = list; *p; p++) max += *p == ',';
  struct stk_loader *l = calloc(1, sizeof(*l));
  if (l) l->parts = calloc(max, sizeof(*l->parts));
  if (!l || !l->parts) {
    free(l);
    return client_fail(STK_ENOMEM, "loader");
  }
  int err = 0;
  for (const char *a = list; err == 0;) {
    const char *comma = strchr(a, ',');
    err = add_part(l, &o, a, comma ? (size_t)(comma - a) : strlen(a));
    if (!comma) break;
    a = comma + 1;
  }
  if (err < 0) {
    stk_loader_close(l);
    return err;
  }
  *ret_loader = l;
  return 0;
}

uint32_t stk_loader_n_parts(const struct stk_loader *l) {
  return l->n;
}

struct stk_client *stk_loader_part(struct stk_loader *l, uint32_t part) {
  return part < l->n ? l->parts[part] : NULL;
}

int loader_part_failed(uint32_t n, uint32_t i, int err) {
  if (n == 1) return err;
  int code = 0;
  char msg[480];
  snprintf(msg, sizeof(msg), "%s", stk_client_last_error(&code));
  client_set_error(code, "dataloader part %u of %u: %s", i, n, msg);
  return err;
}

int stk_loader_commit_all(struct stk_loader *l, const char *job, int64_t step, int64_t timeout_ms) {
  for (uint32_t i = 0; i < l->n; i++) {
    int err = stk_loader_commit(l->parts[i], job, step, timeout_ms);
    if (err < 0) return loader_part_failed(l->n, i, err);
  }
  return 0;
}
