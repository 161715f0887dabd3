/*
 * coord_base: memory, clocks and the kick, the helpers at the bottom of the
 * coordinator that every file calls and that call nothing above them. The
 * kick starts the idle handle with the pass coord_open stored in c->pass,
 * so this file need not know what the pass does.
 */
#include "coord_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

void *coord_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) abort();
  return p;
}

void *coord_xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) abort();
  return p;
}

void *coord_xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) abort();
  return q;
}

char *coord_xstrdup(const char *s) {
  size_t n = strlen(s ? s : "") + 1;
  char *p = coord_xmalloc(n);
  memcpy(p, s ? s : "", n);
  return p;
}

int64_t coord_now(struct coord *c) {
  return (int64_t)uv_now(c->loop);
}

int64_t coord_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void coord_kick(struct coord *c) {
  if (c->handles_open && !c->finalizing && !uv_is_active((uv_handle_t *)&c->idle))
    uv_idle_start(&c->idle, c->pass);
}
