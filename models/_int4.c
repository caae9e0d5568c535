// Ponder's int4 matmul for decode rows (1..16 rows of bf16 activations), on torch's own packed int4 layout.
//
// y[m] = W x[m] with W in torch's `_convert_weight_to_int4pack_for_cpu` layout and tinygemm semantics
// (w = (q - 8) * scale + zero, one bf16 scale/zero pair per `group` inputs, `scales` shaped [K/group, N, 2]).
// The layout (probed, see tests/models/test_int4_kernel.py): for each block of 64 outputs, for each input k,
// 32 bytes; byte j holds output j's nibble low and output j + 32's nibble high. So one 64-byte line is two
// consecutive inputs of 64 outputs. One vpermt2b per 16 outputs turns nibble pairs into bf16 pairs
// (128 + q, the bf16 bit pattern 0x4300 | q), vdpbf16ps multiplies them with the input pair exactly and sums
// in fp32, and the 136 (128 + 8) offset comes out per group with the group's sum of x:
//   sum_k w_k x_k = sum_g [ s_g * sum_k (128 + q_k) x_k + (z_g - 136 s_g) * sum_k x_k ].
// Each row's arithmetic is the same whatever the number of rows, so batched and one-at-a-time decoding agree.
//
// Eight paths, chosen per call (`isa`), each for the layout torch packs for its CPU capability:
//   ISA_BF16   AVX512-BF16 + VBMI, torch's AVX512 layout (above): vdpbf16ps on bf16 pairs.
//   ISA_AVX512 AVX-512 F/BW + VBMI without BF16 (Ice Lake, Sapphire Rapids with BF16 masked): the same layout;
//              one vpermt2b per 16 outputs makes the fp32 value 128 + q directly (bits 0x43000000 | q << 16),
//              and fp32 FMAs multiply it by x exactly; the same offset formula as ISA_BF16.
//   ISA_AVX2   AVX2 + FMA (most laptops), torch's AVX2 layout: blocks of 32 outputs, for each input k 16 bytes,
//              byte j holding output j low and output j + 16 high; q as fp32 by vpmovzxbd + vcvtdq2ps, and
//              sum_k w_k x_k = sum_g [ s_g * sum_k q_k x_k + (z_g - 8 s_g) * sum_k x_k ].
//   ISA_VNNI   AVX-512 VNNI + VBMI without BF16: the same layout; x is held as int16 with one fp32 scale per
//              group (max |x| / 32767, so a group's error is at most 2^-16 of its largest input), the same
//              vpermt2b makes int16 pairs (q_k, q_k+1) and vpdpwssd sums q * x exactly in int32, 32 products an
//              instruction as vdpbf16ps does; then s_g * xscale_g * sum_k q_k x_k + (z_g - 8 s_g) * sum_k x_k.
//   ISA_AVXVNNI AVX2 + AVX-VNNI (Intel Core 12th gen and later, AMD Zen 5): torch's AVX2 layout with the int16
//              activations of ISA_VNNI; two consecutive 16-byte lines (inputs k, k+1) interleave into int16 pairs
//              (q_k, q_k+1) per output and the VEX vpdpwssd sums 16 products an instruction, where ISA_AVX2's FMA
//              does 8 after converting every nibble to fp32.
//   ISA_AVX2I16 AVX2 + FMA without AVX-VNNI: ISA_AVXVNNI's arithmetic with vpmaddwd + vpaddd for vpdpwssd (the same
//              exact int32 sums, so the same bits), and the activations' int16 rounding vectorised.
//   ISA_AVX2A8 AVX2, opt-in (`PONDER_INT4_KERNEL=avx2-a8`): torch's AVX2 layout with x held as int8 per 32 inputs
//              (W4A8, as llama.cpp's Q4_0 x Q8_0 on AVX2); vpmaddubsw sums u8 weight x s8 input pairs (below).
//   ISA_A8     AVX-512 VNNI + VBMI, opt-in (`PONDER_INT4_KERNEL=avx512-a8`): torch's AVX512 layout with x held as
//              int8 per group (max |x| / 127, one fp32 scale a row and group), so it computes with rounded
//              activations (W4A8, as llama.cpp's Q4_0 x Q8_0 does). Two consecutive lines (inputs 4t..4t+3) make,
//              with one vpermt2b per 16 outputs, four u8 weights a dword, and vpdpbusd sums 64 products an
//              instruction, twice vdpbf16ps's 32: the lever where several rows make the step compute-bound.
// The fp32 and int paths round their sums to bf16 to nearest even in software. `features()` says which sets this CPU
// has. Threads: OpenMP, which resolves to torch's own libgomp when torch is loaded first (same soname), so both
// share one pool.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_int4.h"
#include "_int4_api.h"

// Up to 4 rows per pass over a block: 4 rows x 4 output quarters accumulators.
KERNEL_TARGET static inline __attribute__((always_inline)) void block_rows(const uint8_t* blk, const uint32_t* scales32,
                                            const uint16_t* x, const float* xsum, uint16_t* y, const int rows,
                                            int n0, int N, int K, int group) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i magic = _mm512_set1_epi8(0x43);
    const __m512i idx0 = _mm512_set_epi32(
        0x402F400F, 0x402E400E, 0x402D400D, 0x402C400C, 0x402B400B, 0x402A400A, 0x40294009, 0x40284008,
        0x40274007, 0x40264006, 0x40254005, 0x40244004, 0x40234003, 0x40224002, 0x40214001, 0x40204000);
    const __m512i idx1 = _mm512_add_epi8(idx0, _mm512_set1_epi32(0x00100010));
    const int groups = K / group;
    const int pairs = group / 2;
    __m512 out[4][4];
    for (int r = 0; r < rows; r++)
        for (int q = 0; q < 4; q++) out[r][q] = _mm512_setzero_ps();
    const uint8_t* line = blk;
    for (int g = 0; g < groups; g++) {
        prefetch_scales(scales32 + (size_t)g * N + n0, 64);
        __m512 acc[4][4];
        for (int r = 0; r < rows; r++)
            for (int q = 0; q < 4; q++) acc[r][q] = _mm512_setzero_ps();
        for (int p = g * pairs; p < (g + 1) * pairs; p++, line += 64) {
            _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);
            const __m512i v = _mm512_loadu_si512((const void*)line);
            const __m512i lo = _mm512_and_si512(v, nib);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            const __m512i w[4] = {_mm512_permutex2var_epi8(lo, idx0, magic), _mm512_permutex2var_epi8(lo, idx1, magic),
                                  _mm512_permutex2var_epi8(hi, idx0, magic), _mm512_permutex2var_epi8(hi, idx1, magic)};
            for (int r = 0; r < rows; r++) {
                const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)((const uint32_t*)(x + (size_t)r * K))[p]);
                for (int q = 0; q < 4; q++) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], (__m512bh)w[q], xb);
            }
        }
        const uint32_t* sz = scales32 + (size_t)g * N + n0;
        for (int q = 0; q < 4; q++) {
            const __m512i packed = _mm512_loadu_si512((const void*)(sz + 16 * q));
            const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(packed, 16));
            const __m512 z = _mm512_castsi512_ps(_mm512_and_si512(packed, _mm512_set1_epi32((int)0xFFFF0000u)));
            const __m512 offset = _mm512_fnmadd_ps(s, _mm512_set1_ps(136.0f), z);
            for (int r = 0; r < rows; r++) {
                out[r][q] = _mm512_fmadd_ps(s, acc[r][q], out[r][q]);
                out[r][q] = _mm512_fmadd_ps(offset, _mm512_set1_ps(xsum[r * groups + g]), out[r][q]);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int q = 0; q < 4; q++)
            _mm256_storeu_si256((__m256i*)(y + (size_t)r * N + n0 + 16 * q), (__m256i)_mm512_cvtneps_pbh(out[r][q]));
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// fp32 to bf16, to nearest even (as vcvtneps2bf16 rounds finite values).
F512_TARGET static inline __m256i bf16_512(__m512 v) {
    const __m512i b = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16));
}


