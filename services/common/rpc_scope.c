/*
 * rpc_scope: what a scoped token may touch. An operator's token covers
 * every job; a team's covers the jobs whose names start with its prefix
 * (the server's token file, rpc.h). The rule is checked once, here, for
 * every method whose request names its job: the field `job`, or the `job`
 * or `name` of a `spec` (CreateLoader, CreateJob), read through the
 * request's protobuf-c descriptor, so a new RPC is covered without a line
 * of its own. A method whose request names no job (a listing, a client
 * stream, a call naming an attempt) is refused to a scoped token unless
 * its row says its handler checks (RPC_*_SCOPED_ROW); nothing is open by
 * default. A listing answers a view of its response holding only the
 * entries the scope covers (rpc_reply_listing). A leaf: calls only
 * protobuf-c.
 */
#include "rpc_internal.h"

#include <stdlib.h>
#include <string.h>

/* The string field name of msg; NULL when it has none. */
static const char *string_field(const ProtobufCMessage *msg, const char *name) {
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field_by_name(msg->descriptor, name);
  if (!f || f->type != PROTOBUF_C_TYPE_STRING || f->label == PROTOBUF_C_LABEL_REPEATED) return NULL;
  const char *v = *(char *const *)((const char *)msg + f->offset);
  return v ? v : "";
}

const char *rpc_scope_request_job(const ProtobufCMessage *req) {
  if (!req) return NULL;
  const char *job = string_field(req, "job");
  if (job) return job;
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field_by_name(req->descriptor, "spec");
  if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE || f->label == PROTOBUF_C_LABEL_REPEATED)
    return NULL;
  const ProtobufCMessage *spec = *(ProtobufCMessage *const *)((const char *)req + f->offset);
  if (!spec) return "";
  job = string_field(spec, "job");
  return job ? job : string_field(spec, "name");
}

bool rpc_scope_covers(const char *scope, const char *job) {
  return !scope || (job && strncmp(job, scope, strlen(scope)) == 0);
}

/* Repeated message fields of a view (rpc_scope_view): each replaced by a
 * malloc'd array of the covered entries. */
static bool repeated_messages(const ProtobufCFieldDescriptor *f) {
  return f->label == PROTOBUF_C_LABEL_REPEATED && f->type == PROTOBUF_C_TYPE_MESSAGE;
}

ProtobufCMessage *rpc_scope_view(const char *scope, const ProtobufCMessage *resp) {
  const ProtobufCMessageDescriptor *d = resp->descriptor;
  ProtobufCMessage *view = malloc(d->sizeof_message);
  if (!view) return NULL;
  memcpy(view, resp, d->sizeof_message);
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (!repeated_messages(f)) continue;
    size_t *n = (size_t *)((char *)view + f->quantifier_offset);
    ProtobufCMessage **all = *(ProtobufCMessage ***)((char *)view + f->offset);
    ProtobufCMessage **kept = malloc((*n ? *n : 1) * sizeof(*kept));
    size_t k = 0;
    for (size_t j = 0; kept && j < *n; j++)
      if (rpc_scope_covers(scope, rpc_scope_request_job(all[j]))) kept[k++] = all[j];
    *(ProtobufCMessage ***)((char *)view + f->offset) = kept;
    *n = k;
    if (!kept) {
      rpc_scope_view_free(view);
      return NULL;
    }
  }
  return view;
}

void rpc_scope_view_free(ProtobufCMessage *view) {
  if (!view) return;
  const ProtobufCMessageDescriptor *d = view->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++)
    if (repeated_messages(&d->fields[i])) free(*(void **)((char *)view + d->fields[i].offset));
  free(view);
}
