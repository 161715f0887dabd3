/*
 * rpc_loop: the daemon's libuv loop thread drives gRPC's completion queue
 * itself, so a call's completions run where they are read, with no thread
 * hand-off between gRPC and the service state.
 *
 * How. While a server runs, an idle handle keeps libuv's own poll from
 * blocking, and a prepare handle (run just before that poll on each loop
 * iteration) blocks in grpc_completion_queue_next instead, until the next
 * libuv timer is due, and runs each completed tag's callback right there.
 * The loop thread is then gRPC's poller too: it reads the sockets, runs the
 * handlers and writes the replies without waking another thread.
 *
 * libuv's other events (threadpool completions, signals, the metrics
 * socket) would not end that wait, so one watcher thread polls libuv's
 * backend descriptor (its epoll set) and, when it turns readable, kicks the
 * queue with a call on a lame channel (gRPC core has no public "wake"):
 * the call fails at once and its completion ends the wait. The watcher then
 * sleeps until the loop has run an iteration, so it kicks at most once per
 * iteration, and never for gRPC's own traffic.
 *
 * rpc_pump_post queues a tag to run on the loop from any thread (deferred
 * callbacks); those run before the loop blocks again.
 *
 * Parked calls. Debian's libgrpc is built without NDEBUG, so every
 * completion checks its tag against a list of every operation outstanding
 * on its queue, scanned from the start. An open call keeps one outstanding
 * (the close notification that tells of cancellation), so with one queue
 * and N calls parked (a rendezvous of N ranks) each completion scans N
 * entries: quadratic. Calls of methods marked parks are therefore bound to
 * one of RPC_PARKED_QUEUES callback queues, in turn (their arrival is
 * still announced on the loop's queue): each list holds 1/RPC_PARKED_QUEUES
 * of them. A callback queue needs no thread of ours: gRPC runs the tag's
 * functor where the batch completed, as the gRPC call there returns (on
 * the loop, mostly: it is gRPC's poller), or else on its executor thread,
 * and the functor only posts the tag to the loop (rpc_pump_post), where fn
 * runs as for any other completion. The loop cannot wait in several queues
 * at once, which is why these are not queues it drives.
 */
#include "rpc_internal.h"

#include "stk_error.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Completions run per loop iteration at most, so timers and libuv's
 * events are not starved under a flood of calls. */
#define DRIVE_BUDGET 256
/* The longest wait in the queue: a safety net for a missed wakeup and the
 * bound of a UV_RUN_NOWAIT iteration that finds nothing to do. */
#define MAX_WAIT_MS 250
/* Parked-call queues: 100,000 parked calls make lists of ~3,000. */
#define RPC_PARKED_QUEUES 32

struct rpc_pump {
  uv_loop_t *loop;
  grpc_completion_queue *cq;
  grpc_channel *lame; /* Calls on it fail at once: the kicks. */
  uv_prepare_t drive;
  uv_idle_t spin;
  uv_async_t async; /* Posts from other threads when the loop sleeps in libuv. */
  bool stopped;
  int open_handles;
  pthread_mutex_t mu;
  struct rpc_tag *head; /* FIFO of posted tags, under mu. */
  struct rpc_tag *tail;
  /* The watcher, under mu: it polls while polling is set and otherwise
   * waits until iteration moves past the one it last kicked in. */
  pthread_t watcher;
  bool watcher_started;
  pthread_cond_t cond;
  unsigned long iteration;
  bool polling;
  bool quit;
  int quit_fd; /* eventfd: ends the watcher's poll at stop. */
  void (*closed)(void *arg);
  void *closed_arg;
  /* The parked-call queues; their shutdown functors count down, under mu,
   * the queues not yet shut down. */
  grpc_completion_queue *parked[RPC_PARKED_QUEUES];
  unsigned next_parked;
  int parked_open;
  grpc_completion_queue_functor parked_shutdown;
};

/* A kick: a call on the lame channel and what its failed batch fills. */
struct kick {
  struct rpc_tag tag;
  grpc_call *call;
  grpc_metadata_array trailing;
  grpc_status_code status;
  grpc_slice details;
};

void rpc_pump_post(struct rpc_pump *p, struct rpc_tag *tag, bool ok) {
  tag->ok = ok;
  tag->next = NULL;
  pthread_mutex_lock(&p->mu);
  if (p->tail)
    p->tail->next = tag;
  else
    p->head = tag;
  p->tail = tag;
  /* Under mu: once the loop has run this tag it may free the pump, which
   * takes mu first (rpc_pump_stop), so no poster still touches it then. */
  uv_async_send(&p->async);
  pthread_mutex_unlock(&p->mu);
}

static bool posted_pending(struct rpc_pump *p) {
  pthread_mutex_lock(&p->mu);
  bool any = p->head != NULL;
  pthread_mutex_unlock(&p->mu);
  return any;
}

static void run_posted(struct rpc_pump *p) {
  pthread_mutex_lock(&p->mu);
  struct rpc_tag *t = p->head;
  p->head = p->tail = NULL;
  pthread_mutex_unlock(&p->mu);
  while (t) {
    struct rpc_tag *next = t->next; /* fn may free or re-arm t. */
    t->fn(t, t->ok);
    t = next;
  }
}