// The int paths' group step: out += s * xscale * acc + (z - 8 s) * xsum for up to 4 rows of 64 outputs.
VNNI_TARGET static inline __attribute__((always_inline)) void add_int_group(const uint32_t* sz, __m512i acc[4][4],
        const float* xscale, const float* xsum, float* out, const int rows, int g, int groups) {
    for (int q = 0; q < 4; q++) {
        const __m512i packed = _mm512_loadu_si512((const void*)(sz + 16 * q));
        const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(packed, 16));
        const __m512 z = _mm512_castsi512_ps(_mm512_and_si512(packed, _mm512_set1_epi32((int)0xFFFF0000u)));
        const __m512 offset = _mm512_fnmadd_ps(s, _mm512_set1_ps(8.0f), z);
        for (int r = 0; r < rows; r++) {
            const __m512 sx = _mm512_mul_ps(s, _mm512_set1_ps(xscale[r * groups + g]));
            __m512 o = _mm512_fmadd_ps(sx, _mm512_cvtepi32_ps(acc[r][q]), _mm512_loadu_ps(out + r * 64 + 16 * q));
            o = _mm512_fmadd_ps(offset, _mm512_set1_ps(xsum[r * groups + g]), o);
            _mm512_storeu_ps(out + r * 64 + 16 * q, o);
        }
    }
}

// Rounds `rows` rows of 64 fp32 sums in `out` to bf16 into y (row stride N, from output n0).
F512_TARGET static inline __attribute__((always_inline)) void store_rows_bf16(const float* out, uint16_t* y, int rows,
                                                                             int N, int n0) {
    for (int r = 0; r < rows; r++)
        for (int q = 0; q < 4; q++)
            _mm256_storeu_si256((__m256i*)(y + (size_t)r * N + n0 + 16 * q), bf16_512(_mm512_loadu_ps(out + r * 64 + 16 * q)));
}

// ISA_AVX512: up to 4 rows over one block of 64 outputs; xf is x in fp32, out a scratch of rows x 64 floats.
F512_TARGET static inline __attribute__((always_inline)) void block_rows_f512(const uint8_t* blk,
        const uint32_t* scales32, const float* xf, const float* xsum, float* out, uint16_t* y, const int rows,
        int n0, int N, int K, int group) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i magic = _mm512_set1_epi32(0x4300);  // byte 0: 0x00, byte 1: 0x43
    // dword i of idx[o]: bytes (0x40, 0x40, o + i, 0x41) -> 0x00, 0x00, q, 0x43: the fp32 128 + q
    const __m512i base = _mm512_set_epi32(
        0x414F4040, 0x414E4040, 0x414D4040, 0x414C4040, 0x414B4040, 0x414A4040, 0x41494040, 0x41484040,
        0x41474040, 0x41464040, 0x41454040, 0x41444040, 0x41434040, 0x41424040, 0x41414040, 0x41404040);
    const __m512i idx[4] = {_mm512_sub_epi32(base, _mm512_set1_epi32(0x00400000)),
                            _mm512_sub_epi32(base, _mm512_set1_epi32(0x00300000)),
                            _mm512_sub_epi32(base, _mm512_set1_epi32(0x00200000)),
                            _mm512_sub_epi32(base, _mm512_set1_epi32(0x00100000))};
    const int groups = K / group;
    const int pairs = group / 2;
    for (int i = 0; i < rows * 64; i++) out[i] = 0.0f;
    const uint8_t* line = blk;
    for (int g = 0; g < groups; g++) {
        prefetch_scales(scales32 + (size_t)g * N + n0, 64);
        __m512 acc[4][4];
        for (int r = 0; r < rows; r++)
            for (int q = 0; q < 4; q++) acc[r][q] = _mm512_setzero_ps();
        for (int p = g * pairs; p < (g + 1) * pairs; p++, line += 64) {
            _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);
            const __m512i v = _mm512_loadu_si512((const void*)line);
            const __m512i lo = _mm512_and_si512(v, nib);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            for (int e = 0; e < 2; e++) {  // input 2p (bytes 0..31), then 2p + 1 (bytes 32..63)
                const __m512 w[4] = {_mm512_castsi512_ps(_mm512_permutex2var_epi8(lo, idx[2 * e], magic)),
                                     _mm512_castsi512_ps(_mm512_permutex2var_epi8(lo, idx[2 * e + 1], magic)),
                                     _mm512_castsi512_ps(_mm512_permutex2var_epi8(hi, idx[2 * e], magic)),
                                     _mm512_castsi512_ps(_mm512_permutex2var_epi8(hi, idx[2 * e + 1], magic))};
                for (int r = 0; r < rows; r++) {
                    const __m512 xb = _mm512_set1_ps(xf[(size_t)r * K + 2 * p + e]);
                    for (int q = 0; q < 4; q++) acc[r][q] = _mm512_fmadd_ps(w[q], xb, acc[r][q]);
                }
            }
        }
        const uint32_t* sz = scales32 + (size_t)g * N + n0;
        for (int q = 0; q < 4; q++) {
            const __m512i packed = _mm512_loadu_si512((const void*)(sz + 16 * q));
            const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(packed, 16));
            const __m512 z = _mm512_castsi512_ps(_mm512_and_si512(packed, _mm512_set1_epi32((int)0xFFFF0000u)));
            const __m512 offset = _mm512_fnmadd_ps(s, _mm512_set1_ps(136.0f), z);
            for (int r = 0; r < rows; r++) {
                __m512 o = _mm512_fmadd_ps(s, acc[r][q], _mm512_loadu_ps(out + r * 64 + 16 * q));
                o = _mm512_fmadd_ps(offset, _mm512_set1_ps(xsum[r * groups + g]), o);
                _mm512_storeu_ps(out + r * 64 + 16 * q, o);
            }
        }
    }
    store_rows_bf16(out, y, rows, N, n0);
}

