/*
 * The dataloader's renderings for stokerctl (see cli_loader_format.h):
 * `loader show` and `loader explain`, as tables or JSON.
 */
#include "cli_loader_format.h"

#include <inttypes.h>
#include <string.h>

#include "cli_format.h"
#include "cli_loader_spec.h"

static void add_str(cJSON *o, const char *key, const char *s) {
  cJSON_AddStringToObject(o, key, s ? s : "");
}

static cJSON *dataset_json(const Stoker__V1__DatasetSpec *d) {
  cJSON *o = cJSON_CreateObject();
  add_str(o, "name", d->name);
  add_str(o, "uri", d->source ? d->source->uri : NULL);
  add_str(o, "format", d->format ? cli_format_name(d->format) : "");
  cJSON_AddNumberToObject(o, "weight", d->weight);
  add_str(o, "tokenizer", d->tokenizer);
  return o;
}

cJSON *fmt_loader_json(const Stoker__V1__LoaderInfo *info) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  const Stoker__V1__LoaderSpec *s = info->spec;
  add_str(o, "job", s ? s->job : NULL);
  cJSON_AddNumberToObject(o, "committed_step", (double)info->committed_step);
  if (info->failed) {
    cJSON_AddBoolToObject(o, "failed", 1);
    add_str(o, "failure", info->failure);
  }
  if (!s || !s->n_datasets) return o; /* a job that failed to load has only its name */
  cJSON_AddNumberToObject(o, "seq_len", s->seq_len);
  cJSON_AddNumberToObject(o, "global_batch", s->global_batch);
  cJSON_AddNumberToObject(o, "seed", (double)s->seed);
  cJSON_AddNumberToObject(o, "logical_shards", s->logical_shards);
  cJSON_AddNumberToObject(o, "lanes", s->lanes);
  cJSON_AddBoolToObject(o, "add_bos", s->add_bos);
  cJSON_AddBoolToObject(o, "add_eos", s->add_eos);
  cJSON_AddNumberToObject(o, "bos_id", s->bos_id);
  cJSON_AddNumberToObject(o, "eos_id", s->eos_id);
  cJSON_AddNumberToObject(o, "max_doc_tokens", s->max_doc_tokens);
  cJSON *ds = cJSON_AddArrayToObject(o, "datasets");
  for (size_t i = 0; i < s->n_datasets; i++) cJSON_AddItemToArray(ds, dataset_json(s->datasets[i]));
  return o;
}

cJSON *fmt_explain_json(const char *job, int64_t step, uint32_t rank, uint32_t world,
                        const Stoker__V1__ExplainResponse *resp) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  add_str(o, "job", job);
  cJSON_AddNumberToObject(o, "step", (double)step);
  cJSON_AddNumberToObject(o, "rank", rank);
  cJSON_AddNumberToObject(o, "world", world);
  cJSON *arr = cJSON_AddArrayToObject(o, "sources");
  for (size_t i = 0; i < resp->n_sources; i++) {
    const Stoker__V1__LineSource *l = resp->sources[i];
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "line", l->line);
    add_str(x, "dataset", l->dataset);
    add_str(x, "file", l->file);
    cJSON_AddNumberToObject(x, "document", (double)l->document);
    cJSON_AddNumberToObject(x, "doc_token_begin", (double)l->doc_token_begin);
    cJSON_AddNumberToObject(x, "doc_token_end", (double)l->doc_token_end);
    if (l->tokenizer && *l->tokenizer) { /* text datasets: the tokenizer and the text's bytes */
      add_str(x, "tokenizer", l->tokenizer);
      cJSON_AddNumberToObject(x, "doc_byte_begin", (double)l->doc_byte_begin);
      cJSON_AddNumberToObject(x, "doc_byte_end", (double)l->doc_byte_end);
    }
    cJSON_AddNumberToObject(x, "unit", (double)l->unit);
    cJSON_AddNumberToObject(x, "token_begin", (double)l->token_begin);
    cJSON_AddNumberToObject(x, "token_end", (double)l->token_end);
    cJSON_AddNumberToObject(x, "epoch", l->epoch);
    cJSON_AddNumberToObject(x, "lane", l->lane);
    cJSON_AddItemToArray(arr, x);
  }
  return o;
}

static void field(struct table *t, const char *key, const char *value) {
  const char *row[] = {key, value};
  table_add(t, row);
}

