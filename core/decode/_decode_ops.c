// The small ops of a decode step, one call each instead of a dozen torch ops (core/decode/ops.py).
//
// attend: one decode step of attention over Ponder's int8 KV cache, in one call per layer.
// For each row b and KV head h, with the G = Hq / Hkv query heads that share it:
//   1. rotary on the new key and the G queries, with torch's bf16 rounding (x*cos and rotate_half(x)*sin
//      each rounded to bf16, then their sum), as transformers' apply_rotary_pos_emb computes it;
//   2. the new key and value quantized as core.decode.cache.quantize_int8 does (absmax per token and head,
//      scale = max(absmax, 1e-8) / 127, round half to even, bf16 scale) and written at position `pos`;
//   3. scores s_t = (q . k_t) * scale_t * scaling over t = 0..pos read straight from the int8 rows (no
//      dequantized copy of the prefix), softmax in float32, out = sum_t p_t * scale_t * v_t, rounded to bf16.
// Layouts: the cache's q buffer (2, B, Hkv, cap, D) int8 and s buffer (2, B, Hkv, cap) bf16 (Int8KVLayer);
// q / k / v rows of Hq*D / Hkv*D / Hkv*D bf16 with their own row strides; cos / sin (D) bf16 per row
// (row stride 0: one pair for all rows); out (B, Hq*D) bf16. Threads: OpenMP over (row, KV head), which
// binds to torch's libgomp as models/_int4.c does. The per-head work is compiled for AVX-512, AVX2 and
// baseline x86-64 (target_clones) and picked once per machine, so a machine always computes the same way.
//
// rms_norm: y = bf16(w * bf16(x * rsqrt(mean(x^2) + eps))), the lean layers' Qwen2 RMSNorm on bf16 rows.
// silu_mul: y = bf16(bf16(silu(g)) * u), the feed-forward's SwiGLU on bf16 rows.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_decode_ops.h"

#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

static inline float rounded(float f) { return bf2f(f2bf(f)); }

// Cephes' expf for x <= 0 (about 1 ulp), branch-free (no floorf call) so that the loops around it vectorize.
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to an integer, branch-free
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, 4);
    return p * two_n;
}

static void rotate(const uint16_t* x, const uint16_t* cos, const uint16_t* sin, int dim, float* out) {
    const int half = dim / 2;
    for (int d = 0; d < dim; d++) {
        const float turned = d < half ? -bf2f(x[d + half]) : bf2f(x[d - half]);
        out[d] = rounded(rounded(bf2f(x[d]) * bf2f(cos[d])) + rounded(turned * bf2f(sin[d])));
    }
}

static void store_int8(const float* x, int dim, int8_t* q, uint16_t* scale) {
    float amax = 0.0f;
    for (int d = 0; d < dim; d++) amax = fmaxf(amax, fabsf(x[d]));
    const float s = fmaxf(amax, 1e-8f) / 127.0f;
    for (int d = 0; d < dim; d++) {
        float v = nearbyintf(x[d] / s);
        v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
        q[d] = (int8_t)v;
    }
    *scale = f2bf(s);
}

// Softmax numerators of G heads' scores in place, each times its value row's scale (folded into the weight);
// total[g] gets head g's sum of numerators.
static inline __attribute__((always_inline)) void softmax_weights(float* scores, int groups, int tokens,
                                                                  const uint16_t* vs, float* total) {
    for (int g = 0; g < groups; g++) {
        float* sg = scores + (size_t)g * tokens;
        float top = sg[0];
        for (int t = 1; t < tokens; t++) top = fmaxf(top, sg[t]);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int t = 0; t < tokens; t++) {
            const float e = exp_nonpositive(sg[t] - top);
            sg[t] = e * bf2f(vs[t]);
            sum += e;
        }
        total[g] = sum;
    }
}

