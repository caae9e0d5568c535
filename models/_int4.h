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

// _int4_p32.c
void blocks_p32i16(const uint8_t* packed, const uint32_t* scales32, const int16_t* xi, const float* xscale,
                   const float* xsum, uint16_t* y, int M, int N, int K, int group);
void blocks_p32vnni(const uint8_t* packed, const uint32_t* scales32, const int16_t* xi, const float* xscale,
                    const float* xsum, uint16_t* y, int M, int N, int K, int group);
int p32_repack(uint8_t* packed, int N, int K, int to_p32);
#endif
