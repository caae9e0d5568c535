// Ponder's own AVX2 int4 layout ("p32") and the int16 kernels that read it.
//
// torch's AVX2 packing (blocks of 32 outputs; for each input k 16 bytes, byte j holding output j low and output
// j + 16 high) needs four unpacks and four vpmovzxbw per two inputs before vpmaddwd can multiply, so on AVX2 the
// int16 paths are bound by shuffles, not by memory (bench/int4_layouts.c: the same loop takes as long with the
// weights in cache as streamed). p32 keeps torch's blocks of 32 outputs and K * 16 bytes, so a block starts where it
// did and rows of a matrix still slice and concatenate by blocks, but orders a block's bytes so that one vpand and
// one vpsrld per 8 outputs give the int16 pairs (q_k, q_k+1) vpmaddwd takes:
//   for each 8 inputs k0..k0+7, 4 lines of 32 bytes (outputs 0-7, 8-15, 16-23, 24-31); dword j of line l is output
//   8l + j, its nibble s (bits 4s..4s+3) input k0 + 2s and its nibble s + 4 (bits 16 + 4s..) input k0 + 2s + 1.
// The sums are exact int32 as on torch's layout (ISA_AVX2I16, ISA_AVXVNNI), so each path gives the same bits on
// either layout. Weights are moved into p32 once, at load (models.int4_kernel.to_p32), in place.
#include "_int4.h"

// One block's nibble (output n, input k) in torch's AVX2 layout and in p32.
static inline int torch_nibble(const uint8_t* blk, int n, int k) {
    const uint8_t byte = blk[(size_t)k * 16 + (n & 15)];
    return n < 16 ? byte & 15 : byte >> 4;
}

static inline void p32_put(uint8_t* blk, int n, int k, int q) {
    uint32_t* d = (uint32_t*)(blk + (size_t)(k / 8) * 128 + (n / 8) * 32) + n % 8;
    const int r = k % 8;
    *d |= (uint32_t)q << (4 * (r / 2) + 16 * (r % 2));
}

static inline int p32_nibble(const uint8_t* blk, int n, int k) {
    const uint32_t d = ((const uint32_t*)(blk + (size_t)(k / 8) * 128 + (n / 8) * 32))[n % 8];
    const int r = k % 8;
    return (int)(d >> (4 * (r / 2) + 16 * (r % 2))) & 15;
}

// Moves every block of N x K int4 weights between torch's AVX2 layout and p32 (to_p32: that way, else back), in
// place. Returns -1 where a block's scratch cannot be allocated (nothing changed then), else 0.
int p32_repack(uint8_t* packed, int N, int K, int to_p32) {
    const size_t bytes = (size_t)K * 16;
    const int blocks = N / 32;
    int failed = 0;
    #pragma omp parallel
    {
        uint8_t* copy = (uint8_t*)malloc(bytes);
        #pragma omp atomic
        failed += copy == NULL;
        #pragma omp barrier
        if (!failed) {
            #pragma omp for schedule(static)
            for (int b = 0; b < blocks; b++) {
                uint8_t* blk = packed + (size_t)b * bytes;
                memcpy(copy, blk, bytes);
                if (to_p32) {
                    memset(blk, 0, bytes);
                    for (int k = 0; k < K; k++)
                        for (int n = 0; n < 32; n++) p32_put(blk, n, k, torch_nibble(copy, n, k));
                } else {
                    for (int k = 0; k < K; k++)
                        for (int j = 0; j < 16; j++)
                            blk[(size_t)k * 16 + j] = (uint8_t)(p32_nibble(copy, j, k) | p32_nibble(copy, j + 16, k) << 4);
                }
            }
        }
        free(copy);
    }
    return failed ? -1 : 0;
}

// Up to 2 rows over one block of 32 outputs in p32; xi as int16 (pairs read as int32), xscale and xsum one per row
// and group, as ISA_AVX2I16 takes them; the group step is the same: out += s * xscale * acc + (z - 8 s) * xsum.
#define DEFINE_P32(NAME, TARGET, DOT)                                                                                     \
TARGET static inline __attribute__((always_inline)) void block_rows_##NAME(const uint8_t* blk,                             \
        const uint32_t* scales32, const int16_t* xi, const float* xscale, const float* xsum, float* out,                   \
        uint16_t* y, const int rows, int n0, int N, int K, int group) {                                                    \
    const __m256i m4 = _mm256_set1_epi32(0x000F000F);                                                                      \
    const int groups = K / group, eights = group / 8;                                                                      \
    for (int i = 0; i < rows * 32; i++) out[i] = 0.0f;                                                                     \
    const uint8_t* line = blk;  /* 128 bytes per 8 inputs */                                                               \
    for (int g = 0; g < groups; g++) {                                                                                     \
        prefetch_scales(scales32 + (size_t)g * N + n0, 32);                                                                \
        const int sets = rows == 1 ? 2 : 1;                                                                                \
        __m256i acc[2][2][4];                                                                                              \
        avx2_zero_acc(acc, sets, rows);                                                                                    \
        for (int c = g * eights; c < (g + 1) * eights; c++, line += 128) {                                                 \
            const int t = sets == 2 ? (c & 1) : 0;                                                                         \
            _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);                                                     \
            _mm_prefetch((const char*)(line + PREFETCH + 64), _MM_HINT_T0);                                                \
            for (int l = 0; l < 4; l++) {                                                                                  \
                const __m256i d = _mm256_loadu_si256((const __m256i*)(line + 32 * l));                                     \
                const __m256i w0 = _mm256_and_si256(d, m4), w1 = _mm256_and_si256(_mm256_srli_epi32(d, 4), m4);            \
                const __m256i w2 = _mm256_and_si256(_mm256_srli_epi32(d, 8), m4);                                          \
                const __m256i w3 = _mm256_and_si256(_mm256_srli_epi32(d, 12), m4);                                         \
                for (int r = 0; r < rows; r++) {                                                                           \
                    const int32_t* xp = (const int32_t*)(xi + (size_t)r * K + 8 * c);                                      \
                    __m256i a = DOT(acc[t][r][l], w0, _mm256_set1_epi32(xp[0]));                                           \
                    a = DOT(a, w1, _mm256_set1_epi32(xp[1]));                                                              \
                    a = DOT(a, w2, _mm256_set1_epi32(xp[2]));                                                              \
                    acc[t][r][l] = DOT(a, w3, _mm256_set1_epi32(xp[3]));                                                   \
                }                                                                                                          \
            }                                                                                                              \
        }                                                                                                                  \
        if (sets == 2)                                                                                                     \
            for (int l = 0; l < 4; l++) acc[0][0][l] = _mm256_add_epi32(acc[0][0][l], acc[1][0][l]);                       \
        avx2_int_group(scales32 + (size_t)g * N + n0, acc[0], xscale, xsum, out, rows, g, groups);                         \
    }                                                                                                                      \
    avx2_store_rows(out, y, rows, n0, N);                                                                                  \
}