// ISA_AVX2: up to 2 rows over one block of 32 outputs (torch's AVX2 layout, 16 bytes per input).
AVX2_TARGET static inline __attribute__((always_inline)) void block_rows_avx2(const uint8_t* blk,
        const uint32_t* scales32, const float* xf, const float* xsum, float* out, uint16_t* y, const int rows,
        int n0, int N, int K, int group) {
    const __m256i nib = _mm256_set1_epi32(0x0F);
    const int groups = K / group;
    for (int i = 0; i < rows * 32; i++) out[i] = 0.0f;
    const uint8_t* line = blk;
    for (int g = 0; g < groups; g++) {
        prefetch_scales(scales32 + (size_t)g * N + n0, 32);
        __m256 acc[2][4];
        for (int r = 0; r < rows; r++)
            for (int q = 0; q < 4; q++) acc[r][q] = _mm256_setzero_ps();
        for (int k = g * group; k < (g + 1) * group; k++, line += 16) {
            _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);
            const __m256i d0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)line));
            const __m256i d1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(line + 8)));
            const __m256 w[4] = {_mm256_cvtepi32_ps(_mm256_and_si256(d0, nib)),
                                 _mm256_cvtepi32_ps(_mm256_and_si256(d1, nib)),
                                 _mm256_cvtepi32_ps(_mm256_srli_epi32(d0, 4)),
                                 _mm256_cvtepi32_ps(_mm256_srli_epi32(d1, 4))};
            for (int r = 0; r < rows; r++) {
                const __m256 xb = _mm256_broadcast_ss(xf + (size_t)r * K + k);
                for (int q = 0; q < 4; q++) acc[r][q] = _mm256_fmadd_ps(w[q], xb, acc[r][q]);
            }
        }
        const uint32_t* sz = scales32 + (size_t)g * N + n0;
        for (int q = 0; q < 4; q++) {
            const __m256i packed = _mm256_loadu_si256((const __m256i*)(sz + 8 * q));
            const __m256 s = _mm256_castsi256_ps(_mm256_slli_epi32(packed, 16));
            const __m256 z = _mm256_castsi256_ps(_mm256_and_si256(packed, _mm256_set1_epi32((int)0xFFFF0000u)));
            const __m256 offset = _mm256_fnmadd_ps(s, _mm256_set1_ps(8.0f), z);
            for (int r = 0; r < rows; r++) {
                __m256 o = _mm256_fmadd_ps(s, acc[r][q], _mm256_loadu_ps(out + r * 32 + 8 * q));
                o = _mm256_fmadd_ps(offset, _mm256_set1_ps(xsum[r * groups + g]), o);
                _mm256_storeu_ps(out + r * 32 + 8 * q, o);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int q = 0; q < 4; q++)
            _mm_storeu_si128((__m128i*)(y + (size_t)r * N + n0 + 8 * q), bf16_256(_mm256_loadu_ps(out + r * 32 + 8 * q)));
}

// ISA_VNNI: up to 4 rows over one block of 64 outputs; xi is x as int16 (pairs read as int32), xscale one
// scale per row and group.
VNNI_TARGET static inline __attribute__((always_inline)) void block_rows_vnni(const uint8_t* blk,
        const uint32_t* scales32, const int16_t* xi, const float* xscale, const float* xsum, float* out,
        uint16_t* y, const int rows, int n0, int N, int K, int group) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i zero = _mm512_setzero_si512();
    // dword i: bytes (i, zero, 32 + i, zero) of a 64-byte line -> int16 pair (q_2p, q_2p+1) of output i
    const __m512i idx0 = _mm512_set_epi32(
        0x402F400F, 0x402E400E, 0x402D400D, 0x402C400C, 0x402B400B, 0x402A400A, 0x40294009, 0x40284008,
        0x40274007, 0x40264006, 0x40254005, 0x40244004, 0x40234003, 0x40224002, 0x40214001, 0x40204000);
    const __m512i idx1 = _mm512_add_epi8(idx0, _mm512_set1_epi32(0x00100010));
    const int groups = K / group;
    const int pairs = group / 2;
    for (int i = 0; i < rows * 64; i++) out[i] = 0.0f;
    const uint8_t* line = blk;
    for (int g = 0; g < groups; g++) {
        prefetch_scales(scales32 + (size_t)g * N + n0, 64);
        // integer sums are exact in any order, so one or two rows split each sum over two accumulator sets
        // (even and odd lines) to hide vpdpwssd's latency, and every row still gets the same result
        const int sets = rows <= 2 ? 2 : 1;
        __m512i acc[2][4][4];
        for (int t = 0; t < sets; t++)
            for (int r = 0; r < rows; r++)
                for (int q = 0; q < 4; q++) acc[t][r][q] = _mm512_setzero_si512();
        for (int p = g * pairs; p < (g + 1) * pairs; p++, line += 64) {
            const int t = sets == 2 ? (p & 1) : 0;
            _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);
            const __m512i v = _mm512_loadu_si512((const void*)line);
            const __m512i lo = _mm512_and_si512(v, nib);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            const __m512i w[4] = {_mm512_permutex2var_epi8(lo, idx0, zero), _mm512_permutex2var_epi8(lo, idx1, zero),
                                  _mm512_permutex2var_epi8(hi, idx0, zero), _mm512_permutex2var_epi8(hi, idx1, zero)};
            for (int r = 0; r < rows; r++) {
                const __m512i xb = _mm512_set1_epi32(((const int32_t*)(xi + (size_t)r * K))[p]);
                for (int q = 0; q < 4; q++) acc[t][r][q] = _mm512_dpwssd_epi32(acc[t][r][q], w[q], xb);
            }
        }
        if (sets == 2)
            for (int r = 0; r < rows; r++)
                for (int q = 0; q < 4; q++) acc[0][r][q] = _mm512_add_epi32(acc[0][r][q], acc[1][r][q]);
        add_int_group(scales32 + (size_t)g * N + n0, acc[0], xscale, xsum, out, rows, g, groups);
    }
    store_rows_bf16(out, y, rows, N, n0);
}

