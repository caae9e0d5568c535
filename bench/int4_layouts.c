// Int4 layouts for AVX2's exact int16 path, compared on the integer loop alone (no scales, no Python): how long one
// row's int32 sums q * x take on the 0.5B's and 1.5B's per-token matrices, weights in cache ("hot") and streamed
// from 300 MB of copies ("strm"), 2 threads. Three loops, each checked against a scalar sum:
//   old  the shipped avx2-int16 loop on torch's AVX2 layout (extract, unpack, vpmovzxbw, vpmaddwd);
//   mid  torch's layout kept, x split into byte planes (x = 256 xh + xl) for vpmaddubsw (bit-identical sums;
//        tried in models/_int4.c: 1.06x at one row on the 0.5B, none at 2 or 16 rows, so not kept);
//   new  a layout of Ponder's own where one vpand/vpsrld per 8 outputs gives int16 pairs (no shuffles), with the
//        weights repacked at load: shipped since 2026-12-07 as p32 (models/_int4_p32.c).
// Build and run: gcc -O3 -fopenmp bench/int4_layouts.c -o /tmp/int4_layouts && /tmp/int4_layouts
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#define AVX2_TARGET __attribute__((target("avx2,fma")))
#define PREFETCH 2048

// new: blocks of 32 outputs; for each 8 inputs (k..k+7), 4 x 32 bytes (outputs 0-7, 8-15, 16-23, 24-31);
// dword j of a 32-byte line = output j: nibble s (bits 4s..4s+3) = w[k+2s], nibble s+4 (bits 16+4s..) = w[k+2s+1].
AVX2_TARGET static void new_kernel(const uint8_t* packed, const int16_t* xi, int32_t* y, int N, int K) {
    const __m256i M4 = _mm256_set1_epi32(0x000F000F);
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < N / 32; b++) {
        const uint8_t* line = packed + (size_t)b * K * 16;
        __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int k = 0; k < K; k += 8, line += 128) {
            _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);
            _mm_prefetch((const char*)(line + PREFETCH + 64), _MM_HINT_T0);
            const int32_t* xp = (const int32_t*)(xi + k);
            const __m256i x0 = _mm256_set1_epi32(xp[0]), x1 = _mm256_set1_epi32(xp[1]);
            const __m256i x2 = _mm256_set1_epi32(xp[2]), x3 = _mm256_set1_epi32(xp[3]);
            for (int q = 0; q < 4; q++) {
                const __m256i d = _mm256_loadu_si256((const __m256i*)(line + 32 * q));
                __m256i s = _mm256_madd_epi16(_mm256_and_si256(d, M4), x0);
                s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi32(d, 4), M4), x1));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi32(d, 8), M4), x2));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi32(d, 12), M4), x3));
                acc[q] = _mm256_add_epi32(acc[q], s);
            }
        }
        for (int q = 0; q < 4; q++) _mm256_storeu_si256((__m256i*)(y + b * 32 + 8 * q), acc[q]);
    }
}

// old: the shipped avx2-int16 loop (rows = 1, two accumulator sets, integer part only) on torch's AVX2 layout.
AVX2_TARGET static void old_kernel(const uint8_t* packed, const int16_t* xi, int32_t* y, int N, int K) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < N / 32; b++) {
        const uint8_t* line = packed + (size_t)b * K * 16;
        __m256i acc[2][4];
        for (int t = 0; t < 2; t++) for (int q = 0; q < 4; q++) acc[t][q] = _mm256_setzero_si256();
        for (int p = 0; p < K / 2; p++, line += 32) {
            const int t = p & 1;
            _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);
            const __m256i v = _mm256_loadu_si256((const __m256i*)line);
            const __m256i lo = _mm256_and_si256(v, nib);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
            const __m128i lo_k = _mm256_castsi256_si128(lo), lo_k1 = _mm256_extracti128_si256(lo, 1);
            const __m128i hi_k = _mm256_castsi256_si128(hi), hi_k1 = _mm256_extracti128_si256(hi, 1);
            const __m256i w[4] = {_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(lo_k, lo_k1)),
                                  _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(lo_k, lo_k1)),
                                  _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(hi_k, hi_k1)),
                                  _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(hi_k, hi_k1))};
            const __m256i xb = _mm256_set1_epi32(((const int32_t*)xi)[p]);
            for (int q = 0; q < 4; q++) acc[t][q] = _mm256_add_epi32(acc[t][q], _mm256_madd_epi16(w[q], xb));
        }
        for (int q = 0; q < 4; q++) _mm256_storeu_si256((__m256i*)(y + b * 32 + 8 * q), _mm256_add_epi32(acc[0][q], acc[1][q]));
    }
}


