/*
 * Turns `loader create` and `loader mixture` flags into protobuf messages
 * (see cli_loader_spec.h). Only the shape of each value is checked here.
 */
#include "cli_loader_spec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

static const char *const format_names[] = {
    [STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_MEGATRON] = "megatron",
    [STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_LLMC] = "llmc",
    [STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_TEXT] = "text",
};

const char *cli_format_name(int format) {
  if (format == 0) return "-";
  if (format < 0 || format > STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_TEXT) return "?";
  return format_names[format];
}

/* The format named by s, or 0. */
static int format_of(const char *s) {
  for (int f = 1; f <= STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_TEXT; f++) {
    if (strcmp(s, format_names[f]) == 0) return f;
  }
  return 0;
}

/* Cuts "@WEIGHT" off the end of uri (in place) when it is there. */
static int cut_weight(char *uri, double *ret_weight, char *err, size_t err_len) {
  char *at = strrchr(uri, '@');
  *ret_weight = 1.0;
  if (!at) return 0;
  char *end;
  errno = 0;
  double w = strtod(at + 1, &end);
  if (errno || end == at + 1 || *end || !isfinite(w) || w <= 0) {
    snprintf(err, err_len, "--dataset: bad weight \"%s\" (a positive number)", at + 1);
    return STK_EINVAL;
  }
  *at = '\0';
  *ret_weight = w;
  return 0;
}

int cli_parse_dataset(const char *s, struct cli_datasets *d, char *err, size_t err_len) {
  if (d->n == CLI_MAX_DATASETS) {
    snprintf(err, err_len, "--dataset: at most %d datasets", CLI_MAX_DATASETS);
    return STK_EINVAL;
  }
  char *name = d->text[d->n][0], *uri = d->text[d->n][1];
  if (cli_split_label(s, name, 512, uri, 512) < 0 || !uri[0]) {
    snprintf(err, err_len, "--dataset: expected NAME=URI[:FORMAT][@WEIGHT], got \"%s\"", s);
    return STK_EINVAL;
  }
  double weight;
  if (cut_weight(uri, &weight, err, err_len) < 0) return STK_EINVAL;
  char *colon = strrchr(uri, ':');
  int format = colon ? format_of(colon + 1) : 0;
  if (format) *colon = '\0';
  if (!uri[0]) {
    snprintf(err, err_len, "--dataset: no URI in \"%s\"", s);
    return STK_EINVAL;
  }
  Stoker__V1__DatasetSpec *ds = &d->ds[d->n];
  stoker__v1__dataset_spec__init(ds);
  stoker__v1__storage_ref__init(&d->src[d->n]);
  d->src[d->n].uri = uri;
  ds->name = name;
  ds->source = &d->src[d->n];
  ds->format = (Stoker__V1__DatasetFormat)format;
  ds->weight = weight;
  d->ptrs[d->n] = ds;
  d->n++;
  return 0;
}

static int num(const struct cli_args *a, const char *flag, uint64_t max, uint64_t *ret_value,
               bool *ret_set, char *err, size_t err_len);

/* Every --tokenizer NAME=SPEC onto the --dataset NAME (SPEC stays in the
 * flag's own storage: it may be as long as two paths). */
static int tokenizers(const struct cli_args *a, struct cli_datasets *d, char *err, size_t err_len) {
  for (int i = 0; i < a->n_flags; i++) {
    if (strcmp(a->flags[i].name, "tokenizer") != 0) continue;
    const char *v = a->flags[i].value ? a->flags[i].value : "", *eq = strchr(v, '=');
    size_t k = 0, len = eq ? (size_t)(eq - v) : 0;
    while (k < d->n && (strlen(d->ds[k].name) != len || strncmp(d->ds[k].name, v, len) != 0)) k++;
    if (!eq || !len || !eq[1] || k == d->n) {
      snprintf(err, err_len, "--tokenizer: expected NAME=SPEC naming a --dataset, got \"%s\"", v);
      return STK_EINVAL;
    }
    d->ds[k].tokenizer = (char *)eq + 1;
  }
  return 0;
}

