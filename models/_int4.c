// Ponder's int4 matmul for decode rows (1..16 rows of bf16 activations), on torch's own packed int4 layout.
//
// y[m] = W x[m] with W in torch's `_convert_weight_to_int4pack_for_cpu` layout and tinygemm semantics
// (w = (q - 8) * scale + zero, one bf16 scale/zero pair per `group` inputs, `scales` shaped [K/group, N, 2]).
// The layout (probed, see tests/models/test_int4_kernel.py): for each block of 64 outputs, for each input k,
// 32 bytes; byte j holds output j's nibble low and output j + 32's nibble high. So one 64-byte line is two
// consecutive inputs of 64 outputs. One vpermt2b per 16 outputs turns nibble pairs into bf16 pairs
// (128 + q, the bf16 bit pattern 0x4300 | q), vdpbf16ps multiplies them with the input pair exactly and sums
// in fp32, and the 136 (128 + 8) offset comes out per group with the group's sum of x:
//   sum_k w_k x_k = sum_g [ s_g * sum_k (128 + q_k) x_k + (z_g - 136 s_g) * sum_k x_k ].
// Each row's arithmetic is the same whatever the number of rows, so batched and one-at-a-time decoding agree.
// Needs AVX512-BF16 and AVX512-VBMI; `supported()` says whether this CPU has them. Threads: OpenMP, which
// resolves to torch's own libgomp when torch is loaded first (same soname), so both share one pool.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROWS 16
#define PREFETCH 2048

#define KERNEL_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16,avx512vbmi")))

// Up to 4 rows per pass over a block: 4 rows x 4 output quarters accumulators.
KERNEL_TARGET static inline __attribute__((always_inline)) void block_rows(const uint8_t* blk, const uint32_t* scales32,
                                            const uint16_t* x, const float* xsum, uint16_t* y, const int rows,
                                            int n0, int N, int K, int group) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i magic = _mm512_set1_epi8(0x43);
    const __m512i idx0 = _mm512_set_epi32(
        0x402F400F, 0x402E400E, 0x402D400D, 0x402C400C, 0x402B400B, 0x402A400A, 0x40294009, 0x40284008,
        0x40274007, 0x40264006, 0x40254005, 0x40244004, 0x40234003, 0x40224002, 0x40214001, 0x40204000);
    const __m512i idx1 = _mm512_add_epi8(idx0, _mm512_set1_epi32(0x00100010));
    const int groups = K / group;
    const int pairs = group / 2;
    __m512 out[4][4];
    for (int r = 0; r < rows; r++)
        for (int q = 0; q < 4; q++) out[r][q] = _mm512_setzero_ps();
    const uint8_t* line = blk;
    for (int g = 0; g < groups; g++) {
        __m512 acc[4][4];
        for (int r = 0; r < rows; r++)
            for (int q = 0; q < 4; q++) acc[r][q] = _mm512_setzero_ps();
        for (int p = g * pairs; p < (g + 1) * pairs; p++, line += 64) {
            _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);
            const __m512i v = _mm512_loadu_si512((const void*)line);
            const __m512i lo = _mm512_and_si512(v, nib);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            const __m512i w[4] = {_mm512_permutex2var_epi8(lo, idx0, magic), _mm512_permutex2var_epi8(lo, idx1, magic),
                                  _mm512_permutex2var_epi8(hi, idx0, magic), _mm512_permutex2var_epi8(hi, idx1, magic)};
            for (int r = 0; r < rows; r++) {
                const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)((const uint32_t*)(x + (size_t)r * K))[p]);
                for (int q = 0; q < 4; q++) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], (__m512bh)w[q], xb);
            }
        }
        const uint32_t* sz = scales32 + (size_t)g * N + n0;
        for (int q = 0; q < 4; q++) {
            const __m512i packed = _mm512_loadu_si512((const void*)(sz + 16 * q));
            const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(packed, 16));
            const __m512 z = _mm512_castsi512_ps(_mm512_and_si512(packed, _mm512_set1_epi32((int)0xFFFF0000u)));
            const __m512 offset = _mm512_fnmadd_ps(s, _mm512_set1_ps(136.0f), z);
            for (int r = 0; r < rows; r++) {
                out[r][q] = _mm512_fmadd_ps(s, acc[r][q], out[r][q]);
                out[r][q] = _mm512_fmadd_ps(offset, _mm512_set1_ps(xsum[r * groups + g]), out[r][q]);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int q = 0; q < 4; q++)
            _mm256_storeu_si256((__m256i*)(y + (size_t)r * N + n0 + 16 * q), (__m256i)_mm512_cvtneps_pbh(out[r][q]));
}

KERNEL_TARGET static void int4_mm(const uint8_t* packed, const uint32_t* scales32, const uint16_t* x, uint16_t* y,
                                  int M, int N, int K, int group) {
    const int groups = K / group;
    float* xsum = (float*)malloc(sizeof(float) * (size_t)M * groups);
    for (int m = 0; m < M; m++)  // each group's sum of x, in fp32, in input order
        for (int g = 0; g < groups; g++) {
            float s = 0.0f;
            for (int k = g * group; k < (g + 1) * group; k++) {
                uint32_t bits = (uint32_t)x[(size_t)m * K + k] << 16;
                float f;
                memcpy(&f, &bits, 4);
                s += f;
            }
            xsum[m * groups + g] = s;
        }
    const int blocks = N / 64;
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < blocks; b++) {
        const uint8_t* blk = packed + (size_t)b * K * 32;
        for (int m = 0; m < M; m += 4) {
            const int rows = M - m;
            const uint16_t* xm = x + (size_t)m * K;
            const float* sm = xsum + m * groups;
            uint16_t* ym = y + (size_t)m * N;
            if (rows >= 4) block_rows(blk, scales32, xm, sm, ym, 4, b * 64, N, K, group);
            else if (rows == 3) block_rows(blk, scales32, xm, sm, ym, 3, b * 64, N, K, group);
            else if (rows == 2) block_rows(blk, scales32, xm, sm, ym, 2, b * 64, N, K, group);
            else block_rows(blk, scales32, xm, sm, ym, 1, b * 64, N, K, group);
        }
    }
    free(xsum);
}

