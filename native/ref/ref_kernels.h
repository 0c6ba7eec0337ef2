/* Plain-C references of the native kernels: obvious loops in double precision over FP32
 * inputs (the FP16 values upcast by the caller), no tiling, no SIMD, no threads. Tests call
 * them through ctypes and compare the optimised kernels against them. */
#ifndef RATRAIN_REF_KERNELS_H
#define RATRAIN_REF_KERNELS_H
#include <stddef.h>
#include <stdint.h>

/* out[M,N] = op(a) @ op(b); a [M,K] or [K,M] (trans_a); b [K,N] or [N,K] (trans_b) */
void ref_gemm(float *out, const float *a, const float *b, int M, int N, int K, int trans_a,
              int trans_b);
/* o [B,T,Hq,D], lse [B,Hq,T]; k, v [B,T,Hkv,D]; alibi [Hq] or NULL */
void ref_attention_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                       const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal);
/* dq [B,T,Hq,D]; dk, dv [B,T,Hkv,D], overwritten */
void ref_attention_bwd(float *dq, float *dk, float *dv, const float *q, const float *k,
                       const float *v, const float *dout, const float *alibi, int B, int T,
                       int Hq, int Hkv, int D, int causal);
void ref_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C,
                     float eps);
void ref_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                     int N, int C, float eps);
/* out = scale * rotate(x) by angles t * inv_freq [D/2]; inverse: the transpose */
void ref_rope(float *out, const float *x, int B, int T, int H, int D, const float *inv_freq,
              float scale, int inverse);
void ref_swiglu_fwd(float *out, const float *gate, const float *up, size_t n);
void ref_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate,
                    const float *up, size_t n);
void ref_embedding_bwd(float *dtable, const float *dout, const int32_t *ids, int N, int C);
void ref_crossentropy_fwd(float *losses, float *lse, const float *h, const float *w,
                          const int32_t *targets, int N, int V, int C);
void ref_crossentropy_bwd(float *dh, float *dw, const float *h, const float *w,
                          const int32_t *targets, const float *dlosses, int N, int V, int C);
/* bf16 bits (uint16) <- fp32, round to nearest even; NaN -> quiet NaN, same sign */
void ref_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
/* out[M,N] = op(a) @ op(b) for bf16 a, b (layouts as ref_gemm), summed in double */
void ref_gemm_bf16(float *out, const uint16_t *a, const uint16_t *b, int M, int N, int K,
                   int trans_a, int trans_b);
void ref_adamw_step(float *p, float *m, float *v, const float *g, size_t n, float lr,
                    float beta1, float beta2, float eps, float wd, int step);
#endif
