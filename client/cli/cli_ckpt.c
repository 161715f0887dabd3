/*
 * stokerctl's checkpoint subcommands: checkpoint list, show, verify,
 * delete, abort. Each is: check operands, connect to the checkpoint service
 * (--checkpoint / STOKER_CHECKPOINT, default 127.0.0.1:7072), call through
 * libstoker-client, print a table or JSON, map the outcome to an exit code.
 * Verify on a terminal re-reads the checkpoint object by object with Read
 * (the service CRC-checks every block it reads) to draw a progress bar; off
 * a terminal it is one Verify call (the same per-object reads where the
 * service has no Verify).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_ckpt_format.h"
#include "cli_format.h"
#include "stoker_ckpt.h"

static int connect_ckpt(const struct cli_ctx *x, struct stk_client **ret_client) {
  const char *addr = x->args->checkpoint ? x->args->checkpoint : STK_CKPT_DEFAULT_ADDRESS;
  return cli_connect(x, addr, ret_client);
}

/* Operand 2 as a step. */
static int parse_step(const struct cli_ctx *x, int64_t *ret_step) {
  uint64_t s;
  if (flag_parse_uint(x->ops[1], INT64_MAX, &s) < 0)
    return cli_usage_error(x, "bad step \"%s\"", x->ops[1]);
  *ret_step = (int64_t)s;
  return 0;
}

static void print_json(cJSON *o) {
  fmt_print_json(o, stdout);
  cJSON_Delete(o);
}

static int finish(const struct cli_ctx *x, struct stk_client *c, int err) {
  int rc = err ? cli_report(x, err) : 0;
  stk_client_free(c);
  return rc;
}

int cli_ckpt_list(const struct cli_ctx *x) {
  struct stk_client *c = NULL;
  int rc = connect_ckpt(x, &c);
  if (rc) return rc;
  Stoker__V1__ListCheckpointsResponse *l = NULL;
  int err = stk_ckpt_list(c, x->name, 0, &l);
  if (err == 0) {
    if (x->args->json)
      print_json(fmt_ckpt_list_json(x->name, l));
    else
      fmt_ckpt_list(l, stdout);
    protobuf_c_message_free_unpacked(&l->base, NULL);
  }
  return finish(x, c, err);
}

int cli_ckpt_show(const struct cli_ctx *x) {
  int64_t step = 0;
  struct stk_client *c = NULL;
  int rc = parse_step(x, &step);
  if (rc || (rc = connect_ckpt(x, &c)) != 0) return rc;
  Stoker__V1__Manifest *m = NULL;
  int err = stk_ckpt_get_manifest(c, x->name, step, 0, &m);
  if (err == 0) {
    if (x->args->json)
      print_json(fmt_manifest_json(m));
    else
      fmt_manifest_show(m, stdout);
    protobuf_c_message_free_unpacked(&m->base, NULL);
  }
  return finish(x, c, err);
}

int cli_ckpt_delete(const struct cli_ctx *x) {
  int64_t step = 0;
  struct stk_client *c = NULL;
  int rc = parse_step(x, &step);
  if (rc || (rc = connect_ckpt(x, &c)) != 0) return rc;
  int err = stk_ckpt_delete(c, x->name, step, 0);
  if (err == 0) {
    if (x->args->json) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "job", x->name);
      cJSON_AddNumberToObject(o, "deleted_step", (double)step);
      print_json(o);
    } else {
      printf("checkpoint %s step %" PRId64 " deleted\n", x->name, step);
    }
  }
  return finish(x, c, err);
}

int cli_ckpt_abort(const struct cli_ctx *x) {
  struct stk_client *c = NULL;
  int rc = connect_ckpt(x, &c);
  if (rc) return rc;
  int err = stk_ckpt_abort(c, x->name, cli_flag_value(x->args, "reason"), 0);
  if (err == 0) {
    if (x->args->json) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "aborted_attempt", x->name);
      print_json(o);
    } else {
      printf("checkpoint attempt %s aborted\n", x->name);
    }
  }
  return finish(x, c, err);
}

/* ---------------------------------------------------------------- verify */

/* What a client-side verify found (the Verify reply's shape). */
struct report {
  Stoker__V1__VerifyCheckpointResponse v;
  char **problems;
};

static void add_problem(struct report *r, const char *fmt, const char *a, const char *b) {
  char line[768];
  snprintf(line, sizeof(line), fmt, a, b);
  char **p = realloc(r->problems, (r->v.n_problems + 1) * sizeof(*p));
  if (!p) return;
  r->problems = p;
  p[r->v.n_problems++] = strdup(line);
  r->v.problems = r->problems;
}

