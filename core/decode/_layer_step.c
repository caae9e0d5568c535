// Every decoder layer of one fused decode step (core.decode.fused) in one C call, for rows of one request with no
// adapter. Python between the ~170 small calls of a 24-layer step cost about a third of a 0.5B step on an AVX2 CPU
// (bench/results/step_gap_amd_avx2.txt); here the same kernels run back to back:
//   x = RMSNorm(h); qkv = int4(x) + bias; attn = attend(qkv, cache layer); h = bf16(h + int4(attn) + bias);
//   x = RMSNorm(h); gu = int4(x) + bias; h = bf16(h + int4(bf16(silu(g)) * u) + bias)
// with the int4 matmul of models._int4 (its capsule `mm_api`) and this extension's attention, RMSNorm and SwiGLU, so
// each value is rounded where the Python step rounds it (every add is torch's bf16 add: fp32 sum, rounded to bf16).
//
// layers_plan(mm_api, spec, eps, scaling) -> a capsule holding the weights' addresses (the caller keeps the tensors
// alive). spec: layers, hidden, heads, kv_heads, head dim, intermediate size, then per layer the input and
// post-attention norm weights and four matrices (qkv, o, gate_up, down), each packed data, scales, bias (0: none),
// outputs, inputs, group size and the int4 kernel's instruction set.
// layers_step(plan, h, rows, caches, pos, cos, sin): h (rows, hidden) bf16 contiguous, updated in place; caches: per
// layer the int8 layer's q and s buffers and its capacity (core.decode.cache.Int8KVLayer); the token goes in at pos.
#include <stdlib.h>

#include "_decode_ops.h"
#include "../../models/_int4_api.h"

#define SPEC_HEAD 6
#define PER_MAT 7
#define PER_LAYER (2 + 4 * PER_MAT)
#define PLAN_CAPSULE "core.decode._decode_ops.layers_plan"
#define MAX_SIZE (1 << 20)  // hidden, intermediate and head sizes: far beyond any model, and no int overflow below

typedef struct {
    const uint8_t* data;
    const uint32_t* scales;
    const uint16_t* bias;
    int n, k, group, isa;
} Mat;

typedef struct {
    const uint16_t *norm_in, *norm_post;
    Mat qkv, o, gate_up, down;
} Layer;

typedef struct {
    Int4Api api;
    int layers, hidden, heads, kv_heads, dim, inter;
    float eps, scaling;
    Layer layer[];
} Plan;

// y = bf16(y + a) over rows of n (a's row stride a_stride; 0: one row for all, a bias).
static void add_rows(uint16_t* y, const uint16_t* a, int rows, int n, long a_stride) {
    for (int r = 0; r < rows; r++) {
        uint16_t* yr = y + (size_t)r * n;
        const uint16_t* ar = a + (size_t)r * a_stride;
#pragma omp simd
        for (int i = 0; i < n; i++) yr[i] = f2bf(bf2f(yr[i]) + bf2f(ar[i]));
    }
}

// y = x @ W.T (+ bias), api.max_rows rows a call as models.int4_kernel runs them; -1 when out of memory.
static int mm_rows(const Plan* p, const Mat* w, const uint16_t* x, uint16_t* y, int rows) {
    for (int s = 0; s < rows; s += p->api.max_rows) {
        const int m = rows - s < p->api.max_rows ? rows - s : p->api.max_rows;
        if (p->api.mm(w->data, w->scales, x + (size_t)s * w->k, y + (size_t)s * w->n, m, w->n, w->k, w->group,
                      w->isa) < 0)
            return -1;
    }
    if (w->bias != NULL) add_rows(y, w->bias, rows, w->n, 0);
    return 0;
}

