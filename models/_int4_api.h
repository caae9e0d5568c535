// What models._int4 lends other C extensions (its capsule `mm_api`): the checked int4 decode matmul, so that a
// caller running a whole decode step in C (core/decode/_layer_step.c) calls the same kernel without Python between.
#ifndef PONDER_INT4_API_H
#define PONDER_INT4_API_H
#include <stdint.h>

#define INT4_API_CAPSULE "models._int4.mm_api.v1"  // a new name whenever Int4Api changes

typedef struct {
    int max_rows;  // rows a call takes (MAX_ROWS)
    // NULL when a matmul of this shape runs on this CPU with instruction set `isa`, else why not
    const char* (*check)(long rows, long n, long k, long group, long isa);
    // y (rows, n) bf16 = x (rows, k) bf16 @ W.T; 0, or -1 when out of memory. Arguments passed `check` first.
    int (*mm)(const uint8_t* packed, const uint32_t* scales, const uint16_t* x, uint16_t* y, int rows, int n, int k,
              int group, int isa);
} Int4Api;
#endif
