/* Reference GEMM and attention: direct formulas in double, one query row at a time (the
 * score row of length T is the only temporary), used to check the tiled kernels. */
#include <math.h>
#include <stdlib.h>
#include "ref_kernels.h"

void ref_gemm(float *out, const float *a, const float *b, int M, int N, int K, int trans_a,
              int trans_b) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++)
                s += (double)(trans_a ? a[(size_t)k * M + i] : a[(size_t)i * K + k]) *
                     (trans_b ? b[(size_t)j * K + k] : b[(size_t)k * N + j]);
            out[(size_t)i * N + j] = (float)s;
        }
}

#define AT(x, H, b, t, h) ((x) + ((((size_t)(b) * T + (t)) * (H) + (h)) * D))

/* p[j] = softmax_j of scaled, biased, masked scores of query (b, i, h); returns lse */
static double score_row(double *p, const float *q, const float *k, const float *alibi, int b,
                        int i, int h, int T, int Hq, int Hkv, int D, int causal) {
    int kvh = h / (Hq / Hkv);
    double mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < T; j++) {
        if (causal && j > i) { p[j] = -INFINITY; continue; }
        double s = 0.0;
        for (int d = 0; d < D; d++) s += (double)AT(q, Hq, b, i, h)[d] * AT(k, Hkv, b, j, kvh)[d];
        p[j] = s / sqrt((double)D) + (alibi ? (double)alibi[h] * (j - i) : 0.0);
        mx = p[j] > mx ? p[j] : mx;
    }
    for (int j = 0; j < T; j++) sum += (p[j] = exp(p[j] - mx));
    for (int j = 0; j < T; j++) p[j] /= sum;
    return mx + log(sum);
}

void ref_attention_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                       const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal) {
    double *p = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < T; i++) {
                lse[((size_t)b * Hq + h) * T + i] = (float)score_row(p, q, k, alibi, b, i, h, T, Hq, Hkv, D, causal);
                for (int d = 0; d < D; d++) {
                    double s = 0.0;
                    for (int j = 0; j < T; j++) s += p[j] * AT(v, Hkv, b, j, h / (Hq / Hkv))[d];
                    AT(o, Hq, b, i, h)[d] = (float)s;
                }
            }
    free(p);
}

/* o = P V: dP = dO V^T, dS = P (dP - sum_j P dP), dq = scale dS K, dk += scale dS^T q, dv += P^T dO */
void ref_attention_bwd(float *dq, float *dk, float *dv, const float *q, const float *k,
                       const float *v, const float *dout, const float *alibi, int B, int T,
                       int Hq, int Hkv, int D, int causal) {
    double *p = malloc((size_t)T * sizeof(double)), *dp = malloc((size_t)T * sizeof(double));
    double scale = 1.0 / sqrt((double)D);
    size_t nkv = (size_t)B * T * Hkv * D;
    for (size_t i = 0; i < nkv; i++) dk[i] = dv[i] = 0.0f;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < T; i++) {
                int kvh = h / (Hq / Hkv);
                const float *g = AT(dout, Hq, b, i, h);
                score_row(p, q, k, alibi, b, i, h, T, Hq, Hkv, D, causal);
                double pdp = 0.0;
                for (int j = 0; j < T; j++) {
                    dp[j] = 0.0;
                    for (int d = 0; d < D; d++) dp[j] += (double)g[d] * AT(v, Hkv, b, j, kvh)[d];
                    pdp += p[j] * dp[j];
                }
                for (int d = 0; d < D; d++) AT(dq, Hq, b, i, h)[d] = 0.0f;
                for (int j = 0; j < T; j++) {
                    double ds = p[j] * (dp[j] - pdp);
                    for (int d = 0; d < D; d++) {
                        AT(dq, Hq, b, i, h)[d] += (float)(scale * ds * AT(k, Hkv, b, j, kvh)[d]);
                        AT(dk, Hkv, b, j, kvh)[d] += (float)(scale * ds * AT(q, Hq, b, i, h)[d]);
                        AT(dv, Hkv, b, j, kvh)[d] += (float)(p[j] * g[d]);
                    }
                }
            }
    free(p); free(dp);
}
