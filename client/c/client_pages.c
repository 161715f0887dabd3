/*
 * client_pages: a listing followed through all its pages. The daemons
 * answer every listing in pages (services/common/page.h: page_token in,
 * next_page_token out); the admin calls give their callers one response
 * holding every entry, as before paging existed, by asking for page after
 * page and moving each page's entries into the first. The entry field and
 * the token are found from the response's descriptor (its one repeated
 * message field and next_page_token), so one function serves every
 * listing.
 */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

/* Bound on the pages one listing follows (10^6 pages of at least one entry
 * each): a server answering tokens forever cannot hold the caller. */
#define MAX_PAGES 1000000u

static const ProtobufCFieldDescriptor *entries_field(const ProtobufCMessageDescriptor *d) {
  for (unsigned i = 0; i < d->n_fields; i++)
    if (d->fields[i].label == PROTOBUF_C_LABEL_REPEATED &&
        d->fields[i].type == PROTOBUF_C_TYPE_MESSAGE)
      return &d->fields[i];
  return NULL;
}

/* Moves page's entries to the end of all's. */
static int append_entries(const ProtobufCFieldDescriptor *f, ProtobufCMessage *all,
                          ProtobufCMessage *page) {
  size_t *n_all = (size_t *)((char *)all + f->quantifier_offset);
  size_t *n_page = (size_t *)((char *)page + f->quantifier_offset);
  void ***v_all = (void ***)((char *)all + f->offset);
  void ***v_page = (void ***)((char *)page + f->offset);
  if (*n_page == 0) return 0;
  void **v = realloc(*v_all, (*n_all + *n_page) * sizeof(*v));
  if (!v) return STK_ENOMEM;
  memcpy(v + *n_all, *v_page, *n_page * sizeof(*v));
  *v_all = v;
  *n_all += *n_page;
  *n_page = 0; /* the entries belong to all now */
  return 0;
}

static char **token_of(const ProtobufCFieldDescriptor *tf, ProtobufCMessage *m) {
  return (char **)((char *)m + tf->offset);
}

int client_list_all(struct stk_client *c, const char *method, ProtobufCMessage *req,
                    char **req_token, const ProtobufCMessageDescriptor *resp_desc,
                    int64_t timeout_ms, ProtobufCMessage **ret_resp) {
  const ProtobufCFieldDescriptor *f = entries_field(resp_desc);
  const ProtobufCFieldDescriptor *tf =
      protobuf_c_message_descriptor_get_field_by_name(resp_desc, "next_page_token");
  if (!f || !tf || tf->type != PROTOBUF_C_TYPE_STRING)
    return client_fail(STK_EINVAL, "not a paged listing");
  char *first_token = *req_token;
  ProtobufCMessage *all = NULL, *page = NULL;
  int err = client_call(c, method, req, resp_desc, timeout_ms, &all);
  for (unsigned pages = 1; err == 0 && **token_of(tf, all); pages++) {
    if (pages >= MAX_PAGES) {
      err = client_fail(STK_EIO, "listing did not end after a million pages");
      break;
    }
    *req_token = *token_of(tf, all);
    err = client_call(c, method, req, resp_desc, timeout_ms, &page);
    if (err) break;
    if ((err = append_entries(f, all, page)) != 0) {
      err = client_fail(err, "list");
    } else { /* the page's token moves to all: the next request sends it */
      char **t = token_of(tf, all);
      if (*t != tf->default_value) free(*t);
      *t = *token_of(tf, page);
      *token_of(tf, page) = (char *)tf->default_value;
    }
    protobuf_c_message_free_unpacked(page, NULL);
    page = NULL;
  }
  *req_token = first_token;
  if (err) {
    if (all) protobuf_c_message_free_unpacked(all, NULL);
    return err;
  }
  *ret_resp = all;
  return 0;
}