// mid: torch's AVX2 layout kept; two 16-byte broadcasts (inputs k, k+1) interleave into byte pairs (q_k, q_k+1) per
// output in natural order; x = 256 xh + xl as byte planes; vpmaddubsw (xl, q) and (q, xh) sum in int16 for 4 pairs,
// then widen with vpmaddwd by (1, 256).
AVX2_TARGET static void mid_kernel(const uint8_t* packed, const uint32_t* xl2, const uint32_t* xh2, int32_t* y, int N, int K) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const __m256i w256 = _mm256_set1_epi32(0x01000001);  // int16 pairs (1, 256)
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < N / 32; b++) {
        const uint8_t* line = packed + (size_t)b * K * 16;
        __m256i a32[4];  // [half][U/V]
        for (int i = 0; i < 4; i++) a32[i] = _mm256_setzero_si256();
        for (int p0 = 0; p0 < K / 2; p0 += 4) {
            __m256i L[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, H[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
            for (int p = p0; p < p0 + 4; p++, line += 32) {
                _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);
                const __m256i A = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)line));
                const __m256i B = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(line + 16)));
                const __m256i P = _mm256_blend_epi32(_mm256_unpacklo_epi8(A, B), _mm256_unpackhi_epi8(A, B), 0xF0);
                const __m256i w0 = _mm256_and_si256(P, nib), w1 = _mm256_and_si256(_mm256_srli_epi16(P, 4), nib);
                const __m256i xl = _mm256_set1_epi32((int)xl2[p]), xh = _mm256_set1_epi32((int)xh2[p]);
                L[0] = _mm256_add_epi16(L[0], _mm256_maddubs_epi16(xl, w0));
                H[0] = _mm256_add_epi16(H[0], _mm256_maddubs_epi16(w0, xh));
                L[1] = _mm256_add_epi16(L[1], _mm256_maddubs_epi16(xl, w1));
                H[1] = _mm256_add_epi16(H[1], _mm256_maddubs_epi16(w1, xh));
            }
            for (int h = 0; h < 2; h++) {
                a32[2 * h] = _mm256_add_epi32(a32[2 * h], _mm256_madd_epi16(_mm256_unpacklo_epi16(L[h], H[h]), w256));
                a32[2 * h + 1] = _mm256_add_epi32(a32[2 * h + 1], _mm256_madd_epi16(_mm256_unpackhi_epi16(L[h], H[h]), w256));
            }
        }
        for (int h = 0; h < 2; h++) {
            _mm256_storeu_si256((__m256i*)(y + b * 32 + 16 * h), _mm256_permute2x128_si256(a32[2 * h], a32[2 * h + 1], 0x20));
            _mm256_storeu_si256((__m256i*)(y + b * 32 + 16 * h + 8), _mm256_permute2x128_si256(a32[2 * h], a32[2 * h + 1], 0x31));
        }
    }
}

static double now(void) { return omp_get_wtime(); }

static int nib_new(const uint8_t* p, int K, int n, int k) {  // weight (n, k) in the new layout
    const int b = n / 32, q = (n % 32) / 8, j = n % 8, c = k / 8, r = k % 8;
    const uint32_t d = ((const uint32_t*)(p + (size_t)b * K * 16 + (size_t)c * 128 + 32 * q))[j];
    const int s = r / 2, hi = r % 2;
    return (d >> (4 * s + 16 * hi)) & 15;
}
static int nib_old(const uint8_t* p, int K, int n, int k) {  // torch's AVX2 layout
    const int b = n / 32, j = n % 32;
    const uint8_t byte = p[(size_t)b * K * 16 + (size_t)k * 16 + (j % 16)];
    return j < 16 ? byte & 15 : byte >> 4;
}

