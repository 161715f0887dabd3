/*
 * coll.c: the backend-independent part of the collective interface. Today
 * only the element sizes, which both backends and the FSDP layer need to turn
 * element counts into byte counts.
 */
#include "coll.h"

size_t coll_dtype_size(enum coll_dtype dt) {
  switch (dt) {
  case COLL_F32:
    return 4;
  case COLL_BF16:
    return 2;
  }
  return 0;
}
