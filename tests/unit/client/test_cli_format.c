/*
 * stokerctl's output: tables line up, JSON of a Job and an event carries
 * every field under the proto's names (checked by parsing it back, and
 * against the descriptors: a field the proto gains is there too), the
 * job view shows the member table, enum names and times render as shown
 * in the docs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli_format.h"

/* Renders through fn into a malloc'ed string. */
#define CAPTURE(out_str, call)                                                                     \
  do {                                                                                             \
    size_t cap_len_;                                                                               \
    FILE *out = open_memstream(&(out_str), &cap_len_);                                             \
    call;                                                                                          \
    fclose(out);                                                                                   \
  } while (0)

static void test_table_aligns(void **state) {
  static const char *const headers[] = {"NAME", "STATE", "WORLD"};
  struct table *t = table_new(3, headers);
  const char *r1[] = {"a-very-long-name", "RUNNING", "8"};
  const char *r2[] = {"b", NULL, "16"};
  assert_int_equal(table_add(t, r1), 0);
  assert_int_equal(table_add(t, r2), 0);
  char *s = NULL;
  CAPTURE(s, table_print(t, out));
  assert_string_equal(s, "NAME              STATE    WORLD\n"
                         "a-very-long-name  RUNNING  8\n"
                         "b                 -        16\n");
  free(s);
  table_free(t);
  table_free(NULL);
}

static void test_table_grows(void **state) {
  struct table *t = table_new(1, NULL);
  char cell[16];
  for (int i = 0; i < 100; i++) {
    snprintf(cell, sizeof(cell), "%d", i);
    const char *row[] = {cell};
    assert_int_equal(table_add(t, row), 0);
  }
  char *s = NULL;
  CAPTURE(s, table_print(t, out));
  assert_non_null(strstr(s, "0\n1\n"));
  assert_non_null(strstr(s, "\n99\n"));
  free(s);
  table_free(t);
}

static void test_enum_names(void **state) {
  char buf[32];
  assert_string_equal(fmt_job_state(STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, buf, sizeof(buf)),
                      "RUNNING");
  assert_string_equal(
      fmt_event_type(STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_MEMBER_JOINED, buf, sizeof(buf)),
      "MEMBER_JOINED");
  assert_string_equal(fmt_health(STOKER__V1__RANK_HEALTH__RANK_HEALTH_DEGRADED, buf, sizeof(buf)),
                      "DEGRADED");
  assert_string_equal(fmt_job_state(77, buf, sizeof(buf)), "UNKNOWN(77)");
}

static void test_times(void **state) {
  char buf[48];
  fmt_time_ms(1700000000123, buf, sizeof(buf));
  assert_string_equal(buf, "2023-11-14T22:13:20.123Z");
  fmt_time_ms(0, buf, sizeof(buf));
  assert_string_equal(buf, "-");
  fmt_age(100000, 9500, buf, sizeof(buf));
  assert_string_equal(buf, "1m30s");
  fmt_age(100000, 0, buf, sizeof(buf));
  assert_string_equal(buf, "-");
  fmt_age(100000, 200000, buf, sizeof(buf)); /* Clock skew: never negative. */
  assert_string_equal(buf, "0s");
}

/* A job with two members, labels and a checkpoint, in static storage. */
struct sample {
  Stoker__V1__Job job;
  Stoker__V1__JobSpec spec;
  Stoker__V1__JobSpec__LabelsEntry label;
  Stoker__V1__JobSpec__LabelsEntry *labels[1];
  Stoker__V1__StorageRef dataset;
  Stoker__V1__CheckpointRef ckpt;
  Stoker__V1__Member m[2];
  Stoker__V1__Member *members[2];
};

static void sample_init(struct sample *s) {
  stoker__v1__job__init(&s->job);
  stoker__v1__job_spec__init(&s->spec);
  stoker__v1__job_spec__labels_entry__init(&s->label);
  stoker__v1__storage_ref__init(&s->dataset);
  stoker__v1__checkpoint_ref__init(&s->ckpt);
  s->spec.name = "gpt-small";
  s->spec.min_ranks = 2;
  s->spec.max_ranks = 4;
  s->spec.heartbeat_interval_ms = 5000;
  s->label.key = "team";
  s->label.value = "ml";
  s->labels[0] = &s->label;
  s->spec.n_labels = 1;
  s->spec.labels = s->labels;
  s->dataset.uri = "file:///data/corpus";
  s->spec.dataset = &s->dataset;
  s->ckpt.step = 1200;
  s->ckpt.uri = "s3://b/ckpt/1200";
  s->ckpt.generation = 3;
  s->ckpt.committed_at_ms = 1700000000000;
  const char *ids[] = {"rank-a@host1", "b"};
  for (int i = 0; i < 2; i++) {
    stoker__v1__member__init(&s->m[i]);
    s->m[i].member_id = (char *)ids[i];
    s->m[i].rank = (uint32_t)i;
    s->m[i].host = i ? "host2" : "host1";
    s->m[i].step = 1234 + (uint64_t)i;
    s->m[i].tokens_per_s = 4100.4;
    s->m[i].loss = 2.5;
    s->m[i].health = STOKER__V1__RANK_HEALTH__RANK_HEALTH_OK;
    s->m[i].last_heartbeat_ms = 1700000001000;
    s->members[i] = &s->m[i];
  }
  s->job.spec = &s->spec;
  s->job.state = STOKER__V1__JOB_STATE__JOB_STATE_RUNNING;
  s->job.generation = 3;
  s->job.world_size = 2;
  s->job.n_members = 2;
  s->job.members = s->members;
  s->job.latest_checkpoint = &s->ckpt;
  s->job.created_at_ms = 1699999000000;
  s->job.last_event_seq = 42;
}

