// GPTQ's column loop inside one group, for models/gptq.py: the part that Python would run as ~13 tensor
// operations per input column (tens of thousands of columns per model).
//
// The block is W's columns i1..i2 transposed (group rows of `rows` floats, so a column of W is contiguous), h the
// group's diagonal block of the upper Cholesky factor of H^-1, scale and zero the group's grid per row of W.
// For each column i: q = clamp(round((w - zero) / scale + 8), 0, 15) (round half to even, as torch.round),
// err = (w - ((q - 8) * scale + zero)) / h[i][i], and every later column j of the group takes w -= h[i][j] * err.
// Rows of W are independent, so threads take blocks of rows and each block stays in cache for the whole group.
// Plain IEEE float arithmetic with fused multiply-add off: the same codes on every x86-64 CPU, whichever clone runs.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROWS_PER_TASK 256

__attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=off")))
static void group_columns(float* block, const float* h, const float* scale, const float* zero, int32_t* codes,
                          float* err, int rows, int group) {
    #pragma omp parallel for schedule(static)
    for (int r0 = 0; r0 < rows; r0 += ROWS_PER_TASK) {
        const int r1 = r0 + ROWS_PER_TASK < rows ? r0 + ROWS_PER_TASK : rows;
        for (int i = 0; i < group; i++) {
            const float pivot = h[(size_t)i * group + i];
            const float* col = block + (size_t)i * rows;
            float* e = err + (size_t)i * rows;
            int32_t* c = codes + (size_t)i * rows;
            for (int r = r0; r < r1; r++) {
                float q = nearbyintf((col[r] - zero[r]) / scale[r] + 8.0f);
                q = q < 0.0f ? 0.0f : (q > 15.0f ? 15.0f : q);
                c[r] = (int32_t)q;
                e[r] = (col[r] - ((q - 8.0f) * scale[r] + zero[r])) / pivot;
            }
            for (int j = i + 1; j < group; j++) {
                const float hij = h[(size_t)i * group + j];
                float* cj = block + (size_t)j * rows;
                for (int r = r0; r < r1; r++) cj[r] -= hij * e[r];
            }
        }
    }
}

// Reads `nptr` addresses (ints) and then rows and group; -1 with an exception set when they are not as expected.
static int read_args(PyObject* const* args, Py_ssize_t nargs, int nptr, void** ptr, long* rows, long* group,
                     const char* usage) {
    if (nargs != nptr + 2) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    for (int i = 0; i < nptr; i++) {
        ptr[i] = PyLong_AsVoidPtr(args[i]);
        if (ptr[i] == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "gptq: null address");
            return -1;
        }
    }
    *rows = PyLong_AsLong(args[nptr]);
    *group = PyLong_AsLong(args[nptr + 1]);
    if (PyErr_Occurred()) return -1;
    if (*rows < 1 || *group < 1 || *group > 4096) {
        PyErr_SetString(PyExc_ValueError, "gptq: shape outside its range");
        return -1;
    }
    return 0;
}

static inline float bf16_round(float x) {  // to the nearest bfloat16, ties to even (as torch's .to(bfloat16))
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    u &= 0xFFFF0000u;
    memcpy(&x, &u, sizeof u);
    return x;
}

static const float CLIP_RATIOS[] = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f};
#define N_RATIOS (int)(sizeof CLIP_RATIOS / sizeof CLIP_RATIOS[0])

// The group's grid per row (models.gptq._grid): min-max range clipped around its middle by each ratio, scale and
// zero rounded to bf16, and the ratio whose importance-weighted squared rounding error is least (first on ties).
__attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=off")))
static void group_grid(const float* block, const float* importance, float* scale_out, float* zero_out, int rows,
                       int group) {
    #pragma omp parallel for schedule(static)
    for (int r0 = 0; r0 < rows; r0 += ROWS_PER_TASK) {
        const int r1 = r0 + ROWS_PER_TASK < rows ? r0 + ROWS_PER_TASK : rows, n = r1 - r0;
        float lo[ROWS_PER_TASK], hi[ROWS_PER_TASK], mid[ROWS_PER_TASK], best[ROWS_PER_TASK], err[ROWS_PER_TASK];
        float scale[ROWS_PER_TASK], zero[ROWS_PER_TASK];
        for (int r = 0; r < n; r++) lo[r] = hi[r] = block[r0 + r];
        for (int i = 1; i < group; i++) {
            const float* row = block + (size_t)i * rows + r0;
            for (int r = 0; r < n; r++) {
                lo[r] = row[r] < lo[r] ? row[r] : lo[r];
                hi[r] = row[r] > hi[r] ? row[r] : hi[r];
            }
        }
        for (int r = 0; r < n; r++) mid[r] = (lo[r] + hi[r]) / 2.0f;
        for (int k = 0; k < N_RATIOS; k++) {
            const float ratio = CLIP_RATIOS[k];
            for (int r = 0; r < n; r++) {
                const float clo = mid[r] + (lo[r] - mid[r]) * ratio, chi = mid[r] + (hi[r] - mid[r]) * ratio;
                float s = (chi - clo) / 15.0f;
                s = bf16_round(s < 1e-8f ? 1e-8f : s);
                scale[r] = s;
                zero[r] = bf16_round(clo + 8.0f * s);
                err[r] = 0.0f;
            }
            for (int i = 0; i < group; i++) {
                const float* row = block + (size_t)i * rows + r0;
                const float imp = importance[i];
                for (int r = 0; r < n; r++) {
                    float q = nearbyintf((row[r] - zero[r]) / scale[r] + 8.0f);
                    q = q < 0.0f ? 0.0f : (q > 15.0f ? 15.0f : q);
                    const float d = (q - 8.0f) * scale[r] + zero[r] - row[r];
                    err[r] += d * d * imp;
                }
            }
            for (int r = 0; r < n; r++) {
                if (k == 0 || err[r] < best[r]) {
                    best[r] = err[r];
                    scale_out[r0 + r] = scale[r];
                    zero_out[r0 + r] = zero[r];
                }
            }
        }
    }
}

