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
#endif
