/*
 * How stokerctl shows things: aligned text tables for people, one JSON
 * object per line (cJSON) for tooling, and the small renderings both use
 * (durations, ages, enum names). Pure: no network, output to a FILE.
 */
#ifndef STK_CLI_FORMAT_H
#define STK_CLI_FORMAT_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>

#include "stoker/v1/coordinator.pb-c.h"

/* A table of text cells printed with each column padded to its widest
 * cell, two spaces apart. */
struct table;

/* headers may be NULL (no header row). */
struct table *table_new(int n_cols, const char *const *headers);
/* Copies n_cols cells (NULL prints as "-"). Returns 0 or STK_ENOMEM. */
int table_add(struct table *t, const char *const *cells);
void table_print(const struct table *t, FILE *out);
void table_free(struct table *t);

/* "250ms", "5s", "1m30s", "10m", "2h" (the form flag_parse_duration_ms
 * reads); "0s" for 0. */
void fmt_duration_ms(int64_t ms, char *buf, size_t len);
/* How long ago then_ms was at now_ms (Unix ms): "3s", "2m5s"; "-" when
 * then_ms is 0. */
void fmt_age(int64_t now_ms, int64_t then_ms, char *buf, size_t len);
/* Unix ms as "2026-11-21T08:33:29.123Z"; "-" for 0. */
void fmt_time_ms(int64_t ms, char *buf, size_t len);

/* "RUNNING", "MEMBER_JOINED", "OK", "RESTART": the proto names without
 * their prefix; "UNKNOWN(7)" outside the enum. */
const char *fmt_job_state(int state, char *buf, size_t len);
const char *fmt_event_type(int type, char *buf, size_t len);
const char *fmt_health(int health, char *buf, size_t len);
const char *fmt_queue_state(int state, char *buf, size_t len);

/* The value's proto name without the prefix every value of the enum
 * shares ("JOB_STATE_RUNNING" -> "RUNNING": the zero value's name up to
 * "UNSPECIFIED", else the longest common prefix up to an underscore);
 * "UNKNOWN(7)" outside the enum. */
const char *fmt_enum_name(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t len);
size_t fmt_enum_prefix_len(const ProtobufCEnumDescriptor *d);

/* JSON renderings (caller frees with cJSON_Delete), derived from the
 * descriptors (cli_json.c): every field of m in proto order under its proto
 * name; enums by short name, 64-bit integers as numbers, times in Unix ms,
 * repeated fields as arrays, maps as objects, an absent sub-message null,
 * a StorageRef its URI. fmt_message_json(NULL) is null. */
cJSON *fmt_message_json(const ProtobufCMessage *m);
/* The same fields added to an object the caller started. */
void fmt_add_fields_json(cJSON *o, const ProtobufCMessage *m);
/* A job: its name (the spec's) first, then the message. */
cJSON *fmt_job_json(const Stoker__V1__Job *job);
cJSON *fmt_event_json(const Stoker__V1__JobEvent *ev);
/* Prints obj unformatted on one line. */
void fmt_print_json(const cJSON *obj, FILE *out);

/* Human renderings. now_ms is the current Unix time (for ages). */
void fmt_job_show(const Stoker__V1__Job *job, int64_t now_ms, FILE *out);
void fmt_jobs_table(Stoker__V1__Job *const *jobs, size_t n_jobs, int64_t now_ms, FILE *out);
/* One line per event: "SEQ TIME TYPE gen=G" then what happened; the queue
 * and resize events (QUEUED, ADMITTED, PREEMPTED, SHRUNK, GROWN, RESUMED,
 * REJECTED) as a sentence ("admitted 4 ranks", "shrunk to 2 ranks at step 300"),
 * the others as their fields and message. */
void fmt_event_line(const Stoker__V1__JobEvent *ev, FILE *out);

#endif
