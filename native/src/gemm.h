/* Internal GEMM entry with strides and mixed input dtypes, shared by the public gemm_fwd_*
 * wrappers and by kernels that multiply inside (cross-entropy's vocabulary chunks). */
#ifndef RATRAIN_GEMM_H
#define RATRAIN_GEMM_H
#include "internal.h"

typedef struct {
    void *out; rt_dtype out_dt;            /* out [M, ldc] */
    const void *a; rt_dtype a_dt;          /* a [M, lda] or [K, lda] with RT_TRANS_A */
    const void *b; rt_dtype b_dt;          /* b [K, ldb] or [N, ldb] with RT_TRANS_B */
    const float *bias;                     /* [N] or NULL */
    int M, N, K, flags;
    int lda, ldb, ldc;                     /* row strides in elements; 0 = dense */
} rt_gemm_args;

int rt_gemm(const rt_gemm_args *g, int threads);

/* Check `g` and fill its dense strides (0 -> the packed row length): RT_EINVAL or 0.
 * Shared by rt_gemm and the bf16 entries (gemm_bf16.c). */
static inline int rt_gemm_prepare(rt_gemm_args *g, int threads) {
    if (g->M <= 0 || g->N <= 0 || g->K <= 0 || threads < 1 || threads > RT_MAX_THREADS)
        return RT_EINVAL;
    if ((g->flags & RT_ACCUMULATE) && g->out_dt != RT_F32) return RT_EINVAL;
    if (!g->lda) g->lda = (g->flags & RT_TRANS_A) ? g->M : g->K;
    if (!g->ldb) g->ldb = (g->flags & RT_TRANS_B) ? g->K : g->N;
    if (!g->ldc) g->ldc = g->N;
    return 0;
}
#endif