// ISA_A8: up to 4 rows over one block of 64 outputs, two lines (four inputs) a step; xb8 is x as int8 (four
// consecutive inputs read as one int32), xscale one scale per row and group.
VNNI_TARGET static inline __attribute__((always_inline)) void block_rows_a8(const uint8_t* blk,
        const uint32_t* scales32, const int8_t* xb8, const float* xscale, const float* xsum, float* out,
        uint16_t* y, const int rows, int n0, int N, int K, int group) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    // dword i: bytes (i, 32 + i) of the first line and (i, 32 + i) of the second -> inputs 4t..4t+3 of output i
    const __m512i idx0 = _mm512_add_epi32(_mm512_set1_epi32(0x60402000),
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(0x01010101)));
    const __m512i idx1 = _mm512_add_epi8(idx0, _mm512_set1_epi8(0x10));
    const int groups = K / group;
    const int quads = group / 4;
    for (int i = 0; i < rows * 64; i++) out[i] = 0.0f;
    const uint8_t* line = blk;
    for (int g = 0; g < groups; g++) {
        prefetch_scales(scales32 + (size_t)g * N + n0, 64);
        __m512i acc[4][4];
        for (int r = 0; r < rows; r++)
            for (int q = 0; q < 4; q++) acc[r][q] = _mm512_setzero_si512();
        for (int t = g * quads; t < (g + 1) * quads; t++, line += 128) {
            _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);
            _mm_prefetch((const char*)(line + PREFETCH + 64), _MM_HINT_T0);
            const __m512i v0 = _mm512_loadu_si512((const void*)line);
            const __m512i v1 = _mm512_loadu_si512((const void*)(line + 64));
            const __m512i lo0 = _mm512_and_si512(v0, nib), hi0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), nib);
            const __m512i lo1 = _mm512_and_si512(v1, nib), hi1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), nib);
            const __m512i w[4] = {_mm512_permutex2var_epi8(lo0, idx0, lo1), _mm512_permutex2var_epi8(lo0, idx1, lo1),
                                  _mm512_permutex2var_epi8(hi0, idx0, hi1), _mm512_permutex2var_epi8(hi0, idx1, hi1)};
            for (int r = 0; r < rows; r++) {
                const __m512i xb = _mm512_set1_epi32(((const int32_t*)(xb8 + (size_t)r * K))[t]);
                for (int q = 0; q < 4; q++) acc[r][q] = _mm512_dpbusd_epi32(acc[r][q], w[q], xb);
            }
        }
        add_int_group(scales32 + (size_t)g * N + n0, acc, xscale, xsum, out, rows, g, groups);
    }
    store_rows_bf16(out, y, rows, N, n0);
}

// The int-activation paths of the AVX512 layout, ISA_VNNI (xq: int16) and ISA_A8 (xq: int8), 4 rows a pass.
VNNI_TARGET static inline __attribute__((always_inline)) void rows_int(const uint8_t* blk, const uint32_t* scales32,
        const void* xq, const float* xscale, const float* xsum, float* out, uint16_t* y, int rows, int n0, int N,
        int K, int group, int a8) {
    if (a8) {
        const int8_t* x8 = (const int8_t*)xq;
        if (rows >= 4) block_rows_a8(blk, scales32, x8, xscale, xsum, out, y, 4, n0, N, K, group);
        else if (rows == 3) block_rows_a8(blk, scales32, x8, xscale, xsum, out, y, 3, n0, N, K, group);
        else if (rows == 2) block_rows_a8(blk, scales32, x8, xscale, xsum, out, y, 2, n0, N, K, group);
        else block_rows_a8(blk, scales32, x8, xscale, xsum, out, y, 1, n0, N, K, group);
    } else {
        const int16_t* x16 = (const int16_t*)xq;
        if (rows >= 4) block_rows_vnni(blk, scales32, x16, xscale, xsum, out, y, 4, n0, N, K, group);
        else if (rows == 3) block_rows_vnni(blk, scales32, x16, xscale, xsum, out, y, 3, n0, N, K, group);
        else if (rows == 2) block_rows_vnni(blk, scales32, x16, xscale, xsum, out, y, 2, n0, N, K, group);
        else block_rows_vnni(blk, scales32, x16, xscale, xsum, out, y, 1, n0, N, K, group);
    }
}

VNNI_TARGET static void blocks_int(const uint8_t* packed, const uint32_t* scales32, const void* xq,
                                   const float* xscale, const float* xsum, uint16_t* y, int M, int N, int K,
                                   int group, int a8) {
    const int groups = K / group;
    const size_t width = a8 ? 1 : 2;  // bytes an activation
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < N / 64; b++) {
        float out[4 * 64] __attribute__((aligned(64)));
        const uint8_t* blk = packed + (size_t)b * K * 32;
        for (int m = 0; m < M; m += 4)
            rows_int(blk, scales32, (const uint8_t*)xq + (size_t)m * K * width, xscale + m * groups, xsum + m * groups,
                     out, y + (size_t)m * N, M - m, b * 64, N, K, group, a8);
    }
}

// ISA_AVXVNNI and ISA_AVX2I16: up to 2 rows over one block of 32 outputs (torch's AVX2 layout); xi as for
// ISA_VNNI. The two differ only in the int16 dot product: AVX-VNNI's vpdpwssd, or AVX2's vpmaddwd + vpaddd, which
// compute the same exact int32 sums, so both paths give every row the same bits.
#define DEFINE_AVX2_INT16(NAME, TARGET, DOT) \
TARGET static inline __attribute__((always_inline)) void block_rows_##NAME(const uint8_t* blk,                             \
        const uint32_t* scales32, const int16_t* xi, const float* xscale, const float* xsum, float* out,                   \
        uint16_t* y, const int rows, int n0, int N, int K, int group) {                                                    \
    const __m256i nib = _mm256_set1_epi8(0x0F);                                                                            \
    const int groups = K / group;                                                                                          \
    const int pairs = group / 2;                                                                                           \
    for (int i = 0; i < rows * 32; i++) out[i] = 0.0f;                                                                     \
    const uint8_t* line = blk;  /* two inputs a step: 32 bytes, input k's 16 then input k + 1's */                         \
    for (int g = 0; g < groups; g++) {                                                                                     \
        prefetch_scales(scales32 + (size_t)g * N + n0, 32);                                                                \
        const int sets = rows == 1 ? 2 : 1;                                                                                \
        __m256i acc[2][2][4];                                                                                              \
        avx2_zero_acc(acc, sets, rows);                                                                                    \
        for (int p = g * pairs; p < (g + 1) * pairs; p++, line += 32) {                                                    \
            const int t = sets == 2 ? (p & 1) : 0;                                                                         \
            _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);                                                     \
            const __m256i v = _mm256_loadu_si256((const __m256i*)line);                                                    \
            const __m256i lo = _mm256_and_si256(v, nib);                                                                   \
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);                                             \
            const __m128i lo_k = _mm256_castsi256_si128(lo), lo_k1 = _mm256_extracti128_si256(lo, 1);                      \
            const __m128i hi_k = _mm256_castsi256_si128(hi), hi_k1 = _mm256_extracti128_si256(hi, 1);                      \
            /* int16 pairs (q_k, q_k+1): outputs 0-7, 8-15 (low nibbles), 16-23, 24-31 (high nibbles) */                   \
            const __m256i w[4] = {_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(lo_k, lo_k1)),                                    \
                                  _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(lo_k, lo_k1)),                                    \
                                  _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(hi_k, hi_k1)),                                    \
                                  _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(hi_k, hi_k1))};                                   \
            for (int r = 0; r < rows; r++) {                                                                               \
                const __m256i xb = _mm256_set1_epi32(((const int32_t*)(xi + (size_t)r * K))[p]);                           \
                for (int q = 0; q < 4; q++) acc[t][r][q] = DOT(acc[t][r][q], w[q], xb);                                    \
            }                                                                                                              \
        }                                                                                                                  \
        if (sets == 2)                                                                                                     \
            for (int q = 0; q < 4; q++) acc[0][0][q] = _mm256_add_epi32(acc[0][0][q], acc[1][0][q]);                       \
        avx2_int_group(scales32 + (size_t)g * N + n0, acc[0], xscale, xsum, out, rows, g, groups);                         \
    }                                                                                                                      \
    avx2_store_rows(out, y, rows, n0, N);                                                                                  \
}                                                                                                                          \
DEFINE_AVX2_BLOCKS(NAME, TARGET, static)

