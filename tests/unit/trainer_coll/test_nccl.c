/*
 * test_nccl.c (suite 'gpu', registered only with -Dgpu_tests=true): the NCCL
 * backend on real GPUs. One rank per GPU (NCCL before 2.30 refuses two ranks
 * on one GPU), so the multi-rank test runs on as many GPUs as there are, up
 * to 4, and is skipped with one. With any GPU: a one-rank group computes,
 * and a rank whose peers never join times out instead of hanging.
 */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "coll_nccl.h"
#include "stk_error.h"

#define COUNT 1000003

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct rank {
  int rank, n, rc;
  uint8_t *id;
};

/* Every collective once on integer-valued data; checks the results. */
static int exercise(struct coll_group *g, int n, int rank) {
  size_t count = COUNT;
  float *host = malloc(n * count * sizeof *host), *d_send, *d_recv;
  int bad = 0;
  cudaMalloc((void **)&d_send, n * count * sizeof(float));
  cudaMalloc((void **)&d_recv, n * count * sizeof(float));
  for (size_t i = 0; i < n * count; i++) host[i] = (float)((rank + i) % 7);
  cudaMemcpy(d_send, host, n * count * sizeof(float), cudaMemcpyHostToDevice);
  if (coll_all_reduce(g, d_send, n * count, COLL_F32) != 0) bad++;
  cudaMemcpy(host, d_send, n * count * sizeof(float), cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < n * count; i++) {
    float want = 0;
    for (int q = 0; q < n; q++) want += (float)((q + i) % 7);
    if (host[i] != want) bad++;
  }
  if (coll_reduce_scatter(g, d_send, d_recv, count, COLL_F32) != 0) bad++;
  if (coll_all_gather(g, d_recv, d_send, count, COLL_F32) != 0) bad++;
  if (coll_all_reduce(g, d_send, count, COLL_BF16) != 0) bad++;
  cudaFree(d_send);
  cudaFree(d_recv);
  free(host);
  return bad;
}

static void *rank_main(void *p) {
  struct rank *r = p;
  struct coll_group *g;
  r->rc = coll_nccl_group_new(r->rank, r->n, r->id, r->rank, NULL, 60000, &g);
  if (r->rc) return NULL;
  r->rc = exercise(g, r->n, r->rank) ? -1 : 0;
  coll_free(g);
  return NULL;
}

static void test_one_rank(void **state) {
  uint8_t id[COLL_NCCL_ID_BYTES];
  assert_int_equal(coll_nccl_unique_id(id), 0);
  struct rank r = {.rank = 0, .n = 1, .id = id};
  rank_main(&r);
  assert_int_equal(r.rc, 0);
}

static void test_ranks_per_gpu(void **state) {
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  if (gpus < 2) skip();
  int n = gpus > 4 ? 4 : gpus;
  uint8_t id[COLL_NCCL_ID_BYTES];
  assert_int_equal(coll_nccl_unique_id(id), 0);
  struct rank r[4];
  pthread_t th[4];
  for (int i = 0; i < n; i++) {
    r[i] = (struct rank){.rank = i, .n = n, .id = id};
    pthread_create(&th[i], NULL, rank_main, &r[i]);
  }
  for (int i = 0; i < n; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(r[i].rc, 0);
  }
}

static void test_missing_peer_times_out(void **state) {
  uint8_t id[COLL_NCCL_ID_BYTES];
  assert_int_equal(coll_nccl_unique_id(id), 0);
  struct coll_group *g = NULL;
  int64_t t0 = now_ms();
  assert_int_equal(coll_nccl_group_new(0, 2, id, 0, NULL, 2000, &g), STK_ETIMEDOUT);
  assert_true(now_ms() - t0 < 10000);
  assert_null(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_rank),
      cmocka_unit_test(test_ranks_per_gpu),
      cmocka_unit_test(test_missing_peer_times_out),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