/* Every --dataset, --block-tokens N as the unit size of each llm.c one
 * (refused when none is llm.c: it would change nothing), then --tokenizer. */
static int datasets(const struct cli_args *a, struct cli_datasets *d, char *err, size_t err_len) {
  d->n = 0;
  for (int i = 0; i < a->n_flags; i++) {
    if (strcmp(a->flags[i].name, "dataset") != 0) continue;
    if (cli_parse_dataset(a->flags[i].value, d, err, err_len) < 0) return STK_EINVAL;
  }
  uint64_t block = 0;
  bool block_set;
  if (num(a, "block-tokens", UINT32_MAX, &block, &block_set, err, err_len) < 0) return STK_EINVAL;
  if (!block_set) return tokenizers(a, d, err, err_len);
  size_t llmc = 0;
  for (size_t i = 0; i < d->n; i++) {
    if (d->ds[i].format != STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_LLMC) continue;
    d->ds[i].block_tokens = (uint32_t)block;
    llmc++;
  }
  if (block == 0 || llmc == 0) {
    snprintf(err, err_len, "--block-tokens: %s",
             block == 0 ? "must be at least 1" : "no --dataset NAME=URI:llmc to apply it to");
    return STK_EINVAL;
  }
  return tokenizers(a, d, err, err_len);
}

/* Parses an optional integer flag; *ret_set tells whether it was given. */
static int num(const struct cli_args *a, const char *flag, uint64_t max, uint64_t *ret_value,
               bool *ret_set, char *err, size_t err_len) {
  const char *v = cli_flag_value(a, flag);
  if (ret_set) *ret_set = v != NULL;
  if (!v) return 0;
  if (flag_parse_uint(v, max, ret_value) < 0) {
    snprintf(err, err_len, "--%s: bad number \"%s\"", flag, v);
    return STK_EINVAL;
  }
  return 0;
}

/* seq-len and global-batch, both positive when given. */
static int shape(const struct cli_args *a, uint32_t *seq_len, uint32_t *global, char *err,
                 size_t err_len) {
  uint64_t sl = 0, gb = 0;
  bool sl_set, gb_set;
  if (num(a, "seq-len", UINT32_MAX - 1, &sl, &sl_set, err, err_len) < 0 ||
      num(a, "global-batch", UINT32_MAX, &gb, &gb_set, err, err_len) < 0)
    return STK_EINVAL;
  if ((sl_set && sl == 0) || (gb_set && gb == 0)) {
    snprintf(err, err_len, "--%s must be at least 1",
             sl_set && sl == 0 ? "seq-len" : "global-batch");
    return STK_EINVAL;
  }
  *seq_len = (uint32_t)sl;
  *global = (uint32_t)gb;
  return 0;
}

/* --bos / --eos ID: the token id, and insertion on. */
static int special(const struct cli_args *a, const char *flag, protobuf_c_boolean *ret_on,
                   uint32_t *ret_id, char *err, size_t err_len) {
  uint64_t id = 0;
  bool set;
  if (num(a, flag, UINT32_MAX, &id, &set, err, err_len) < 0) return STK_EINVAL;
  *ret_on = set;
  *ret_id = (uint32_t)id;
  return 0;
}

