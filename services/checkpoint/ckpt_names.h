/*
 * ckpt_names: the names that reach storage keys (job, tensor, attempt,
 * object names, the deployment's key prefix) and the construction of every
 * key of a checkpoint, so that no name from the network can make a key
 * escape its job's prefix:
 *
 *   PREFIX/JOB/step-000000001234/attempt-ID/rank-00003-0000.bin
 *   PREFIX/JOB/step-000000001234/attempt-ID/manifest.pb   (written last)
 *
 * Paths (prefix, tensor and object names) use [A-Za-z0-9._/-], no segment is
 * empty, "." or contains "..", and there is no leading or trailing "/". Job
 * names and attempt ids are single segments. Control characters, spaces and
 * non-ASCII bytes are refused everywhere. Failures are STK_EINVAL with a
 * detail naming the problem.
 */
#ifndef STK_CKPT_NAMES_H
#define STK_CKPT_NAMES_H

#include <stddef.h>
#include <stdint.h>

#define CKPT_JOB_MAX_BYTES     128
#define CKPT_TENSOR_MAX_BYTES  512
#define CKPT_PREFIX_MAX_BYTES  512
#define CKPT_OBJECT_MAX_BYTES  128
#define CKPT_ATTEMPT_MAX_BYTES 64
/* Steps are written with 12 digits so that keys sort by step. */
#define CKPT_STEP_MAX INT64_C(999999999999)

int ckpt_name_check_job(const char *job);
int ckpt_name_check_tensor(const char *tensor);
/* The empty prefix is allowed (keys then start with the job). */
int ckpt_name_check_prefix(const char *prefix);
/* An object's name relative to its attempt directory, as the manifest
 * records it. */
int ckpt_name_check_object(const char *object);
/* [A-Za-z0-9-], 1..64 bytes. */
int ckpt_name_check_attempt(const char *attempt);
/* 0 <= step <= CKPT_STEP_MAX. */
int ckpt_name_check_step(int64_t step);

/* A fresh attempt id: 32 random hex digits (getrandom). 0 or STK_EIO. */
int ckpt_attempt_generate(char ret_attempt[CKPT_ATTEMPT_MAX_BYTES + 1]);

/* The object name of a rank's n-th object: "rank-00003-0000.bin". */
void ckpt_object_name(uint32_t rank, uint32_t n, char ret_name[CKPT_OBJECT_MAX_BYTES + 1]);

/*
 * Keys, returned malloc'd (free() them). Every part is checked first: 0,
 * STK_EINVAL, STK_ENOMEM. Directory keys end with "/" (for listing).
 */
int ckpt_key_job_dir(const char *prefix, const char *job, char **ret_key);
int ckpt_key_step_dir(const char *prefix, const char *job, int64_t step, char **ret_key);
int ckpt_key_attempt_dir(const char *prefix, const char *job, int64_t step, const char *attempt,
                         char **ret_key);
int ckpt_key_object(const char *prefix, const char *job, int64_t step, const char *attempt,
                    const char *object, char **ret_key);
int ckpt_key_manifest(const char *prefix, const char *job, int64_t step, const char *attempt,
                      char **ret_key);

/* Parses a step directory segment "step-000000001234" (a trailing "/" is
 * allowed), as a LIST under the job directory returns. 0 or STK_EINVAL. */
int ckpt_key_parse_step(const char *segment, int64_t *ret_step);

#endif
