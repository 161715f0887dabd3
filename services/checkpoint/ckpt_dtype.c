/* ckpt_dtype: one table of the checkpoint element types. */
#include "ckpt_dtype.h"

#include "stoker/v1/checkpoint.pb-c.h"

static const struct {
  int dtype;
  uint32_t bytes;
  const char *name;
} types[] = {
    {STOKER__V1__DTYPE__DTYPE_F32, 4, "f32"},   {STOKER__V1__DTYPE__DTYPE_BF16, 2, "bf16"},
    {STOKER__V1__DTYPE__DTYPE_F16, 2, "f16"},   {STOKER__V1__DTYPE__DTYPE_I64, 8, "i64"},
    {STOKER__V1__DTYPE__DTYPE_U8, 1, "u8"},     {STOKER__V1__DTYPE__DTYPE_BYTES, 1, "bytes"},
    {STOKER__V1__DTYPE__DTYPE_F64, 8, "f64"},   {STOKER__V1__DTYPE__DTYPE_I32, 4, "i32"},
    {STOKER__V1__DTYPE__DTYPE_I16, 2, "i16"},   {STOKER__V1__DTYPE__DTYPE_I8, 1, "i8"},
    {STOKER__V1__DTYPE__DTYPE_BOOL, 1, "bool"}, {STOKER__V1__DTYPE__DTYPE_U16, 2, "u16"},
    {STOKER__V1__DTYPE__DTYPE_U32, 4, "u32"},   {STOKER__V1__DTYPE__DTYPE_U64, 8, "u64"},
};

uint32_t ckpt_dtype_bytes(int dtype) {
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
    if (types[i].dtype == dtype) return types[i].bytes;
  return 0;
}

const char *ckpt_dtype_name(int dtype) {
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
    if (types[i].dtype == dtype) return types[i].name;
  return "unknown";
}