static void test_job_json(void **state) {
  static struct sample s;
  sample_init(&s);
  cJSON *o = fmt_job_json(&s.job);
  char *text = NULL;
  CAPTURE(text, fmt_print_json(o, out));
  cJSON_Delete(o);
  assert_ptr_equal(strchr(text, '\n'), text + strlen(text) - 1); /* One line. */
  cJSON *back = cJSON_Parse(text);
  free(text);
  assert_non_null(back);
  assert_string_equal(cJSON_GetObjectItem(back, "name")->valuestring, "gpt-small");
  assert_string_equal(cJSON_GetObjectItem(back, "state")->valuestring, "RUNNING");
  assert_int_equal(cJSON_GetObjectItem(back, "generation")->valuedouble, 3);
  assert_int_equal(cJSON_GetObjectItem(back, "last_event_seq")->valuedouble, 42);
  cJSON *spec = cJSON_GetObjectItem(back, "spec");
  assert_int_equal(cJSON_GetObjectItem(spec, "max_ranks")->valuedouble, 4);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(spec, "labels"), "team")->valuestring,
                      "ml");
  assert_string_equal(cJSON_GetObjectItem(spec, "dataset")->valuestring, "file:///data/corpus");
  cJSON *members = cJSON_GetObjectItem(back, "members");
  assert_int_equal(cJSON_GetArraySize(members), 2);
  cJSON *m1 = cJSON_GetArrayItem(members, 1);
  assert_string_equal(cJSON_GetObjectItem(m1, "member_id")->valuestring, "b");
  assert_int_equal(cJSON_GetObjectItem(m1, "step")->valuedouble, 1235);
  assert_string_equal(cJSON_GetObjectItem(m1, "health")->valuestring, "OK");
  cJSON *ck = cJSON_GetObjectItem(back, "latest_checkpoint");
  assert_int_equal(cJSON_GetObjectItem(ck, "step")->valuedouble, 1200);
  assert_string_equal(cJSON_GetObjectItem(ck, "uri")->valuestring, "s3://b/ckpt/1200");
  cJSON_Delete(back);
}

static void test_job_json_minimal(void **state) {
  Stoker__V1__Job job = STOKER__V1__JOB__INIT; /* As unpacked from an empty message. */
  cJSON *o = fmt_job_json(&job);
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "spec")));
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "latest_checkpoint")));
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "queue"))); /* Not submitted. */
  assert_string_equal(cJSON_GetObjectItem(o, "state")->valuestring, "UNSPECIFIED");
  cJSON_Delete(o);
}

static void test_job_show(void **state) {
  static struct sample s;
  sample_init(&s);
  char *text = NULL;
  CAPTURE(text, fmt_job_show(&s.job, 1700000004000, out));
  assert_non_null(strstr(text, "Job:"));
  assert_non_null(strstr(text, "gpt-small"));
  assert_non_null(strstr(text, "RUNNING"));
  assert_non_null(strstr(text, "step 1200 at s3://b/ckpt/1200"));
  assert_non_null(strstr(text, "team=ml"));
  assert_non_null(strstr(text, "every 5s"));
  /* The member table: header and rows aligned column by column. */
  const char *hdr = strstr(text, "RANK  MEMBER");
  assert_non_null(hdr);
  const char *row0 =
      strstr(text, "\n0     rank-a@host1  host1  1234  4100      2.5000  OK      3s ago");
  assert_non_null(row0);
  assert_non_null(strstr(text, "\n1     b             host2  1235"));
  free(text);
}