#define DOT_AVXVNNI(acc, w, x) _mm256_dpwssd_avx_epi32(acc, w, x)
#define DOT_AVX2(acc, w, x) _mm256_add_epi32(acc, _mm256_madd_epi16(w, x))
DEFINE_AVX2_INT16(avxvnni, AVXVNNI_TARGET, DOT_AVXVNNI)
DEFINE_AVX2_INT16(avx2i16, AVX2_TARGET, DOT_AVX2)

// ISA_AVX2A8 (opt-in): torch's AVX2 layout, x as int8 per block of 32 inputs (max |x| / 127, one fp32 scale a
// block, as llama.cpp's Q8_0), so it computes with rounded activations (W4A8). Two 32-byte loads hold inputs k..k+3;
// one vpunpck{l,h}bw of their nibbles gives every output the byte pairs (q_k, q_k+2) in the low lane and
// (q_k+1, q_k+3) in the high lane, and vpmaddubsw multiplies them with x's bytes in the same order (xq holds each
// quad as x_k, x_k+2, x_k+1, x_k+3) and sums pairs in int16: 16 products an instruction where ISA_AVX2's FMA does 8
// after converting every nibble to fp32. A lane's int16 sum over a block is at most 16 * 15 * 127 < 2^15; the lanes
// are added in int32, scaled by the block's scale in fp32, and the group's weight scale and offset come last.
AVX2_TARGET static inline __attribute__((always_inline)) void block_rows_avx2a8(const uint8_t* blk,
        const uint32_t* scales32, const int8_t* xq, const float* xscale, const float* xsum, float* out, uint16_t* y,
        const int rows, int n0, int N, int K, int group) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    // lane 0: bytes (0, 1) of the quad's dword repeated (x_k, x_k+2); lane 1: bytes (2, 3) (x_k+1, x_k+3)
    const __m256i spread = _mm256_set_epi8(3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2,
                                           1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
    const int groups = K / group, blocks = K / 32;
    float facc[2 * 32] __attribute__((aligned(32)));
    for (int i = 0; i < rows * 32; i++) out[i] = 0.0f;
    const uint8_t* line = blk;
    for (int g = 0; g < groups; g++) {
        prefetch_scales(scales32 + (size_t)g * N + n0, 32);
        for (int i = 0; i < rows * 32; i++) facc[i] = 0.0f;
        for (int b = g * group / 32; b < (g + 1) * group / 32; b++) {
            __m256i acc[2][4];
            for (int r = 0; r < rows; r++)
                for (int q = 0; q < 4; q++) acc[r][q] = _mm256_setzero_si256();
            for (int t = 0; t < 8; t++, line += 64) {
                _mm_prefetch((const char*)(line + PREFETCH), _MM_HINT_T0);
                const __m256i v0 = _mm256_loadu_si256((const __m256i*)line);
                const __m256i v1 = _mm256_loadu_si256((const __m256i*)(line + 32));
                const __m256i lo0 = _mm256_and_si256(v0, nib), hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), nib);
                const __m256i lo1 = _mm256_and_si256(v1, nib), hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), nib);
                const __m256i w[4] = {_mm256_unpacklo_epi8(lo0, lo1), _mm256_unpackhi_epi8(lo0, lo1),
                                      _mm256_unpacklo_epi8(hi0, hi1), _mm256_unpackhi_epi8(hi0, hi1)};
                for (int r = 0; r < rows; r++) {
                    const int32_t quad = ((const int32_t*)(xq + (size_t)r * K))[b * 8 + t];
                    const __m256i xb = _mm256_shuffle_epi8(_mm256_set1_epi32(quad), spread);
                    for (int q = 0; q < 4; q++) acc[r][q] = _mm256_add_epi16(acc[r][q], _mm256_maddubs_epi16(w[q], xb));
                }
            }
            for (int r = 0; r < rows; r++) {
                const __m256 sb = _mm256_set1_ps(xscale[r * blocks + b]);
                for (int q = 0; q < 4; q++) {
                    const __m256i sum = _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(acc[r][q])),
                                                         _mm256_cvtepi16_epi32(_mm256_extracti128_si256(acc[r][q], 1)));
                    float* f = facc + r * 32 + 8 * q;
                    _mm256_store_ps(f, _mm256_fmadd_ps(sb, _mm256_cvtepi32_ps(sum), _mm256_load_ps(f)));
                }
            }
        }
        const uint32_t* sz = scales32 + (size_t)g * N + n0;
        for (int q = 0; q < 4; q++) {
            const __m256i packed = _mm256_loadu_si256((const __m256i*)(sz + 8 * q));
            const __m256 s = _mm256_castsi256_ps(_mm256_slli_epi32(packed, 16));
            const __m256 z = _mm256_castsi256_ps(_mm256_and_si256(packed, _mm256_set1_epi32((int)0xFFFF0000u)));
            const __m256 offset = _mm256_fnmadd_ps(s, _mm256_set1_ps(8.0f), z);
            for (int r = 0; r < rows; r++) {
                __m256 o = _mm256_fmadd_ps(s, _mm256_load_ps(facc + r * 32 + 8 * q), _mm256_loadu_ps(out + r * 32 + 8 * q));
                o = _mm256_fmadd_ps(offset, _mm256_set1_ps(xsum[r * groups + g]), o);
                _mm256_storeu_ps(out + r * 32 + 8 * q, o);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int q = 0; q < 4; q++)
            _mm_storeu_si128((__m128i*)(y + (size_t)r * N + n0 + 8 * q), bf16_256(_mm256_loadu_ps(out + r * 32 + 8 * q)));
}

AVX2_TARGET static void blocks_avx2a8(const uint8_t* packed, const uint32_t* scales32, const int8_t* xq,
                                      const float* xscale, const float* xsum, uint16_t* y, int M, int N, int K,
                                      int group) {
    const int groups = K / group, blocks = K / 32;
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < N / 32; b++) {
        float out[2 * 32] __attribute__((aligned(32)));
        const uint8_t* blk = packed + (size_t)b * K * 16;
        for (int m = 0; m < M; m += 2) {
            const int8_t* xm = xq + (size_t)m * K;
            const float* cm = xscale + m * blocks;
            const float* sm = xsum + m * groups;
            uint16_t* ym = y + (size_t)m * N;
            if (M - m >= 2) block_rows_avx2a8(blk, scales32, xm, cm, sm, out, ym, 2, b * 32, N, K, group);
            else block_rows_avx2a8(blk, scales32, xm, cm, sm, out, ym, 1, b * 32, N, K, group);
        }
    }
}

