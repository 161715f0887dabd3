/*
 * ckpt_dtype: element sizes and names of the checkpoint DType enum
 * (proto/stoker/v1/checkpoint.proto). Boxes count elements; storage counts
 * bytes; this is the one place that converts.
 */
#ifndef STK_CKPT_DTYPE_H
#define STK_CKPT_DTYPE_H

#include <stdint.h>

/* Bytes per element of a DType value; 0 for DTYPE_UNSPECIFIED or unknown. */
uint32_t ckpt_dtype_bytes(int dtype);

/* "f32", "bf16", ...; "unknown" outside the enum. */
const char *ckpt_dtype_name(int dtype);

#endif
