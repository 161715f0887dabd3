/*
 * What the checkpoint parts of libstoker-client share: the method names and
 * the conversion of a caller's box into a Box message.
 */
#ifndef STK_CKPT_INTERNAL_H
#define STK_CKPT_INTERNAL_H

#include "stoker_ckpt.h"

#define CKPT_METHOD(name) "/stoker.v1.Checkpoint/" name

/* True when box has 1..STK_CKPT_MAX_DIMS dims, each size > 0, and (when
 * shape is not NULL) lies inside shape. */
bool ckpt_box_valid(const struct stk_ckpt_box *box, const uint64_t *shape);

/* Points msg at box's arrays (no copy; msg lives no longer than box). */
void ckpt_box_msg(const struct stk_ckpt_box *box, Stoker__V1__Box *msg);

#endif
