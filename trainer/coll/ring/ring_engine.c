/*
 * ring_engine.c: runs a ring plan (see ring_internal.h) on one thread. The
 * send stream to the next rank and the receive stream from the previous rank
 * advance independently on non-blocking sockets under one poll(): while the
 * kernel drains what we sent, we receive and reduce the next segment, and a
 * step starts forwarding as soon as its first segment is ready. Every wait is
 * bounded by the deadline and watches the group's abort eventfd.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "ring_internal.h"
#include "stk_error.h"

/* Largest single send() or recv(); keeps each call's work bounded. */
#define IO_MAX_BYTES (4u << 20)

struct engine {
  struct ring_group *g;
  const struct ring_plan *p;
  size_t esize;
  int sstep; /* Send cursor: step and offset. */
  size_t soff;
  int rstep; /* Receive cursor: step, offset and bytes made ready. */
  size_t roff;
  size_t ready;
};

int64_t ring_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static size_t min_size(size_t a, size_t b) {
  return a < b ? a : b;
}

/* Bytes of step k ready to forward; SIZE_MAX once the step is complete. */
static size_t ready_of(const struct engine *e, int k) {
  if (k < e->rstep) return SIZE_MAX;
  return k == e->rstep ? e->ready : 0;
}

/* Bytes of step k sent; SIZE_MAX once complete (chunks may differ in
 * length, and a guard on a finished step must not limit anything). */
static size_t sent_of(const struct engine *e, int k) {
  if (k < e->sstep) return SIZE_MAX;
  return k == e->sstep ? e->soff : 0;
}

static size_t send_avail(const struct engine *e) {
  if (e->sstep >= e->p->nsteps) return 0;
  const struct ring_step *st = &e->p->steps[e->sstep];
  size_t lim = st->send_bytes;
  if (st->send_dep >= 0) lim = min_size(lim, ready_of(e, st->send_dep));
  return lim > e->soff ? lim - e->soff : 0;
}

static size_t recv_room(const struct engine *e) {
  if (e->rstep >= e->p->nsteps) return 0;
  const struct ring_step *st = &e->p->steps[e->rstep];
  size_t lim = st->recv_bytes;
  if (st->recv_guard >= 0) lim = min_size(lim, sent_of(e, st->recv_guard));
  return lim > e->roff ? lim - e->roff : 0;
}

static void advance_send(struct engine *e) {
  while (e->sstep < e->p->nsteps && e->soff == e->p->steps[e->sstep].send_bytes) {
    e->sstep++;
    e->soff = 0;
  }
}

/* Reduces the complete elements received but not yet made ready: always when
 * flush is set or the step is complete, else only a full segment's worth. */
static void make_ready(struct engine *e, int flush) {
  const struct ring_step *st = &e->p->steps[e->rstep];
  if (!st->addend) {
    e->ready = e->roff;
    return;
  }
  size_t complete = e->roff - e->roff % e->esize;
  size_t pending = complete - e->ready;
  if (pending == 0) return;
  if (!flush && pending < e->g->segment_bytes && e->roff != st->recv_bytes) return;
  ring_reduce(e->p->dt, st->out + e->ready, st->recv + e->ready, st->addend + e->ready, pending);
  e->ready = complete;
}

/* Moves the receive cursor past completed steps, checking the header. */
static int advance_recv(struct engine *e) {
  while (e->rstep < e->p->nsteps) {
    const struct ring_step *st = &e->p->steps[e->rstep];
    make_ready(e, 0);
    if (e->ready != st->recv_bytes) return 0;
    if (e->rstep == 0 && memcmp(st->recv, st->send, st->recv_bytes) != 0) {
      stk_set_detail("ring: neighbour called a different collective");
      return STK_EINVAL;
    }
    e->rstep++;
    e->roff = 0;
    e->ready = 0;
  }
  return 0;
}

static int io_error(const char *what) {
  stk_set_detail("ring: %s: %s", what, strerror(errno));
  return STK_EIO;
}

static int do_send(struct engine *e) {
  size_t avail;
  while ((avail = send_avail(e)) > 0) {
    const struct ring_step *st = &e->p->steps[e->sstep];
    ssize_t n = send(e->g->next_fd, st->send + e->soff, min_size(avail, IO_MAX_BYTES),
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno == EINTR) continue;
      return io_error("send to next rank");
    }
    e->soff += (size_t)n;
    advance_send(e);
  }
  return 0;
}

static int do_recv(struct engine *e) {
  size_t room;
  while ((room = recv_room(e)) > 0) {
    const struct ring_step *st = &e->p->steps[e->rstep];
    ssize_t n = recv(e->g->prev_fd, st->recv + e->roff, min_size(room, IO_MAX_BYTES), MSG_DONTWAIT);
    if (n == 0) {
      stk_set_detail("ring: previous rank closed its connection");
      return STK_EIO;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno == EINTR) continue;
      return io_error("recv from previous rank");
    }
    e->roff += (size_t)n;
    int rc = advance_recv(e);
    if (rc) return rc;
  }
  return 0;
}

/* Waits until a socket is ready, the deadline passes or the group aborts. */
static int wait_io(struct engine *e, int64_t deadline_ms, int want_send, int want_recv,
                   short *ret_send_ev, short *ret_recv_ev) {
  struct pollfd fds[3] = {
      {.fd = e->g->abort_fd, .events = POLLIN},
      {.fd = want_send ? e->g->next_fd : -1, .events = POLLOUT},
      {.fd = want_recv ? e->g->prev_fd : -1, .events = POLLIN},
  };
  for (;;) {
    int64_t left = deadline_ms - ring_now_ms();
    if (left <= 0) {
      stk_set_detail("ring: collective timed out");
      return STK_ETIMEDOUT;
    }
    int n = poll(fds, 3, left > 60000 ? 60000 : (int)left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("poll");
    if (fds[0].revents) break;
    if (n == 0) continue;
    *ret_send_ev = fds[1].revents;
    *ret_recv_ev = fds[2].revents;
    return 0;
  }
  stk_set_detail("ring: group aborted");
  return STK_ECANCELED;
}

int ring_run(struct ring_group *g, const struct ring_plan *p, int64_t deadline_ms) {
  struct engine e = {.g = g, .p = p, .esize = coll_dtype_size(p->dt)};
  advance_send(&e);
  int rc = advance_recv(&e);
  while (rc == 0 && (e.sstep < p->nsteps || e.rstep < p->nsteps)) {
    if (atomic_load(&g->aborted)) return STK_ECANCELED;
    int want_send = send_avail(&e) > 0;
    if (!want_send && e.rstep < p->nsteps) {
      make_ready(&e, 1); /* The send side waits for us: reduce what we have. */
      want_send = send_avail(&e) > 0;
    }
    short sev = 0, rev = 0;
    rc = wait_io(&e, deadline_ms, want_send, recv_room(&e) > 0, &sev, &rev);
    if (rc == 0 && sev) rc = do_send(&e);
    if (rc == 0 && rev) rc = do_recv(&e);
  }
  return rc;
}
