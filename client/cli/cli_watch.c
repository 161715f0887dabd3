/*
 * `stokerctl job watch NAME [--after SEQ]`: streams a job's events, one
 * line (or one JSON object) each, until Ctrl-C or the job is deleted.
 * Events arrive on the client's thread; the main thread only waits for the
 * end or a signal.
 */
#include <signal.h>
#include <stdio.h>

#include "cli.h"
#include "cli_format.h"

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
  (void)sig;
  interrupted = 1;
}

static void on_event(void *arg, const Stoker__V1__JobEvent *ev) {
  const struct cli_ctx *x = arg;
  if (x->args->json) {
    cJSON *o = fmt_event_json(ev);
    fmt_print_json(o, stdout);
    cJSON_Delete(o);
  } else {
    fmt_event_line(ev, stdout);
  }
  fflush(stdout);
}

static void catch_signals(void) {
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

int cli_job_watch(const struct cli_ctx *x) {
  uint64_t after = 0;
  const char *v = cli_flag_value(x->args, "after");
  if (v && flag_parse_uint(v, UINT64_MAX, &after) < 0)
    return cli_usage_error(x, "--after: bad sequence number \"%s\"", v);
  struct stk_client *c;
  int rc = cli_connect(x, x->args->coordinator, &c);
  if (rc) return rc;
  catch_signals();
  struct stk_watch *w = NULL;
  int err = stk_job_watch(c, x->name, after, on_event, (void *)x, &w);
  while (err == 0 && !interrupted) {
    err = stk_watch_wait(w, 200);
    if (err == STK_ETIMEDOUT)
      err = 0;
    else
      break;
  }
  stk_watch_free(w);
  rc = err && !interrupted ? cli_report(x, err) : 0;
  stk_client_free(c);
  return rc;
}
