/*
 * bench_stats: the benches' clock, median and quantile (bench_stats.h).
 */
#include "bench_stats.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

double bench_now_ms(void) {
  return bench_now_s() * 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(const double *v, size_t n) {
  if (n == 0) return 0;
  double *s = malloc(n * sizeof(*s));
  if (!s) abort(); /* A bench cannot report without its figures. */
  memcpy(s, v, n * sizeof(*s));
  qsort(s, n, sizeof(*s), cmp_double);
  double m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  free(s);
  return m;
}

double bench_quantile_sort(double *v, size_t n, double q) {
  if (n == 0) return 0;
  qsort(v, n, sizeof(*v), cmp_double);
  return v[(size_t)(q * (double)(n - 1))];
}
