/*
 * The capability probe (see s3_probe.h).
 */
#include "s3_probe.h"

#include "log.h"
#include "stk_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static int run(struct s3_thread *s, const struct s3_op *op, long *ret_status) {
  struct s3_result res;
  int err = s3_thread_do(s, op, &res);
  if (ret_status) *ret_status = res.status;
  s3_result_clear(&res);
  return err;
}

static int probe_conditional(struct s3_thread *s, const char *key, bool *ret) {
  struct s3_op put = {
      .kind = S3_OP_PUT, .key = key, .body = "1", .body_len = 1, .if_none_match = true};
  int err = run(s, &put, NULL);
  if (err) return err;
  long status = 0;
  err = run(s, &put, &status);
  *ret = err == STK_EEXIST && status == 412;
  struct s3_op del = {.kind = S3_OP_DELETE, .key = key};
  run(s, &del, NULL);
  return err == 0 || err == STK_EEXIST ? 0 : err;
}

static int probe_multipart(struct s3_thread *s, const char *key, struct s3_caps *caps) {
  struct s3_op create = {.kind = S3_OP_MPU_CREATE, .key = key};
  struct s3_result res;
  int err = s3_thread_do(s, &create, &res);
  char *id = res.upload_id;
  res.upload_id = NULL;
  s3_result_clear(&res);
  if (err) return err;
  struct s3_op part = {.kind = S3_OP_MPU_PART,
                       .key = key,
                       .upload_id = id,
                       .part_number = 1,
                       .body = "probe",
                       .body_len = 5};
  err = run(s, &part, NULL);
  struct s3_op list = {.kind = S3_OP_MPU_LIST_PARTS, .key = key, .upload_id = id};
  if (!err) {
    int list_err = s3_thread_do(s, &list, &res);
    caps->multipart_list_parts =
        list_err == 0 && res.n_entries == 1 && res.entries[0].part_number == 1;
    s3_result_clear(&res);
  }
  struct s3_op abort_op = {.kind = S3_OP_MPU_ABORT, .key = key, .upload_id = id};
  bool aborted = run(s, &abort_op, NULL) == 0;
  /* Gone after abort: ListParts answers NoSuchUpload (or, without ListParts,
   * trust the 2xx). */
  caps->multipart_abort =
      aborted && (!caps->multipart_list_parts || run(s, &list, NULL) == STK_ENOENT);
  struct s3_op uploads = {.kind = S3_OP_MPU_LIST_UPLOADS, .prefix = key, .max_keys = 1};
  long status = 0;
  int list_err = run(s, &uploads, &status);
  caps->multipart_list_uploads = list_err == 0;
  if (list_err)
    log_warn("storage.probe",
             "ListMultipartUploads answered %ld (%s), asked once: orphaned multipart uploads "
             "will not be found",
             status, stk_strerror(list_err));
  free(id);
  return err;
}

int s3_probe(struct s3_thread *s, const char *key_prefix, struct s3_caps *ret) {
  unsigned char rnd[8];
  if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd)) memset(rnd, 0, sizeof(rnd));
  char key[1100];
  snprintf(key, sizeof(key), "%s.stk-probe-%02x%02x%02x%02x%02x%02x%02x%02x", key_prefix, rnd[0],
           rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
  struct s3_caps caps = {0};
  int err = probe_conditional(s, key, &caps.conditional_put);
  if (!err) err = probe_multipart(s, key, &caps);
  if (!err) *ret = caps;
  return err;
}
