/*
 * How stokerctl shows the dataloader: a loader's spec and committed step,
 * and a batch's provenance (which dataset, document and token range fed
 * each line), as text tables for people or JSON for tooling. Pure.
 */
#ifndef STK_CLI_LOADER_FORMAT_H
#define STK_CLI_LOADER_FORMAT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>

#include "stoker/v1/dataloader.pb-c.h"

/* Field names are the proto's; committed_step -1 means none. Caller frees
 * with cJSON_Delete. */
cJSON *fmt_loader_json(const Stoker__V1__LoaderInfo *info);
/* {"job", "step", "rank", "world", "sources": [LineSource...]}. */
cJSON *fmt_explain_json(const char *job, int64_t step, uint32_t rank, uint32_t world,
                        const Stoker__V1__ExplainResponse *resp);

/* ListLoaders: JOB STATE COMMITTED REASON rows (with a PART column first
 * when part >= 0; the header only when header is true), or one
 * fmt_loader_json object per job appended to arr (with "part" when >= 0). */
void fmt_loader_list(const Stoker__V1__ListLoadersResponse *resp, int part, bool header, FILE *out);
void fmt_loader_list_json(const Stoker__V1__ListLoadersResponse *resp, int part, cJSON *arr);

/* A summary and a table of datasets (NAME URI FORMAT WEIGHT); a failed job
 * shows its name and the reason. */
void fmt_loader_show(const Stoker__V1__LoaderInfo *info, FILE *out);
/* LINE DATASET DOCUMENT UNIT TOKENS EPOCH LANE, one row per run. */
void fmt_explain_table(const Stoker__V1__ExplainResponse *resp, FILE *out);

#endif
