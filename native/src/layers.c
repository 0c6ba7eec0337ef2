/* Row-wise layer kernels of a LLaMA block: RMSNorm, RoPE, SwiGLU, embedding, each forward
 * and backward. Memory bound: rows are split over the threads, each row is converted to FP32
 * in the thread's AM buffer, computed in FP32 and cast back to the storage dtype. */
#include <omp.h>
#include <stdlib.h>
#include "layers.h"

#define CHUNK 2048   /* elements per AM staging buffer for flat kernels */

/* forward: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps), saved per row */
int rt_rmsnorm_fwd(void *out, float *rstd, const void *x, const void *w, int N, int C,
                   float eps, rt_dtype dt, int threads) {
    if (N <= 0 || C <= 0 || (size_t)C * 12 > rt_am_bytes()) return RT_EINVAL;
    const rt_simd *S = rt_simd_get();
    #pragma omp parallel num_threads(threads)
    {
        float *wf = rt_am(omp_get_thread_num()), *xf = wf + C;
        rt_load_f32(S, wf, w, 0, C, dt);
        #pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            rt_load_f32(S, xf, x, (size_t)n * C, C, dt);
            float r = 1.0f / sqrtf(S->dot(xf, xf, C) / (float)C + eps);
            for (int c = 0; c < C; c++) xf[c] = xf[c] * r * wf[c];
            rt_store_f32(S, out, (size_t)n * C, xf, C, dt);
            rstd[n] = r;
        }
    }
    return RT_OK;
}

/* backward of y = xhat * w, xhat = x * rstd:
 *   dx = rstd * (dy*w - xhat * mean(dy*w*xhat));  dw += sum_rows dy * xhat  (accumulated) */
int rt_rmsnorm_bwd(void *dx, float *dw, const void *dout, const void *x, const void *w,
                   const float *rstd, int N, int C, rt_dtype dt, int threads) {
    if (N <= 0 || C <= 0 || (size_t)C * 16 > rt_am_bytes()) return RT_EINVAL;
    const rt_simd *S = rt_simd_get();
    #pragma omp parallel num_threads(threads)
    {
        float *wf = rt_am(omp_get_thread_num()), *xf = wf + C, *gf = xf + C, *dwp = gf + C;
        rt_load_f32(S, wf, w, 0, C, dt);
        memset(dwp, 0, (size_t)C * 4);
        #pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            rt_load_f32(S, xf, x, (size_t)n * C, C, dt);
            rt_load_f32(S, gf, dout, (size_t)n * C, C, dt);
            float r = rstd[n], proj = 0.0f;
            for (int c = 0; c < C; c++) {
                xf[c] *= r;                          /* xhat */
                dwp[c] += gf[c] * xf[c];
                gf[c] *= wf[c];                      /* dxhat */
                proj += gf[c] * xf[c];
            }
            proj /= (float)C;
            for (int c = 0; c < C; c++) gf[c] = r * (gf[c] - xf[c] * proj);
            rt_store_f32(S, dx, (size_t)n * C, gf, C, dt);
        }
        #pragma omp critical
        for (int c = 0; c < C; c++) dw[c] += dwp[c];
    }
    return RT_OK;
}

/* HF rotate_half with cos, sin scaled by s (yarn's attention factor, else 1):
 * out[i] = s (x[i] cos - x[i+D/2] sin), out[i+D/2] = s (x[i+D/2] cos + x[i] sin), angle
 * t * inv_freq[i] (ratrain.models.rope computes inv_freq for every RoPE type); the backward
 * is the transpose: the inverse rotation (sin -> -sin) times the same s */
int rt_rope(void *out, const void *x, int B, int T, int H, int D, const float *inv_freq,
            float scale, int inverse, rt_dtype dt, int threads) {
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0 || D % 2 || !inv_freq ||
        (size_t)D * 8 > rt_am_bytes()) return RT_EINVAL;
    int half = D / 2;
    float *tab = malloc((size_t)T * D * sizeof(float));      /* [T][cos(D/2) sin(D/2)] */
    if (!tab) return RT_ENOMEM;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double ang = (double)t * inv_freq[i];
            tab[(size_t)t * D + i] = (float)(cos(ang) * scale);
            tab[(size_t)t * D + half + i] = (float)((inverse ? -sin(ang) : sin(ang)) * scale);
        }
    const rt_simd *S = rt_simd_get();
    size_t rows = (size_t)B * T * H;
    #pragma omp parallel num_threads(threads)
    {
        float *xf = rt_am(omp_get_thread_num()), *of = xf + D;
        #pragma omp for schedule(static)
        for (size_t r = 0; r < rows; r++) {
            const float *cs = tab + (r / H % T) * D, *sn = cs + half;
            rt_load_f32(S, xf, x, r * D, D, dt);
            for (int i = 0; i < half; i++) {
                of[i] = xf[i] * cs[i] - xf[i + half] * sn[i];
                of[i + half] = xf[i + half] * cs[i] + xf[i] * sn[i];
            }
            rt_store_f32(S, out, r * D, of, D, dt);
        }
    }
    free(tab);
    return RT_OK;
}

