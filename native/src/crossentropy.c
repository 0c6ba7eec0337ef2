/* Cross-entropy fused with the LM head, chunked over the vocabulary so the N x V logits never
 * exist: each chunk's logits = h @ W[v0:v1]^T go through the blocked GEMM into an N x chunk
 * FP32 workspace, then an online log-sum-exp (forward) or the softmax gradient (backward).
 *   forward:  loss[n] = lse[n] - logit[n, target[n]]   (target < 0: ignored, loss 0)
 *   backward: G = (softmax - onehot) * dloss[n];  dh = G @ W;  dW += G^T @ h  (f32, +=)
 * and the backward's two halves for zb1 (NOTE [split logits gradient]).
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

/* ws [N, vc] f32 = G of the chunk: softmax(logits) - onehot(target), times dlosses[n] (rows of
 * ignored targets are zero) */
static int grad_chunk(float *ws, const void *h, const void *w, const int32_t *targets,
                      const float *lse, const float *dlosses, int N, int C, int v0, int vc,
                      rt_dtype dt, const rt_simd *S, int threads) {
    int st = logits_chunk(ws, h, w, N, C, v0, vc, dt, threads);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int n = 0; n < N; n++) {
        float *row = ws + (size_t)n * vc;
        int t = targets[n];
        if (t < 0) { memset(row, 0, (size_t)vc * 4); continue; }
        S->exp_sub_sum(row, vc, lse[n]);                          /* softmax */
        if (t >= v0 && t < v0 + vc) row[t - v0] -= 1.0f;
        S->scale(row, vc, dlosses[n]);
    }
    return st;
}

/* dh32 [N, C] += G [N, vc] @ W[v0:v0+vc]; G is bf16 in bf16 (NOTE [bf16 logits gradient]),
 * else f32 */
static int dh_chunk(float *dh32, const void *g, const void *wc, int N, int C, int vc,
                    rt_dtype dt, int threads) {
    if (dt == RT_BF16)
        return gemm_fwd_bf16(dh32, RT_F32, g, wc, NULL, N, C, vc, RT_ACCUMULATE, threads);
    rt_gemm_args a = {dh32, RT_F32, g, RT_F32, wc, dt, NULL, N, C, vc, RT_ACCUMULATE, vc, C, C};
    return rt_gemm(&a, threads);
}

/* dw[v0:v0+vc] [vc, C] += G^T @ h */
static int dw_chunk(float *dwc, const void *g, const void *h, int N, int C, int vc,
                    rt_dtype dt, int threads) {
    if (dt == RT_BF16)
        return gemm_fwd_bf16(dwc, RT_F32, g, h, NULL, vc, C, N, RT_TRANS_A | RT_ACCUMULATE,
                             threads);
    rt_gemm_args a = {dwc, RT_F32, g, RT_F32, h, dt, NULL, vc, C, N, RT_TRANS_A | RT_ACCUMULATE,
                      vc, C, C};
    return rt_gemm(&a, threads);
}

static const void *w_rows(const void *w, int v0, int C, rt_dtype dt) {
    return (const char *)w + (size_t)v0 * C * rt_esize(dt);
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
        st = grad_chunk(ws, h, w, targets, lse, dlosses, N, C, v0, vc, dt, S, threads);
        const void *g = ws;
        if (dt == RT_BF16) { S->f2bf(gb, ws, (size_t)N * vc); g = gb; }
        if (!st) st = dh_chunk(dh32, g, w_rows(w, v0, C, dt), N, C, vc, dt, threads);
        if (!st) st = dw_chunk(dw + (size_t)v0 * C, g, h, N, C, vc, dt, threads);
    }
    rt_store_f32(S, dh, 0, dh32, (size_t)N * C, dt);
    free(ws); free(dh32); free(gb);
    return st;
}

/* NOTE [split logits gradient]: zb1's B and W halves of rt_crossentropy_bwd. B runs its
 * chunks' logits, G and dh GEMMs and keeps every chunk's G in g (N x V elements, chunk by
 * chunk: the chunk at v0 is the N x vc block at g + N * v0, as the fused kernel holds it in
 * its workspace); W runs the dW GEMMs on those blocks. The GEMM calls and their operands
 * are the fused kernel's, so B then W compute its bits. g is f32, bf16 in bf16. */
int rt_crossentropy_bwd_input(void *dh, void *g, const void *h, const void *w,
                              const int32_t *targets, const float *lse, const float *dlosses,
                              int N, int V, int C, int chunk, rt_dtype dt, int threads) {
    if (N <= 0 || V <= 0 || C <= 0 || chunk <= 0) return RT_EINVAL;
    int vc_max = rt_min(chunk, V);
    float *dh32 = calloc((size_t)N * C, 4);
    float *ws = dt == RT_BF16 ? malloc((size_t)N * vc_max * 4) : NULL;
    if (!dh32 || (dt == RT_BF16 && !ws)) { free(dh32); free(ws); return RT_ENOMEM; }
    const rt_simd *S = rt_simd_get();
    int st = RT_OK;
    for (int v0 = 0; v0 < V && !st; v0 += vc_max) {
        int vc = rt_min(vc_max, V - v0);
        size_t at = (size_t)N * v0;
        float *f = dt == RT_BF16 ? ws : (float *)g + at;
        st = grad_chunk(f, h, w, targets, lse, dlosses, N, C, v0, vc, dt, S, threads);
        const void *gc = f;
        if (dt == RT_BF16) {
            gc = (rt_bf16 *)g + at;
            S->f2bf((rt_bf16 *)gc, ws, (size_t)N * vc);
        }
        if (!st) st = dh_chunk(dh32, gc, w_rows(w, v0, C, dt), N, C, vc, dt, threads);
    }
    rt_store_f32(S, dh, 0, dh32, (size_t)N * C, dt);
    free(dh32); free(ws);
    return st;
}

int rt_crossentropy_bwd_weight(float *dw, const void *g, const void *h, int N, int V, int C,
                               int chunk, rt_dtype dt, int threads) {
    if (N <= 0 || V <= 0 || C <= 0 || chunk <= 0) return RT_EINVAL;
    int vc_max = rt_min(chunk, V), st = RT_OK;
    size_t gsize = dt == RT_BF16 ? 2 : 4;
    for (int v0 = 0; v0 < V && !st; v0 += vc_max)
        st = dw_chunk(dw + (size_t)v0 * C, (const char *)g + (size_t)N * v0 * gsize, h, N, C,
                      rt_min(vc_max, V - v0), dt, threads);
    return st;
}