// Reads nptr addresses, then ndims integers, from a fastcall argument vector of exactly `want` arguments.
static int read_args(PyObject* const* args, Py_ssize_t nargs, Py_ssize_t want, void** ptr, int nptr, long* dims,
                     int ndims, const char* usage) {
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    for (int i = 0; i < nptr; i++) {
        ptr[i] = PyLong_AsVoidPtr(args[i]);
        if (ptr[i] == NULL && PyErr_Occurred()) return -1;
    }
    for (int i = 0; i < ndims; i++) {
        dims[i] = PyLong_AsLong(args[nptr + i]);
        if (dims[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

// mm(packed, scales, x, y, M, N, K, group): addresses as ints, arrays contiguous; y bf16 [M, N] is written.
static PyObject* py_mm(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    void* ptr[4];
    long dims[4];
    if (read_args(args, nargs, 8, ptr, 4, dims, 4, "mm takes packed, scales, x, y, M, N, K, group") < 0) return NULL;
    const long M = dims[0], N = dims[1], K = dims[2], group = dims[3];
    if (M < 1 || M > MAX_ROWS || N < 64 || N % 64 || group < 4 || group % 4 || K < group || K % group) {
        PyErr_SetString(PyExc_ValueError, "int4 mm: shape outside the kernel's range");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    int4_mm((const uint8_t*)ptr[0], (const uint32_t*)ptr[1], (const uint16_t*)ptr[2], (uint16_t*)ptr[3], (int)M,
            (int)N, (int)K, (int)group);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

// unpack: the bf16 weight, transposed (K rows of N), as models.quantization.unpack_int4 computes it:
// w = ((q - 8) * scale) + zero in fp32 (two roundings, no fused multiply-add), rounded to bf16.
KERNEL_TARGET __attribute__((optimize("fp-contract=off"))) static void unpack(const uint8_t* packed,
                                                                              const uint32_t* scales32, uint16_t* out,
                                                                              int N, int K, int group) {
    const int blocks = N / 64;
    #pragma omp parallel for schedule(static)
    for (int k = 0; k < K; k++) {
        const uint32_t* sz = scales32 + (size_t)(k / group) * N;
        uint16_t* row = out + (size_t)k * N;
        for (int b = 0; b < blocks; b++) {
            const __m256i v = _mm256_loadu_si256((const __m256i*)(packed + ((size_t)b * K + k) * 32));
            const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
            const __m128i parts[4] = {_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1),
                                      _mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)};
            for (int q = 0; q < 4; q++) {
                const int n = b * 64 + 16 * q;
                const __m512i packed_sz = _mm512_loadu_si512((const void*)(sz + n));
                const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(packed_sz, 16));
                const __m512 z = _mm512_castsi512_ps(_mm512_and_si512(packed_sz, _mm512_set1_epi32((int)0xFFFF0000u)));
                const __m512 w = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(parts[q])), _mm512_set1_ps(8.0f));
                const __m512 r = _mm512_add_ps(_mm512_mul_ps(w, s), z);
                _mm256_storeu_si256((__m256i*)(row + n), (__m256i)_mm512_cvtneps_pbh(r));
            }
        }
    }
}

// unpack(packed, scales, out, N, K, group): out bf16 [K, N] is written.
static PyObject* py_unpack(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    void* ptr[3];
    long dims[3];
    if (read_args(args, nargs, 6, ptr, 3, dims, 3, "unpack takes packed, scales, out, N, K, group") < 0) return NULL;
    const long N = dims[0], K = dims[1], group = dims[2];
    if (N < 64 || N % 64 || group < 1 || K < group || K % group) {
        PyErr_SetString(PyExc_ValueError, "int4 unpack: shape outside the kernel's range");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    unpack((const uint8_t*)ptr[0], (const uint32_t*)ptr[1], (uint16_t*)ptr[2], (int)N, (int)K, (int)group);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject* py_supported(PyObject* self, PyObject* unused) {
    (void)self; (void)unused;
    __builtin_cpu_init();
    int ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi");
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"mm", (PyCFunction)(void (*)(void))py_mm, METH_FASTCALL, "y = x @ W.T for int4 W in torch's packed layout"},
    {"unpack", (PyCFunction)(void (*)(void))py_unpack, METH_FASTCALL, "the bf16 weight (K, N) of a packed int4 matrix"},
    {"supported", py_supported, METH_NOARGS, "whether this CPU has AVX512-BF16 and AVX512-VBMI"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_int4", "Ponder's int4 decode matmul", -1, methods};

PyMODINIT_FUNC PyInit__int4(void) {
    PyObject* m = PyModule_Create(&module);
    if (m != NULL) PyModule_AddIntConstant(m, "MAX_ROWS", MAX_ROWS);
    return m;
}
