/*
 * rpc_methods: a service's method table checked against its protobuf-c
 * descriptor. Rows name methods by their field in the generated service
 * struct (rpc.h, RPC_*_ROW), so the compiler refuses a method the .proto
 * lacks; this file finds each row's method in the descriptor and refuses a
 * table that leaves a method out, names one twice, or names one the
 * descriptor lacks (a table built by hand), so a daemon whose table and
 * protos disagree fails at start with the method named, instead of
 * answering UNIMPLEMENTED at run time. Also the paths clients call,
 * "/pkg.Svc/Method", from the same names (RPC_METHOD_PATH, once per call
 * site).
 */
#include "rpc_internal.h"

#include "stk_error.h"

#include <ctype.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* Whether field is protobuf-c's field name for the method name: each upper
 * case letter lowered, with '_' before it except at the start
 * ("KvCompareSet" -> "kv_compare_set"). */
static bool field_matches(const char *method, const char *field) {
  for (size_t i = 0; method[i]; i++) {
    unsigned char ch = (unsigned char)method[i];
    if (isupper(ch)) {
      if (i > 0 && *field++ != '_') return false;
      ch = (unsigned char)tolower(ch);
    }
    if (*field++ != (char)ch) return false;
  }
  return *field == '\0';
}

const ProtobufCMethodDescriptor *rpc_method_by_field(const ProtobufCServiceDescriptor *desc,
                                                     const char *field) {
  for (unsigned i = 0; field && i < desc->n_methods; i++)
    if (field_matches(desc->methods[i].name, field)) return &desc->methods[i];
  return NULL;
}

const ProtobufCMessageDescriptor *rpc_method_output(const ProtobufCServiceDescriptor *desc,
                                                    const char *field) {
  const ProtobufCMethodDescriptor *md = rpc_method_by_field(desc, field);
  return md ? md->output : NULL;
}

int rpc_method_path(const ProtobufCServiceDescriptor *desc, const char *field, char *buf,
                    size_t len) {
  const ProtobufCMethodDescriptor *md = rpc_method_by_field(desc, field);
  if (!md) {
    stk_set_detail("rpc: %s has no method %s", desc->name, field ? field : "(null)");
    return STK_EINVAL;
  }
  int n = snprintf(buf, len, "/%s/%s", desc->name, md->name);
  return n < 0 || (size_t)n >= len ? STK_ERANGE : 0;
}

const char *rpc_method_path_cached(struct rpc_method_path_cache *cache,
                                   const ProtobufCServiceDescriptor *desc, const char *field) {
  if (atomic_load_explicit(&cache->state, memory_order_acquire) == 2) return cache->path;
  int unwritten = 0;
  if (atomic_compare_exchange_strong(&cache->state, &unwritten, 1)) {
    if (rpc_method_path(desc, field, cache->path, sizeof(cache->path)) != 0)
      snprintf(cache->path, sizeof(cache->path), "/%s/%s", desc->name, field);
    atomic_store_explicit(&cache->state, 2, memory_order_release);
    return cache->path;
  }
  /* Another thread is writing it: a snprintf away. */
  while (atomic_load_explicit(&cache->state, memory_order_acquire) != 2) sched_yield();
  return cache->path;
}

int rpc_methods_check(const ProtobufCServiceDescriptor *desc, const struct rpc_method_def *defs,
                      size_t n_defs, const struct rpc_method_def **ret_rows) {
  for (unsigned i = 0; i < desc->n_methods; i++) ret_rows[i] = NULL;
  for (size_t r = 0; r < n_defs; r++) {
    const struct rpc_method_def *d = &defs[r];
    const ProtobufCMethodDescriptor *md = rpc_method_by_field(desc, d->name);
    if (!md) {
      stk_set_detail("rpc: %s has no method %s (the table and the .proto disagree)", desc->name,
                     d->name ? d->name : "(null)");
      return STK_EINVAL;
    }
    size_t i = (size_t)(md - desc->methods);
    if (ret_rows[i]) {
      stk_set_detail("rpc: %s/%s has two rows in the method table", desc->name, md->name);
      return STK_EINVAL;
    }
    if ((d->kind == RPC_UNSERVED) != !d->handler || (unsigned)d->kind > RPC_UNSERVED) {
      stk_set_detail("rpc: %s/%s: a served method needs a handler, an unserved one has none",
                     desc->name, md->name);
      return STK_EINVAL;
    }
    ret_rows[i] = d;
  }
  for (unsigned i = 0; i < desc->n_methods; i++) {
    if (ret_rows[i]) continue;
    stk_set_detail("rpc: %s/%s has no row in the method table (RPC_UNSERVED_ROW to leave it "
                   "unimplemented)",
                   desc->name, desc->methods[i].name);
    return STK_EINVAL;
  }
  return 0;
}
