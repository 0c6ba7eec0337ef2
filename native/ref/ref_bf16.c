/* Reference bf16 kernels: the fp32 -> bf16 rounding written from its definition (keep 8
 * significant bits, round half to even with rint in double) rather than the bit trick the
 * kernels use, and the bf16 GEMM as obvious loops in double. */
#include <math.h>
#include <string.h>
#include "ref_kernels.h"

#define BF16_MAX 3.3895313892515355e38      /* (2 - 2^-7) * 2^127 */

static uint16_t top_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)(x >> 16);
}

void ref_f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double d = src[i];
        if (isnan(d)) { dst[i] = top_half(src[i]) | 0x40u; continue; }   /* quiet, same sign */
        if (d == 0.0 || isinf(d)) { dst[i] = top_half(src[i]); continue; }
        int e;
        frexp(d, &e);                                   /* |d| in [2^(e-1), 2^e) */
        int q = e - 8 < -133 ? -133 : e - 8;            /* ulp: 8 bits, or the subnormal 2^-133 */
        double r = rint(ldexp(d, -q));                  /* ties to even (default rounding) */
        r = ldexp(r, q);
        if (fabs(r) > BF16_MAX) r = copysign(INFINITY, d);
        dst[i] = top_half((float)r);                    /* exact: r has at most 8 bits */
    }
}

static double widen(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

void ref_gemm_bf16(float *out, const uint16_t *a, const uint16_t *b, int M, int N, int K,
                   int trans_a, int trans_b) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++) {
                uint16_t av = trans_a ? a[(size_t)k * M + i] : a[(size_t)i * K + k];
                uint16_t bv = trans_b ? b[(size_t)j * K + k] : b[(size_t)k * N + j];
                s += widen(av) * widen(bv);
            }
            out[(size_t)i * N + j] = (float)s;
        }
}
