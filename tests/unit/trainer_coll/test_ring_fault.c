/*
 * test_ring_fault.c: the ring fails instead of hanging. A killed peer
 * process makes every other rank fail with STK_EIO well within the timeout;
 * a stalled peer makes them fail by the timeout; abort from another thread
 * ends a waiting collective with STK_ECANCELED at once; ranks that call
 * different collectives get STK_EINVAL; a failed group refuses later calls;
 * the rendezvous ignores stray connections and times out on a missing peer.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "coll.h"
#include "ring.h"
#include "ring_harness.h"
#include "stk_error.h"

#define BIG_COUNT (4u << 20) /* 16 MiB of f32: more than the socket buffers hold. */

static void sleep_ms(int ms) {
  usleep((useconds_t)ms * 1000);
}

/* --- a peer process killed in the middle of an all-reduce --- */

struct kill_rank {
  int rank, n, listener;
  const char *const *addrs;
  int rc;
  int64_t elapsed_ms;
};

static void *kill_rank_main(void *p) {
  struct kill_rank *k = p;
  struct coll_group *g;
  k->rc = ring_group_new(k->rank, k->n, k->addrs, 10000, k->listener, &g);
  if (k->rc) return NULL;
  float *buf = calloc(BIG_COUNT, sizeof *buf);
  int64_t t0 = harness_now_ms();
  k->rc = coll_all_reduce(g, buf, BIG_COUNT, COLL_F32);
  k->elapsed_ms = harness_now_ms() - t0;
  free(buf);
  coll_free(g);
  return NULL;
}

static void test_killed_peer(void **state) {
  enum { N = 4, VICTIM = 1 };
  char addr[N][RING_ADDR_MAX];
  const char *addrs[N];
  struct kill_rank k[N];
  for (int r = 0; r < N; r++) {
    k[r] = (struct kill_rank){.rank = r, .n = N, .addrs = addrs};
    assert_int_equal(ring_listen("127.0.0.1", &k[r].listener, addr[r]), 0);
    addrs[r] = addr[r];
  }
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) { /* The victim joins and then just waits to be killed. */
    struct coll_group *g;
    if (ring_group_new(VICTIM, N, addrs, 10000, k[VICTIM].listener, &g) != 0) _exit(1);
    for (;;) pause();
  }
  close(k[VICTIM].listener);
  pthread_t th[N];
  for (int r = 0; r < N; r++)
    if (r != VICTIM) pthread_create(&th[r], NULL, kill_rank_main, &k[r]);
  sleep_ms(500);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  for (int r = 0; r < N; r++) {
    if (r == VICTIM) continue;
    pthread_join(th[r], NULL);
    assert_int_equal(k[r].rc, STK_EIO);
    assert_true(k[r].elapsed_ms < 5000); /* Timeout is 10 s: failed, not timed out. */
  }
}

/* --- a peer that never calls: the others time out --- */

static int stall_body(struct coll_group *g, void *arg) {
  if (g->rank == 2) {
    sleep_ms(1500);
    return 0;
  }
  float buf[100] = {0};
  return coll_all_reduce(g, buf, 100, COLL_F32);
}

static void test_stalled_peer(void **state) {
  struct harness_result res;
  harness_run(4, 300, stall_body, NULL, &res);
  int timeouts = 0;
  for (int r = 0; r < 4; r++) {
    assert_int_equal(res.join_rc[r], 0);
    if (r == 2) continue;
    assert_true(res.body_rc[r] == STK_ETIMEDOUT || res.body_rc[r] == STK_EIO);
    timeouts += res.body_rc[r] == STK_ETIMEDOUT;
    assert_true(res.elapsed_ms[r] < 1300);
  }
  assert_true(timeouts >= 1);
}

/* --- abort from another thread --- */

static void *aborter(void *p) {
  sleep_ms(100);
  coll_abort(p);
  return NULL;
}

static int abort_body(struct coll_group *g, void *arg) {
  float buf[1000] = {0};
  if (g->rank == 1) { /* Arrives after its neighbour aborted: sees a closed ring. */
    sleep_ms(400);
    return coll_all_gather(g, buf, buf, 500, COLL_F32) == STK_EIO ? 0 : 1001;
  }
  pthread_t th;
  pthread_create(&th, NULL, aborter, g);
  int rc = coll_all_gather(g, buf, buf, 500, COLL_F32);
  pthread_join(th, NULL);
  if (rc != STK_ECANCELED) return 1002;
  /* Later calls fail at once too. */
  return coll_all_reduce(g, buf, 10, COLL_F32) == STK_ECANCELED ? 0 : 1003;
}

static void test_abort(void **state) {
  struct harness_result res;
  harness_run(2, 30000, abort_body, NULL, &res);
  assert_int_equal(res.body_rc[0], 0);
  assert_int_equal(res.body_rc[1], 0);
  assert_true(res.elapsed_ms[0] < 1000); /* Not the 30 s timeout. */
  assert_true(res.elapsed_ms[1] < 2000);
}

