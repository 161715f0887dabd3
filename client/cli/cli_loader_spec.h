/*
 * `stokerctl loader create` and `loader mixture` flags to a LoaderSpec or
 * an UpdateMixtureRequest, checked here, away from the network, so tests
 * can check every flag lands in its field. The dataloader validates the
 * rest (names, bounds, whether a dataset opens) and its message is shown.
 *
 * A dataset is NAME=URI[:FORMAT][@WEIGHT]: FORMAT is megatron, llmc or text
 * (recognised only as the last ':' part, since URIs hold ':' themselves);
 * WEIGHT a positive number after the last '@' (default 1). --tokenizer
 * NAME=SPEC (repeatable, create and mixture) sets the tokenizer of the
 * --dataset NAME: bytes or gpt2:VOCAB,MERGES (text datasets); in a mixture
 * the dataset is read with it from the new version on.
 */
#ifndef STK_CLI_LOADER_SPEC_H
#define STK_CLI_LOADER_SPEC_H

#include "cli_args.h"
#include "stoker/v1/dataloader.pb-c.h"

#define CLI_MAX_DATASETS 32

/* Datasets and the storage their pointers use. */
struct cli_datasets {
  size_t n;
  Stoker__V1__DatasetSpec ds[CLI_MAX_DATASETS];
  Stoker__V1__DatasetSpec *ptrs[CLI_MAX_DATASETS];
  Stoker__V1__StorageRef src[CLI_MAX_DATASETS];
  char text[CLI_MAX_DATASETS][2][512]; /* Name, URI. */
};

struct cli_loader_spec {
  Stoker__V1__LoaderSpec spec;
  struct cli_datasets d;
};

/* Documents named by --block-document DATASET/FILE/DOC and their storage. */
struct cli_doc_refs {
  size_t n;
  Stoker__V1__DocumentRef refs[CLI_MAX_FLAGS];
  Stoker__V1__DocumentRef *ptrs[CLI_MAX_FLAGS];
  char text[CLI_MAX_FLAGS][2][512]; /* Dataset, file. */
};

struct cli_mixture {
  Stoker__V1__UpdateMixtureRequest req;
  struct cli_datasets d;
  struct cli_doc_refs docs;
};

/* Parses one NAME=URI[:FORMAT][@WEIGHT] into d's next slot. Returns 0 or
 * STK_EINVAL with a one-line reason in err. */
int cli_parse_dataset(const char *s, struct cli_datasets *d, char *err, size_t err_len);

/* Fills out from job and --dataset (one or more), --seq-len, --global-batch
 * (required), --seed, --shards, --lanes, --bos ID, --eos ID (each turns the
 * insertion on), --max-doc-tokens. */
int cli_loader_spec_from_args(const struct cli_args *a, const char *job,
                              struct cli_loader_spec *out, char *err, size_t err_len);

/* Fills out from job and --from-step (required), --dataset (optional: the
 * new mixture), --seq-len, --global-batch, --block-document DATASET/FILE/DOC
 * (repeatable: documents never served again, named as `loader explain`
 * names them; FILE is everything between the first and the last '/');
 * at least one change. */
int cli_mixture_from_args(const struct cli_args *a, const char *job, struct cli_mixture *out,
                          char *err, size_t err_len);

/* "megatron", "llmc", "text"; "-" for unspecified, "?" outside the enum. */
const char *cli_format_name(int format);

#endif
