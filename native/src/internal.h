/* Shared internals of the native kernels: the per-ISA primitive table (rt_simd), the bf16
 * GEMM kernel table, scratch arenas (GSM per cluster, AM per core), portable half/bf16<->float
 * and small helpers. Kernel files are ISA-neutral C that call the primitives of the path
 * chosen at run time. */
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
    void (*bf2f)(float *dst, const rt_bf16 *src, size_t n);      /* unaligned ok, exact */
    void (*f2bf)(rt_bf16 *dst, const float *src, size_t n);      /* unaligned ok, RNE */
} rt_simd;

extern const rt_simd rt_simd_scalar, rt_simd_avx2, rt_simd_avx512;
const rt_simd *rt_simd_get(void);              /* the path chosen (dispatch.c) */

/* bf16 GEMM kernels of the paths with bf16 dot products (gemm_bf16.c drives them). Panels of
 * op(b) are pair-interleaved: strip row p holds NR 32-bit pairs (b[2p][j], b[2p+1][j]), the
 * layout both VDPBF16PS and an AMX B tile read. K is zero-padded to a multiple of kstep. */
typedef struct {
    const char *name;
    int mr, nr;                 /* micro-tile: MR rows x NR columns */
    int kstep, kc;              /* K padding unit; K chunk per packed A block (kstep multiple) */
    int a_rows;                 /* A micro-panel: 1 = [MR][kcp] rows (AMX); 0 = [kcp/2][MR] pairs */
    int (*begin)(void);         /* per thread before its first ukr call: RT_OK or RT_EISA */
    void (*end)(void);          /* per thread after its last ukr call */
    /* full A micro-panel (MR rows, kc a kstep multiple) of op(a) = a^T, a stored [K, M] with
     * row stride lda, from a at (k0, i0); NULL: gemm_bf16.c's portable loop packs it */
    void (*pack_a_trans)(rt_bf16 *dst, const rt_bf16 *a, size_t lda, int kc);
    /* full pairs [0, np) of a full NR-column strip of op(b), b at (0, j0); NULL: portable */
    void (*pack_b)(rt_bf16 *dst, const rt_bf16 *b, size_t ldb, int trans, int np);
    /* c[MR,NR] (row stride ldc) = (first ? 0 : c) + a_panel @ b_strip over kcp (padded) K */
    void (*ukr)(int kcp, const rt_bf16 *a, const rt_bf16 *b, float *c, int ldc, int first);
} rt_bf16_gemm;

extern const rt_bf16_gemm rt_bf16_gemm_amx, rt_bf16_gemm_avx512;
const rt_bf16_gemm *rt_bf16_gemm_get(void);    /* NULL: bf16 GEMMs widen to fp32 (dispatch.c) */
/* the pack_b of both bf16 kernels, NR = 32 (bf16_avx512.c) */
void rt_bf16_pack_b_avx512(rt_bf16 *dst, const rt_bf16 *b, size_t ldb, int trans, int np);
/* VCVTNEPS2BF16 cast with a subnormal fix-up, bit-identical to rt_f2bf (bf16_avx512.c) */
void rt_f2bf_avx512bf16(rt_bf16 *dst, const float *src, size_t n);

/* scratch: one GSM buffer shared by the threads, one AM buffer per thread (dma.c) */
void *rt_gsm(void);
void *rt_am(int tid);

/* portable bit-exact IEEE half conversion (scalar.c) */
float rt_h2f(rt_half h);
rt_half rt_f2h(float f);
/* bf16 is fp32's top half: widening is a shift; narrowing rounds to nearest even, and a NaN
 * keeps its sign and top payload bits with the quiet bit set (what VCVTNEPS2BF16 does) */
static inline float rt_bf2f(rt_bf16 h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline rt_bf16 rt_f2bf(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (rt_bf16)((x >> 16) | 0x40u);
    return (rt_bf16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);    /* ties to even; max -> inf */
}

static inline size_t rt_round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
static inline int rt_min(int a, int b) { return a < b ? a : b; }
static inline int rt_max(int a, int b) { return a > b ? a : b; }
static inline size_t rt_esize(rt_dtype dt) { return dt == RT_F32 ? 4 : 2; }
/* load n elements of dtype dt starting at element offset off into f32 dst */
static inline void rt_load_f32(const rt_simd *S, float *dst, const void *src, size_t off,
                               size_t n, rt_dtype dt) {
    if (dt == RT_F16) S->h2f(dst, (const rt_half *)src + off, n);
    else if (dt == RT_BF16) S->bf2f(dst, (const rt_bf16 *)src + off, n);
    else memcpy(dst, (const float *)src + off, n * sizeof(float));
}
static inline void rt_store_f32(const rt_simd *S, void *dst, size_t off, const float *src,
                                size_t n, rt_dtype dt) {
    if (dt == RT_F16) S->f2h((rt_half *)dst + off, src, n);
    else if (dt == RT_BF16) S->f2bf((rt_bf16 *)dst + off, src, n);
    else memcpy((float *)dst + off, src, n * sizeof(float));
}
#endif