/* --- ranks disagreeing on the collective --- */

static int mismatch_body(struct coll_group *g, void *arg) {
  float send[11] = {0}, recv[22];
  int rc = coll_all_gather(g, send, recv, g->rank == 0 ? 10 : 11, COLL_F32);
  if (rc != STK_EINVAL && rc != STK_EIO) return 1001;
  int again = coll_all_gather(g, send, recv, 10, COLL_F32);
  if (again != STK_ESTATE) return 1002;
  return rc;
}

static void test_mismatch(void **state) {
  struct harness_result res;
  harness_run(2, 5000, mismatch_body, NULL, &res);
  assert_true(res.body_rc[0] == STK_EINVAL || res.body_rc[1] == STK_EINVAL);
  assert_true(res.body_rc[0] < 0 && res.body_rc[1] < 0); /* Not 1001, 1002. */
}

/* --- rendezvous --- */

static int stray_fd = -1;

/* Connects to rank 0's listener and sends a hello that is not a rank's. */
static void connect_stray(const char *const *addrs, int n) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  const char *colon = strrchr(addrs[0], ':');
  sa.sin_port = htons((uint16_t)atoi(colon + 1));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  stray_fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_int_equal(connect(stray_fd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(send(stray_fd, "GET / HTTP/1.0\r\n", 16, 0), 16);
}

static int sum_body(struct coll_group *g, void *arg) {
  float v = (float)(g->rank + 1);
  int rc = coll_all_reduce(g, &v, 1, COLL_F32);
  return rc ? rc : (v == 3.0f ? 0 : -1);
}

static void test_stray_connection(void **state) {
  struct harness_result res;
  harness_before_join = connect_stray;
  harness_run(2, 5000, sum_body, NULL, &res);
  harness_before_join = NULL;
  close(stray_fd);
  assert_int_equal(res.join_rc[0], 0);
  assert_int_equal(res.join_rc[1], 0);
  assert_int_equal(res.body_rc[0], 0);
  assert_int_equal(res.body_rc[1], 0);
}

static void test_join_timeout(void **state) {
  char a0[RING_ADDR_MAX], a1[RING_ADDR_MAX];
  int l0, l1;
  assert_int_equal(ring_listen(NULL, &l0, a0), 0);
  assert_int_equal(ring_listen(NULL, &l1, a1), 0);
  close(l1); /* Nobody will ever listen on rank 1's address. */
  const char *addrs[2] = {a0, a1};
  struct coll_group *g = NULL;
  int64_t t0 = harness_now_ms();
  assert_int_equal(ring_group_new(0, 2, addrs, 300, l0, &g), STK_ETIMEDOUT);
  int64_t took = harness_now_ms() - t0;
  assert_true(took >= 290 && took < 2000);
  assert_null(g);
}

static void test_bad_arguments(void **state) {
  struct coll_group *g = NULL;
  const char *addrs[2] = {"127.0.0.1:1", "no-port"};
  assert_int_equal(ring_group_new(2, 2, addrs, 100, -1, &g), STK_EINVAL);
  assert_int_equal(ring_group_new(0, 0, addrs, 100, -1, &g), STK_EINVAL);
  assert_int_equal(ring_group_new(1, 2, addrs, 100, -1, &g), STK_EINVAL); /* "no-port". */
  assert_null(g);
}

/* --- ranks that open their own listeners on the published addresses --- */

struct own_rank {
  int rank, rc;
  const char *const *addrs;
};

static void *own_rank_main(void *p) {
  struct own_rank *o = p;
  struct coll_group *g;
  o->rc = ring_group_new(o->rank, 3, o->addrs, 5000, -1, &g);
  if (o->rc == 0) {
    float v = 1;
    o->rc = coll_all_reduce(g, &v, 1, COLL_F32) || v != 3.0f ? -1 : 0;
    coll_free(g);
  }
  return NULL;
}

static void test_join_own_listener(void **state) {
  char addr[3][RING_ADDR_MAX];
  const char *addrs[3];
  for (int r = 0; r < 3; r++) {
    int l;
    assert_int_equal(ring_listen("127.0.0.1", &l, addr[r]), 0);
    close(l); /* Free the port again; the rank binds it itself. */
    addrs[r] = addr[r];
  }
  struct own_rank o[3];
  pthread_t th[3];
  for (int r = 2; r >= 0; r--) { /* Reverse order: connects must be retried. */
    o[r] = (struct own_rank){.rank = r, .addrs = addrs};
    pthread_create(&th[r], NULL, own_rank_main, &o[r]);
    sleep_ms(50);
  }
  for (int r = 0; r < 3; r++) {
    pthread_join(th[r], NULL);
    assert_int_equal(o[r].rc, 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_killed_peer),
      cmocka_unit_test(test_stalled_peer),
      cmocka_unit_test(test_abort),
      cmocka_unit_test(test_mismatch),
      cmocka_unit_test(test_stray_connection),
      cmocka_unit_test(test_join_timeout),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_join_own_listener),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
