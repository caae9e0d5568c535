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

// group_columns(block, h, scale, zero, codes, err, rows, group): addresses as ints, arrays contiguous float32
// (codes int32); block is updated in place, codes and err [group, rows] are written.
static PyObject* py_group_columns(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "group_columns takes block, h, scale, zero, codes, err, rows, group");
        return NULL;
    }
    void* ptr[6];
    for (int i = 0; i < 6; i++) {
        ptr[i] = PyLong_AsVoidPtr(args[i]);
        if (ptr[i] == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "group_columns: null address");
            return NULL;
        }
    }
    const long rows = PyLong_AsLong(args[6]), group = PyLong_AsLong(args[7]);
    if (PyErr_Occurred()) return NULL;
    if (rows < 1 || group < 1 || group > 4096) {
        PyErr_SetString(PyExc_ValueError, "group_columns: shape outside its range");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    group_columns((float*)ptr[0], (const float*)ptr[1], (const float*)ptr[2], (const float*)ptr[3], (int32_t*)ptr[4],
                  (float*)ptr[5], (int)rows, (int)group);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"group_columns", (PyCFunction)(void (*)(void))py_group_columns, METH_FASTCALL,
     "GPTQ's rounding and error feedback over the columns of one group"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gptq", "GPTQ's column loop", -1, methods};

PyMODINIT_FUNC PyInit__gptq(void) { return PyModule_Create(&module); }