static void on_async(uv_async_t *a) {
  run_posted(a->data);
}

/* ------------------------------------------------- parked-call queues */

/* A gRPC thread: a parked call's batch completed. */
static void on_parked_completion(grpc_completion_queue_functor *f, int ok) {
  struct rpc_tag *tag = (struct rpc_tag *)f; /* The functor is the first member. */
  rpc_pump_post(tag->via, tag, ok != 0);
}

static void on_parked_shutdown(grpc_completion_queue_functor *f, int ok) {
  (void)ok;
  struct rpc_pump *p = RPC_CONTAINER(f, struct rpc_pump, parked_shutdown);
  pthread_mutex_lock(&p->mu);
  p->parked_open--;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->mu);
}

static int open_parked(struct rpc_pump *p) {
  p->parked_shutdown.functor_run = on_parked_shutdown;
  for (int i = 0; i < RPC_PARKED_QUEUES; i++) {
    p->parked[i] = grpc_completion_queue_create_for_callback(&p->parked_shutdown, NULL);
    if (!p->parked[i]) return STK_ENOMEM;
    p->parked_open++;
  }
  return 0;
}

/* Shuts the parked-call queues down and waits for gRPC to say so (nothing
 * is outstanding on them by now: every call is freed). */
static void close_parked(struct rpc_pump *p) {
  for (int i = 0; i < RPC_PARKED_QUEUES; i++)
    if (p->parked[i]) grpc_completion_queue_shutdown(p->parked[i]);
  pthread_mutex_lock(&p->mu);
  while (p->parked_open > 0) pthread_cond_wait(&p->cond, &p->mu);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < RPC_PARKED_QUEUES; i++) {
    if (p->parked[i]) grpc_completion_queue_destroy(p->parked[i]);
    p->parked[i] = NULL;
  }
}

grpc_completion_queue *rpc_pump_parked_cq(struct rpc_pump *p) {
  return p->parked[p->next_parked++ % RPC_PARKED_QUEUES];
}

void rpc_pump_parked_tag(struct rpc_pump *p, struct rpc_tag *tag) {
  tag->functor.functor_run = on_parked_completion;
  /* Run where the batch completed (the loop, mostly), when gRPC's API call
   * there returns; elsewhere gRPC's executor runs it. It only posts. */
  tag->functor.inlineable = 1;
  tag->via = p;
}

/* ------------------------------------------------------------ the kick */

static void on_kick_done(struct rpc_tag *tag, bool ok) {
  (void)ok;
  struct kick *k = RPC_CONTAINER(tag, struct kick, tag);
  grpc_metadata_array_destroy(&k->trailing);
  grpc_slice_unref(k->details);
  grpc_call_unref(k->call);
  free(k);
}