// Scores, softmax and the weighted sum of values for G query heads over T int8 rows of one KV head.
CLONES static void attend_head(const float* q, int groups, int dim, int tokens, const int8_t* kq, const uint16_t* ks,
                               const int8_t* vq, const uint16_t* vs, float scaling, float* scores, uint16_t* out) {
    float kf[MAX_DIM], acc[MAX_GROUP * MAX_DIM], total[MAX_GROUP];
    for (int t = 0; t < tokens; t++) {
        const int8_t* row = kq + (size_t)t * dim;
        for (int d = 0; d < dim; d++) kf[d] = (float)row[d];
        const float factor = bf2f(ks[t]) * scaling;
        for (int g = 0; g < groups; g++) {
            const float* qg = q + g * dim;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int d = 0; d < dim; d++) dot += qg[d] * kf[d];
            scores[(size_t)g * tokens + t] = dot * factor;
        }
    }
    softmax_weights(scores, groups, tokens, vs, total);
    for (int i = 0; i < groups * dim; i++) acc[i] = 0.0f;
    for (int t = 0; t < tokens; t++) {
        const int8_t* row = vq + (size_t)t * dim;
        for (int d = 0; d < dim; d++) kf[d] = (float)row[d];
        for (int g = 0; g < groups; g++) {
            const float w = scores[(size_t)g * tokens + t];
            float* ag = acc + g * dim;
            for (int d = 0; d < dim; d++) ag[d] += w * kf[d];
        }
    }
    for (int g = 0; g < groups; g++)
        for (int d = 0; d < dim; d++) out[g * dim + d] = f2bf(acc[g * dim + d] / total[g]);
}

#define AVX512 __attribute__((target("avx512f")))
#define BLOCK 16

// Sums of 16 vectors, lane i = the sum of v[i]'s lanes (a transpose-and-add tree, 45 instructions for 16 sums).
AVX512 static inline __attribute__((always_inline)) __m512 sums16(const __m512* v) {
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    const __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
    const __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, 0x88), _mm512_shuffle_f32x4(e0, e1, 0xDD));
}

AVX512 static inline __attribute__((always_inline)) __m512 int8_to_ps(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}

AVX512 static inline __attribute__((always_inline)) __m512 bf16_to_ps(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// attend_head for dim = 16 * CHUNKS on AVX-512: tiles of BLOCK tokens converted to float once and read by every
// query head of the group; no horizontal sum per (token, head).
AVX512 static inline __attribute__((always_inline)) void attend_head_avx512(
    const float* q, int groups, const int CHUNKS, int tokens, const int8_t* kq, const uint16_t* ks, const int8_t* vq,
    const uint16_t* vs, float scaling, float* scores, uint16_t* out) {
    const int dim = 16 * CHUNKS;
    __attribute__((aligned(64))) float tile[BLOCK * 16 * 16];
    __attribute__((aligned(64))) float padded_scales[BLOCK];
    __m512 part[BLOCK];
    for (int t0 = 0; t0 < tokens; t0 += BLOCK) {
        const int n = tokens - t0 < BLOCK ? tokens - t0 : BLOCK;
        for (int i = 0; i < BLOCK; i++) {
            padded_scales[i] = i < n ? bf2f(ks[t0 + i]) * scaling : 0.0f;
            for (int c = 0; c < CHUNKS; c++)
                _mm512_store_ps(tile + (i * CHUNKS + c) * 16,
                                i < n ? int8_to_ps(kq + (size_t)(t0 + i) * dim + 16 * c) : _mm512_setzero_ps());
        }
        const __m512 factor = _mm512_load_ps(padded_scales);
        for (int g = 0; g < groups; g++) {
            for (int i = 0; i < BLOCK; i++) {
                __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q + g * dim), _mm512_load_ps(tile + i * CHUNKS * 16));
                for (int c = 1; c < CHUNKS; c++)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * dim + 16 * c), _mm512_load_ps(tile + (i * CHUNKS + c) * 16),
                                          acc);
                part[i] = acc;
            }
            const __m512 s = _mm512_mul_ps(sums16(part), factor);
            _mm512_mask_storeu_ps(scores + (size_t)g * tokens + t0, (__mmask16)((1u << n) - 1u), s);
        }
    }
    float total[MAX_GROUP];
    softmax_weights(scores, groups, tokens, vs, total);
    __m512 acc[MAX_GROUP][16];
    for (int g = 0; g < groups; g++)
        for (int c = 0; c < CHUNKS; c++) acc[g][c] = _mm512_setzero_ps();
    for (int t0 = 0; t0 < tokens; t0 += BLOCK) {
        const int n = tokens - t0 < BLOCK ? tokens - t0 : BLOCK;
        for (int i = 0; i < n; i++)
            for (int c = 0; c < CHUNKS; c++)
                _mm512_store_ps(tile + (i * CHUNKS + c) * 16, int8_to_ps(vq + (size_t)(t0 + i) * dim + 16 * c));
        for (int g = 0; g < groups; g++) {
            __m512 a[16];
            for (int c = 0; c < CHUNKS; c++) a[c] = acc[g][c];
            for (int i = 0; i < n; i++) {
                const __m512 w = _mm512_set1_ps(scores[(size_t)g * tokens + t0 + i]);
                for (int c = 0; c < CHUNKS; c++) a[c] = _mm512_fmadd_ps(w, _mm512_load_ps(tile + (i * CHUNKS + c) * 16), a[c]);
            }
            for (int c = 0; c < CHUNKS; c++) acc[g][c] = a[c];
        }
    }
    for (int g = 0; g < groups; g++)
        for (int c = 0; c < CHUNKS; c++) {
            __attribute__((aligned(64))) float v[16];
            _mm512_store_ps(v, _mm512_div_ps(acc[g][c], _mm512_set1_ps(total[g])));
            for (int d = 0; d < 16; d++) out[g * dim + 16 * c + d] = f2bf(v[d]);
        }
}