// x as int8 per block of 32 inputs for ISA_AVX2A8: q = round(x / scale), scale = max |x| / 127 (0 for an all-zero
// block), each quad stored as (x_k, x_k+2, x_k+1, x_k+3); xsum becomes each group's sum of the rounded x (in fp32,
// block by block), so the product is W times the rounded x, as for ISA_A8.
// Eight inputs a vector (ISA_AVX2A8 runs only where AVX2 does), rounded to nearest even as lrintf; no fused
// multiply-add in the sums, so each group's xsum is the plain fp32 sum of its blocks' scale * sum q.
AVX2_TARGET __attribute__((optimize("fp-contract=off"))) static void to_int8_b32(const uint16_t* x, int8_t* xq,
        float* xscale, float* xsum, int M, int K, int group) {
    const int groups = K / group, blocks = K / 32;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    // after two packs the block's dwords hold inputs 0-3, 8-11, 16-19, 24-27, 4-7, 12-15, 20-23, 28-31
    const __m256i dwords = _mm256_set_epi32(7, 3, 6, 2, 5, 1, 4, 0);
    const __m256i quads = _mm256_set_epi8(15, 13, 14, 12, 11, 9, 10, 8, 7, 5, 6, 4, 3, 1, 2, 0,
                                          15, 13, 14, 12, 11, 9, 10, 8, 7, 5, 6, 4, 3, 1, 2, 0);
    for (int m = 0; m < M; m++) {
        for (int g = 0; g < groups; g++) xsum[m * groups + g] = 0.0f;
        for (int b = 0; b < blocks; b++) {
            const uint16_t* xb = x + (size_t)m * K + (size_t)b * 32;
            __m256 v[4];
            __m256 vmax = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(xb + 8 * i)));
                v[i] = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
                vmax = _mm256_max_ps(vmax, _mm256_and_ps(v[i], absmask));
            }
            float lanes[8];
            _mm256_storeu_ps(lanes, vmax);
            float amax = 0.0f;
            for (int i = 0; i < 8; i++) amax = fmaxf(amax, lanes[i]);
            const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            __m256i q[4];
            for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
            const __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            int32_t parts[8];
            _mm256_storeu_si256((__m256i*)parts, total);
            int sum = 0;
            for (int i = 0; i < 8; i++) sum += parts[i];
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            const __m256i ordered = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(bytes, dwords), quads);
            _mm256_storeu_si256((__m256i*)(xq + (size_t)m * K + (size_t)b * 32), ordered);
            xscale[m * blocks + b] = amax / 127.0f;
            xsum[m * groups + b * 32 / group] += (float)sum * (amax / 127.0f);
        }
    }
}

// x as int8 per group: q = round(x / scale), scale = max |x| / 127 (0 for an all-zero group). xsum becomes the
// rounded x's sum (scale * sum q, exact in int): the product is then exactly W times the rounded x, whose error
// meets the weights centred (q - 8), not the raw nibbles q (which would add 7.5 s times the rounding errors' sum).
static void to_int8(const uint16_t* x, int8_t* xb8, float* xscale, float* xsum, int M, int K, int group) {
    const int groups = K / group;
    for (int m = 0; m < M; m++)
        for (int g = 0; g < groups; g++) {
            const uint16_t* xg = x + (size_t)m * K + (size_t)g * group;
            int8_t* qg = xb8 + (size_t)m * K + (size_t)g * group;
            float amax = 0.0f;
            for (int k = 0; k < group; k++) amax = fmaxf(amax, fabsf(bf16_to_float(xg[k])));
            const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int k = 0; k < group; k++) {
                qg[k] = (int8_t)lrintf(bf16_to_float(xg[k]) * inv);
                sum += qg[k];
            }
            xscale[m * groups + g] = amax / 127.0f;
            xsum[m * groups + g] = (float)sum * (amax / 127.0f);
        }
}

// x as int16 per group: q = round(x / scale), scale = max |x| / 32767 (0 for an all-zero group).
static void to_int16_scalar(const uint16_t* x, int16_t* xi, float* xscale, int M, int K, int group) {
    const int groups = K / group;
    for (int m = 0; m < M; m++)
        for (int g = 0; g < groups; g++) {
            const uint16_t* xg = x + (size_t)m * K + (size_t)g * group;
            float amax = 0.0f;
            for (int k = 0; k < group; k++) amax = fmaxf(amax, fabsf(bf16_to_float(xg[k])));
            const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
            for (int k = 0; k < group; k++) xi[(size_t)m * K + (size_t)g * group + k] = (int16_t)lrintf(bf16_to_float(xg[k]) * inv);
            xscale[m * groups + g] = amax / 32767.0f;
        }
}

// to_int16 eight inputs at a time (groups of a multiple of 8 inputs): the same fp32 products and the same rounding
// to nearest even (vcvtps2dq under the default MXCSR, as lrintf), so the same int16 values bit for bit.
AVX2_TARGET static void to_int16_avx2(const uint16_t* x, int16_t* xi, float* xscale, int M, int K, int group) {
    const int groups = K / group;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int m = 0; m < M; m++)
        for (int g = 0; g < groups; g++) {
            const uint16_t* xg = x + (size_t)m * K + (size_t)g * group;
            int16_t* qg = xi + (size_t)m * K + (size_t)g * group;
            __m256 vmax = _mm256_setzero_ps();
            for (int k = 0; k < group; k += 8) {
                const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(xg + k)));
                vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)), absmask));
            }
            float lanes[8];
            _mm256_storeu_ps(lanes, vmax);
            float amax = 0.0f;
            for (int i = 0; i < 8; i++) amax = fmaxf(amax, lanes[i]);
            const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
            const __m256 vinv = _mm256_set1_ps(inv);
            for (int k = 0; k < group; k += 8) {
                const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(xg + k)));
                const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)), vinv));
                const __m128i packed = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
                _mm_storeu_si128((__m128i*)(qg + k), packed);
            }
            xscale[m * groups + g] = amax / 32767.0f;
        }
}

static void to_int16(const uint16_t* x, int16_t* xi, float* xscale, int M, int K, int group) {
    if (group % 8 == 0 && __builtin_cpu_supports("avx2")) to_int16_avx2(x, xi, xscale, M, K, group);
    else to_int16_scalar(x, xi, xscale, M, K, group);
}

KERNEL_TARGET static void blocks_bf16(const uint8_t* packed, const uint32_t* scales32, const uint16_t* x,
                                      const float* xsum, uint16_t* y, int M, int N, int K, int group) {
    const int groups = K / group;
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < N / 64; b++) {
        const uint8_t* blk = packed + (size_t)b * K * 32;
        for (int m = 0; m < M; m += 4) {
            const int rows = M - m;
            const uint16_t* xm = x + (size_t)m * K;
            const float* sm = xsum + m * groups;
            uint16_t* ym = y + (size_t)m * N;
            if (rows >= 4) block_rows(blk, scales32, xm, sm, ym, 4, b * 64, N, K, group);
            else if (rows == 3) block_rows(blk, scales32, xm, sm, ym, 3, b * 64, N, K, group);
            else if (rows == 2) block_rows(blk, scales32, xm, sm, ym, 2, b * 64, N, K, group);
            else block_rows(blk, scales32, xm, sm, ym, 1, b * 64, N, K, group);
        }
    }
}