/* Any thread: makes a completion appear on the queue soon. */
static void kick(struct rpc_pump *p) {
  struct kick *k = calloc(1, sizeof(*k));
  if (!k) return; /* The wait ends at MAX_WAIT_MS anyway. */
  k->tag.fn = on_kick_done;
  grpc_metadata_array_init(&k->trailing);
  k->details = grpc_empty_slice();
  k->call = grpc_channel_create_call(p->lame, NULL, GRPC_PROPAGATE_DEFAULTS, p->cq,
                                     grpc_slice_from_static_string("/stoker.rpc/Kick"), NULL,
                                     gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  grpc_op ops[2] = {{0}};
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[1].data.recv_status_on_client.trailing_metadata = &k->trailing;
  ops[1].data.recv_status_on_client.status = &k->status;
  ops[1].data.recv_status_on_client.status_details = &k->details;
  if (!k->call || grpc_call_start_batch(k->call, ops, 2, &k->tag, NULL) != GRPC_CALL_OK) {
    if (k->call) grpc_call_unref(k->call);
    grpc_metadata_array_destroy(&k->trailing);
    free(k);
  }
}

static void *watch_libuv(void *arg) {
  struct rpc_pump *p = arg;
  struct pollfd fds[2] = {{.fd = uv_backend_fd(p->loop), .events = POLLIN},
                          {.fd = p->quit_fd, .events = POLLIN}};
  unsigned long kicked_in = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->quit && p->iteration == kicked_in) pthread_cond_wait(&p->cond, &p->mu);
    if (p->quit) break;
    p->polling = true;
    pthread_mutex_unlock(&p->mu);
    int n = poll(fds, 2, -1);
    pthread_mutex_lock(&p->mu);
    p->polling = false;
    if (p->quit) break;
    if (n > 0 && (fds[0].revents & (POLLIN | POLLERR | POLLHUP))) {
      kicked_in = p->iteration;
      pthread_mutex_unlock(&p->mu);
      kick(p);
      pthread_mutex_lock(&p->mu);
    } else if (n < 0 && errno != EINTR) {
      break; /* Cannot watch: the wait's bound keeps the loop going. */
    }
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* ------------------------------------------------------------ the drive */

static void on_spin(uv_idle_t *h) {
  (void)h; /* Its only purpose: libuv polls without blocking while active. */
}

/* How long the loop may wait in the queue: until libuv's next timer. */
static int wait_ms(struct rpc_pump *p) {
  if (posted_pending(p)) return 0;
  uv_idle_stop(&p->spin); /* Else libuv reports 0 because of it. */
  int t = uv_backend_timeout(p->loop);
  uv_idle_start(&p->spin, on_spin);
  return t < 0 || t > MAX_WAIT_MS ? MAX_WAIT_MS : t;
}

static gpr_timespec deadline_in(int ms) {
  if (ms <= 0) return gpr_inf_past(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

static void on_drive(uv_prepare_t *h) {
  struct rpc_pump *p = h->data;
  pthread_mutex_lock(&p->mu);
  p->iteration++;
  if (!p->polling) pthread_cond_signal(&p->cond);
  pthread_mutex_unlock(&p->mu);
  run_posted(p);
  int ms = wait_ms(p);
  for (int n = 0; n < DRIVE_BUDGET && !p->stopped; n++) {
    grpc_event ev = grpc_completion_queue_next(p->cq, deadline_in(n == 0 ? ms : 0), NULL);
    if (ev.type != GRPC_OP_COMPLETE) break;        /* Timeout (shutdown is rpc_pump_stop's). */
    if (n == 0 && ms > 0) uv_update_time(p->loop); /* Handlers read uv_now. */
    struct rpc_tag *t = ev.tag;
    t->fn(t, ev.success != 0);
    if (!p->stopped) run_posted(p);
  }
}

/* ------------------------------------------------------- start and stop */

static void on_handle_closed(uv_handle_t *h) {
  struct rpc_pump *p = h->data;
  if (--p->open_handles > 0) return;
  void (*closed)(void *) = p->closed;
  void *arg = p->closed_arg;
  pthread_cond_destroy(&p->cond);
  pthread_mutex_destroy(&p->mu);
  if (p->quit_fd >= 0) close(p->quit_fd);
  free(p);
  if (closed) closed(arg);
}

static void close_handles(struct rpc_pump *p) {
  p->open_handles = 3;
  uv_close((uv_handle_t *)&p->drive, on_handle_closed);
  uv_close((uv_handle_t *)&p->spin, on_handle_closed);
  uv_close((uv_handle_t *)&p->async, on_handle_closed);
}

static void stop_watcher(struct rpc_pump *p) {
  if (!p->watcher_started) return;
  pthread_mutex_lock(&p->mu);
  p->quit = true;
  pthread_cond_signal(&p->cond);
  pthread_mutex_unlock(&p->mu);
  uint64_t one = 1;
  if (write(p->quit_fd, &one, sizeof(one)) < 0) { /* An eventfd write cannot fail here. */
  }
  pthread_join(p->watcher, NULL);
  p->watcher_started = false;
}

int rpc_pump_start(uv_loop_t *loop, grpc_completion_queue *cq, struct rpc_pump **ret_pump) {
  struct rpc_pump *p = calloc(1, sizeof(*p));
  if (!p) return STK_ENOMEM;
  p->loop = loop;
  p->cq = cq;
  p->quit_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cond, NULL);
  uv_prepare_init(loop, &p->drive);
  uv_idle_init(loop, &p->spin);
  uv_async_init(loop, &p->async, on_async);
  p->drive.data = p->spin.data = p->async.data = p;
  p->lame = grpc_lame_client_channel_create(NULL, GRPC_STATUS_UNAVAILABLE, "rpc loop kick");
  int err = open_parked(p);
  if (err || p->quit_fd < 0 || !p->lame || pthread_create(&p->watcher, NULL, watch_libuv, p) != 0) {
    if (p->lame) grpc_channel_destroy(p->lame);
    close_parked(p);
    stk_set_detail("rpc: cannot start the loop's completion queues and their watcher");
    close_handles(p); /* Frees p; cq stays the caller's. */
    return err ? err : STK_EINTERNAL;
  }
  p->watcher_started = true;
  uv_prepare_start(&p->drive, on_drive);
  uv_idle_start(&p->spin, on_spin);
  *ret_pump = p;
  return 0;
}

void rpc_pump_stop(struct rpc_pump *p, void (*closed)(void *arg), void *arg) {
  p->stopped = true; /* on_drive may be below us on the stack: it stops. */
  stop_watcher(p);
  uv_prepare_stop(&p->drive);
  uv_idle_stop(&p->spin);
  grpc_completion_queue_shutdown(p->cq);
  for (;;) { /* Kicks still in flight; nothing else should be left. */
    grpc_event ev = grpc_completion_queue_next(p->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type == GRPC_OP_COMPLETE) ((struct rpc_tag *)ev.tag)->fn(ev.tag, ev.success != 0);
  }
  close_parked(p);
  run_posted(p);
  grpc_completion_queue_destroy(p->cq);
  p->cq = NULL;
  grpc_channel_destroy(p->lame);
  p->lame = NULL;
  p->closed = closed;
  p->closed_arg = arg;
  close_handles(p);
}
