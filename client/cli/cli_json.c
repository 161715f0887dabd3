/*
 * stokerctl --json: messages as JSON objects for tooling, one per line,
 * derived from the protobuf-c descriptors rather than copied field by field,
 * so a field added to a proto shows up here (and equals stoker.jobs'
 * as_dict(), which derives it from the same descriptors) without a line of
 * C. Field names and order are the proto's; enums are their short names
 * ("RUNNING", the prefix every value of the enum shares cut off;
 * "UNKNOWN(7)" outside it); 64-bit integers are numbers; times stay Unix
 * milliseconds; a repeated field is an array, a map an object, an absent
 * sub-message null, and a StorageRef its URI ("" when absent). The few
 * objects that are not one message (a job's name on top, a verify report's
 * job, step and ok) add their keys around fmt_add_fields_json.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli_format.h"

cJSON *fmt_job_json(const Stoker__V1__Job *j) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddStringToObject(o, "name", j->spec && j->spec->name ? j->spec->name : "");
  fmt_add_fields_json(o, &j->base);
  return o;
}

cJSON *fmt_event_json(const Stoker__V1__JobEvent *ev) {
  return fmt_message_json(&ev->base);
}

void fmt_print_json(const cJSON *obj, FILE *out) {
  char *s = cJSON_PrintUnformatted(obj);
  if (!s) return;
  fprintf(out, "%s\n", s);
  cJSON_free(s);
}

cJSON *fmt_message_json(const ProtobufCMessage *m) {
  if (!m) return cJSON_CreateNull();
  cJSON *o = cJSON_CreateObject();
  if (o) fmt_add_fields_json(o, m);
  return o;
}

static cJSON *field_json(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f);

void fmt_add_fields_json(cJSON *o, const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      uint32_t set = *(const uint32_t *)(const void *)((const char *)m + f->quantifier_offset);
      if (set != f->id) continue; /* Another member of the oneof is set. */
    }
    cJSON_AddItemToObject(o, f->name, field_json(m, f));
  }
}

/* ---- one field ---- */

static bool is_map_entry(const ProtobufCMessageDescriptor *d) {
  size_t n = strlen(d->name);
  return d->n_fields == 2 && n > 5 && strcmp(d->name + n - 5, "Entry") == 0 &&
         strcmp(d->fields[0].name, "key") == 0 && strcmp(d->fields[1].name, "value") == 0;
}

static size_t element_bytes(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
    return 8;
  case PROTOBUF_C_TYPE_DOUBLE:
    return sizeof(double);
  case PROTOBUF_C_TYPE_STRING:
  case PROTOBUF_C_TYPE_MESSAGE:
    return sizeof(void *);
  case PROTOBUF_C_TYPE_BYTES:
    return sizeof(ProtobufCBinaryData);
  case PROTOBUF_C_TYPE_BOOL:
    return sizeof(protobuf_c_boolean);
  default:
    return 4; /* 32-bit integers, float, enum. */
  }
}

static cJSON *value_json(const ProtobufCFieldDescriptor *f, const void *p);

static cJSON *field_json(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  const void *p = (const char *)m + f->offset;
  if (f->label != PROTOBUF_C_LABEL_REPEATED) return value_json(f, p);
  size_t n = *(const size_t *)(const void *)((const char *)m + f->quantifier_offset);
  const char *arr = *(const char *const *)p;
  if (f->type == PROTOBUF_C_TYPE_MESSAGE && is_map_entry(f->descriptor)) {
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; i < n; i++) {
      const ProtobufCMessage *e = ((const ProtobufCMessage *const *)(const void *)arr)[i];
      const ProtobufCMessageDescriptor *ed = e->descriptor;
      cJSON *k = value_json(&ed->fields[0], (const char *)e + ed->fields[0].offset);
      char num[32];
      const char *key = cJSON_IsString(k) ? k->valuestring : num;
      if (!cJSON_IsString(k)) snprintf(num, sizeof(num), "%.17g", cJSON_GetNumberValue(k));
      cJSON_AddItemToObject(o, key,
                            value_json(&ed->fields[1], (const char *)e + ed->fields[1].offset));
      cJSON_Delete(k);
    }
    return o;
  }
  cJSON *a = cJSON_CreateArray();
  size_t size = element_bytes(f->type);
  for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, value_json(f, arr + i * size));
  return a;
}

static cJSON *value_json(const ProtobufCFieldDescriptor *f, const void *p) {
  char buf[64];
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32:
    return cJSON_CreateNumber(*(const int32_t *)p);
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32:
    return cJSON_CreateNumber(*(const uint32_t *)p);
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
    return cJSON_CreateNumber((double)*(const int64_t *)p);
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
    return cJSON_CreateNumber((double)*(const uint64_t *)p);
  case PROTOBUF_C_TYPE_FLOAT:
    return cJSON_CreateNumber(*(const float *)p);
  case PROTOBUF_C_TYPE_DOUBLE:
    return cJSON_CreateNumber(*(const double *)p);
  case PROTOBUF_C_TYPE_BOOL:
    return cJSON_CreateBool(*(const protobuf_c_boolean *)p);
  case PROTOBUF_C_TYPE_ENUM:
    return cJSON_CreateString(fmt_enum_name(f->descriptor, *(const int *)p, buf, sizeof(buf)));
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(const char *const *)p;
    return cJSON_CreateString(s ? s : "");
  }
  case PROTOBUF_C_TYPE_BYTES: /* No operator object holds bytes: their size. */
    return cJSON_CreateNumber((double)((const ProtobufCBinaryData *)p)->len);
  case PROTOBUF_C_TYPE_MESSAGE: {
    const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)p;
    if (f->descriptor == &stoker__v1__storage_ref__descriptor) {
      const Stoker__V1__StorageRef *ref = (const Stoker__V1__StorageRef *)sub;
      return cJSON_CreateString(ref && ref->uri ? ref->uri : "");
    }
    return fmt_message_json(sub);
  }
  }
  return cJSON_CreateNull();
}
