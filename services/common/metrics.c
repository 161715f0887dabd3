/*
 * metrics: the registry behind metrics.h. Hot paths (a counter bump per
 * RPC, a latency observation per batch) must not take a lock, so a series
 * is a block of C11 atomics whose address never changes; the mutex guards
 * only the registry's arrays, taken when a series is created or looked up
 * and while rendering. Doubles (gauges, histogram sums) live as their bit
 * patterns in atomic uint64s and are updated with compare-and-swap loops.
 *
 * Layout: families sorted by name, each holding its series sorted by label
 * string, both found by binary search; the render walks them in order, so
 * the output is deterministic.
 */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"
#include "strbuf.h"

enum metric_type { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM };

/* Upper bounds in seconds; the last bucket is +Inf. Texts are the `le`
 * labels, written out so the render does not depend on float printing. */
#define N_BUCKETS 20
static const double bucket_bounds[N_BUCKETS - 1] = {
    50e-6,  100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
    100e-3, 250e-3, 500e-3, 1,      2.5,  5,      10,   30,    60};
static const char *const bucket_les[N_BUCKETS] = {
    "5e-05", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05",
    "0.1",   "0.25",   "0.5",     "1",      "2.5",   "5",      "10",    "30",   "60",    "+Inf"};

struct metric_counter {
  _Atomic uint64_t value;
};

struct metric_gauge {
  _Atomic uint64_t bits; /* A double's bit pattern. */
};

struct metric_histogram {
  _Atomic uint64_t buckets[N_BUCKETS]; /* Per bucket, not cumulative. */
  _Atomic uint64_t sum_bits;           /* Sum of observations (double). */
};

struct series {
  char *labels; /* "" when none. */
  union {
    struct metric_counter counter;
    struct metric_gauge gauge;
    struct metric_histogram histogram;
  } u;
};

struct family {
  char *name;
  char *help;
  enum metric_type type;
  void **series; /* struct series *, sorted by labels. */
  size_t n_series, cap_series;
};

struct collector {
  metrics_collect_fn fn;
  void *arg;
};

struct metrics {
  pthread_mutex_t mu;
  void **families; /* struct family *, sorted by name. */
  size_t n_families, cap_families;
  struct collector *collectors;
  size_t n_collectors;
};

static uint64_t double_bits(double v) {
  uint64_t b;
  memcpy(&b, &v, sizeof(b));
  return b;
}

static double bits_double(uint64_t b) {
  double v;
  memcpy(&v, &b, sizeof(v));
  return v;
}

struct metrics *metrics_new(void) {
  struct metrics *m = calloc(1, sizeof(*m));
  if (!m) return NULL;
  pthread_mutex_init(&m->mu, NULL);
  return m;
}

static void family_free(struct family *f) {
  for (size_t i = 0; i < f->n_series; i++) {
    struct series *s = f->series[i];
    free(s->labels);
    free(s);
  }
  free(f->series);
  free(f->name);
  free(f->help);
  free(f);
}

