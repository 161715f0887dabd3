/*
 * dl_scan: finding a token id (the end-of-text delimiter) in a run of
 * tokens, the hot loop of reading llm.c files: units are random blocks of
 * a large map, every token of a block is scanned once to find document
 * boundaries, and the scan runs at memory speed or close to it.
 */
#ifndef STK_DL_SCAN_H
#define STK_DL_SCAN_H

#include <stdint.h>

/* First index in [i, end) where t holds id, or end. */
uint64_t dl_scan_u32(const uint32_t *t, uint64_t i, uint64_t end, uint32_t id);
uint64_t dl_scan_u16(const uint16_t *t, uint64_t i, uint64_t end, uint16_t id);

/* The portable uint32 scan, whatever the CPU (tests compare the two). */
uint64_t dl_scan_u32_portable(const uint32_t *t, uint64_t i, uint64_t end, uint32_t id);

#endif