AVX512 static void attend_head_avx512_64(const float* q, int groups, int tokens, const int8_t* kq, const uint16_t* ks,
                                         const int8_t* vq, const uint16_t* vs, float scaling, float* scores,
                                         uint16_t* out) {
    attend_head_avx512(q, groups, 4, tokens, kq, ks, vq, vs, scaling, scores, out);
}

AVX512 static void attend_head_avx512_128(const float* q, int groups, int tokens, const int8_t* kq, const uint16_t* ks,
                                          const int8_t* vq, const uint16_t* vs, float scaling, float* scores,
                                          uint16_t* out) {
    attend_head_avx512(q, groups, 8, tokens, kq, ks, vq, vs, scaling, scores, out);
}

static int has_avx512 = -1;  // -1 until the first call asks the CPU

void detect_avx512(void) {
    if (has_avx512 < 0) {
        __builtin_cpu_init();
        has_avx512 = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
}


static int step_head(const Step* st, int b, int h, float* scores) {
    const int groups = st->heads / st->kv_heads, dim = st->dim, tokens = st->pos + 1;
    const uint16_t* cos = st->cos + (size_t)b * st->cs_stride;
    const uint16_t* sin = st->sin + (size_t)b * st->cs_stride;
    const size_t head_rows = (size_t)st->cap * dim, plane = (size_t)st->rows * st->kv_heads;
    int8_t* kq = st->cache_q + ((size_t)b * st->kv_heads + h) * head_rows;
    int8_t* vq = kq + plane * head_rows;
    uint16_t* ks = st->cache_s + ((size_t)b * st->kv_heads + h) * st->cap;
    uint16_t* vs = ks + plane * st->cap;
    float x[MAX_DIM], qf[MAX_GROUP * MAX_DIM];
    rotate(st->k + (size_t)b * st->k_stride + (size_t)h * dim, cos, sin, dim, x);
    store_int8(x, dim, kq + (size_t)st->pos * dim, ks + st->pos);
    const uint16_t* v = st->v + (size_t)b * st->v_stride + (size_t)h * dim;
    for (int d = 0; d < dim; d++) x[d] = bf2f(v[d]);
    store_int8(x, dim, vq + (size_t)st->pos * dim, vs + st->pos);
    for (int g = 0; g < groups; g++)
        rotate(st->q + (size_t)b * st->q_stride + (size_t)(h * groups + g) * dim, cos, sin, dim, qf + g * dim);
    uint16_t* out = st->out + (size_t)b * st->heads * dim + (size_t)h * groups * dim;
    if (has_avx512 && dim == 64)
        attend_head_avx512_64(qf, groups, tokens, kq, ks, vq, vs, st->scaling, scores, out);
    else if (has_avx512 && dim == 128)
        attend_head_avx512_128(qf, groups, tokens, kq, ks, vq, vs, st->scaling, scores, out);
    else
        attend_head(qf, groups, dim, tokens, kq, ks, vq, vs, st->scaling, scores, out);
    return 0;
}

int run_step(const Step* st) {
    const int tasks = st->rows * st->kv_heads, groups = st->heads / st->kv_heads;
    const size_t scratch = (size_t)groups * (st->pos + 1);
    int failed = 0;
    // small prefixes run on one thread: a parallel region costs ~4 us, more than the work it would split there (one
    // row of the 0.5B, 2 KV heads, 1 thread / 2: 7.6 / 7.6 us at 32 cached tokens, 11.1 / 8.0 at 64, 20.4 / 14.2 at
    // 150, 36.7 / 25.2 at 300; each head is computed the same either way)
#pragma omp parallel for schedule(static) if ((long)tasks * (st->pos + 1) >= 128) reduction(| : failed)
    for (int task = 0; task < tasks; task++) {
        float* scores = malloc(scratch * sizeof(float));
        if (scores == NULL) {
            failed = 1;
            continue;
        }
        step_head(st, task / st->kv_heads, task % st->kv_heads, scores);
        free(scores);
    }
    return failed;
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

// attend(q, k, v, cos, sin, cache_q, cache_s, out, q_stride, k_stride, v_stride, cs_stride,
//      rows, heads, kv_heads, dim, cap, pos, scaling): addresses as ints, strides in elements.
static PyObject* py_attend(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    void* ptr[8];
    long dims[10];
    if (read_args(args, nargs, 19, ptr, 8, dims, 10, "attend takes 8 addresses, 4 strides, 6 sizes and the scaling") < 0)
        return NULL;
    const double scaling = PyFloat_AsDouble(args[18]);
    if (scaling == -1.0 && PyErr_Occurred()) return NULL;
    Step st = {ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], dims[0], dims[1], dims[2], dims[3], ptr[5], ptr[6], ptr[7],
               (int)dims[4], (int)dims[5], (int)dims[6], (int)dims[7], (int)dims[8], (int)dims[9], (float)scaling};
    if (st.rows < 1 || st.kv_heads < 1 || st.heads % st.kv_heads || st.heads / st.kv_heads > MAX_GROUP ||
        st.dim < 2 || st.dim % 2 || st.dim > MAX_DIM || st.pos < 0 || st.pos >= st.cap) {
        PyErr_SetString(PyExc_ValueError, "kv attention step: shape outside the kernel's range");
        return NULL;
    }
    detect_avx512();
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = run_step(&st);
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

CLONES void rms_rows(const uint16_t* x, long x_stride, const uint16_t* w, uint16_t* y, int rows, int n, float eps) {
    for (int r = 0; r < rows; r++) {
        const uint16_t* xr = x + (size_t)r * x_stride;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < n; i++) sum += bf2f(xr[i]) * bf2f(xr[i]);
        const float inv = 1.0f / sqrtf(sum / (float)n + eps);
#pragma omp simd
        for (int i = 0; i < n; i++) y[(size_t)r * n + i] = f2bf(bf2f(w[i]) * rounded(bf2f(xr[i]) * inv));
    }
}

CLONES void silu_mul_rows(const uint16_t* g, long g_stride, const uint16_t* u, long u_stride, uint16_t* y,
                                 int rows, int n) {
    // chunks of 256 elements of any row, on torch's OpenMP threads when there is enough work (a step of several
    // rows: 4 × 4864 took 68 µs on one thread); each element is computed the same either way
    const int per_row = (n + 255) / 256, chunks = rows * per_row;
#pragma omp parallel for schedule(static) if ((long)rows * n >= 4096)
    for (int c = 0; c < chunks; c++) {
        float e[256];
        const int r = c / per_row, i0 = (c % per_row) * 256;
        const uint16_t* gr = g + (size_t)r * g_stride;
        const uint16_t* ur = u + (size_t)r * u_stride;
        uint16_t* yr = y + (size_t)r * n;
        const int m = n - i0 < 256 ? n - i0 : 256;
#pragma omp simd
        for (int i = 0; i < m; i++) e[i] = -fabsf(bf2f(gr[i0 + i]));
#pragma omp simd
        for (int i = 0; i < m; i++) e[i] = exp_nonpositive(e[i]);  // exp(-|x|): no overflow either side
#pragma omp simd
        for (int i = 0; i < m; i++) {
            const float x = bf2f(gr[i0 + i]);
            const float sigmoid = (x >= 0.0f ? 1.0f : e[i]) / (1.0f + e[i]);
            yr[i0 + i] = f2bf(rounded(x * sigmoid) * bf2f(ur[i0 + i]));
        }
    }
}

// rms_norm(x, w, y, rows, n, x_stride, eps): y (rows, n) contiguous.
static PyObject* py_rms_norm(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    void* ptr[3];
    long dims[3];
    if (read_args(args, nargs, 7, ptr, 3, dims, 3, "rms_norm takes x, w, y, rows, n, x_stride, eps") < 0) return NULL;
    const double eps = PyFloat_AsDouble(args[6]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    if (dims[0] < 1 || dims[1] < 1 || dims[2] < dims[1]) {
        PyErr_SetString(PyExc_ValueError, "rms_norm: bad shape");
        return NULL;
    }
    rms_rows(ptr[0], dims[2], ptr[1], ptr[2], (int)dims[0], (int)dims[1], (float)eps);
    Py_RETURN_NONE;
}

// silu_mul(g, u, y, rows, n, g_stride, u_stride): y (rows, n) contiguous.
static PyObject* py_silu_mul(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    void* ptr[3];
    long dims[4];
    if (read_args(args, nargs, 7, ptr, 3, dims, 4, "silu_mul takes g, u, y, rows, n, g_stride, u_stride") < 0)
        return NULL;
    if (dims[0] < 1 || dims[1] < 1 || dims[2] < dims[1] || dims[3] < dims[1]) {
        PyErr_SetString(PyExc_ValueError, "silu_mul: bad shape");
        return NULL;
    }
    silu_mul_rows(ptr[0], dims[2], ptr[1], dims[3], ptr[2], (int)dims[0], (int)dims[1]);
    Py_RETURN_NONE;
}

// attend_many(args, scaling): several attend calls (one per request of a joint step, each its own cache layer)
// in one parallel region over every (request, row, KV head). `args`: a list of 18 integers per call, attend's
// 8 addresses and 10 strides and sizes in attend's order.
#define MAX_CALLS 64
static PyObject* py_attend_many(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "attend_many takes a list of 18 integers per call and the scaling");
        return NULL;
    }
    const Py_ssize_t n = PyList_GET_SIZE(args[0]);
    const double scaling = PyFloat_AsDouble(args[1]);
    if (scaling == -1.0 && PyErr_Occurred()) return NULL;
    if (n % 18 || n / 18 < 1 || n / 18 > MAX_CALLS) {
        PyErr_SetString(PyExc_ValueError, "attend_many: 18 integers per call, 1 to 64 calls");
        return NULL;
    }
    const int calls = (int)(n / 18);
    Step st[MAX_CALLS];
    int first[MAX_CALLS + 1];
    first[0] = 0;
    for (int c = 0; c < calls; c++) {
        void* ptr[8];
        long dims[10];
        for (int i = 0; i < 8; i++) {
            ptr[i] = PyLong_AsVoidPtr(PyList_GET_ITEM(args[0], c * 18 + i));
            if (ptr[i] == NULL && PyErr_Occurred()) return NULL;
        }
        for (int i = 0; i < 10; i++) {
            dims[i] = PyLong_AsLong(PyList_GET_ITEM(args[0], c * 18 + 8 + i));
            if (dims[i] == -1 && PyErr_Occurred()) return NULL;
        }
        Step one = {ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], dims[0], dims[1], dims[2], dims[3], ptr[5], ptr[6],
                    ptr[7], (int)dims[4], (int)dims[5], (int)dims[6], (int)dims[7], (int)dims[8], (int)dims[9],
                    (float)scaling};
        if (one.rows < 1 || one.kv_heads < 1 || one.heads % one.kv_heads || one.heads / one.kv_heads > MAX_GROUP ||
            one.dim < 2 || one.dim % 2 || one.dim > MAX_DIM || one.pos < 0 || one.pos >= one.cap) {
            PyErr_SetString(PyExc_ValueError, "kv attention step: shape outside the kernel's range");
            return NULL;
        }
        st[c] = one;
        first[c + 1] = first[c] + one.rows * one.kv_heads;
    }
    detect_avx512();
    long work = 0;
    for (int c = 0; c < calls; c++) work += (long)st[c].rows * st[c].kv_heads * (st[c].pos + 1);
    const int tasks = first[calls];
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for schedule(static) if (work >= 1024) reduction(| : failed)
    for (int task = 0; task < tasks; task++) {
        int c = 0;
        while (task >= first[c + 1]) c++;
        const Step* one = &st[c];
        const int local = task - first[c];
        float* scores = malloc((size_t)(one->heads / one->kv_heads) * (one->pos + 1) * sizeof(float));
        if (scores == NULL) {
            failed = 1;
            continue;
        }
        step_head(one, local / one->kv_heads, local % one->kv_heads, scores);
        free(scores);
    }
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

