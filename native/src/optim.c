/* Optimizer-side kernels: the AdamW step on FP32 master weights (writing the FP16 or BF16
 * view the forward pass reads), fp16 and bf16 casts, and the finite-check + sum-of-squares
 * reduction used for gradient clipping and dynamic loss scaling. */
#include <omp.h>
#include "layers.h"

#define CHUNK 4096

/* torch.optim.AdamW: p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps); then the 16-bit view of
 * each chunk (view_dt RT_F16 or RT_BF16, both round to nearest even) if view is not NULL */
static int adamw_step(float *master, float *m, float *v, void *view, rt_dtype view_dt,
                      const float *grad, size_t n, float lr, float beta1, float beta2,
                      float eps, float wd, int step) {
    if (step < 1) return RT_EINVAL;
    const rt_simd *S = rt_simd_get();
    float bc1 = 1.0f - powf(beta1, (float)step), bc2_sqrt = sqrtf(1.0f - powf(beta2, (float)step));
    float step_size = lr / bc1, decay = 1.0f - lr * wd;
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t len = n - off < CHUNK ? n - off : CHUNK;
        float *p = master + off, *mm = m + off, *vv = v + off;
        const float *g = grad + off;
        for (size_t i = 0; i < len; i++) {
            p[i] *= decay;
            mm[i] = beta1 * mm[i] + (1.0f - beta1) * g[i];
            vv[i] = beta2 * vv[i] + (1.0f - beta2) * g[i] * g[i];
            p[i] -= step_size * mm[i] / (sqrtf(vv[i]) / bc2_sqrt + eps);
        }
        if (view) rt_store_f32(S, view, off, p, len, view_dt);
    }
    return RT_OK;
}

int adamw_step_f32(float *master, float *m, float *v, rt_half *param_f16, const float *grad,
                   size_t n, float lr, float beta1, float beta2, float eps, float wd, int step) {
    return adamw_step(master, m, v, param_f16, RT_F16, grad, n, lr, beta1, beta2, eps, wd, step);
}
int adamw_step_f32_bf16(float *master, float *m, float *v, rt_bf16 *param_bf16,
                        const float *grad, size_t n, float lr, float beta1, float beta2,
                        float eps, float wd, int step) {
    return adamw_step(master, m, v, param_bf16, RT_BF16, grad, n, lr, beta1, beta2, eps, wd,
                      step);
}

int cast_f32_to_f16(rt_half *dst, const float *src, size_t n) {
    rt_simd_get()->f2h(dst, src, n);
    return RT_OK;
}
int cast_f16_to_f32(float *dst, const rt_half *src, size_t n) {
    rt_simd_get()->h2f(dst, src, n);
    return RT_OK;
}
int cast_f32_to_bf16(rt_bf16 *dst, const float *src, size_t n) {
    rt_simd_get()->f2bf(dst, src, n);
    return RT_OK;
}
int cast_bf16_to_f32(float *dst, const rt_bf16 *src, size_t n) {
    rt_simd_get()->bf2f(dst, src, n);
    return RT_OK;
}

/* returns 1 when every element is finite; *sumsq in double (chunk partials in f32 staging) */
int rt_finite_sumsq(double *sumsq, const void *x, size_t n, rt_dtype dt, int threads) {
    const rt_simd *S = rt_simd_get();
    long nchunks = (long)((n + CHUNK - 1) / CHUNK);
    double total = 0.0;
    int finite = 1;
    #pragma omp parallel num_threads(threads) reduction(+:total) reduction(&&:finite)
    {
        float *buf = rt_am(omp_get_thread_num());
        #pragma omp for schedule(static)
        for (long ch = 0; ch < nchunks; ch++) {
            size_t off = (size_t)ch * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
            rt_load_f32(S, buf, x, off, len, dt);
            double part = 0.0;
            for (size_t i = 0; i < len; i++) part += (double)buf[i] * buf[i];
            finite = finite && isfinite(part);
            total += part;
        }
    }
    *sumsq = total;
    return finite;
}
