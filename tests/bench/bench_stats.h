/*
 * bench_stats: how the bench programs in this folder time their phases and
 * summarise their rounds. One clock (CLOCK_MONOTONIC) and one median, so
 * that every bench states "the median over rounds" the same way: an even
 * count takes the mean of the two middle values.
 */
#ifndef STK_BENCH_STATS_H
#define STK_BENCH_STATS_H

#include <stddef.h>

/* Monotonic time, in seconds and in milliseconds since an arbitrary start;
 * only differences mean anything. */
double bench_now_s(void);
double bench_now_ms(void);

/* The median of v[0..n), v left unchanged: the middle value once sorted,
 * for an even n the mean of the two middle ones; 0 for n == 0. Values that
 * compare unordered (NaN) compare equal to everything. */
double bench_median(const double *v, size_t n);

/* The q-quantile of v[0..n) (0 <= q <= 1) by the lower nearest rank: the
 * value at index floor(q * (n - 1)) once sorted; 0 for n == 0. Sorts v in
 * place, so that large samples (latencies of every call) are not copied. */
double bench_quantile_sort(double *v, size_t n, double q);

#endif
