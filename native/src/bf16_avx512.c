/* AVX512_BF16 path: the 12x32 bf16 GEMM micro-kernel on VDPBF16PS (two k per instruction,
 * fp32 accumulators kept in 24 zmm registers) and the VCVTNEPS2BF16 fp32 -> bf16 cast.
 * Compiled for avx512bf16 via a file-wide target pragma; dispatch.c only selects it on CPUs
 * that have the instructions, so the rest of the library still runs without them. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,avx2")
#include <immintrin.h>
#include "internal.h"
#include "bf16_simd.h"

#define MR 12
#define NR 32
#define ROW_DECL(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = _mm512_setzero_ps();
#define ROW_DOT(i) { __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]); \
    c##i##0 = _mm512_dpbf16_ps(c##i##0, ai, b0); c##i##1 = _mm512_dpbf16_ps(c##i##1, ai, b1); }
#define ROW_STORE(i) { float *ci = c + (i) * ldc; \
    if (!first) { c##i##0 = _mm512_add_ps(c##i##0, _mm512_load_ps(ci)); \
                  c##i##1 = _mm512_add_ps(c##i##1, _mm512_load_ps(ci + 16)); } \
    _mm512_store_ps(ci, c##i##0); _mm512_store_ps(ci + 16, c##i##1); }
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/* a: [kcp/2][MR] pairs (a[i][2p], a[i][2p+1]) as 32-bit words; b: [kcp/2][NR] pairs. One
 * VDPBF16PS adds a[i][2p]*b[2p][j] + a[i][2p+1]*b[2p+1][j] to lane j: both products are exact
 * in fp32 (8-bit significands), so only the accumulation rounds. */
static void ukr_dpbf16(int kcp, const rt_bf16 *a16, const rt_bf16 *b, float *c, int ldc, int first) {
    const uint32_t *a = (const uint32_t *)a16;
    ROWS(ROW_DECL)
    for (int p = 0; p < kcp / 2; p++, a += MR, b += 2 * NR) {
        __m512bh b0 = (__m512bh)_mm512_load_si512(b), b1 = (__m512bh)_mm512_load_si512(b + 32);
        _mm_prefetch((const char *)(b + 16 * NR), _MM_HINT_T0);
        ROWS(ROW_DOT)
    }
    ROWS(ROW_STORE)
}

/* pairs [0, np) of a full 32-column strip of op(b) (b at (0, j0)) as [np][32] words, the
 * layout of gemm_bf16.c's pack_b_strip: a word transpose when b is [N, K] (trans: each row
 * of b holds the pairs of one column), else a zero-extend-and-or of rows 2p and 2p+1 */
void rt_bf16_pack_b_avx512(rt_bf16 *dst, const rt_bf16 *b, size_t ldb, int trans, int np) {
    if (!trans) {
        for (int p = 0; p < np; p++)
            for (int h = 0; h < 32; h += 16) {
                const rt_bf16 *r0 = b + (size_t)(2 * p) * ldb + h;
                __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)r0));
                __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + ldb)));
                _mm512_storeu_si512(dst + (size_t)p * 64 + 2 * h, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
        return;
    }
    for (int p0 = 0; p0 < np; p0 += 16) {
        int cnt = np - p0 < 16 ? np - p0 : 16;
        __mmask16 m = (__mmask16)((1u << cnt) - 1);
        for (int h = 0; h < 32; h += 16) {
            __m512i w[16];
            for (int c = 0; c < 16; c++) w[c] = _mm512_maskz_loadu_epi32(m, b + (size_t)(h + c) * ldb + 2 * p0);
            transpose_16x16_epi32(w);
            for (int p = 0; p < cnt; p++) _mm512_storeu_si512(dst + (size_t)(p0 + p) * 64 + 2 * h, w[p]);
        }
    }
}

static int begin_none(void) { return RT_OK; }
static void end_none(void) {}

const rt_bf16_gemm rt_bf16_gemm_avx512 = {
    "avx512_bf16", MR, NR, 2, 256, 0, begin_none, end_none, NULL, rt_bf16_pack_b_avx512, ukr_dpbf16,
};

/* VCVTNEPS2BF16 rounds to nearest even and quiets NaN like rt_f2bf, but reads subnormal inputs
 * as zero: those lanes (rare) take the integer rounding instead, so every path agrees bitwise */
void rt_f2bf_avx512bf16(rt_bf16 *dst, const float *src, size_t n) {
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 f = _mm512_loadu_ps(src + i);
        __m256i r = (__m256i)_mm512_cvtneps_pbh(f);
        __mmask16 sub = _mm512_fpclass_ps_mask(f, 0x20);           /* 0x20: denormal */
        if (sub) {
            __m512i x = _mm512_castps_si512(f), hi = _mm512_srli_epi32(x, 16);
            __m512i fix = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(half, _mm512_and_si512(hi, one))), 16);
            r = _mm256_mask_mov_epi16(r, sub, _mm512_cvtepi32_epi16(fix));
        }
        _mm256_storeu_si256((__m256i *)(dst + i), r);
    }
    for (; i < n; i++) dst[i] = rt_f2bf(src[i]);
}
