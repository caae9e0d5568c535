// The sampler's shortlist in one scan (core.decode.sampling): each row's c highest float32 logits with their ids,
// highest first, equal values in id order. torch's topk over Qwen's 151,936-entry vocabulary was most of the
// 0.85-1.0 ms a chat-default token spent sampling inside `generate` (docs/results.md); this scan skips every 64-value
// block whose maximum cannot enter the candidates, which after the first few blocks is nearly all of them.
//
// top_candidates(x, rows, vocab, row_stride, c, values, ids) -> True, or False when a row holds a NaN (values and ids
// then unfinished): addresses of x (rows, vocab) float32 with unit column stride, values (rows, c) float32 and ids
// (rows, c) int64, both contiguous; 1 <= c <= vocab.
#include <math.h>
#include <stdlib.h>

#include "_decode_ops.h"

#define BLOCK 64
#define MAX_ROWS (1L << 16)  // far beyond any batch: the heaps' size cannot overflow
#define MAX_CANDIDATES (1L << 20)

typedef struct {
    float value;
    long id;
} Cand;

// Candidate a ranks below b: a smaller value, or the same value and a later id (ids arrive in increasing order).
static int below(const Cand* a, const Cand* b) { return a->value < b->value || (a->value == b->value && a->id > b->id); }

// Min-heap on `below`: heap[0] is the candidate the next better one replaces.
static void sift_down(Cand* heap, int n, int i) {
    for (;;) {
        int low = i;
        const int l = 2 * i + 1, r = l + 1;
        if (l < n && below(&heap[l], &heap[low])) low = l;
        if (r < n && below(&heap[r], &heap[low])) low = r;
        if (low == i) return;
        const Cand t = heap[i];
        heap[i] = heap[low];
        heap[low] = t;
        i = low;
    }
}

static void push(Cand* heap, int* n, int c, float value, long id) {
    if (*n < c) {  // not full: sift the newcomer up
        int i = (*n)++;
        heap[i] = (Cand){value, id};
        while (i > 0 && below(&heap[i], &heap[(i - 1) / 2])) {
            const Cand t = heap[i];
            heap[i] = heap[(i - 1) / 2];
            heap[(i - 1) / 2] = t;
            i = (i - 1) / 2;
        }
    } else if (value > heap[0].value) {  // an equal value comes later in id order: it ranks below, it stays out
        heap[0] = (Cand){value, id};
        sift_down(heap, c, 0);
    }
}

static int rank_order(const void* a, const void* b) {  // highest first, equal values in id order
    const Cand *x = a, *y = b;
    return below(y, x) ? -1 : below(x, y) ? 1 : 0;
}

// One row's c best into values / ids; 1 when the row holds a NaN (then nothing is written: the caller takes torch's
// ops, whose draw fails on it as before).
static int one_row(const float* x, long vocab, int c, Cand* heap, float* values, int64_t* ids) {
    int n = 0;
    for (long start = 0; start < vocab; start += BLOCK) {
        const long end = start + BLOCK < vocab ? start + BLOCK : vocab;
        float most = -INFINITY;
        int nan = 0;
#pragma omp simd reduction(max : most) reduction(| : nan)
        for (long i = start; i < end; i++) {
            most = x[i] > most ? x[i] : most;
            nan |= x[i] != x[i];
        }
        if (nan) return 1;
        if (n == c && !(most > heap[0].value)) continue;  // nothing here beats the lowest candidate
        for (long i = start; i < end; i++)
            if (n < c || x[i] > heap[0].value) push(heap, &n, c, x[i], i);
    }
    qsort(heap, (size_t)n, sizeof(Cand), rank_order);
    for (int j = 0; j < n; j++) {
        values[j] = heap[j].value;
        ids[j] = heap[j].id;
    }
    return 0;
}

PyObject* py_top_candidates(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "top_candidates takes x, rows, vocab, row_stride, c, values, ids");
        return NULL;
    }
    const float* x = PyLong_AsVoidPtr(args[0]);
    const long rows = PyErr_Occurred() ? 0 : PyLong_AsLong(args[1]);
    const long vocab = PyErr_Occurred() ? 0 : PyLong_AsLong(args[2]);
    const long stride = PyErr_Occurred() ? 0 : PyLong_AsLong(args[3]);
    const long c = PyErr_Occurred() ? 0 : PyLong_AsLong(args[4]);
    float* values = PyErr_Occurred() ? NULL : PyLong_AsVoidPtr(args[5]);
    int64_t* ids = PyErr_Occurred() ? NULL : PyLong_AsVoidPtr(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (x == NULL || values == NULL || ids == NULL || rows < 1 || rows > MAX_ROWS || vocab < 1 || stride < vocab || c < 1 ||
        c > vocab || c > MAX_CANDIDATES) {
        PyErr_SetString(PyExc_ValueError, "top_candidates: bad rows, vocabulary, stride or count");
        return NULL;
    }
    Cand* heaps = malloc(sizeof(Cand) * (size_t)c * (size_t)rows);
    if (heaps == NULL) return PyErr_NoMemory();
    int nan = 0;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for schedule(static) if (rows > 1) reduction(| : nan)
    for (long r = 0; r < rows; r++)
        nan |= one_row(x + r * stride, vocab, (int)c, heaps + r * c, values + r * c, ids + r * c);
    Py_END_ALLOW_THREADS
    free(heaps);
    return PyBool_FromLong(!nan);
}
