// What this CPU can do at most, for the decode step's bounds (bench/machine_bounds.py builds and runs it):
//   read bandwidth: 1 and 2 threads each stream their part of a 1 GiB buffer with 64-byte loads, best of 5;
//   vdpbf16ps zmm (the int4 kernel's bf16 dot product) and vpdpbusd zmm (int8 VNNI) per second, 12
//   independent accumulator chains per thread, on 1 and 2 threads; likewise the fp32 paths' instructions:
//   vfmadd231ps zmm and ymm, and vpermt2b zmm (one per 16 weights on the AVX-512 path without BF16).
// Prints one "name threads value" line per figure, for the instructions this CPU has.
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

__attribute__((target("avx512f"))) static long long stream(const char* buf, size_t lo, size_t hi) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = lo; i < hi; i += 256) {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512(buf + i));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512(buf + i + 64));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512(buf + i + 128));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512(buf + i + 192));
    }
    return _mm512_reduce_add_epi64(_mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3)));
}

__attribute__((target("avx512f,avx512bf16,avx512vnni"))) static double dots(int int8, long iters) {
    __m512 acc[12];
    __m512i acci[12];
    for (int i = 0; i < 12; i++) acc[i] = _mm512_setzero_ps(), acci[i] = _mm512_setzero_si512();
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    __m512i ai = _mm512_set1_epi8(1);
    const double start = now();
    for (long it = 0; it < iters; it++) {
        if (int8)
            for (int i = 0; i < 12; i++) acci[i] = _mm512_dpbusd_epi32(acci[i], ai, ai);
        else
            for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, a);
        __asm__ volatile("" : "+v"(a), "+v"(ai));
    }
    const double secs = now() - start;
    float sink = 0;
    for (int i = 0; i < 12; i++) sink += acc[i][0] + (float)acci[i][0];
    if (sink == 12345.0f) printf("#\n");
    return secs;
}

#define CHAINS(isa, name, type, zero, op)                                                  \
    __attribute__((target(isa))) static double name(long iters) {                               \
        type acc[12];                                                                        \
        type a = zero;                                                                       \
        for (int i = 0; i < 12; i++) acc[i] = zero;                                          \
        const double start = now();                                                          \
        for (long it = 0; it < iters; it++) {                                                \
            for (int i = 0; i < 12; i++) acc[i] = op;                                        \
            __asm__ volatile("" : "+v"(a));                                                  \
        }                                                                                    \
        const double secs = now() - start;                                                   \
        for (int i = 1; i < 12; i++) __asm__ volatile("" : : "v"(acc[i]));                   \
        __asm__ volatile("" : : "v"(acc[0]));                                                \
        return secs;                                                                         \
    }
CHAINS("avx512f", fma_zmm, __m512, _mm512_set1_ps(1e-9f), _mm512_fmadd_ps(acc[i], a, a))
CHAINS("avx2,fma", fma_ymm, __m256, _mm256_set1_ps(1e-9f), _mm256_fmadd_ps(acc[i], a, a))
CHAINS("avx512f,avx512vbmi", perm_zmm, __m512i, _mm512_set1_epi8(1), _mm512_permutex2var_epi8(a, acc[i], a))

static void rate(const char* name, double (*fn)(long)) {
    const long iters = 50000000;
    for (int threads = 1; threads <= 2; threads++) {
        double secs = 0;
#pragma omp parallel num_threads(threads) reduction(max : secs)
        secs = fn(iters);
        printf("%s %d %.3f\n", name, threads, threads * 12.0 * iters / secs / 1e9);
    }
}

int main(void) {
    __builtin_cpu_init();
    const size_t n = (size_t)1 << 30;
    char* buf = aligned_alloc(64, n);
    if (buf == NULL) return 1;
    memset(buf, 1, n);
    for (int threads = 1; threads <= 2; threads++) {
        double best = 1e9;
        for (int pass = 0; pass < 5; pass++) {
            long long sink = 0;
            const double start = now();
#pragma omp parallel num_threads(threads) reduction(^ : sink)
            {
                const size_t part = n / threads, lo = part * omp_get_thread_num();
                sink ^= stream(buf, lo, lo + part);
            }
            const double secs = now() - start;
            if (secs < best) best = secs;
            if (sink == 42) printf("#\n");
        }
        printf("read_gb_s %d %.2f\n", threads, n / best / 1e9);
    }
    free(buf);
    const long iters = 50000000;
    const int has_dots[2] = {__builtin_cpu_supports("avx512bf16"), __builtin_cpu_supports("avx512vnni")};
    for (int int8 = 0; int8 < 2; int8++)
        for (int threads = 1; threads <= 2 && has_dots[int8]; threads++) {
            double secs = 0;
#pragma omp parallel num_threads(threads) reduction(max : secs)
            secs = dots(int8, iters);
            printf("%s %d %.3f\n", int8 ? "vpdpbusd_g_s" : "vdpbf16ps_g_s", threads, threads * 12.0 * iters / secs / 1e9);
        }
    if (__builtin_cpu_supports("avx512f")) rate("vfmadd_zmm_g_s", fma_zmm);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) rate("vfmadd_ymm_g_s", fma_ymm);
    if (__builtin_cpu_supports("avx512vbmi")) rate("vpermt2b_zmm_g_s", perm_zmm);
    return 0;
}