void metrics_free(struct metrics *m) {
  if (!m) return;
  for (size_t i = 0; i < m->n_families; i++) family_free(m->families[i]);
  free(m->families);
  free(m->collectors);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

/* Binary search over an array of pointers to structs whose first member
 * is a char * key. Returns the index of the match or the insertion point. */
static size_t search(void *const *arr, size_t n, const char *key, bool *ret_found) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int cmp = strcmp(*(char *const *)arr[mid], key);
    if (cmp == 0) {
      *ret_found = true;
      return mid;
    }
    if (cmp < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *ret_found = false;
  return lo;
}

/* Inserts item at pos, growing the array. Returns false when out of memory. */
static bool insert_at(void ***arr, size_t *n, size_t *cap, size_t pos, void *item) {
  if (*n == *cap) {
    size_t ncap = *cap ? *cap * 2 : 8;
    void **p = realloc(*arr, ncap * sizeof(*p));
    if (!p) return false;
    *arr = p;
    *cap = ncap;
  }
  memmove(*arr + pos + 1, *arr + pos, (*n - pos) * sizeof(**arr));
  (*arr)[pos] = item;
  (*n)++;
  return true;
}

/* Finds or creates the family; NULL when out of memory or when name
 * already names a family of another type (a programming error). */
static struct family *family_get(struct metrics *m, const char *name, const char *help,
                                 enum metric_type type) {
  bool found;
  size_t pos = search(m->families, m->n_families, name, &found);
  if (found) {
    struct family *f = m->families[pos];
    return f->type == type ? f : NULL;
  }
  struct family *f = calloc(1, sizeof(*f));
  if (!f) return NULL;
  f->name = strdup(name);
  f->help = strdup(help ? help : "");
  f->type = type;
  if (!f->name || !f->help || !insert_at(&m->families, &m->n_families, &m->cap_families, pos, f)) {
    family_free(f);
    return NULL;
  }
  return f;
}

static struct series *series_get(struct family *f, const char *labels) {
  bool found;
  size_t pos = search(f->series, f->n_series, labels, &found);
  if (found) return f->series[pos];
  struct series *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  s->labels = strdup(labels);
  if (!s->labels || !insert_at(&f->series, &f->n_series, &f->cap_series, pos, s)) {
    free(s->labels);
    free(s);
    return NULL;
  }
  return s;
}

static struct series *lookup(struct metrics *m, const char *name, const char *help,
                             const char *labels, enum metric_type type) {
  if (!m || !name || !*name) return NULL;
  pthread_mutex_lock(&m->mu);
  struct family *f = family_get(m, name, help, type);
  struct series *s = f ? series_get(f, labels ? labels : "") : NULL;
  pthread_mutex_unlock(&m->mu);
  return s;
}

struct metric_counter *metrics_counter(struct metrics *m, const char *name, const char *help,
                                       const char *labels) {
  struct series *s = lookup(m, name, help, labels, METRIC_COUNTER);
  return s ? &s->u.counter : NULL;
}

struct metric_gauge *metrics_gauge(struct metrics *m, const char *name, const char *help,
                                   const char *labels) {
  struct series *s = lookup(m, name, help, labels, METRIC_GAUGE);
  return s ? &s->u.gauge : NULL;
}

struct metric_histogram *metrics_histogram(struct metrics *m, const char *name, const char *help,
                                           const char *labels) {
  struct series *s = lookup(m, name, help, labels, METRIC_HISTOGRAM);
  return s ? &s->u.histogram : NULL;
}

/* Updates accept NULL (a series that could not be created) as a no-op. */
void metric_counter_add(struct metric_counter *c, uint64_t n) {
  if (c) atomic_fetch_add_explicit(&c->value, n, memory_order_relaxed);
}

void metric_gauge_set(struct metric_gauge *g, double v) {
  if (g) atomic_store_explicit(&g->bits, double_bits(v), memory_order_relaxed);
}

static void add_double(_Atomic uint64_t *bits, double delta) {
  uint64_t old = atomic_load_explicit(bits, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(bits, &old, double_bits(bits_double(old) + delta),
                                                memory_order_relaxed, memory_order_relaxed)) {
  }
}

void metric_gauge_add(struct metric_gauge *g, double delta) {
  if (g) add_double(&g->bits, delta);
}

void metric_histogram_observe(struct metric_histogram *h, double seconds) {
  if (!h) return;
  size_t i = 0;
  while (i < N_BUCKETS - 1 && !(seconds <= bucket_bounds[i])) i++;
  atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
  add_double(&h->sum_bits, seconds);
}

/* Prometheus float text: shortest round-tripping form, Inf/NaN spelled
 * the way the format wants. */
static void put_double(struct strbuf *sb, double v) {
  if (isnan(v)) return strbuf_puts(sb, "NaN");
  if (isinf(v)) return strbuf_puts(sb, v > 0 ? "+Inf" : "-Inf");
  char buf[40];
  snprintf(buf, sizeof(buf), "%.15g", v);
  if (strtod(buf, NULL) != v) snprintf(buf, sizeof(buf), "%.17g", v);
  strbuf_puts(sb, buf);
}

/* HELP text escapes backslash and newline. */
static void put_help(struct strbuf *sb, const struct family *f) {
  static const char *const types[] = {"counter", "gauge", "histogram"};
  strbuf_printf(sb, "# HELP %s ", f->name);
  for (const char *p = f->help; *p; p++) {
    if (*p == '\\')
      strbuf_puts(sb, "\\\\");
    else if (*p == '\n')
      strbuf_puts(sb, "\\n");
    else
      strbuf_putc(sb, *p);
  }
  strbuf_printf(sb, "\n# TYPE %s %s\n", f->name, types[f->type]);
}

/* name{labels} or name when there are none. */
static void put_series_name(struct strbuf *sb, const char *name, const char *suffix,
                            const char *labels) {
  strbuf_printf(sb, "%s%s", name, suffix);
  if (*labels) strbuf_printf(sb, "{%s}", labels);
  strbuf_putc(sb, ' ');
}

static void render_histogram(struct strbuf *sb, const char *name, const struct series *s) {
  const struct metric_histogram *h = &s->u.histogram;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < N_BUCKETS; i++) {
    cumulative += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
    strbuf_printf(sb, "%s_bucket{%s%sle=\"%s\"} %" PRIu64 "\n", name, s->labels,
                  *s->labels ? "," : "", bucket_les[i], cumulative);
  }
  put_series_name(sb, name, "_sum", s->labels);
  put_double(sb, bits_double(atomic_load_explicit(&h->sum_bits, memory_order_relaxed)));
  strbuf_putc(sb, '\n');
  /* The count is the +Inf bucket, so the two always agree in one render. */
  put_series_name(sb, name, "_count", s->labels);
  strbuf_printf(sb, "%" PRIu64 "\n", cumulative);
}