// group_grid(block, importance, scale, zero, rows, group): addresses as ints, float32 arrays, block [group, rows];
// scale and zero [rows] are written.
static PyObject* py_group_grid(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    void* ptr[4];
    long rows, group;
    if (read_args(args, nargs, 4, ptr, &rows, &group, "group_grid takes block, importance, scale, zero, rows, group") < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    group_grid((const float*)ptr[0], (const float*)ptr[1], (float*)ptr[2], (float*)ptr[3], (int)rows, (int)group);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

// group_columns(block, h, scale, zero, codes, err, rows, group): addresses as ints, arrays contiguous float32
// (codes int32); block is updated in place, codes and err [group, rows] are written.
static PyObject* py_group_columns(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    void* ptr[6];
    long rows, group;
    if (read_args(args, nargs, 6, ptr, &rows, &group,
                  "group_columns takes block, h, scale, zero, codes, err, rows, group") < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    group_columns((float*)ptr[0], (const float*)ptr[1], (const float*)ptr[2], (const float*)ptr[3], (int32_t*)ptr[4],
                  (float*)ptr[5], (int)rows, (int)group);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

// int8_digits(x, bf16, n, d, scale, q1, q2): x [n, d] (float32, or bf16 when bf16 != 0) written as two int8
// digits per value, x = scale[col] * (q1 + q2 / 254), scale = max |x| of the column / 127 (see models/gptq.py,
// add_gram). The operations and their order are those of the torch fallback (int8_digits there), so both give
// the same digits. Threads take blocks of rows: one pass for the column maxima, one for the digits.
static inline float load_x(const void* x, int bf16, size_t i) {
    if (!bf16) return ((const float*)x)[i];
    uint32_t bits = (uint32_t)((const uint16_t*)x)[i] << 16;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

__attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=off")))
static void int8_digits(const void* x, int bf16, long n, long d, float* scale, int8_t* q1, int8_t* q2) {
    for (long j = 0; j < d; j++) scale[j] = 0.0f;
    #pragma omp parallel
    {
        float* mine = (float*)calloc((size_t)d, sizeof(float));
        #pragma omp for schedule(static)
        for (long i = 0; i < n; i++)
            for (long j = 0; j < d; j++) {
                const float a = fabsf(load_x(x, bf16, (size_t)i * d + j));
                if (a > mine[j]) mine[j] = a;
            }
        #pragma omp critical
        for (long j = 0; j < d; j++)
            if (mine[j] > scale[j]) scale[j] = mine[j];
        free(mine);
    }
    for (long j = 0; j < d; j++) scale[j] = (scale[j] > 1e-30f ? scale[j] : 1e-30f) / 127.0f;
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++)
        for (long j = 0; j < d; j++) {
            const size_t k = (size_t)i * d + j;
            const float r = load_x(x, bf16, k) / scale[j];
            const float a = nearbyintf(r);
            q1[k] = (int8_t)a;
            q2[k] = (int8_t)nearbyintf((r - a) * 254.0f);
        }
}

// int8_digits(x, bf16, n, d, scale, q1, q2): addresses as ints.
static PyObject* py_int8_digits(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "int8_digits takes x, bf16, n, d, scale, q1, q2");
        return NULL;
    }
    void* ptr[4];
    long flag, n, d;
    const int at[4] = {0, 4, 5, 6};
    for (int k = 0; k < 4; k++) {
        ptr[k] = PyLong_AsVoidPtr(args[at[k]]);
        if (PyErr_Occurred()) return NULL;
    }
    flag = PyLong_AsLong(args[1]);
    n = PyLong_AsLong(args[2]);
    d = PyLong_AsLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    Py_BEGIN_ALLOW_THREADS
    int8_digits(ptr[0], (int)flag, n, d, (float*)ptr[1], (int8_t*)ptr[2], (int8_t*)ptr[3]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"group_columns", (PyCFunction)(void (*)(void))py_group_columns, METH_FASTCALL,
     "GPTQ's rounding and error feedback over the columns of one group"},
    {"group_grid", (PyCFunction)(void (*)(void))py_group_grid, METH_FASTCALL,
     "the group's clipped min-max int4 grid per row, least importance-weighted error"},
    {"int8_digits", (PyCFunction)(void (*)(void))py_int8_digits, METH_FASTCALL,
     "two int8 digits per value and a scale per column (exact Gram products from int8 ones)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gptq", "GPTQ's column loop", -1, methods};

PyMODINIT_FUNC PyInit__gptq(void) { return PyModule_Create(&module); }