static void test_jobs_table(void **state) {
  static struct sample s;
  sample_init(&s);
  Stoker__V1__Job *jobs[] = {&s.job};
  char *text = NULL;
  CAPTURE(text, fmt_jobs_table(jobs, 1, 1699999060000, out));
  assert_string_equal(text, "NAME       STATE    GENERATION  WORLD  RANKS  STEP  CHECKPOINT  AGE\n"
                            "gpt-small  RUNNING  3           2      2-4    1235  1200        1m\n");
  free(text);
}

static void test_event(void **state) {
  Stoker__V1__JobEvent ev = STOKER__V1__JOB_EVENT__INIT;
  ev.seq = 7;
  ev.time_ms = 1700000000123;
  ev.job = "gpt";
  ev.type = STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_MEMBER_LOST;
  ev.generation = 2;
  ev.member_id = "r1";
  ev.message = "lease expired";
  char *text = NULL;
  CAPTURE(text, fmt_event_line(&ev, out));
  assert_string_equal(
      text, "7  2023-11-14T22:13:20.123Z  MEMBER_LOST  gen=2  member=r1  lease expired\n");
  free(text);
  cJSON *o = fmt_event_json(&ev);
  assert_int_equal(cJSON_GetObjectItem(o, "seq")->valuedouble, 7);
  assert_string_equal(cJSON_GetObjectItem(o, "type")->valuestring, "MEMBER_LOST");
  assert_string_equal(cJSON_GetObjectItem(o, "job")->valuestring, "gpt");
  assert_string_equal(cJSON_GetObjectItem(o, "member_id")->valuestring, "r1");
  cJSON_Delete(o);
}

/* The JSON comes from the descriptors: every field of every message a job
 * holds is a key, whatever the proto adds later, with no C per field. */
static void assert_every_field(const cJSON *o, const ProtobufCMessageDescriptor *d) {
  assert_true(cJSON_IsObject(o));
  for (unsigned i = 0; i < d->n_fields; i++)
    if (!cJSON_HasObjectItem(o, d->fields[i].name))
      fail_msg("%s: no key %s", d->name, d->fields[i].name);
  assert_int_equal(cJSON_GetArraySize(o) >= (int)d->n_fields, 1);
}

static void test_json_has_every_field_of_the_descriptors(void **state) {
  static struct sample s;
  sample_init(&s);
  cJSON *o = fmt_job_json(&s.job);
  assert_every_field(o, &stoker__v1__job__descriptor);
  assert_int_equal(cJSON_GetArraySize(o), (int)stoker__v1__job__descriptor.n_fields + 1); /* name */
  assert_every_field(cJSON_GetObjectItem(o, "spec"), &stoker__v1__job_spec__descriptor);
  assert_every_field(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "members"), 0),
                     &stoker__v1__member__descriptor);
  assert_every_field(cJSON_GetObjectItem(o, "latest_checkpoint"),
                     &stoker__v1__checkpoint_ref__descriptor);
  /* A StorageRef is its URI, "" when absent; a map an object. */
  cJSON *spec = cJSON_GetObjectItem(o, "spec");
  assert_string_equal(cJSON_GetObjectItem(spec, "checkpoint_storage")->valuestring, "");
  assert_true(cJSON_IsObject(cJSON_GetObjectItem(spec, "labels")));
  cJSON_Delete(o);
  Stoker__V1__JobEvent ev = STOKER__V1__JOB_EVENT__INIT;
  ev.type = 99;
  o = fmt_event_json(&ev);
  assert_every_field(o, &stoker__v1__job_event__descriptor);
  assert_string_equal(cJSON_GetObjectItem(o, "type")->valuestring, "UNKNOWN(99)");
  cJSON_Delete(o);
}

static void test_enum_prefixes_come_from_the_descriptor(void **state) {
  char buf[48];
  assert_string_equal(fmt_enum_name(&stoker__v1__heartbeat_action__descriptor,
                                    STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_CONTINUE, buf,
                                    sizeof(buf)),
                      "CONTINUE"); /* No UNSPECIFIED: the common prefix. */
  assert_string_equal(fmt_enum_name(&stoker__v1__job_event_type__descriptor,
                                    STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_MEMBER_JOINED, buf,
                                    sizeof(buf)),
                      "MEMBER_JOINED");
  assert_int_equal(fmt_enum_prefix_len(&stoker__v1__job_state__descriptor), strlen("JOB_STATE_"));
}