/* out = silu(g) * u = g * sigmoid(g) * u */
int rt_swiglu_fwd(void *out, const void *gate, const void *up, size_t n, rt_dtype dt, int threads) {
    const rt_simd *S = rt_simd_get();
    long nchunks = (long)((n + CHUNK - 1) / CHUNK);
    #pragma omp parallel num_threads(threads)
    {
        float *g = rt_am(omp_get_thread_num()), *u = g + CHUNK;
        #pragma omp for schedule(static)
        for (long ch = 0; ch < nchunks; ch++) {
            size_t off = (size_t)ch * CHUNK, m = n - off < CHUNK ? n - off : CHUNK;
            rt_load_f32(S, g, gate, off, m, dt);
            rt_load_f32(S, u, up, off, m, dt);
            for (size_t i = 0; i < m; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            rt_store_f32(S, out, off, g, m, dt);
        }
    }
    return RT_OK;
}

/* dgate = dy * u * s * (1 + g (1 - s)), dup = dy * g * s, s = sigmoid(g) */
int rt_swiglu_bwd(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                  size_t n, rt_dtype dt, int threads) {
    const rt_simd *S = rt_simd_get();
    long nchunks = (long)((n + CHUNK - 1) / CHUNK);
    #pragma omp parallel num_threads(threads)
    {
        float *g = rt_am(omp_get_thread_num()), *u = g + CHUNK, *dy = u + CHUNK;
        #pragma omp for schedule(static)
        for (long ch = 0; ch < nchunks; ch++) {
            size_t off = (size_t)ch * CHUNK, m = n - off < CHUNK ? n - off : CHUNK;
            rt_load_f32(S, g, gate, off, m, dt);
            rt_load_f32(S, u, up, off, m, dt);
            rt_load_f32(S, dy, dout, off, m, dt);
            for (size_t i = 0; i < m; i++) {
                float s = 1.0f / (1.0f + expf(-g[i])), gi = g[i];
                g[i] = dy[i] * u[i] * s * (1.0f + gi * (1.0f - s));
                u[i] = dy[i] * gi * s;
            }
            rt_store_f32(S, dgate, off, g, m, dt);
            rt_store_f32(S, dup, off, u, m, dt);
        }
    }
    return RT_OK;
}

int rt_embedding_fwd(void *out, const int32_t *ids, const void *table, int N, int V, int C,
                     rt_dtype dt, int threads) {
    size_t e = rt_esize(dt);
    for (int n = 0; n < N; n++) if (ids[n] < 0 || ids[n] >= V) return RT_EINVAL;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int n = 0; n < N; n++)
        memcpy((char *)out + (size_t)n * C * e, (const char *)table + (size_t)ids[n] * C * e, C * e);
    return RT_OK;
}

/* dtable[ids[n]] += dout[n]; threads split the columns so no two write the same element */
int rt_embedding_bwd(float *dtable, const void *dout, const int32_t *ids, int N, int V, int C,
                     rt_dtype dt, int threads) {
    for (int n = 0; n < N; n++) if (ids[n] < 0 || ids[n] >= V) return RT_EINVAL;
    if ((size_t)C * 4 > rt_am_bytes()) return RT_EINVAL;
    const rt_simd *S = rt_simd_get();
    #pragma omp parallel num_threads(threads)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        int c0 = C * tid / nt, c1 = C * (tid + 1) / nt;
        float *row = rt_am(tid);
        for (int n = 0; n < N && c1 > c0; n++) {
            rt_load_f32(S, row, dout, (size_t)n * C + c0, c1 - c0, dt);
            S->axpy(dtable + (size_t)ids[n] * C + c0, row, c1 - c0, 1.0f);
        }
    }
    return RT_OK;
}