/* Reads one chunk back (the service checks its blocks' CRCs). */
static int read_chunk(struct stk_client *c, const Stoker__V1__Manifest *m,
                      const Stoker__V1__ChunkEntry *ch) {
  void *buf = malloc(ch->length ? ch->length : 1);
  if (!buf || !ch->box) {
    free(buf);
    return STK_ENOMEM;
  }
  struct stk_ckpt_want w = {
      ch->tensor, {ch->box->n_sizes, ch->box->offsets, ch->box->sizes}, buf, ch->length};
  int err = stk_ckpt_read(c, m->job, m->step, &w, 1, 0, NULL);
  free(buf);
  return err;
}

static void draw(bool bar, uint64_t done, uint64_t total) {
  if (!bar) return;
  char line[256];
  fmt_progress(done, total, 40, line, sizeof(line));
  fprintf(stderr, "\r%s", line);
  fflush(stderr);
}

/* Verifies object o: every chunk stored in it, read back. */
static void verify_object(struct stk_client *c, const Stoker__V1__Manifest *m, size_t o,
                          struct report *r, bool bar, uint64_t total) {
  const Stoker__V1__ObjectEntry *obj = m->objects[o];
  for (size_t i = 0; i < m->n_chunks; i++) {
    const Stoker__V1__ChunkEntry *ch = m->chunks[i];
    if (strcmp(ch->object, obj->key) != 0) continue;
    int err = read_chunk(c, m, ch);
    if (err < 0) {
      add_problem(r, "%s: %s", obj->key, stk_client_last_error(NULL));
      return;
    }
    r->v.bytes += ch->length;
    draw(bar, r->v.bytes, total);
  }
}

/* Client-side verify: per object, per chunk, with a bar when asked. */
static int verify_by_reads(struct stk_client *c, const char *job, int64_t step, bool bar,
                           struct report *r) {
  Stoker__V1__Manifest *m = NULL;
  int err = stk_ckpt_get_manifest(c, job, step, 0, &m);
  if (err < 0) return err;
  uint64_t total = 0, block = m->crc_block_bytes ? m->crc_block_bytes : (1u << 20);
  for (size_t i = 0; i < m->n_chunks; i++) total += m->chunks[i]->length;
  draw(bar, 0, total);
  for (size_t o = 0; o < m->n_objects; o++) {
    verify_object(c, m, o, r, bar, total);
    r->v.objects++;
    r->v.blocks += (m->objects[o]->size + block - 1) / block;
  }
  if (bar) fputc('\n', stderr);
  protobuf_c_message_free_unpacked(&m->base, NULL);
  return 0;
}

static void print_report(const struct cli_ctx *x, int64_t step,
                         const Stoker__V1__VerifyCheckpointResponse *v) {
  if (x->args->json)
    print_json(fmt_verify_json(x->name, step, v));
  else
    fmt_verify_report(x->name, step, v, stdout);
}

int cli_ckpt_verify(const struct cli_ctx *x) {
  int64_t step = 0;
  struct stk_client *c = NULL;
  int rc = parse_step(x, &step);
  if (rc || (rc = connect_ckpt(x, &c)) != 0) return rc;
  bool bar = cli_flag_set(x->args, "progress") || (!x->args->json && isatty(STDERR_FILENO));
  Stoker__V1__VerifyCheckpointResponse *v = NULL;
  struct report r = {.v = STOKER__V1__VERIFY_CHECKPOINT_RESPONSE__INIT};
  int err = bar ? STK_ENOTSUP : stk_ckpt_verify(c, x->name, step, 0, &v);
  if (err == STK_ENOTSUP) { /* A terminal, or a service without Verify. */
    err = verify_by_reads(c, x->name, step, bar, &r);
    v = err == 0 ? &r.v : NULL;
  }
  if (err == 0) {
    print_report(x, step, v);
    if (v->n_problems) {
      fprintf(stderr, "stokerctl: %s: %zu problem%s found\n", x->cmd, v->n_problems,
              v->n_problems == 1 ? "" : "s");
      rc = CLI_EXIT_OTHER;
    }
    if (v != &r.v) protobuf_c_message_free_unpacked(&v->base, NULL);
  }
  for (size_t i = 0; i < r.v.n_problems; i++) free(r.problems[i]);
  free(r.problems);
  rc = err ? cli_report(x, err) : rc;
  stk_client_free(c);
  return rc;
}
