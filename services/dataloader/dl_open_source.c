/*
 * dl_open_source: the default mapping from a DatasetSpec to a reader.
 * "file:///path" and "/path" open a dataset on local disk with the spec's
 * format; "synthetic:N_DOCS:MIN_LEN:MAX_LEN:SEED" opens the arithmetic
 * corpus of formats/dl_synthetic.h (tests, benchmarks, demos).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "dl_internal.h"
#include "dl_synthetic.h"
#include "stk_error.h"

static int open_synthetic(const Stoker__V1__DatasetSpec *spec, const char *args,
                          struct dl_source **ret) {
  uint64_t n, seed;
  uint32_t lo, hi;
  int used = 0;
  if (sscanf(args, "%" SCNu64 ":%" SCNu32 ":%" SCNu32 ":%" SCNu64 "%n", &n, &lo, &hi, &seed,
             &used) != 4 ||
      args[used] != 0) {
    stk_set_detail("dataset %s: synthetic source must be synthetic:N_DOCS:MIN:MAX:SEED",
                   spec->name);
    return STK_EINVAL;
  }
  return dl_source_open_synthetic(spec->name, n, lo, hi, seed, ret);
}

int dl_default_open_source(void *arg, const Stoker__V1__DatasetSpec *spec,
                           struct dl_source **ret_source) {
  const char *uri = spec->source ? spec->source->uri : NULL;
  if (!uri || !*uri) {
    stk_set_detail("dataset %s: source.uri is required", spec->name);
    return STK_EINVAL;
  }
  if (strncmp(uri, "synthetic:", 10) == 0) return open_synthetic(spec, uri + 10, ret_source);
  if (strncmp(uri, "file://", 7) == 0) uri += 7;
  if (uri[0] != '/') {
    stk_set_detail("dataset %s: unsupported source '%s' (file:///path or synthetic:...)",
                   spec->name, spec->source->uri);
    return STK_EINVAL;
  }
  if (spec->format < STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_MEGATRON ||
      spec->format > STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_TEXT) {
    stk_set_detail("dataset %s: unknown format %d", spec->name, (int)spec->format);
    return STK_EINVAL;
  }
  struct dl_source_opts o = {
      .name = spec->name,
      .path = uri,
      .format = (enum dl_format)spec->format,
      .tokenizer = spec->tokenizer && *spec->tokenizer ? spec->tokenizer : NULL,
      .block_tokens = spec->block_tokens,
      .block_bytes = spec->block_bytes,
      .eot_id = -1,
  };
  (void)arg;
  return dl_source_open(&o, ret_source);
}
