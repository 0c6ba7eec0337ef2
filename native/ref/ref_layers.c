/* Reference layer kernels (RMSNorm, RoPE, SwiGLU, embedding, LM-head cross-entropy, AdamW):
 * the textbook formulas in double, full logits materialised, no chunking. */
#include <math.h>
#include <stdlib.h>
#include "ref_kernels.h"

void ref_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C,
                     float eps) {
    for (int n = 0; n < N; n++) {
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)x[(size_t)n * C + c] * x[(size_t)n * C + c];
        double r = 1.0 / sqrt(ss / C + eps);
        rstd[n] = (float)r;
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (float)(x[(size_t)n * C + c] * r * w[c]);
    }
}

void ref_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                     int N, int C, float eps) {
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *gr = dout + (size_t)n * C;
        double ss = 0.0, proj = 0.0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        double r = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) proj += (double)gr[c] * w[c] * xr[c] * r;
        for (int c = 0; c < C; c++) {
            dx[(size_t)n * C + c] = (float)(r * (gr[c] * w[c] - xr[c] * r * proj / C));
            dw[c] += (float)(gr[c] * xr[c] * r);
        }
    }
}

void ref_rope(float *out, const float *x, int B, int T, int H, int D, const float *inv_freq,
              float scale, int inverse) {
    int half = D / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                const float *xr = x + (((size_t)b * T + t) * H + h) * D;
                float *o = out + (((size_t)b * T + t) * H + h) * D;
                for (int i = 0; i < half; i++) {
                    double ang = (double)t * inv_freq[i];
                    double c = cos(ang) * scale, s = (inverse ? -sin(ang) : sin(ang)) * scale;
                    o[i] = (float)(xr[i] * c - xr[i + half] * s);
                    o[i + half] = (float)(xr[i + half] * c + xr[i] * s);
                }
            }
}

void ref_swiglu_fwd(float *out, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = (float)(gate[i] / (1.0 + exp(-(double)gate[i])) * up[i]);
}

void ref_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate,
                    const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double s = 1.0 / (1.0 + exp(-(double)gate[i]));
        dgate[i] = (float)(dout[i] * up[i] * s * (1.0 + gate[i] * (1.0 - s)));
        dup[i] = (float)(dout[i] * gate[i] * s);
    }
}

void ref_embedding_bwd(float *dtable, const float *dout, const int32_t *ids, int N, int C) {
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) dtable[(size_t)ids[n] * C + c] += dout[(size_t)n * C + c];
}

static double logits_row(double *z, const float *h, const float *w, int n, int V, int C) {
    double mx = -INFINITY, sum = 0.0;
    for (int v = 0; v < V; v++) {
        double s = 0.0;
        for (int c = 0; c < C; c++) s += (double)h[(size_t)n * C + c] * w[(size_t)v * C + c];
        z[v] = s;
        mx = s > mx ? s : mx;
    }
    for (int v = 0; v < V; v++) sum += exp(z[v] - mx);
    return mx + log(sum);
}

void ref_crossentropy_fwd(float *losses, float *lse, const float *h, const float *w,
                          const int32_t *targets, int N, int V, int C) {
    double *z = malloc((size_t)V * sizeof(double));
    for (int n = 0; n < N; n++) {
        double l = logits_row(z, h, w, n, V, C);
        lse[n] = (float)l;
        losses[n] = targets[n] < 0 ? 0.0f : (float)(l - z[targets[n]]);
    }
    free(z);
}

void ref_crossentropy_bwd(float *dh, float *dw, const float *h, const float *w,
                          const int32_t *targets, const float *dlosses, int N, int V, int C) {
    double *z = malloc((size_t)V * sizeof(double));
    for (int n = 0; n < N; n++) {
        double l = logits_row(z, h, w, n, V, C);
        for (int c = 0; c < C; c++) dh[(size_t)n * C + c] = 0.0f;
        if (targets[n] < 0) continue;
        for (int v = 0; v < V; v++) {
            double g = (exp(z[v] - l) - (v == targets[n])) * dlosses[n];
            for (int c = 0; c < C; c++) {
                dh[(size_t)n * C + c] += (float)(g * w[(size_t)v * C + c]);
                dw[(size_t)v * C + c] += (float)(g * h[(size_t)n * C + c]);
            }
        }
    }
    free(z);
}

void ref_adamw_step(float *p, float *m, float *v, const float *g, size_t n, float lr,
                    float beta1, float beta2, float eps, float wd, int step) {
    double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
    for (size_t i = 0; i < n; i++) {
        double pi = p[i] * (1.0 - (double)lr * wd);
        m[i] = (float)(beta1 * (double)m[i] + (1.0 - beta1) * g[i]);
        v[i] = (float)(beta2 * (double)v[i] + (1.0 - beta2) * (double)g[i] * g[i]);
        p[i] = (float)(pi - lr * (m[i] / bc1) / (sqrt(v[i] / bc2) + eps));
    }
}