F512_TARGET static void blocks_f512(const uint8_t* packed, const uint32_t* scales32, const float* xf,
                                    const float* xsum, uint16_t* y, int M, int N, int K, int group) {
    const int groups = K / group;
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < N / 64; b++) {
        float out[4 * 64] __attribute__((aligned(64)));
        const uint8_t* blk = packed + (size_t)b * K * 32;
        for (int m = 0; m < M; m += 4) {
            const int rows = M - m;
            const float* xm = xf + (size_t)m * K;
            const float* sm = xsum + m * groups;
            uint16_t* ym = y + (size_t)m * N;
            if (rows >= 4) block_rows_f512(blk, scales32, xm, sm, out, ym, 4, b * 64, N, K, group);
            else if (rows == 3) block_rows_f512(blk, scales32, xm, sm, out, ym, 3, b * 64, N, K, group);
            else if (rows == 2) block_rows_f512(blk, scales32, xm, sm, out, ym, 2, b * 64, N, K, group);
            else block_rows_f512(blk, scales32, xm, sm, out, ym, 1, b * 64, N, K, group);
        }
    }
}

AVX2_TARGET static void blocks_avx2(const uint8_t* packed, const uint32_t* scales32, const float* xf,
                                    const float* xsum, uint16_t* y, int M, int N, int K, int group) {
    const int groups = K / group;
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < N / 32; b++) {
        float out[2 * 32] __attribute__((aligned(32)));
        const uint8_t* blk = packed + (size_t)b * K * 16;
        for (int m = 0; m < M; m += 2) {
            const float* xm = xf + (size_t)m * K;
            const float* sm = xsum + m * groups;
            uint16_t* ym = y + (size_t)m * N;
            if (M - m >= 2) block_rows_avx2(blk, scales32, xm, sm, out, ym, 2, b * 32, N, K, group);
            else block_rows_avx2(blk, scales32, xm, sm, out, ym, 1, b * 32, N, K, group);
        }
    }
}

static int int4_mm(const uint8_t* packed, const uint32_t* scales32, const uint16_t* x, uint16_t* y, int M, int N,
                   int K, int group, int isa) {
    const int groups = K / group;
    float* xsum = (float*)malloc(sizeof(float) * (size_t)M * groups);
    const int fp32 = isa == ISA_AVX512 || isa == ISA_AVX2;
    float* xf = fp32 ? (float*)malloc(sizeof(float) * (size_t)M * K) : NULL;
    const int ints = isa == ISA_VNNI || isa == ISA_AVXVNNI || isa == ISA_AVX2I16 || isa == ISA_P32I16 ||
                     isa == ISA_P32VNNI;
    int16_t* xi = ints ? (int16_t*)malloc(sizeof(int16_t) * (size_t)M * K) : NULL;
    const int a8 = isa == ISA_A8 || isa == ISA_AVX2A8;
    int8_t* xb8 = a8 ? (int8_t*)malloc((size_t)M * K) : NULL;
    const int scales_per_row = isa == ISA_AVX2A8 ? K / 32 : groups;
    float* xscale = ints || a8 ? (float*)malloc(sizeof(float) * (size_t)M * scales_per_row) : NULL;
    if (xsum == NULL || (fp32 && xf == NULL) || (ints && xi == NULL) || (a8 && xb8 == NULL) ||
        ((ints || a8) && xscale == NULL)) {
        free(xsum);
        free(xf);
        free(xi);
        free(xb8);
        free(xscale);
        return -1;
    }
    for (int m = 0; m < M; m++)  // each group's sum of x, in fp32, in input order
        for (int g = 0; g < groups; g++) {
            float s = 0.0f;
            for (int k = g * group; k < (g + 1) * group; k++) s += bf16_to_float(x[(size_t)m * K + k]);
            xsum[m * groups + g] = s;
        }
    if (xf != NULL)
        for (size_t i = 0; i < (size_t)M * K; i++) xf[i] = bf16_to_float(x[i]);
    if (xi != NULL) to_int16(x, xi, xscale, M, K, group);
    if (isa == ISA_A8) to_int8(x, xb8, xscale, xsum, M, K, group);
    if (isa == ISA_AVX2A8) to_int8_b32(x, xb8, xscale, xsum, M, K, group);
    if (isa == ISA_A8) blocks_int(packed, scales32, xb8, xscale, xsum, y, M, N, K, group, 1);
    else if (isa == ISA_BF16) blocks_bf16(packed, scales32, x, xsum, y, M, N, K, group);
    else if (isa == ISA_VNNI) blocks_int(packed, scales32, xi, xscale, xsum, y, M, N, K, group, 0);
    else if (isa == ISA_AVXVNNI) blocks_avxvnni(packed, scales32, xi, xscale, xsum, y, M, N, K, group);
    else if (isa == ISA_AVX2I16) blocks_avx2i16(packed, scales32, xi, xscale, xsum, y, M, N, K, group);
    else if (isa == ISA_P32I16) blocks_p32i16(packed, scales32, xi, xscale, xsum, y, M, N, K, group);
    else if (isa == ISA_P32VNNI) blocks_p32vnni(packed, scales32, xi, xscale, xsum, y, M, N, K, group);
    else if (isa == ISA_AVX2A8) blocks_avx2a8(packed, scales32, xb8, xscale, xsum, y, M, N, K, group);
    else if (isa == ISA_AVX512) blocks_f512(packed, scales32, xf, xsum, y, M, N, K, group);
    else blocks_avx2(packed, scales32, xf, xsum, y, M, N, K, group);
    free(xsum);
    free(xf);
    free(xi);
    free(xb8);
    free(xscale);
    return 0;
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

static int cpu_features(void) {  // bit i: ISA i runs on this CPU
    __builtin_cpu_init();
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("fma");
    return (avx512 && __builtin_cpu_supports("avx512bf16")) << ISA_BF16 | avx512 << ISA_AVX512 |
           (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) << ISA_AVX2 |
           (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) << ISA_AVX2I16 |
           (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) << ISA_AVX2A8 |
           (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) << ISA_P32I16 |
           (avx512 && __builtin_cpu_supports("avx512vnni")) << ISA_VNNI |
           (avx512 && __builtin_cpu_supports("avx512vnni")) << ISA_A8 |
           (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
            __builtin_cpu_supports("avxvnni") != 0) << ISA_AVXVNNI |
           (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
            __builtin_cpu_supports("avxvnni") != 0) << ISA_P32VNNI;
}

// NULL when mm can run this shape with instruction set `isa` on this CPU, else the reason.
static const char* check_mm(long M, long N, long K, long group, long isa) {
    if (isa < 0 || isa > ISA_LAST || !(cpu_features() >> isa & 1)) return "int4 mm: this CPU lacks that instruction set";
    const int p32 = isa == ISA_P32I16 || isa == ISA_P32VNNI;  // blocks of 32 outputs, 8 inputs a step
    if (M < 1 || M > MAX_ROWS || N < 32 || N % (p32 ? 32 : 64) || group < 4 || group % (p32 ? 8 : 4) || K < group ||
        K % group || ((isa == ISA_VNNI || isa == ISA_AVXVNNI || isa == ISA_AVX2I16 || p32) && group > MAX_VNNI_GROUP) ||
        (isa == ISA_AVX2A8 && group % 32))
        return "int4 mm: shape outside the kernel's range";
    return NULL;
}

// mm(packed, scales, x, y, M, N, K, group, isa): addresses as ints, arrays contiguous; y bf16 [M, N] is written.
static PyObject* py_mm(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    void* ptr[4];
    long dims[5];
    if (read_args(args, nargs, 9, ptr, 4, dims, 5, "mm takes packed, scales, x, y, M, N, K, group, isa") < 0)
        return NULL;
    const long M = dims[0], N = dims[1], K = dims[2], group = dims[3], isa = dims[4];
    const char* why = check_mm(M, N, K, group, isa);
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = int4_mm((const uint8_t*)ptr[0], (const uint32_t*)ptr[1], (const uint16_t*)ptr[2], (uint16_t*)ptr[3],
                 (int)M, (int)N, (int)K, (int)group, (int)isa);
    Py_END_ALLOW_THREADS
    if (rc < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

// unpack: the bf16 weight, transposed (K rows of N), as models.quantization.unpack_int4 computes it:
// w = ((q - 8) * scale) + zero in fp32 (two roundings, no fused multiply-add), rounded to bf16 (nearest even, as
// torch rounds). AVX-512 F/BW only: it runs for ISA_BF16 and ISA_AVX512 (the layout of 64-output blocks).
F512_TARGET __attribute__((optimize("fp-contract=off"))) static void unpack(const uint8_t* packed,
                                                                              const uint32_t* scales32, uint16_t* out,
                                                                              int N, int K, int group) {
    const int blocks = N / 64;
    #pragma omp parallel for schedule(static)
    for (int k = 0; k < K; k++) {
        const uint32_t* sz = scales32 + (size_t)(k / group) * N;
        uint16_t* row = out + (size_t)k * N;
        for (int b = 0; b < blocks; b++) {
            const __m256i v = _mm256_loadu_si256((const __m256i*)(packed + ((size_t)b * K + k) * 32));
            const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
            const __m128i parts[4] = {_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1),
                                      _mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)};
            for (int q = 0; q < 4; q++) {
                const int n = b * 64 + 16 * q;
                const __m512i packed_sz = _mm512_loadu_si512((const void*)(sz + n));
                const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(packed_sz, 16));
                const __m512 z = _mm512_castsi512_ps(_mm512_and_si512(packed_sz, _mm512_set1_epi32((int)0xFFFF0000u)));
                const __m512 w = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(parts[q])), _mm512_set1_ps(8.0f));
                const __m512 r = _mm512_add_ps(_mm512_mul_ps(w, s), z);
                _mm256_storeu_si256((__m256i*)(row + n), bf16_512(r));
            }
        }
    }
}

