/* AVX2 + F16C + FMA path of the rt_simd primitives (6x16 GEMM micro-kernel, small matmul,
 * fp16/bf16 conversions, vectorised exp). Compiled via a file-wide target pragma; dispatch.c only
 * selects it on CPUs with avx2, fma and f16c. */
#pragma GCC target("avx2,f16c,fma")
#include <immintrin.h>
#include "internal.h"

#define MR 6
#define ROW_DECL(i) __m256 c##i##0 = _mm256_setzero_ps(), c##i##1 = _mm256_setzero_ps();
#define ROW_FMA(i) { __m256 ai = _mm256_broadcast_ss(a + i); \
    c##i##0 = _mm256_fmadd_ps(ai, b0, c##i##0); c##i##1 = _mm256_fmadd_ps(ai, b1, c##i##1); }
#define ROW_STORE(i) { float *ci = c + (i) * ldc; \
    if (!first) { c##i##0 = _mm256_add_ps(c##i##0, _mm256_load_ps(ci)); \
                  c##i##1 = _mm256_add_ps(c##i##1, _mm256_load_ps(ci + 8)); } \
    _mm256_store_ps(ci, c##i##0); _mm256_store_ps(ci + 8, c##i##1); }
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

static void ukr_avx2(int kc, const float *a, const float *b, float *c, int ldc, int first) {
    ROWS(ROW_DECL)
    for (int p = 0; p < kc; p++, a += MR, b += 16) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        ROWS(ROW_FMA)
    }
    ROWS(ROW_STORE)
}

/* c[R rows, V*8 cols] block of the small matmul, R <= 4, V <= 3 */
static inline void mm_block(float *c, int ldc, const float *a, int lda, const float *b,
                            int ldb, int k, int beta, int R, int V) {
    __m256 acc[4][3];
    for (int i = 0; i < R; i++)
        for (int v = 0; v < V; v++)
            acc[i][v] = beta ? _mm256_loadu_ps(c + (size_t)i * ldc + 8 * v) : _mm256_setzero_ps();
    for (int p = 0; p < k; p++) {
        __m256 bv[3];
        for (int v = 0; v < V; v++) bv[v] = _mm256_loadu_ps(b + (size_t)p * ldb + 8 * v);
        for (int i = 0; i < R; i++) {
            __m256 ai = _mm256_broadcast_ss(a + (size_t)i * lda + p);
            for (int v = 0; v < V; v++) acc[i][v] = _mm256_fmadd_ps(ai, bv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < R; i++)
        for (int v = 0; v < V; v++) _mm256_storeu_ps(c + (size_t)i * ldc + 8 * v, acc[i][v]);
}
static void mm_rows(float *c, int ldc, const float *a, int lda, const float *b, int ldb,
                    int m, int k, int beta, int V) {
    int i = 0;
    for (; i + 4 <= m; i += 4) {
        float *ci = c + (size_t)i * ldc; const float *ai = a + (size_t)i * lda;
        if (V == 3) mm_block(ci, ldc, ai, lda, b, ldb, k, beta, 4, 3);
        else if (V == 2) mm_block(ci, ldc, ai, lda, b, ldb, k, beta, 4, 2);
        else mm_block(ci, ldc, ai, lda, b, ldb, k, beta, 4, 1);
    }
    for (; i < m; i++) {
        float *ci = c + (size_t)i * ldc; const float *ai = a + (size_t)i * lda;
        if (V == 3) mm_block(ci, ldc, ai, lda, b, ldb, k, beta, 1, 3);
        else if (V == 2) mm_block(ci, ldc, ai, lda, b, ldb, k, beta, 1, 2);
        else mm_block(ci, ldc, ai, lda, b, ldb, k, beta, 1, 1);
    }
}
static void mm_avx2(float *c, int ldc, const float *a, int lda, const float *b, int ldb,
                    int m, int n, int k, int beta) {
    int j = 0;
    for (; j + 24 <= n; j += 24) mm_rows(c + j, ldc, a, lda, b + j, ldb, m, k, beta, 3);
    if (j < n) mm_rows(c + j, ldc, a, lda, b + j, ldb, m, k, beta, (n - j) / 8);
}

static void h2f_avx2(float *dst, const rt_half *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}
static void f2h_avx2(rt_half *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

static void bf2f_avx2(float *dst, const rt_bf16 *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i))), 16));
    for (; i < n; i++) dst[i] = rt_bf2f(src[i]);
}
/* rt_f2bf on 8 lanes: x + 0x7fff + (bit 16 of x) rounds ties to even; NaN -> x>>16 | 0x40 */
static void f2bf_avx2(rt_bf16 *dst, const float *src, size_t n) {
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 f = _mm256_loadu_ps(src + i);
        __m256i x = _mm256_castps_si256(f), hi = _mm256_srli_epi32(x, 16);
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(half, _mm256_and_si256(hi, one))), 16);
        __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
        r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
    }
    for (; i < n; i++) dst[i] = rt_f2bf(src[i]);
}

/* exp(x) = 2^n * e^r as in avx512.c; 2^n built in the exponent field (x clamped to normals) */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.5f)), _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static float row_max_avx2(const float *x, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    float t[8], r = -INFINITY;
    _mm256_storeu_ps(t, m);
    for (int j = 0; j < 8; j++) r = t[j] > r ? t[j] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}
static float exp_sub_sum_avx2(float *x, int n, float mx) {
    __m256 s = _mm256_setzero_ps(), vm = _mm256_set1_ps(mx);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        s = _mm256_add_ps(s, e);
    }
    float t = hsum256(s);
    for (; i < n; i++) { x[i] = expf(x[i] - mx); t += x[i]; }
    return t;
}
static void scale_avx2(float *x, int n, float s) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(s)));
    for (; i < n; i++) x[i] *= s;
}
static void axpy_avx2(float *y, const float *x, int n, float a) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_set1_ps(a), _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
static float dot_avx2(const float *x, const float *y, int n) {
    __m256 s = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s);
    float t = hsum256(s);
    for (; i < n; i++) t += x[i] * y[i];
    return t;
}

const rt_simd rt_simd_avx2 = {
    "avx2", MR, 16, 8, ukr_avx2, mm_avx2, h2f_avx2, f2h_avx2, row_max_avx2,
    exp_sub_sum_avx2, scale_avx2, axpy_avx2, dot_avx2, bf2f_avx2, f2bf_avx2,
};