int main(void) {
    int shapes[][3] = {{1152, 896, 24}, {896, 896, 24}, {9728, 896, 24}, {896, 4864, 24}, {151936, 896, 1},
                       {2048, 1536, 28}, {1536, 1536, 28}, {17920, 1536, 28}, {1536, 8960, 28}, {151936, 1536, 1}};
    double tot[2][3][2] = {{{0}}};  // model, kernel, hot/streamed
    for (int s = 0; s < 10; s++) {
        const int N = shapes[s][0], K = shapes[s][1], cnt = shapes[s][2], model = s >= 5;
        const size_t bytes = (size_t)N * K / 2;
        const int copies = (int)(300e6 / bytes) + 1;
        uint8_t* base = aligned_alloc(64, bytes * copies);
        for (size_t i = 0; i < bytes * copies; i++) base[i] = (uint8_t)(rand() >> 7);
        int16_t* xi = aligned_alloc(64, K * 2);
        for (int k = 0; k < K; k++) xi[k] = (int16_t)((rand() % 65535) - 32767);
        uint32_t* xl2 = aligned_alloc(64, K * 2); uint32_t* xh2 = aligned_alloc(64, K * 2);
        for (int p = 0; p < K / 2; p++) {
            const uint32_t l = (uint8_t)xi[2 * p] | (uint32_t)(uint8_t)xi[2 * p + 1] << 8;
            const uint32_t h = (uint8_t)(xi[2 * p] >> 8) | (uint32_t)(uint8_t)(xi[2 * p + 1] >> 8) << 8;
            xl2[p] = l | l << 16; xh2[p] = h | h << 16;
        }
        int32_t* y = aligned_alloc(64, N * 4);
        int32_t* y3 = aligned_alloc(64, N * 4);
        int32_t* y2 = aligned_alloc(64, N * 4);
        // correctness of both kernels against a scalar sum, on copy 0
        new_kernel(base, xi, y, N, K);
        old_kernel(base, xi, y2, N, K);
        mid_kernel(base, xl2, xh2, y3, N, K);
        for (int n = 0; n < N; n++) if (y3[n] != y2[n]) { printf("MID MISMATCH %d %d at %d: %d %d\n", N, K, n, y3[n], y2[n]); return 1; }
        for (int n = 0; n < N; n += 97) {
            long a = 0, o = 0;
            for (int k = 0; k < K; k++) { a += (long)nib_new(base, K, n, k) * xi[k]; o += (long)nib_old(base, K, n, k) * xi[k]; }
            if (a != y[n] || o != y2[n]) { printf("MISMATCH %d %d: %ld %d / %ld %d\n", N, K, a, y[n], o, y2[n]); return 1; }
        }
        for (int kern = 0; kern < 3; kern++)
            for (int hot = 0; hot < 2; hot++) {
                const int reps = hot ? 200 : 30 * copies;
                double best = 1e9;
                for (int rep3 = 0; rep3 < 3; rep3++) {
                    double t0 = now();
                    for (int i = 0; i < reps; i++) {
                        const uint8_t* p = base + (hot ? 0 : (size_t)(i % copies) * bytes);
                        if (kern == 1) new_kernel(p, xi, y, N, K); else if (kern == 2) mid_kernel(p, xl2, xh2, y, N, K); else old_kernel(p, xi, y, N, K);
                    }
                    double us = (now() - t0) / reps * 1e6;
                    if (us < best) best = us;
                }
                tot[model][kern][hot ? 0 : 1] += best * cnt;
                printf("%6d x %5d %s %s %8.1f us  %.1f GB/s\n", N, K, kern == 1 ? "new" : kern == 2 ? "mid" : "old", hot ? "hot " : "strm", best, bytes / best / 1e3);
            }
        free(base); free(xi); free(y); free(y2); free(y3); free(xl2); free(xh2);
    }
    for (int m = 0; m < 2; m++)
        printf("%s per token: old hot %.2f ms, streamed %.2f ms; new hot %.2f ms, streamed %.2f ms; mid hot %.2f, streamed %.2f\n", m ? "1.5B" : "0.5B",
               tot[m][0][0] / 1e3, tot[m][0][1] / 1e3, tot[m][1][0] / 1e3, tot[m][1][1] / 1e3, tot[m][2][0] / 1e3, tot[m][2][1] / 1e3);
    return 0;
}