#define DOT_P32VNNI(acc, w, x) _mm256_dpwssd_avx_epi32(acc, w, x)
#define DOT_P32I16(acc, w, x) _mm256_add_epi32(acc, _mm256_madd_epi16(w, x))
DEFINE_P32(p32vnni, AVXVNNI_TARGET, DOT_P32VNNI)
DEFINE_AVX2_BLOCKS(p32vnni, AVXVNNI_TARGET, )
DEFINE_P32(p32i16_rows, AVX2_TARGET, DOT_P32I16)

// ISA_AVX2I16's one-row step on p32 (decode), with fewer operations a line and the same int32 sums: the nibbles at
// bits 4-7 of each int16 are taken in place, as 16 q (vpand with 0x00F0), so a line needs one vpsrld (by 8) and four
// vpand where the form above needs three and four. Their products go to an accumulator of their own, folded in as
// hi >> 4 (exact: a multiple of 16) at most every 256 inputs, before it could overflow (128 * 15 * 16 * 32767 < 2^31).
// vpmaddwd + vpaddd have no latency chain worth splitting, so one set of accumulators.
AVX2_TARGET static inline __attribute__((always_inline)) void block_row1_p32i16(const uint8_t* blk,
        const uint32_t* scales32, const int16_t* xi, const float* xscale, const float* xsum, float* out, uint16_t* y,
        int n0, int N, int K, int group) {
    const __m256i m1 = _mm256_set1_epi32(0x000F000F), m16 = _mm256_set1_epi32(0x00F000F0);
    const int groups = K / group, eights = group / 8;
    for (int i = 0; i < 32; i++) out[i] = 0.0f;
    const uint8_t* line = blk;  /* 128 bytes per 8 inputs */
    for (int g = 0; g < groups; g++) {
        prefetch_scales(scales32 + (size_t)g * N + n0, 32);
        __m256i acc[2][4], hi[4];
        for (int l = 0; l < 4; l++) acc[0][l] = hi[l] = _mm256_setzero_si256();
        for (int e = 0; e < eights; e++, line += 128) {
            _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);
            _mm_prefetch((const char*)(line + PREFETCH + 64), _MM_HINT_T0);
            const int32_t* xp = (const int32_t*)(xi + (size_t)8 * (g * eights + e));
            const __m256i x0 = _mm256_set1_epi32(xp[0]), x1 = _mm256_set1_epi32(xp[1]);
            const __m256i x2 = _mm256_set1_epi32(xp[2]), x3 = _mm256_set1_epi32(xp[3]);
            for (int l = 0; l < 4; l++) {
                const __m256i d = _mm256_loadu_si256((const __m256i*)(line + 32 * l));
                const __m256i d8 = _mm256_srli_epi32(d, 8);
                const __m256i lo = _mm256_add_epi32(_mm256_madd_epi16(_mm256_and_si256(d, m1), x0),
                                                    _mm256_madd_epi16(_mm256_and_si256(d8, m1), x2));
                const __m256i h = _mm256_add_epi32(_mm256_madd_epi16(_mm256_and_si256(d, m16), x1),
                                                   _mm256_madd_epi16(_mm256_and_si256(d8, m16), x3));
                acc[0][l] = _mm256_add_epi32(acc[0][l], lo);
                hi[l] = _mm256_add_epi32(hi[l], h);
            }
            if ((e & 31) == 31 || e == eights - 1)
                for (int l = 0; l < 4; l++) {
                    acc[0][l] = _mm256_add_epi32(acc[0][l], _mm256_srai_epi32(hi[l], 4));
                    hi[l] = _mm256_setzero_si256();
                }
        }
        avx2_int_group(scales32 + (size_t)g * N + n0, acc, xscale, xsum, out, 1, g, groups);
    }
    avx2_store_rows(out, y, 1, n0, N);
}

AVX2_TARGET static inline __attribute__((always_inline)) void block_rows_p32i16(const uint8_t* blk,
        const uint32_t* scales32, const int16_t* xi, const float* xscale, const float* xsum, float* out,
        uint16_t* y, const int rows, int n0, int N, int K, int group) {
    if (rows == 1) block_row1_p32i16(blk, scales32, xi, xscale, xsum, out, y, n0, N, K, group);
    else block_rows_p32i16_rows(blk, scales32, xi, xscale, xsum, out, y, rows, n0, N, K, group);
}
DEFINE_AVX2_BLOCKS(p32i16, AVX2_TARGET, )
