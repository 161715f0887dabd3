/*
 * How stokerctl shows checkpoints: the list of a job's checkpoints, a
 * manifest summarised per tensor (dtype, global shape, chunks, objects it
 * spans), the manifest as JSON, a verify report, and the progress bar a
 * terminal sees during verify. Pure: no network, output to a FILE.
 */
#ifndef STK_CLI_CKPT_FORMAT_H
#define STK_CLI_CKPT_FORMAT_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "stoker/v1/checkpoint.pb-c.h"

/* "F32", "BF16", ...; "UNKNOWN(9)" outside the enum. */
const char *fmt_dtype(int dtype, char *buf, size_t len);
/* "1.5 GiB", "12.0 MiB", "512 B". */
void fmt_bytes(uint64_t bytes, char *buf, size_t len);

/* STEP COMMITTED GENERATION URI, one row per checkpoint. */
void fmt_ckpt_list(const Stoker__V1__ListCheckpointsResponse *l, FILE *out);
/* {"job", "checkpoints": [{"step", "uri", "committed_at_ms", "generation"}]}. */
cJSON *fmt_ckpt_list_json(const char *job, const Stoker__V1__ListCheckpointsResponse *l);

/* A summary (job, step, world, attempt, created, objects, bytes) then
 * TENSOR DTYPE SHAPE CHUNKS OBJECTS BYTES, one row per tensor in order of
 * first appearance. */
void fmt_manifest_show(const Stoker__V1__Manifest *m, FILE *out);
/* The whole manifest: proto field names; boxes as {"offsets","sizes"};
 * objects with their block CRC32C as numbers. */
cJSON *fmt_manifest_json(const Stoker__V1__Manifest *m);

/* "checkpoint j step 10: OK, 3 objects, 1.5 GiB, 1536 blocks" then one
 * line per problem. */
void fmt_verify_report(const char *job, int64_t step, const Stoker__V1__VerifyCheckpointResponse *v,
                       FILE *out);
cJSON *fmt_verify_json(const char *job, int64_t step,
                       const Stoker__V1__VerifyCheckpointResponse *v);

/* "[#########...........]  45%  1.2 GiB / 2.7 GiB" in buf (width bar
 * cells); done is clamped to total. */
void fmt_progress(uint64_t done, uint64_t total, int width, char *buf, size_t len);

#endif