static const char* read_mat(const Int4Api* api, PyObject* spec, Py_ssize_t at, Mat* m, long n, long k) {
    void* ptr[3];
    long dims[4];
    for (int i = 0; i < 3; i++) {
        ptr[i] = PyLong_AsVoidPtr(PyList_GET_ITEM(spec, at + i));
        if (ptr[i] == NULL && PyErr_Occurred()) return "";
    }
    for (int i = 0; i < 4; i++) {
        dims[i] = PyLong_AsLong(PyList_GET_ITEM(spec, at + 3 + i));
        if (dims[i] == -1 && PyErr_Occurred()) return "";
    }
    if (ptr[0] == NULL || ptr[1] == NULL || dims[0] != n || dims[1] != k) return "layers_plan: a matrix of the wrong shape";
    const char* why = api->check(1, dims[0], dims[1], dims[2], dims[3]);
    if (why != NULL) return why;
    *m = (Mat){ptr[0], ptr[1], ptr[2], (int)dims[0], (int)dims[1], (int)dims[2], (int)dims[3]};
    return NULL;
}

static void free_plan(PyObject* capsule) { free(PyCapsule_GetPointer(capsule, PLAN_CAPSULE)); }

PyObject* py_layers_plan(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyCapsule_IsValid(args[0], INT4_API_CAPSULE) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "layers_plan takes models._int4.mm_api, a list of integers, eps, scaling");
        return NULL;
    }
    const Int4Api* api = PyCapsule_GetPointer(args[0], INT4_API_CAPSULE);
    PyObject* spec = args[1];
    const double eps = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred()) return NULL;
    const double scaling = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return NULL;
    const Py_ssize_t size = PyList_GET_SIZE(spec);
    long head[SPEC_HEAD] = {0};
    for (int i = 0; i < SPEC_HEAD && i < size; i++) {
        head[i] = PyLong_AsLong(PyList_GET_ITEM(spec, i));
        if (head[i] == -1 && PyErr_Occurred()) return NULL;
    }
    const long layers = size >= SPEC_HEAD ? head[0] : -1, hidden = head[1], heads = head[2], kv = head[3],
               dim = head[4], inter = head[5];
    if (layers < 1 || layers > (size - SPEC_HEAD) / PER_LAYER || size != SPEC_HEAD + layers * PER_LAYER ||
        hidden < 1 || hidden > MAX_SIZE || kv < 1 || heads < kv || heads % kv || heads / kv > MAX_GROUP || dim < 2 ||
        dim % 2 || dim > MAX_DIM || inter < 1 || inter > MAX_SIZE || heads * dim > MAX_SIZE) {
        PyErr_SetString(PyExc_ValueError, "layers_plan: model shape outside the step's range");
        return NULL;
    }
    Plan* p = malloc(sizeof(Plan) + sizeof(Layer) * (size_t)layers);
    if (p == NULL) return PyErr_NoMemory();
    *p = (Plan){*api, (int)layers, (int)hidden, (int)heads, (int)kv, (int)dim, (int)inter, (float)eps, (float)scaling};
    for (long l = 0; l < layers; l++) {
        const Py_ssize_t at = SPEC_HEAD + l * PER_LAYER;
        Layer* L = &p->layer[l];
        L->norm_in = PyLong_AsVoidPtr(PyList_GET_ITEM(spec, at));
        L->norm_post = PyErr_Occurred() ? NULL : PyLong_AsVoidPtr(PyList_GET_ITEM(spec, at + 1));
        const char* why = PyErr_Occurred() ? "" : (L->norm_in == NULL || L->norm_post == NULL)
                                                      ? "layers_plan: a norm weight is missing" : NULL;
        if (why == NULL) why = read_mat(api, spec, at + 2, &L->qkv, (heads + 2 * kv) * dim, hidden);
        if (why == NULL) why = read_mat(api, spec, at + 2 + PER_MAT, &L->o, hidden, heads * dim);
        if (why == NULL) why = read_mat(api, spec, at + 2 + 2 * PER_MAT, &L->gate_up, 2 * inter, hidden);
        if (why == NULL) why = read_mat(api, spec, at + 2 + 3 * PER_MAT, &L->down, hidden, inter);
        if (why != NULL) {
            free(p);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, why);
            return NULL;
        }
    }
    PyObject* capsule = PyCapsule_New(p, PLAN_CAPSULE, free_plan);
    if (capsule == NULL) free(p);
    return capsule;
}

typedef struct {
    int8_t* q;
    uint16_t* s;
    int cap;
} CacheLayer;

