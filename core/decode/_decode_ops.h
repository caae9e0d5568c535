// Shared by the decode-step C sources (core/decode/_decode_ops.c: attention over the int8 cache, RMSNorm, SwiGLU;
// core/decode/_layer_step.c: every decoder layer of a step in one call; core/decode/_sampling.c: the sampler's
// shortlist): the attention step's arguments, the kernels one source lends the other, and bf16 helpers.
#ifndef PONDER_DECODE_OPS_H
#define PONDER_DECODE_OPS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DIM 256
#define MAX_GROUP 16

static inline float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f2bf(float f) {  // round to nearest even, as c10::BFloat16 (branch-free: loops vectorize)
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t rounded_bits = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet_nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded_bits);
}

// One attention step (_decode_ops.c, `attend`): rows' q / k / v before rotary, the cache layer, the output.
typedef struct {
    const uint16_t *q, *k, *v, *cos, *sin;
    long q_stride, k_stride, v_stride, cs_stride;
    int8_t* cache_q;
    uint16_t* cache_s;
    uint16_t* out;
    int rows, heads, kv_heads, dim, cap, pos;
    float scaling;
} Step;

// Shared between this extension's sources only: hidden, so that no other library's symbols of these names can bind.
#pragma GCC visibility push(hidden)
void detect_avx512(void);
int run_step(const Step* st);  // nonzero when out of memory
void rms_rows(const uint16_t* x, long x_stride, const uint16_t* w, uint16_t* y, int rows, int n, float eps);
void silu_mul_rows(const uint16_t* g, long g_stride, const uint16_t* u, long u_stride, uint16_t* y, int rows, int n);

PyObject* py_layers_plan(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* py_layers_step(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* py_top_candidates(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
#pragma GCC visibility pop
#endif
