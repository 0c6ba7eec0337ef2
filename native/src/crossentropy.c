/* Cross-entropy fused with the LM head, chunked over the vocabulary so the N x V logits never
 * exist: each chunk's logits = h @ W[v0:v1]^T go through the blocked GEMM into an N x chunk
 * FP32 workspace, then an online log-sum-exp (forward) or the softmax gradient (backward).
 *   forward:  loss[n] = lse[n] - logit[n, target[n]]   (target < 0: ignored, loss 0)
 *   backward: G = (softmax - onehot) * dloss[n];  dh = G @ W;  dW += G^T @ h  (f32, +=)
 *
 * NOTE [bf16 logits gradient]: in bf16, G is rounded to bf16 (nearest even) before its two
 * GEMMs, so they run on the bf16 GEMM (AMX tiles where permitted) instead of widening W and
 * h to fp32: the backward of the LM head is most of a small model's step. PyTorch's bf16
 * autocast does the same (its matmul backward takes a bf16 gradient). G's entries then
 * carry a relative error of at most 2^-9; dh and dW still sum in fp32. */
#include <omp.h>
#include <stdlib.h>
#include "gemm.h"
#include "layers.h"

/* ws [N, vc] f32 = h @ W[v0:v0+vc]^T; bf16 runs on the bf16 GEMM (AMX or VDPBF16PS where
 * the path has them): exact bf16 products, fp32 sums, as the widening GEMM computes them */
static int logits_chunk(float *ws, const void *h, const void *w, int N, int C, int v0, int vc,
                        rt_dtype dt, int threads) {
    if (dt == RT_BF16)
        return gemm_fwd_bf16(ws, RT_F32, h, (const rt_bf16 *)w + (size_t)v0 * C, NULL, N, vc, C,
                             RT_TRANS_B, threads);
    rt_gemm_args g = {ws, RT_F32, h, dt, (const char *)w + (size_t)v0 * C * rt_esize(dt), dt,
                      NULL, N, vc, C, RT_TRANS_B, C, C, vc};
    return rt_gemm(&g, threads);
}

int rt_crossentropy_fwd(float *losses, float *lse, const void *h, const void *w,
                        const int32_t *targets, int N, int V, int C, int chunk, rt_dtype dt,
                        int threads) {
    if (N <= 0 || V <= 0 || C <= 0 || chunk <= 0) return RT_EINVAL;
    int vc_max = rt_min(chunk, V);
    float *ws = malloc((size_t)N * vc_max * 4), *m = malloc((size_t)N * 8), *l = m + N;
    if (!ws || !m) { free(ws); free(m); return RT_ENOMEM; }
    for (int n = 0; n < N; n++) { m[n] = -INFINITY; l[n] = 0.0f; losses[n] = 0.0f; }
    const rt_simd *S = rt_simd_get();
    int st = RT_OK;
    for (int v0 = 0; v0 < V && !st; v0 += vc_max) {
        int vc = rt_min(vc_max, V - v0);
        st = logits_chunk(ws, h, w, N, C, v0, vc, dt, threads);
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int n = 0; n < N; n++) {
            float *row = ws + (size_t)n * vc;
            int t = targets[n];
            if (t >= v0 && t < v0 + vc) losses[n] = -row[t - v0];   /* lse added at the end */
            float mx = fmaxf(m[n], S->row_max(row, vc));
            l[n] = l[n] * expf(m[n] - mx) + S->exp_sub_sum(row, vc, mx);
            m[n] = mx;
        }
    }
    for (int n = 0; n < N; n++) {
        lse[n] = m[n] + logf(l[n]);
        losses[n] = targets[n] < 0 ? 0.0f : losses[n] + lse[n];
    }
    free(ws); free(m);
    return st;
}

int rt_crossentropy_bwd(void *dh, float *dw, const void *h, const void *w,
                        const int32_t *targets, const float *lse, const float *dlosses, int N,
                        int V, int C, int chunk, rt_dtype dt, int threads) {
    if (N <= 0 || V <= 0 || C <= 0 || chunk <= 0) return RT_EINVAL;
    int vc_max = rt_min(chunk, V);
    float *ws = malloc((size_t)N * vc_max * 4), *dh32 = calloc((size_t)N * C, 4);
    rt_bf16 *gb = dt == RT_BF16 ? malloc((size_t)N * vc_max * 2) : NULL;
    if (!ws || !dh32 || (dt == RT_BF16 && !gb)) {
        free(ws); free(dh32); free(gb);
        return RT_ENOMEM;
    }
    const rt_simd *S = rt_simd_get();
    int st = RT_OK;
    for (int v0 = 0; v0 < V && !st; v0 += vc_max) {
        int vc = rt_min(vc_max, V - v0);
        st = logits_chunk(ws, h, w, N, C, v0, vc, dt, threads);
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int n = 0; n < N; n++) {
            float *row = ws + (size_t)n * vc;
            int t = targets[n];
            if (t < 0) { memset(row, 0, (size_t)vc * 4); continue; }
            S->exp_sub_sum(row, vc, lse[n]);                          /* softmax */
            if (t >= v0 && t < v0 + vc) row[t - v0] -= 1.0f;
            S->scale(row, vc, dlosses[n]);
        }
        const void *wc = (const char *)w + (size_t)v0 * C * rt_esize(dt);
        if (dt == RT_BF16) {    /* NOTE [bf16 logits gradient] */
            S->f2bf(gb, ws, (size_t)N * vc);
            if (!st) st = gemm_fwd_bf16(dh32, RT_F32, gb, wc, NULL, N, C, vc, RT_ACCUMULATE,
                                        threads);
            if (!st) st = gemm_fwd_bf16(dw + (size_t)v0 * C, RT_F32, gb, h, NULL, vc, C, N,
                                        RT_TRANS_A | RT_ACCUMULATE, threads);
            continue;
        }
        rt_gemm_args gh = {dh32, RT_F32, ws, RT_F32, wc, dt, NULL, N, C, vc, RT_ACCUMULATE, vc, C, C};
        rt_gemm_args gw = {dw + (size_t)v0 * C, RT_F32, ws, RT_F32, h, dt, NULL, vc, C, N,
                           RT_TRANS_A | RT_ACCUMULATE, vc, C, C};
        if (!st) st = rt_gemm(&gh, threads);
        if (!st) st = rt_gemm(&gw, threads);
    }
    rt_store_f32(S, dh, 0, dh32, (size_t)N * C, dt);
    free(ws); free(dh32); free(gb);
    return st;
}