// The layers over h's rows; nonzero when out of memory.
static int run_layers(const Plan* p, uint16_t* h, int rows, const CacheLayer* caches, int pos, const uint16_t* cos,
                      const uint16_t* sin) {
    const int hidden = p->hidden, q_n = p->heads * p->dim, kv_n = p->kv_heads * p->dim, qkv_n = q_n + 2 * kv_n;
    const int wide = hidden > 2 * p->inter ? hidden : 2 * p->inter;
    uint16_t* buf = malloc(sizeof(uint16_t) * (size_t)rows * (hidden + qkv_n + q_n + wide + p->inter));
    if (buf == NULL) return -1;
    uint16_t *x = buf, *qkv = x + (size_t)rows * hidden, *attn = qkv + (size_t)rows * qkv_n;
    uint16_t *t = attn + (size_t)rows * q_n, *act = t + (size_t)rows * wide;
    int failed = 0;
    for (int l = 0; l < p->layers && !failed; l++) {
        const Layer* L = &p->layer[l];
        rms_rows(h, hidden, L->norm_in, x, rows, hidden, p->eps);
        failed |= mm_rows(p, &L->qkv, x, qkv, rows);
        const Step st = {qkv, qkv + q_n, qkv + q_n + kv_n, cos, sin, qkv_n, qkv_n, qkv_n, 0, caches[l].q, caches[l].s,
                         attn, rows, p->heads, p->kv_heads, p->dim, caches[l].cap, pos, p->scaling};
        failed |= failed ? 0 : run_step(&st);
        failed |= failed ? 0 : mm_rows(p, &L->o, attn, t, rows);
        if (failed) break;
        add_rows(h, t, rows, hidden, hidden);
        rms_rows(h, hidden, L->norm_post, x, rows, hidden, p->eps);
        failed |= mm_rows(p, &L->gate_up, x, t, rows);
        silu_mul_rows(t, 2 * p->inter, t + p->inter, 2 * p->inter, act, rows, p->inter);
        failed |= failed ? 0 : mm_rows(p, &L->down, act, t, rows);
        if (!failed) add_rows(h, t, rows, hidden, hidden);
    }
    free(buf);
    return failed;
}

PyObject* py_layers_step(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7 || !PyCapsule_IsValid(args[0], PLAN_CAPSULE) || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "layers_step takes a plan, h, rows, a list of 3 integers a layer, pos, cos, sin");
        return NULL;
    }
    const Plan* p = PyCapsule_GetPointer(args[0], PLAN_CAPSULE);
    uint16_t* h = PyLong_AsVoidPtr(args[1]);
    if (PyErr_Occurred()) return NULL;
    const long rows = PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    const long pos = PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    const uint16_t* cos = PyLong_AsVoidPtr(args[5]);
    if (PyErr_Occurred()) return NULL;
    const uint16_t* sin = PyLong_AsVoidPtr(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (h == NULL || cos == NULL || sin == NULL || rows < 1 || rows > MAX_SIZE || pos < 0 ||
        PyList_GET_SIZE(args[3]) != 3 * (Py_ssize_t)p->layers) {
        PyErr_SetString(PyExc_ValueError, "layers_step: bad rows, position or cache list");
        return NULL;
    }
    CacheLayer* caches = malloc(sizeof(CacheLayer) * (size_t)p->layers);
    if (caches == NULL) return PyErr_NoMemory();
    for (int l = 0; l < p->layers; l++) {
        caches[l].q = PyLong_AsVoidPtr(PyList_GET_ITEM(args[3], 3 * l));
        caches[l].s = PyErr_Occurred() ? NULL : PyLong_AsVoidPtr(PyList_GET_ITEM(args[3], 3 * l + 1));
        const long cap = PyErr_Occurred() ? -1 : PyLong_AsLong(PyList_GET_ITEM(args[3], 3 * l + 2));
        if (PyErr_Occurred() || caches[l].q == NULL || caches[l].s == NULL || pos >= cap || cap > INT32_MAX) {
            free(caches);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "layers_step: a cache layer without room at pos");
            return NULL;
        }
        caches[l].cap = (int)cap;
    }
    detect_avx512();
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = run_layers(p, h, (int)rows, caches, (int)pos, cos, sin);
    Py_END_ALLOW_THREADS
    free(caches);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
