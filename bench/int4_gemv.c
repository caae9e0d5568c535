// A candidate int4 GEMV kernel for one decode row, measured by bench/int4_gemv.py (not used by the app).
// y = W x, W int4 with torch's tinygemm semantics (w = (q - 8) * scale + zero, one scale/zero per 128 inputs),
// x bf16. Each nibble q becomes the bf16 number 128 + q by OR-ing 0x4300 into it (no lookup table), products
// with x are exact in AVX512-BF16's vdpbf16ps and summed in fp32, and the 128 + 8 offset is taken out per group
// with the group's sum of x: sum_k w_k x_k = sum_g [ s_g * sum (128 + q) x + (z_g - 136 s_g) * sum x ].
// Software prefetch PF bytes ahead keeps the weight stream near the machine's bandwidth.
#include <immintrin.h>
#include <stdint.h>
#include <omp.h>
#ifndef PF
#define PF 2048
#endif
// packed: for each block of 16 rows nb, for each pair-of-pairs pp (K/4): 32 bytes
//   byte l: low nibble = q[n0 + l/2][4pp + l%2], high nibble = q[n0 + l/2][4pp + 2 + l%2]
// scale, zero: float [K/128][N]
// x: bf16 [K] (as uint16), xsum: float [K/128]
void gemv(const uint8_t* packed, const float* scale, const float* zero, const uint16_t* x, const float* xsum,
          float* y, int N, int K) {
    const int G = K / 128;
    const int NB = N / 16;
    const __m512i m4 = _mm512_set1_epi16(0x0F);
    const __m512i magic = _mm512_set1_epi16(0x4300);  // bf16(128 + q) = 0x4300 | q
    const uint32_t* xp = (const uint32_t*)x;  // bf16 pairs
    #pragma omp parallel for schedule(static)
    for (int nb = 0; nb < NB; nb++) {
        const uint8_t* b = packed + (size_t)nb * (K / 4) * 32;
        __m512 out = _mm512_setzero_ps();
        for (int g = 0; g < G; g++) {
            __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
            __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
            for (int pp = g * 32; pp < g * 32 + 32; pp += 2) {
                _mm_prefetch((const char*)(b + (size_t)pp * 32 + PF), _MM_HINT_T0);
                __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(b + (size_t)pp * 32)));
                __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(b + (size_t)pp * 32 + 32)));
                __m512i lo = _mm512_or_si512(_mm512_and_si512(w, m4), magic);
                __m512i hi = _mm512_or_si512(_mm512_srli_epi16(w, 4), magic);
                __m512i lo2 = _mm512_or_si512(_mm512_and_si512(v, m4), magic);
                __m512i hi2 = _mm512_or_si512(_mm512_srli_epi16(v, 4), magic);
                acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)lo, (__m512bh)_mm512_set1_epi32((int)xp[2 * pp]));
                acc1 = _mm512_dpbf16_ps(acc1, (__m512bh)hi, (__m512bh)_mm512_set1_epi32((int)xp[2 * pp + 1]));
                acc2 = _mm512_dpbf16_ps(acc2, (__m512bh)lo2, (__m512bh)_mm512_set1_epi32((int)xp[2 * pp + 2]));
                acc3 = _mm512_dpbf16_ps(acc3, (__m512bh)hi2, (__m512bh)_mm512_set1_epi32((int)xp[2 * pp + 3]));
            }
            acc0 = _mm512_add_ps(acc0, acc2); acc1 = _mm512_add_ps(acc1, acc3);
            __m512 s = _mm512_loadu_ps(scale + (size_t)g * N + nb * 16);
            __m512 z = _mm512_loadu_ps(zero + (size_t)g * N + nb * 16);
            out = _mm512_fmadd_ps(s, _mm512_add_ps(acc0, acc1), out);
            out = _mm512_fmadd_ps(_mm512_fnmadd_ps(s, _mm512_set1_ps(136.0f), z), _mm512_set1_ps(xsum[g]), out);  // (z - 136 s) sum x
        }
        _mm512_storeu_ps(y + nb * 16, out);
    }
}
int threads(void) { int n = 0;
#pragma omp parallel
  {
#pragma omp atomic
    n++;
  }
  return n; }