static void summary(const Stoker__V1__LoaderInfo *info, FILE *out) {
  const Stoker__V1__LoaderSpec *s = info->spec;
  char buf[256];
  struct table *t = table_new(2, NULL);
  if (!t) return;
  field(t, "Loader:", s->job);
  snprintf(buf, sizeof(buf), "seq_len %u, global batch %u lines", s->seq_len, s->global_batch);
  field(t, "Shape:", buf);
  snprintf(buf, sizeof(buf), "%" PRIu64, s->seed);
  field(t, "Seed:", buf);
  snprintf(buf, sizeof(buf), "%u logical shards, %u lanes", s->logical_shards, s->lanes);
  field(t, "Sharding:", buf);
  char b[16] = "off", e[16] = "off";
  if (s->add_bos) snprintf(b, sizeof(b), "%u", s->bos_id);
  if (s->add_eos) snprintf(e, sizeof(e), "%u", s->eos_id);
  snprintf(buf, sizeof(buf), "bos %s, eos %s", b, e);
  field(t, "Specials:", buf);
  if (s->max_doc_tokens) {
    snprintf(buf, sizeof(buf), "%u", s->max_doc_tokens);
    field(t, "Max doc tokens:", buf);
  }
  if (info->committed_step >= 0) {
    snprintf(buf, sizeof(buf), "%" PRId64, info->committed_step);
  } else {
    snprintf(buf, sizeof(buf), "none");
  }
  field(t, "Committed step:", buf);
  if (info->failed) {
    snprintf(buf, sizeof(buf), "failed: %s", info->failure);
    field(t, "State:", buf);
  }
  table_print(t, out);
  table_free(t);
}

void fmt_loader_list(const Stoker__V1__ListLoadersResponse *resp, int part, bool header,
                     FILE *out) {
  static const char *const headers[] = {"PART", "JOB", "STATE", "COMMITTED", "REASON"};
  int skip = part < 0; /* no PART column */
  struct table *t = table_new(5 - skip, header ? headers + skip : NULL);
  if (!t) return;
  for (size_t i = 0; i < resp->n_loaders; i++) {
    const Stoker__V1__LoaderInfo *info = resp->loaders[i];
    char p[16], step[24] = "none";
    snprintf(p, sizeof(p), "%d", part);
    if (info->committed_step >= 0) snprintf(step, sizeof(step), "%" PRId64, info->committed_step);
    const char *row[] = {p, info->spec ? info->spec->job : "", info->failed ? "failed" : "ok", step,
                         info->failed ? info->failure : ""};
    table_add(t, row + skip);
  }
  table_print(t, out);
  table_free(t);
}

void fmt_loader_list_json(const Stoker__V1__ListLoadersResponse *resp, int part, cJSON *arr) {
  for (size_t i = 0; arr && i < resp->n_loaders; i++) {
    cJSON *o = fmt_loader_json(resp->loaders[i]);
    if (o && part >= 0) cJSON_AddNumberToObject(o, "part", part);
    if (o) cJSON_AddItemToArray(arr, o);
  }
}

void fmt_loader_show(const Stoker__V1__LoaderInfo *info, FILE *out) {
  if (!info->spec) return;
  if (info->failed && !info->spec->n_datasets) { /* failed to load: the name and why */
    fprintf(out, "Loader:  %s\nState:   failed: %s\n", info->spec->job, info->failure);
    return;
  }
  summary(info, out);
  static const char *const headers[] = {"DATASET", "URI", "FORMAT", "WEIGHT"};
  struct table *t = table_new(4, headers);
  if (!t) return;
  for (size_t i = 0; i < info->spec->n_datasets; i++) {
    const Stoker__V1__DatasetSpec *d = info->spec->datasets[i];
    char w[32];
    snprintf(w, sizeof(w), "%g", d->weight);
    const char *row[] = {d->name, d->source ? d->source->uri : NULL, cli_format_name(d->format), w};
    table_add(t, row);
  }
  fprintf(out, "\n");
  table_print(t, out);
  table_free(t);
}

void fmt_explain_table(const Stoker__V1__ExplainResponse *resp, FILE *out) {
  static const char *const headers[] = {"LINE", "DATASET", "FILE",  "DOCUMENT", "DOC TOKENS",
                                        "UNIT", "TOKENS",  "EPOCH", "LANE"};
  struct table *t = table_new(9, headers);
  if (!t) return;
  for (size_t i = 0; i < resp->n_sources; i++) {
    const Stoker__V1__LineSource *l = resp->sources[i];
    char line[16], doc[24], doc_range[48], unit[24], range[48], epoch[16], lane[16];
    snprintf(line, sizeof(line), "%u", l->line);
    snprintf(doc, sizeof(doc), "%" PRIu64, l->document);
    snprintf(doc_range, sizeof(doc_range), "%" PRIu64 "-%" PRIu64, l->doc_token_begin,
             l->doc_token_end);
    snprintf(unit, sizeof(unit), "%" PRIu64, l->unit);
    snprintf(range, sizeof(range), "%" PRIu64 "-%" PRIu64, l->token_begin, l->token_end);
    snprintf(epoch, sizeof(epoch), "%u", l->epoch);
    snprintf(lane, sizeof(lane), "%u", l->lane);
    const char *row[] = {line, l->dataset, l->file, doc, doc_range, unit, range, epoch, lane};
    table_add(t, row);
  }
  table_print(t, out);
  table_free(t);
}
