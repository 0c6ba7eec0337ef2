/* Portable C path: bit-exact IEEE half and bf16 conversion and the scalar versions of the rt_simd
 * primitives. Used when RATRAIN_ISA=scalar or the CPU has neither AVX2+FMA nor AVX-512;
 * it is also the model the SIMD files must agree with. */
#include "internal.h"

float rt_h2f(rt_half h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {                                  /* zero or subnormal: m * 2^-24 */
        float f = (float)m * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (e == 31) bits = sign | 0x7f800000u | (m << 13);          /* inf / nan */
    else bits = sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

rt_half rt_f2h(float f) {
    uint32_t x, ax;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (rt_half)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  /* nan */
    if (ax >= 0x477ff000u) return (rt_half)(sign | 0x7c00u);   /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                        /* below 2^-14: subnormal, RNE by lrintf */
        float a;
        memcpy(&a, &ax, 4);
        return (rt_half)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    ax += 0xfffu + ((ax >> 13) & 1u);              /* round to nearest even */
    return (rt_half)(sign | ((ax - 0x38000000u) >> 13));
}

static void ukr_scalar(int kc, const float *a, const float *b, float *c, int ldc, int first) {
    float acc[4][8] = {{0}};
    for (int p = 0; p < kc; p++, a += 4, b += 8)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 8; j++) acc[i][j] += a[i] * b[j];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++) c[i * ldc + j] = (first ? 0.0f : c[i * ldc + j]) + acc[i][j];
}

static void mm_scalar(float *c, int ldc, const float *a, int lda, const float *b, int ldb,
                      int m, int n, int k, int beta) {
    for (int i = 0; i < m; i++) {
        float *ci = c + (size_t)i * ldc;
        if (!beta) memset(ci, 0, (size_t)n * sizeof(float));
        for (int p = 0; p < k; p++) {
            float aip = a[(size_t)i * lda + p];
            const float *bp = b + (size_t)p * ldb;
            for (int j = 0; j < n; j++) ci[j] += aip * bp[j];
        }
    }
}

static void h2f_scalar(float *dst, const rt_half *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = rt_h2f(src[i]);
}
static void f2h_scalar(rt_half *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = rt_f2h(src[i]);
}
static void bf2f_scalar(float *dst, const rt_bf16 *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = rt_bf2f(src[i]);
}
static void f2bf_scalar(rt_bf16 *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = rt_f2bf(src[i]);
}
static float row_max_scalar(const float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}
static float exp_sub_sum_scalar(float *x, int n, float m) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - m); s += x[i]; }
    return s;
}
static void scale_scalar(float *x, int n, float s) {
    for (int i = 0; i < n; i++) x[i] *= s;
}
static void axpy_scalar(float *y, const float *x, int n, float a) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}
static float dot_scalar(const float *x, const float *y, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}

const rt_simd rt_simd_scalar = {
    "scalar", 4, 8, 1, ukr_scalar, mm_scalar, h2f_scalar, f2h_scalar, row_max_scalar,
    exp_sub_sum_scalar, scale_scalar, axpy_scalar, dot_scalar, bf2f_scalar, f2bf_scalar,
};