int cli_loader_spec_from_args(const struct cli_args *a, const char *job,
                              struct cli_loader_spec *out, char *err, size_t err_len) {
  Stoker__V1__LoaderSpec *s = &out->spec;
  uint64_t seed = 0, shards = 0, lanes = 0, max_doc = 0;
  stoker__v1__loader_spec__init(s);
  s->job = (char *)job;
  if (datasets(a, &out->d, err, err_len) < 0 ||
      shape(a, &s->seq_len, &s->global_batch, err, err_len) < 0 ||
      num(a, "seed", UINT64_MAX, &seed, NULL, err, err_len) < 0 ||
      num(a, "shards", UINT32_MAX, &shards, NULL, err, err_len) < 0 ||
      num(a, "lanes", UINT32_MAX, &lanes, NULL, err, err_len) < 0 ||
      num(a, "max-doc-tokens", UINT32_MAX, &max_doc, NULL, err, err_len) < 0 ||
      special(a, "bos", &s->add_bos, &s->bos_id, err, err_len) < 0 ||
      special(a, "eos", &s->add_eos, &s->eos_id, err, err_len) < 0)
    return STK_EINVAL;
  if (out->d.n == 0 || !s->seq_len || !s->global_batch) {
    snprintf(err, err_len, "%s is required",
             out->d.n == 0 ? "--dataset NAME=URI[:FORMAT][@WEIGHT]"
             : !s->seq_len ? "--seq-len N"
                           : "--global-batch N");
    return STK_EINVAL;
  }
  s->n_datasets = out->d.n;
  s->datasets = out->d.ptrs;
  s->seed = seed;
  s->logical_shards = (uint32_t)shards;
  s->lanes = (uint32_t)lanes;
  s->max_doc_tokens = (uint32_t)max_doc;
  return 0;
}

/* Every --block-document DATASET/FILE/DOC into r's block_documents. */
static int doc_refs(const struct cli_args *a, struct cli_doc_refs *d, char *err, size_t err_len) {
  d->n = 0;
  for (int i = 0; i < a->n_flags; i++) {
    if (strcmp(a->flags[i].name, "block-document") != 0) continue;
    const char *v = a->flags[i].value ? a->flags[i].value : "";
    const char *first = strchr(v, '/'), *last = strrchr(v, '/');
    uint64_t doc;
    size_t ds_len = first ? (size_t)(first - v) : 0;
    size_t file_len = first && last > first ? (size_t)(last - first - 1) : 0;
    if (ds_len == 0 || file_len == 0 || ds_len >= 512 || file_len >= 512 ||
        flag_parse_uint(last + 1, UINT64_MAX, &doc) < 0) {
      snprintf(err, err_len, "--block-document: expected DATASET/FILE/DOC, got \"%s\"", v);
      return STK_EINVAL;
    }
    char *ds = d->text[d->n][0], *file = d->text[d->n][1];
    memcpy(ds, v, ds_len);
    ds[ds_len] = '\0';
    memcpy(file, first + 1, file_len);
    file[file_len] = '\0';
    stoker__v1__document_ref__init(&d->refs[d->n]);
    d->refs[d->n].dataset = ds;
    d->refs[d->n].file = file;
    d->refs[d->n].document = doc;
    d->ptrs[d->n] = &d->refs[d->n];
    d->n++;
  }
  return 0;
}

int cli_mixture_from_args(const struct cli_args *a, const char *job, struct cli_mixture *out,
                          char *err, size_t err_len) {
  Stoker__V1__UpdateMixtureRequest *r = &out->req;
  uint64_t from = 0;
  bool from_set;
  stoker__v1__update_mixture_request__init(r);
  r->job = (char *)job;
  if (num(a, "from-step", INT64_MAX, &from, &from_set, err, err_len) < 0 ||
      datasets(a, &out->d, err, err_len) < 0 ||
      shape(a, &r->seq_len, &r->global_batch, err, err_len) < 0 ||
      doc_refs(a, &out->docs, err, err_len) < 0)
    return STK_EINVAL;
  if (!from_set) {
    snprintf(err, err_len, "--from-step S is required");
    return STK_EINVAL;
  }
  if (out->d.n == 0 && !r->seq_len && !r->global_batch && out->docs.n == 0) {
    snprintf(err, err_len,
             "nothing to change (give --dataset, --seq-len, --global-batch or --block-document)");
    return STK_EINVAL;
  }
  r->n_block_documents = out->docs.n;
  r->block_documents = out->docs.n ? out->docs.ptrs : NULL;
  r->from_step = (int64_t)from;
  r->n_datasets = out->d.n;
  r->datasets = out->d.n ? out->d.ptrs : NULL;
  return 0;
}
