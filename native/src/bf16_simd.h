/* AVX-512 helper of the two bf16 GEMM kernels' packers (bf16_amx.c, bf16_avx512.c): a 16 x 16
 * transpose of 32-bit words (bf16 pairs). Include after the file's AVX-512 target pragma. */
#ifndef RATRAIN_BF16_SIMD_H
#define RATRAIN_BF16_SIMD_H
#include <immintrin.h>

/* r[i] (16 words) <- column i of the 16 x 16 word matrix r: 32-bit, 64-bit, then 128-bit lane
 * interleaves */
static inline void transpose_16x16_epi32(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int h = 0; h < 16; h += 8)
        for (int j = 0; j < 4; j++) {
            t[h + j] = _mm512_shuffle_i32x4(r[h + j], r[h + j + 4], 0x88);
            t[h + j + 4] = _mm512_shuffle_i32x4(r[h + j], r[h + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
    }
}

#endif