static void render_series(struct strbuf *sb, const struct family *f, const struct series *s) {
  switch (f->type) {
  case METRIC_COUNTER:
    put_series_name(sb, f->name, "", s->labels);
    strbuf_printf(sb, "%" PRIu64 "\n",
                  atomic_load_explicit(&s->u.counter.value, memory_order_relaxed));
    break;
  case METRIC_GAUGE:
    put_series_name(sb, f->name, "", s->labels);
    put_double(sb, bits_double(atomic_load_explicit(&s->u.gauge.bits, memory_order_relaxed)));
    strbuf_putc(sb, '\n');
    break;
  case METRIC_HISTOGRAM:
    render_histogram(sb, f->name, s);
    break;
  }
}

int metrics_add_collector(struct metrics *m, metrics_collect_fn fn, void *arg) {
  if (!m || !fn) return STK_EINVAL;
  pthread_mutex_lock(&m->mu);
  struct collector *grown = realloc(m->collectors, (m->n_collectors + 1) * sizeof(*grown));
  if (grown) {
    m->collectors = grown;
    m->collectors[m->n_collectors++] = (struct collector){fn, arg};
  }
  pthread_mutex_unlock(&m->mu);
  return grown ? 0 : STK_ENOMEM;
}

char *metrics_render(struct metrics *m, size_t *ret_len) {
  struct strbuf sb = STRBUF_INIT;
  pthread_mutex_lock(&m->mu);
  for (size_t i = 0; i < m->n_families; i++) {
    const struct family *f = m->families[i];
    put_help(&sb, f);
    for (size_t j = 0; j < f->n_series; j++) render_series(&sb, f, f->series[j]);
  }
  for (size_t i = 0; i < m->n_collectors; i++) m->collectors[i].fn(&sb, m->collectors[i].arg);
  pthread_mutex_unlock(&m->mu);
  return strbuf_take(&sb, ret_len);
}
