/* Shared internals of the native kernels: the per-ISA primitive table (rt_simd), scratch
 * arenas (GSM per cluster, AM per core), portable half<->float and small helpers. Kernel
 * files are ISA-neutral C that call the primitives of the path chosen at run time. */
#ifndef RATRAIN_INTERNAL_H
#define RATRAIN_INTERNAL_H
#include <math.h>
#include <string.h>
#include "ratrain_kernels.h"

#define RT_MAX_THREADS 64
#define RT_ALIGN 64

/* Per-ISA primitives; every pointer is 64-byte aligned unless noted, n any size. */
typedef struct {
    const char *name;
    int mr, nr;                 /* GEMM micro-tile: MR rows x NR columns */
    int vec;                    /* float lanes; small-matmul column counts are multiples */
    /* c[MR,NR] (row stride ldc) = (first ? 0 : c) + a_panel[kc][MR] @ b_panel[kc][NR] */
    void (*gemm_ukr)(int kc, const float *a, const float *b, float *c, int ldc, int first);
    /* c[m,n] = (beta ? c : 0) + a[m,k] (stride lda) @ b[k,n] (stride ldb); n % vec == 0 */
    void (*mm)(float *c, int ldc, const float *a, int lda, const float *b, int ldb,
               int m, int n, int k, int beta);
    void (*h2f)(float *dst, const rt_half *src, size_t n);       /* unaligned ok */
    void (*f2h)(rt_half *dst, const float *src, size_t n);       /* unaligned ok, RNE */
    float (*row_max)(const float *x, int n);
    float (*exp_sub_sum)(float *x, int n, float m);   /* x = exp(x - m); returns sum */
    void (*scale)(float *x, int n, float s);          /* x *= s */
    void (*axpy)(float *y, const float *x, int n, float a);   /* y += a * x */
    float (*dot)(const float *x, const float *y, int n);
} rt_simd;

extern const rt_simd rt_simd_scalar, rt_simd_avx2, rt_simd_avx512;
const rt_simd *rt_simd_get(void);              /* the path chosen (dispatch.c) */

/* scratch: one GSM buffer shared by the threads, one AM buffer per thread (dma.c) */
void *rt_gsm(void);
void *rt_am(int tid);

/* portable bit-exact IEEE half conversion (scalar.c) */
float rt_h2f(rt_half h);
rt_half rt_f2h(float f);

static inline size_t rt_round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
static inline int rt_min(int a, int b) { return a < b ? a : b; }
static inline int rt_max(int a, int b) { return a > b ? a : b; }
static inline size_t rt_esize(rt_dtype dt) { return dt == RT_F16 ? 2 : 4; }
/* load n elements of dtype dt starting at element offset off into f32 dst */
static inline void rt_load_f32(const rt_simd *S, float *dst, const void *src, size_t off,
                               size_t n, rt_dtype dt) {
    if (dt == RT_F16) S->h2f(dst, (const rt_half *)src + off, n);
    else memcpy(dst, (const float *)src + off, n * sizeof(float));
}
static inline void rt_store_f32(const rt_simd *S, void *dst, size_t off, const float *src,
                                size_t n, rt_dtype dt) {
    if (dt == RT_F16) S->f2h((rt_half *)dst + off, src, n);
    else memcpy((float *)dst + off, src, n * sizeof(float));
}
#endif
