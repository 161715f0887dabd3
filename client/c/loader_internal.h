/*
 * What the dataloader parts of libstoker-client share: the method names
 * and the Batch reply to struct stk_batch conversion.
 */
#ifndef STK_LOADER_INTERNAL_H
#define STK_LOADER_INTERNAL_H

#include "stoker_loader.h"

#define DL_METHOD(name) "/stoker.v1.Dataloader/" name

/* Takes msg (a Stoker__V1__Batch) in every case: on success it belongs to
 * *ret_batch; on failure (STK_ECORRUPT: sizes disagree; STK_ENOMEM) it is
 * freed and this thread's last error set. */
int loader_batch_from_msg(ProtobufCMessage *msg, struct stk_batch *ret_batch);

#endif
