// Shared by Ponder's int4 kernel sources (models/_int4.c: the module and the layouts torch packs;
// models/_int4_p32.c: Ponder's own AVX2 layout): instruction sets, build targets and small inline helpers.
#ifndef PONDER_INT4_H
#define PONDER_INT4_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROWS 16
#ifndef PREFETCH
#define PREFETCH 2048
#endif

#define KERNEL_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16,avx512vbmi")))
#define F512_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,fma")))
#define AVX2_TARGET __attribute__((target("avx2,fma")))
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512vnni,fma")))
#define AVXVNNI_TARGET __attribute__((target("avx2,fma,avxvnni")))
#define MAX_VNNI_GROUP 2048  // 15 * 32767 * 2048 < 2^31: a group's integer sum cannot overflow

// ISA_P32I16 / ISA_P32VNNI: ISA_AVX2I16's and ISA_AVXVNNI's arithmetic on Ponder's AVX2 layout (_int4_p32.c).
enum { ISA_BF16 = 0, ISA_AVX512 = 1, ISA_AVX2 = 2, ISA_VNNI = 3, ISA_AVXVNNI = 4, ISA_A8 = 5, ISA_AVX2I16 = 6,
       ISA_AVX2A8 = 7, ISA_P32I16 = 8, ISA_P32VNNI = 9, ISA_LAST = ISA_P32VNNI };

// A group's scales and zero points (`outputs` uint32 at a stride of N per group) are read after its multiply-adds,
// at a stride no hardware prefetcher follows across many groups: asking for them as the group starts hides the miss.
static inline __attribute__((always_inline)) void prefetch_scales(const uint32_t* sz, const int outputs) {
    const char* at = (const char*)sz;
    for (int b = 0; b < outputs * 4; b += 64) _mm_prefetch(at + b, _MM_HINT_T0);
    _mm_prefetch(at + outputs * 4 - 1, _MM_HINT_T0);
}

// fp32 to bf16, to nearest even (as vcvtneps2bf16 rounds finite values).
AVX2_TARGET static inline __m128i bf16_256(__m256 v) {
    const __m256i b = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// Zeroes the int16 AVX2 paths' accumulators of one group: `sets` alternating sets (2 for one row: exact integer sums,
// so splitting one row's changes nothing) of `rows` rows x 4 lines of 8 outputs.
AVX2_TARGET static inline __attribute__((always_inline)) void avx2_zero_acc(__m256i acc[2][2][4], const int sets,
                                                                           const int rows) {
    for (int t = 0; t < sets; t++)
        for (int r = 0; r < rows; r++)
            for (int l = 0; l < 4; l++) acc[t][r][l] = _mm256_setzero_si256();
}

// The int16 AVX2 paths' group step (ISA_AVXVNNI, ISA_AVX2I16 and their p32 forms), for up to 2 rows of 32 outputs:
// out += s * xscale * acc + (z - 8 s) * xsum, acc[r][l] holding outputs 8l..8l+7's exact sums of q * x.
AVX2_TARGET static inline __attribute__((always_inline)) void avx2_int_group(const uint32_t* sz, __m256i acc[2][4],
        const float* xscale, const float* xsum, float* out, const int rows, int g, int groups) {
    for (int l = 0; l < 4; l++) {
        const __m256i packed = _mm256_loadu_si256((const __m256i*)(sz + 8 * l));
        const __m256 s = _mm256_castsi256_ps(_mm256_slli_epi32(packed, 16));
        const __m256 z = _mm256_castsi256_ps(_mm256_and_si256(packed, _mm256_set1_epi32((int)0xFFFF0000u)));
        const __m256 offset = _mm256_fnmadd_ps(s, _mm256_set1_ps(8.0f), z);
        for (int r = 0; r < rows; r++) {
            const __m256 sx = _mm256_mul_ps(s, _mm256_set1_ps(xscale[r * groups + g]));
            __m256 o = _mm256_fmadd_ps(sx, _mm256_cvtepi32_ps(acc[r][l]), _mm256_loadu_ps(out + r * 32 + 8 * l));
            o = _mm256_fmadd_ps(offset, _mm256_set1_ps(xsum[r * groups + g]), o);
            _mm256_storeu_ps(out + r * 32 + 8 * l, o);
        }
    }
}

// Rounds `rows` rows of 32 fp32 sums in `out` to bf16 into y (row stride N, from output n0).
AVX2_TARGET static inline __attribute__((always_inline)) void avx2_store_rows(const float* out, uint16_t* y,
                                                                             const int rows, int n0, int N) {
    for (int r = 0; r < rows; r++)
        for (int l = 0; l < 4; l++)
            _mm_storeu_si128((__m128i*)(y + (size_t)r * N + n0 + 8 * l), bf16_256(_mm256_loadu_ps(out + r * 32 + 8 * l)));
}

// blocks_NAME: the int16 AVX2 paths over every block of 32 outputs (K * 16 bytes in either layout), 2 rows a pass of
// block_rows_NAME(blk, scales32, xi, xscale, xsum, out, y, rows, n0, N, K, group).
#define DEFINE_AVX2_BLOCKS(NAME, TARGET, LINKAGE)                                                                       \
LINKAGE TARGET void blocks_##NAME(const uint8_t* packed, const uint32_t* scales32, const int16_t* xi,                      \
                                  const float* xscale, const float* xsum, uint16_t* y, int M, int N, int K, int group) {   \
    const int groups = K / group;                                                                                          \
    _Pragma("omp parallel for schedule(static)")                                                                           \
    for (int b = 0; b < N / 32; b++) {                                                                                     \
        float out[2 * 32] __attribute__((aligned(32)));                                                                    \
        const uint8_t* blk = packed + (size_t)b * K * 16;                                                                  \
        for (int m = 0; m < M; m += 2) {                                                                                   \
            const int16_t* xm = xi + (size_t)m * K;                                                                        \
            const float* cm = xscale + m * groups;                                                                         \
            const float* sm = xsum + m * groups;                                                                           \
            uint16_t* ym = y + (size_t)m * N;                                                                              \
            if (M - m >= 2) block_rows_##NAME(blk, scales32, xm, cm, sm, out, ym, 2, b * 32, N, K, group);                 \
            else block_rows_##NAME(blk, scales32, xm, cm, sm, out, ym, 1, b * 32, N, K, group);                            \
        }                                                                                                                  \
    }                                                                                                                      \
}

// _int4_p32.c
void blocks_p32i16(const uint8_t* packed, const uint32_t* scales32, const int16_t* xi, const float* xscale,
                   const float* xsum, uint16_t* y, int M, int N, int K, int group);
void blocks_p32vnni(const uint8_t* packed, const uint32_t* scales32, const int16_t* xi, const float* xscale,
                    const float* xsum, uint16_t* y, int M, int N, int K, int group);
int p32_repack(uint8_t* packed, int N, int K, int to_p32);
#endif