// use_avx512(flag): whether attend takes its AVX-512 tiles (where the CPU has them) or the portable loops;
// returns the previous setting. For tests of the portable path on AVX-512 machines.
static PyObject* py_use_avx512(PyObject* self, PyObject* flag) {
    (void)self;
    detect_avx512();
    const int previous = has_avx512, wanted = PyObject_IsTrue(flag);
    if (wanted < 0) return NULL;
    __builtin_cpu_init();
    has_avx512 = wanted && __builtin_cpu_supports("avx512f");
    return PyBool_FromLong(previous);
}

static PyMethodDef methods[] = {
    {"use_avx512", py_use_avx512, METH_O, "take the AVX-512 attention tiles (True) or the portable loops"},
    {"attend", (PyCFunction)(void (*)(void))py_attend, METH_FASTCALL,
     "append one token's key and value to an int8 cache layer and attend over it"},
    {"attend_many", (PyCFunction)(void (*)(void))py_attend_many, METH_FASTCALL,
     "several attend calls (one per request of a joint step) in one parallel region"},
    {"rms_norm", (PyCFunction)(void (*)(void))py_rms_norm, METH_FASTCALL, "Qwen2 RMSNorm of bf16 rows"},
    {"silu_mul", (PyCFunction)(void (*)(void))py_silu_mul, METH_FASTCALL, "silu(g) * u of bf16 rows"},
    {"layers_plan", (PyCFunction)(void (*)(void))py_layers_plan, METH_FASTCALL,
     "the weights of a packed-int4 Qwen2 model's decoder layers, for layers_step (_layer_step.c)"},
    {"layers_step", (PyCFunction)(void (*)(void))py_layers_step, METH_FASTCALL,
     "every decoder layer of one decode step, in one call"},
    {"top_candidates", (PyCFunction)(void (*)(void))py_top_candidates, METH_FASTCALL,
     "each row's c highest float32 values and their ids, highest first, equal values in id order (_sampling.c)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decode_ops", "The small ops of a decode step",
                                    -1, methods};

PyMODINIT_FUNC PyInit__decode_ops(void) {
    PyObject* m = PyModule_Create(&module);
    if (m != NULL) {
        PyModule_AddIntConstant(m, "MAX_DIM", MAX_DIM);
        PyModule_AddIntConstant(m, "MAX_GROUP", MAX_GROUP);
    }
    return m;
}