// unpack(packed, scales, out, N, K, group): out bf16 [K, N] is written.
static PyObject* py_unpack(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    void* ptr[3];
    long dims[3];
    if (read_args(args, nargs, 6, ptr, 3, dims, 3, "unpack takes packed, scales, out, N, K, group") < 0) return NULL;
    const long N = dims[0], K = dims[1], group = dims[2];
    if (!(cpu_features() >> ISA_AVX512 & 1)) {
        PyErr_SetString(PyExc_ValueError, "int4 unpack: needs AVX-512 F/BW/VBMI");
        return NULL;
    }
    if (N < 64 || N % 64 || group < 1 || K < group || K % group) {
        PyErr_SetString(PyExc_ValueError, "int4 unpack: shape outside the kernel's range");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    unpack((const uint8_t*)ptr[0], (const uint32_t*)ptr[1], (uint16_t*)ptr[2], (int)N, (int)K, (int)group);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

// p32(packed, N, K, to_p32): int4 weights moved between torch's AVX2 layout and Ponder's p32 (_int4_p32.c), in place.
static PyObject* py_p32(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    (void)self;
    void* ptr[1];
    long dims[3];
    if (read_args(args, nargs, 4, ptr, 1, dims, 3, "p32 takes packed, N, K, to_p32") < 0) return NULL;
    const long N = dims[0], K = dims[1], to_p32 = dims[2];
    if (N < 32 || N % 32 || K < 8 || K % 8) {
        PyErr_SetString(PyExc_ValueError, "int4 p32: shape outside the layout's range");
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = p32_repack((uint8_t*)ptr[0], (int)N, (int)K, to_p32 != 0);
    Py_END_ALLOW_THREADS
    if (rc < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject* py_features(PyObject* self, PyObject* unused) {
    (void)self; (void)unused;
    return PyLong_FromLong(cpu_features());
}

static PyMethodDef methods[] = {
    {"mm", (PyCFunction)(void (*)(void))py_mm, METH_FASTCALL, "y = x @ W.T for int4 W in torch's packed layout"},
    {"unpack", (PyCFunction)(void (*)(void))py_unpack, METH_FASTCALL, "the bf16 weight (K, N) of a packed int4 matrix"},
    {"p32", (PyCFunction)(void (*)(void))py_p32, METH_FASTCALL, "int4 weights between torch's AVX2 layout and p32"},
    {"features", py_features, METH_NOARGS, "bit mask of the instruction sets (ISA_*) this CPU runs"},
    {NULL, NULL, 0, NULL},
};

static const Int4Api api = {MAX_ROWS, check_mm, int4_mm};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_int4", "Ponder's int4 decode matmul", -1, methods};

PyMODINIT_FUNC PyInit__int4(void) {
    PyObject* m = PyModule_Create(&module);
    if (m != NULL) {
        PyModule_AddIntConstant(m, "MAX_ROWS", MAX_ROWS);
        PyModule_AddIntConstant(m, "ISA_BF16", ISA_BF16);
        PyModule_AddIntConstant(m, "ISA_AVX512", ISA_AVX512);
        PyModule_AddIntConstant(m, "ISA_AVX2", ISA_AVX2);
        PyModule_AddIntConstant(m, "ISA_AVXVNNI", ISA_AVXVNNI);
        PyModule_AddIntConstant(m, "ISA_VNNI", ISA_VNNI);
        PyModule_AddIntConstant(m, "ISA_A8", ISA_A8);
        PyModule_AddIntConstant(m, "ISA_AVX2I16", ISA_AVX2I16);
        PyModule_AddIntConstant(m, "ISA_AVX2A8", ISA_AVX2A8);
        PyModule_AddIntConstant(m, "ISA_P32I16", ISA_P32I16);
        PyModule_AddIntConstant(m, "ISA_P32VNNI", ISA_P32VNNI);
        PyModule_AddIntConstant(m, "MAX_VNNI_GROUP", MAX_VNNI_GROUP);
        PyObject* capsule = PyCapsule_New((void*)&api, INT4_API_CAPSULE, NULL);
        if (capsule == NULL || PyModule_AddObject(m, "mm_api", capsule) < 0) {
            Py_XDECREF(capsule);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