/* The queue and resize events read as sentences from their fields. */
static void test_queue_events(void **state) {
  Stoker__V1__JobEvent ev = STOKER__V1__JOB_EVENT__INIT;
  ev.seq = 9;
  ev.time_ms = 1700000000123;
  ev.generation = 3;
  struct {
    Stoker__V1__JobEventType type;
    uint32_t world;
    int64_t step;
    const char *message, *want;
  } cases[] = {
      {STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_QUEUED, 0, 0, "queued in team-a at position 2",
       "queued in team-a at position 2"},
      {STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_ADMITTED, 4, 0, "admitted 4 ranks by cq",
       "admitted 4 ranks by cq"},
      {STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_ADMITTED, 4, 0, "", "admitted 4 ranks"},
      {STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_PREEMPTED, 0, 300, "kueue: evicted",
       "preempted at step 300: kueue: evicted"},
      {STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_SHRUNK, 2, 300, "shrunk from 4 to 2 ranks at step 300",
       "shrunk to 2 ranks at step 300"},
      {STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_GROWN, 4, 320, "", "grown to 4 ranks at step 320"},
      {STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_SHRUNK, 1, 330, "", "shrunk to 1 rank at step 330"},
      {STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_ADMITTED, 1, 0, "", "admitted 1 rank"},
      {STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_RESUMED, 2, 300, "", "resumed at step 300"},
      {STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_REJECTED, 0, 0,
       "rejected by the queue controller: stoker-template-x: Not Found",
       "rejected by the queue controller: stoker-template-x: Not Found"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    ev.type = cases[i].type;
    ev.world_size = cases[i].world;
    ev.step = cases[i].step;
    ev.message = (char *)cases[i].message;
    char *text = NULL, type[48], want[256];
    CAPTURE(text, fmt_event_line(&ev, out));
    snprintf(want, sizeof(want), "9  2023-11-14T22:13:20.123Z  %s  gen=3  %s\n",
             fmt_event_type(ev.type, type, sizeof(type)), cases[i].want);
    assert_string_equal(text, want);
    free(text);
  }
}

/* A submitted job: job show prints where it went and the queue's report;
 * the JSON carries both under the proto's names. */
static void test_job_queue(void **state) {
  static struct sample s;
  sample_init(&s);
  Stoker__V1__Submission sub = STOKER__V1__SUBMISSION__INIT;
  sub.queue = "team-a";
  sub.template_ = "llm";
  char *args[] = {"--lr", "3e-4"};
  sub.args = args;
  sub.n_args = 2;
  s.spec.submission = &sub;
  char *text = NULL;
  CAPTURE(text, fmt_job_show(&s.job, 1700000004000, out));
  assert_non_null(strstr(text, "queue team-a, priority (default), template llm"));
  assert_non_null(strstr(text, "--lr 3e-4"));
  assert_non_null(strstr(text, "not yet seen by the queue controller"));
  free(text);
  Stoker__V1__QueueStatus q = STOKER__V1__QUEUE_STATUS__INIT;
  q.state = STOKER__V1__QUEUE_STATE__QUEUE_STATE_QUEUED;
  q.position = 2;
  q.workload = "job-llm-1";
  q.cluster_queue = "cq";
  q.message = "waiting for quota";
  q.updated_ms = 1700000001000;
  s.job.queue = &q;
  CAPTURE(text, fmt_job_show(&s.job, 1700000004000, out));
  assert_non_null(
      strstr(text, "QUEUED at position 2, cluster queue cq, workload job-llm-1 (3s ago)"));
  assert_non_null(strstr(text, "waiting for quota"));
  free(text);
  q.state = STOKER__V1__QUEUE_STATE__QUEUE_STATE_ADMITTED;
  q.admitted_ranks = 4;
  CAPTURE(text, fmt_job_show(&s.job, 1700000004000, out));
  assert_non_null(strstr(text, "ADMITTED, 4 ranks admitted, cluster queue cq"));
  free(text);
  cJSON *o = fmt_job_json(&s.job);
  cJSON *jq = cJSON_GetObjectItem(o, "queue");
  assert_string_equal(cJSON_GetObjectItem(jq, "state")->valuestring, "ADMITTED");
  assert_int_equal(cJSON_GetObjectItem(jq, "admitted_ranks")->valuedouble, 4);
  assert_string_equal(cJSON_GetObjectItem(jq, "workload")->valuestring, "job-llm-1");
  cJSON *js = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "spec"), "submission");
  assert_string_equal(cJSON_GetObjectItem(js, "template")->valuestring, "llm");
  assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(js, "args"), 1)->valuestring, "3e-4");
  cJSON_Delete(o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_aligns),
      cmocka_unit_test(test_table_grows),
      cmocka_unit_test(test_enum_names),
      cmocka_unit_test(test_times),
      cmocka_unit_test(test_job_json),
      cmocka_unit_test(test_job_json_minimal),
      cmocka_unit_test(test_job_show),
      cmocka_unit_test(test_jobs_table),
      cmocka_unit_test(test_event),
      cmocka_unit_test(test_queue_events),
      cmocka_unit_test(test_job_queue),
      cmocka_unit_test(test_json_has_every_field_of_the_descriptors),
      cmocka_unit_test(test_enum_prefixes_come_from_the_descriptor),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
