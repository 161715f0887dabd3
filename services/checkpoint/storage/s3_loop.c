/*
 * libcurl's multi interface driven by a libuv loop: curl tells us which
 * sockets to watch (CURLMOPT_SOCKETFUNCTION -> uv_poll) and when to call it
 * back (CURLMOPT_TIMERFUNCTION -> uv_timer); we tell curl when a socket is
 * ready and collect finished transfers, each handed to the attempt_done
 * the client set (this file calls nothing above it).
 */
#include "s3_internal.h"

#include "stk_error.h"

#include <stdlib.h>

struct sock_ctx {
  uv_poll_t poll;
  curl_socket_t fd;
  struct s3_client *c;
  struct sock_ctx *prev, *next;
};

static void handle_closed(uv_handle_t *h) {
  struct s3_client *c = h->data;
  if (h->type == UV_POLL) free((struct sock_ctx *)h);
  c->pending_closes--;
  s3_loop_maybe_free(c);
}

static void check_done(struct s3_client *c) {
  CURLMsg *msg;
  int left;
  while (c->multi && (msg = curl_multi_info_read(c->multi, &left)) != NULL) {
    if (msg->msg != CURLMSG_DONE) continue;
    struct s3_req *r = NULL;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
    CURLcode code = msg->data.result;
    curl_multi_remove_handle(c->multi, msg->easy_handle);
    c->attempt_done(r, code);
  }
}

static void on_poll(uv_poll_t *h, int status, int events) {
  struct sock_ctx *s = (struct sock_ctx *)h; /* poll is the first member */
  int flags = 0, running;
  if (status < 0) flags = CURL_CSELECT_ERR;
  if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
  if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
  struct s3_client *c = s->c;
  curl_multi_socket_action(c->multi, s->fd, flags, &running);
  check_done(c);
}

static void sock_close(struct s3_client *c, struct sock_ctx *s) {
  uv_poll_stop(&s->poll);
  if (s->prev)
    s->prev->next = s->next;
  else
    c->socks = s->next;
  if (s->next) s->next->prev = s->prev;
  c->pending_closes++;
  uv_close((uv_handle_t *)&s->poll, handle_closed);
}

static int on_socket(CURL *e, curl_socket_t fd, int what, void *userp, void *socketp) {
  struct s3_client *c = userp;
  struct sock_ctx *s = socketp;
  if (what == CURL_POLL_REMOVE) {
    if (s) {
      curl_multi_assign(c->multi, fd, NULL);
      sock_close(c, s);
    }
    return 0;
  }
  if (!s) {
    s = calloc(1, sizeof(*s));
    if (!s || uv_poll_init_socket(c->loop, &s->poll, fd) != 0) {
      free(s);
      return -1;
    }
    s->fd = fd;
    s->c = c;
    s->poll.data = c;
    s->next = c->socks;
    if (c->socks) c->socks->prev = s;
    c->socks = s;
    curl_multi_assign(c->multi, fd, s);
  }
  int events =
      ((what & CURL_POLL_IN) ? UV_READABLE : 0) | ((what & CURL_POLL_OUT) ? UV_WRITABLE : 0);
  uv_poll_start(&s->poll, events, on_poll);
  return 0;
}

static void on_timeout(uv_timer_t *t) {
  struct s3_client *c = t->data;
  int running;
  curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  check_done(c);
}

static int on_timer(CURLM *m, long timeout_ms, void *userp) {
  struct s3_client *c = userp;
  if (timeout_ms < 0)
    uv_timer_stop(&c->timer);
  else
    uv_timer_start(&c->timer, on_timeout, (uint64_t)timeout_ms, 0);
  return 0;
}

int s3_loop_init(struct s3_client *c, void (*attempt_done)(struct s3_req *r, CURLcode code)) {
  c->attempt_done = attempt_done;
  c->multi = curl_multi_init();
  if (!c->multi) return STK_ENOMEM;
  uv_timer_init(c->loop, &c->timer);
  c->timer.data = c;
  curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
  curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
  curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, on_timer);
  curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
  curl_multi_setopt(c->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)c->cfg.max_concurrency);
  return 0;
}

/* After every easy handle is removed: drop curl, close the handles. */
void s3_loop_close(struct s3_client *c) {
  curl_multi_cleanup(c->multi);
  c->multi = NULL;
  while (c->socks) sock_close(c, c->socks);
  uv_timer_stop(&c->timer);
  c->pending_closes++;
  uv_close((uv_handle_t *)&c->timer, handle_closed);
}

void s3_loop_maybe_free(struct s3_client *c) {
  if (!c->closing || c->pending_closes > 0 || c->all) return;
  free(c->host);
  free(c->cfg_owned);
  free(c);
}
