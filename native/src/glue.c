/* Glue the generated programs call between kernels: element-wise adds (residual streams),
 * gradient accumulation into fp32 buffers, column sums (bias gradients) and the loss mean
 * and its gradient. fp16 and bf16 operands are widened to fp32 in chunks, computed, and
 * rounded once (nearest even, as numpy does); every result is bit-identical to the
 * per-element loops the generated modules used to carry. */
#include "internal.h"

#define CHUNK 1024   /* fp32 elements staged per step of the 16-bit helpers */

int rt_add_f32(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    return RT_OK;
}

int rt_accumulate_set_f32(float *target, const float *value, size_t n) {
    memmove(target, value, n * sizeof(float));
    return RT_OK;
}

int rt_accumulate_add_f32(float *target, const float *value, size_t n) {
    for (size_t i = 0; i < n; i++) target[i] = target[i] + value[i];
    return RT_OK;
}

int rt_column_sums_f32(float *out, const float *x, size_t rows, size_t cols) {
    memset(out, 0, cols * sizeof(float));
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) out[c] = out[c] + x[r * cols + c];
    return RT_OK;
}

/* The 16-bit twins: X is the name suffix, T the storage type, WIDEN / ROUND the rt_simd
 * converters to and from fp32 (h2f/f2h for fp16, bf2f/f2bf for bf16). */
#define RT_GLUE_16(X, T, WIDEN, ROUND)                                                     \
int rt_add_##X(T *out, const T *a, const T *b, size_t n) {                                 \
    const rt_simd *S = rt_simd_get();                                                      \
    float ta[CHUNK], tb[CHUNK];                                                            \
    for (size_t at = 0; at < n; at += CHUNK) {                                             \
        size_t w = n - at < CHUNK ? n - at : CHUNK;                                        \
        S->WIDEN(ta, a + at, w);                                                           \
        S->WIDEN(tb, b + at, w);                                                           \
        for (size_t i = 0; i < w; i++) ta[i] = ta[i] + tb[i];                              \
        S->ROUND(out + at, ta, w);                                                         \
    }                                                                                      \
    return RT_OK;                                                                          \
}                                                                                          \
int rt_accumulate_set_##X(float *target, const T *value, size_t n) {                       \
    rt_simd_get()->WIDEN(target, value, n);                                                \
    return RT_OK;                                                                          \
}                                                                                          \
int rt_accumulate_add_##X(float *target, const T *value, size_t n) {                       \
    const rt_simd *S = rt_simd_get();                                                      \
    float t[CHUNK];                                                                        \
    for (size_t at = 0; at < n; at += CHUNK) {                                             \
        size_t w = n - at < CHUNK ? n - at : CHUNK;                                        \
        S->WIDEN(t, value + at, w);                                                        \
        for (size_t i = 0; i < w; i++) target[at + i] = target[at + i] + t[i];             \
    }                                                                                      \
    return RT_OK;                                                                          \
}                                                                                          \
int rt_column_sums_##X(T *out, const T *x, size_t rows, size_t cols) {                     \
    const rt_simd *S = rt_simd_get();                                                      \
    float acc[CHUNK], t[CHUNK];                                                            \
    for (size_t at = 0; at < cols; at += CHUNK) {                                          \
        size_t w = cols - at < CHUNK ? cols - at : CHUNK;                                  \
        memset(acc, 0, w * sizeof(float));                                                 \
        for (size_t r = 0; r < rows; r++) {                                                \
            S->WIDEN(t, x + r * cols + at, w);                                             \
            for (size_t c = 0; c < w; c++) acc[c] = acc[c] + t[c];                         \
        }                                                                                  \
        S->ROUND(out + at, acc, w);                                                        \
    }                                                                                      \
    return RT_OK;                                                                          \
}
RT_GLUE_16(f16, rt_half, h2f, f2h)
RT_GLUE_16(bf16, rt_bf16, bf2f, f2bf)

int rt_mean_into(float *out, const float *x, size_t n) {
    double total = 0;
    for (size_t i = 0; i < n; i++) total += x[i];
    out[0] = (float)(total / n);
    return RT_OK;
}

/* d(mean)/d(x[i]) = total / n for every element */
int rt_spread(const float *total, float *out, size_t n) {
    float each = total[0] / n;
    for (size_t i = 0; i < n; i++) out[i] = each;
    return RT_OK;
}
