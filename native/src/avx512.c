/* AVX-512 path of the rt_simd primitives: the 12x32 GEMM micro-kernel, the small matmul used
 * by attention tiles, fp16 (F16C) and bf16 conversions and a vectorised exp. Compiled for avx512f/bw/vl/dq
 * via a file-wide target pragma and only called when dispatch.c found those features. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2")
#include <immintrin.h>
#include "internal.h"

#define MR 12
#define ROW_DECL(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = _mm512_setzero_ps();
#define ROW_FMA(i) { __m512 ai = _mm512_set1_ps(a[i]); \
    c##i##0 = _mm512_fmadd_ps(ai, b0, c##i##0); c##i##1 = _mm512_fmadd_ps(ai, b1, c##i##1); }
#define ROW_STORE(i) { float *ci = c + (i) * ldc; \
    if (!first) { c##i##0 = _mm512_add_ps(c##i##0, _mm512_load_ps(ci)); \
                  c##i##1 = _mm512_add_ps(c##i##1, _mm512_load_ps(ci + 16)); } \
    _mm512_store_ps(ci, c##i##0); _mm512_store_ps(ci + 16, c##i##1); }
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

static void ukr_avx512(int kc, const float *a, const float *b, float *c, int ldc, int first) {
    ROWS(ROW_DECL)
    for (int p = 0; p < kc; p++, a += MR, b += 32) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        _mm_prefetch((const char *)(b + 256), _MM_HINT_T0);
        ROWS(ROW_FMA)
    }
    ROWS(ROW_STORE)
}

/* c[R rows, V*16 cols] block of the small matmul, R <= 8, V <= 2 */
static inline void mm_block(float *c, int ldc, const float *a, int lda, const float *b,
                            int ldb, int k, int beta, int R, int V) {
    __m512 acc[8][2];
    for (int i = 0; i < R; i++)
        for (int v = 0; v < V; v++)
            acc[i][v] = beta ? _mm512_loadu_ps(c + (size_t)i * ldc + 16 * v) : _mm512_setzero_ps();
    for (int p = 0; p < k; p++) {
        __m512 bv[2];
        for (int v = 0; v < V; v++) bv[v] = _mm512_loadu_ps(b + (size_t)p * ldb + 16 * v);
        for (int i = 0; i < R; i++) {
            __m512 ai = _mm512_set1_ps(a[(size_t)i * lda + p]);
            for (int v = 0; v < V; v++) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < R; i++)
        for (int v = 0; v < V; v++) _mm512_storeu_ps(c + (size_t)i * ldc + 16 * v, acc[i][v]);
}
#define MM_CASE(R, V) mm_block(c, ldc, a, lda, b, ldb, k, beta, R, V)
static void mm_rows(float *c, int ldc, const float *a, int lda, const float *b, int ldb,
                    int m, int k, int beta, int V) {
    int i = 0;
    for (; i + 8 <= m; i += 8) {
        float *ci = c + (size_t)i * ldc; const float *ai = a + (size_t)i * lda;
        if (V == 2) mm_block(ci, ldc, ai, lda, b, ldb, k, beta, 8, 2);
        else mm_block(ci, ldc, ai, lda, b, ldb, k, beta, 8, 1);
    }
    for (; i < m; i++) {
        float *ci = c + (size_t)i * ldc; const float *ai = a + (size_t)i * lda;
        if (V == 2) mm_block(ci, ldc, ai, lda, b, ldb, k, beta, 1, 2);
        else mm_block(ci, ldc, ai, lda, b, ldb, k, beta, 1, 1);
    }
}
static void mm_avx512(float *c, int ldc, const float *a, int lda, const float *b, int ldb,
                      int m, int n, int k, int beta) {
    int j = 0;
    for (; j + 32 <= n; j += 32) mm_rows(c + j, ldc, a, lda, b + j, ldb, m, k, beta, 2);
    if (j < n) mm_rows(c + j, ldc, a, lda, b + j, ldb, m, k, beta, 1);
}

static void h2f_avx512(float *dst, const rt_half *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}
static void f2h_avx512(rt_half *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

static void bf2f_avx512(float *dst, const rt_bf16 *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_si512(dst + i, _mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i))), 16));
    for (; i < n; i++) dst[i] = rt_bf2f(src[i]);
}
/* rt_f2bf on 16 lanes (the integer round-to-nearest-even of avx2.c) */
static void f2bf_avx512(rt_bf16 *dst, const float *src, size_t n) {
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 f = _mm512_loadu_ps(src + i);
        __m512i x = _mm512_castps_si512(f), hi = _mm512_srli_epi32(x, 16);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(half, _mm512_and_si512(hi, one))), 16);
        r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), hi, _mm512_set1_epi32(0x40));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; i++) dst[i] = rt_f2bf(src[i]);
}

/* exp(x) = 2^n * e^r, n = round(x log2 e), |r| <= ln2/2, degree-7 Taylor (rel err ~1e-7) */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.5f)), _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
static float row_max_avx512(const float *x, int n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
    if (i < n) m = _mm512_mask_max_ps(m, (__mmask16)((1u << (n - i)) - 1), m,
                                      _mm512_maskz_loadu_ps((__mmask16)((1u << (n - i)) - 1), x + i));
    return _mm512_reduce_max_ps(m);
}
static float exp_sub_sum_avx512(float *x, int n, float mx) {
    __m512 s = _mm512_setzero_ps(), vm = _mm512_set1_ps(mx);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(x + i, e);
        s = _mm512_add_ps(s, e);
    }
    float t = _mm512_reduce_add_ps(s);
    for (; i < n; i++) { x[i] = expf(x[i] - mx); t += x[i]; }
    return t;
}
static void scale_avx512(float *x, int n, float s) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(s)));
    for (; i < n; i++) x[i] *= s;
}
static void axpy_avx512(float *y, const float *x, int n, float a) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(_mm512_set1_ps(a), _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
static float dot_avx512(const float *x, const float *y, int n) {
    __m512 s = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), s);
    float t = _mm512_reduce_add_ps(s);
    for (; i < n; i++) t += x[i] * y[i];
    return t;
}

const rt_simd rt_simd_avx512 = {
    "avx512", MR, 32, 16, ukr_avx512, mm_avx512, h2f_avx512, f2h_avx512, row_max_avx512,
    exp_sub_sum_avx512, scale_avx512, axpy_avx512, dot_avx512, bf2f_avx512, f2bf_avx512,
};
