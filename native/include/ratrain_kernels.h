/* ratrain native kernels: the public C interface the Cython bindings and generated programs call.
 * Names follow llm.c: <op>_<fwd|bwd>_<dtype>, outputs first, then inputs and saved state, then
 * sizes, then the thread count (threads stand for the DSP cores of one cluster). Every kernel
 * returns an rt_status (0 = ok). Shapes are row-major; fp16 is IEEE half stored as uint16_t,
 * bf16 (bfloat16: fp32's top 16 bits) is stored as uint16_t too. */
#ifndef RATRAIN_KERNELS_H
#define RATRAIN_KERNELS_H
#include <stddef.h>
#include <stdint.h>

typedef uint16_t rt_half;
typedef uint16_t rt_bf16;
typedef enum { RT_OK = 0, RT_EINVAL = -1, RT_ENOMEM = -2, RT_EISA = -3 } rt_status;
typedef enum { RT_F32 = 0, RT_F16 = 1, RT_BF16 = 2 } rt_dtype;
enum { RT_TRANS_A = 1, RT_TRANS_B = 2, RT_ACCUMULATE = 4 };   /* gemm flags */

/* ---- dispatch and scratch (dispatch.c, dma.c) ---- */
/* paths, widest first: "amx" (AMX-BF16 tiles for the bf16 GEMM, else as avx512),
 * "avx512_bf16" (VDPBF16PS GEMM, VCVTNEPS2BF16 casts, else as avx512), "avx512", "avx2",
 * "scalar"; below avx512_bf16 the bf16 GEMM widens to fp32 and runs the fp32 GEMM */
const char *rt_isa_name(void);
int rt_set_isa(const char *name);              /* force a path; RT_EISA if the CPU lacks it */
int rt_scratch_config(size_t gsm_bytes, size_t am_bytes);  /* sizes from the hw profile */
size_t rt_gsm_bytes(void);
size_t rt_am_bytes(void);

/* ---- DMA between the DDR arena and on-chip scratch (dma.c) ---- */
typedef enum { RT_GSM = 0, RT_AM = 1 } rt_level;
typedef struct { int pending; int status; } rt_dma_handle;
/* copy rows x row_bytes; strides in bytes on both sides; completes at dma_wait */
int dma_get_2d(void *scratch, size_t scratch_stride, const void *ddr, size_t ddr_stride,
               size_t rows, size_t row_bytes, rt_level level, rt_dma_handle *h);
int dma_put_2d(void *ddr, size_t ddr_stride, const void *scratch, size_t scratch_stride,
               size_t rows, size_t row_bytes, rt_level level, rt_dma_handle *h);
int dma_wait(rt_dma_handle *h);
/* counters[0..3] = bytes DDR->GSM, DDR->AM, GSM->DDR, AM->DDR; [4],[5] = gets, puts */
void rt_dma_stats(uint64_t counters[6]);
void rt_dma_reset(void);

/* ---- GEMM (gemm.c): out[M,N] = op(a)[M,K] @ op(b)[K,N] (+ bias[N]) ---- */
/* flags: RT_TRANS_A (a stored [K,M]), RT_TRANS_B (b stored [N,K]), RT_ACCUMULATE (out f32 +=) */
int gemm_fwd_f16(void *out, rt_dtype out_dtype, const rt_half *a, const rt_half *b,
                 const float *bias, int M, int N, int K, int flags, int threads);
int gemm_fwd_f32(void *out, rt_dtype out_dtype, const float *a, const float *b,
                 const float *bias, int M, int N, int K, int flags, int threads);
/* bf16 a, b (fp32 products are exact), fp32 accumulation; out_dtype RT_BF16 (round to
 * nearest even) or RT_F32; same flags, bias and status codes as gemm_fwd_f16. Subnormal bf16
 * inputs may count as zero on the amx and avx512_bf16 paths (the instructions' DAZ). */
int gemm_fwd_bf16(void *out, rt_dtype out_dtype, const rt_bf16 *a, const rt_bf16 *b,
                  const float *bias, int M, int N, int K, int flags, int threads);
/* tiling the GEMM uses for these sizes: plan[0..3] = MC, KC, NC, MR*65536+NR */
int rt_gemm_plan(int plan[4], int M, int N, int K, rt_dtype in_dtype, int flags);

/* ---- causal attention, flash style (attention_fwd.c, attention_bwd.c) ---- */
/* q,o [B,T,Hq,D]; k,v [B,T,Hkv,D]; lse [B,Hq,T] f32; alibi [Hq] f32 or NULL */
int attention_fwd_f16(rt_half *o, float *lse, const rt_half *q, const rt_half *k,
                      const rt_half *v, const float *alibi, int B, int T, int Hq, int Hkv,
                      int D, int causal, int threads);
/* bf16 q, k, v, o; fp32 scores, softmax statistics (lse) and accumulation */
int attention_fwd_bf16(rt_bf16 *o, float *lse, const rt_bf16 *q, const rt_bf16 *k,
                       const rt_bf16 *v, const float *alibi, int B, int T, int Hq, int Hkv,
                       int D, int causal, int threads);
int attention_fwd_f32(float *o, float *lse, const float *q, const float *k, const float *v,
                      const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal,
                      int threads);
/* dq [B,T,Hq,D]; dk, dv [B,T,Hkv,D] (overwritten) */
int attention_bwd_f16(rt_half *dq, rt_half *dk, rt_half *dv, const rt_half *q,
                      const rt_half *k, const rt_half *v, const rt_half *o, const float *lse,
                      const rt_half *dout, const float *alibi, int B, int T, int Hq, int Hkv,
                      int D, int causal, int threads);
int attention_bwd_bf16(rt_bf16 *dq, rt_bf16 *dk, rt_bf16 *dv, const rt_bf16 *q,
                       const rt_bf16 *k, const rt_bf16 *v, const rt_bf16 *o, const float *lse,
                       const rt_bf16 *dout, const float *alibi, int B, int T, int Hq, int Hkv,
                       int D, int causal, int threads);
int attention_bwd_f32(float *dq, float *dk, float *dv, const float *q, const float *k,
                      const float *v, const float *o, const float *lse, const float *dout,
                      const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal,
                      int threads);

/* ---- layer kernels (layers.c, crossentropy.c via entry.c); X = f16 (rt_half), bf16
 * (rt_bf16) or f32; 16-bit inputs are widened to fp32, math is fp32, outputs are rounded
 * back (bf16: to nearest even); lse, rstd, losses and the dw/dtable accumulators are f32 ---- */
#define RT_DECLARE_LAYERS(X, T, G)                                                           \
/* out,x [N,C]; w [C]; rstd [N] f32 saved for backward */                                    \
int rmsnorm_fwd_##X(T *out, float *rstd, const T *x, const T *w, int N, int C, float eps,    \
                    int threads);                                                            \
/* dx [N,C] overwritten; dw [C] f32 accumulated (+=) */                                      \
int rmsnorm_bwd_##X(T *dx, float *dw, const T *dout, const T *x, const T *w,                 \
                    const float *rstd, int N, int C, int threads);                           \
/* out,x [B,T,H,D], positions 0..T-1, HF rotate_half; inv_freq [D/2] f32 (any RoPE type,    \
 * from ratrain.models.rope), cos and sin times scale (yarn's attention factor, else 1);     \
 * backward = inverse rotation times the same scale (the transpose) */                       \
int rope_fwd_##X(T *out, const T *x, int B, int T_, int H, int D, const float *inv_freq,     \
                 float scale, int threads);                                                  \
int rope_bwd_##X(T *dx, const T *dout, int B, int T_, int H, int D, const float *inv_freq,   \
                 float scale, int threads);                                                  \
/* out = silu(gate) * up, all [n]; backward overwrites dgate, dup */                         \
int swiglu_fwd_##X(T *out, const T *gate, const T *up, size_t n, int threads);               \
int swiglu_bwd_##X(T *dgate, T *dup, const T *dout, const T *gate, const T *up, size_t n,    \
                   int threads);                                                             \
/* out [N,C] = table[V,C][ids[N]]; backward scatter-adds into dtable [V,C] f32 (+=) */       \
int embedding_fwd_##X(T *out, const int32_t *ids, const T *table, int N, int V, int C,       \
                      int threads);                                                          \
int embedding_bwd_##X(float *dtable, const T *dout, const int32_t *ids, int N, int V, int C, \
                      int threads);                                                          \
/* LM head + cross-entropy, vocab in chunks: losses, lse [N] f32; h [N,C]; w [V,C];          \
 * targets [N] (<0 ignored); backward: dh [N,C] overwritten, dw [V,C] f32 (+=),              \
 * dlosses [N] f32 = d(total loss)/d(loss[n]) */                                             \
int crossentropy_fwd_##X(float *losses, float *lse, const T *h, const T *w,                  \
                         const int32_t *targets, int N, int V, int C, int chunk,             \
                         int threads);                                                       \
int crossentropy_bwd_##X(T *dh, float *dw, const T *h, const T *w, const int32_t *targets,   \
                         const float *lse, const float *dlosses, int N, int V, int C,        \
                         int chunk, int threads);                                            \
/* the backward's halves (zb1's B and W): _input overwrites dh and writes the logits gradient \
 * g [N*V] (G: f32, bf16 in bf16) chunk by chunk, the chunk at v0 as its [N, vc] block at     \
 * g + N*v0; _weight adds g's dw into dw [V,C] f32 (+=); with the same chunk and threads,    \
 * _input then _weight compute crossentropy_bwd's bits */                                    \
int crossentropy_bwd_input_##X(T *dh, G *g, const T *h, const T *w, const int32_t *targets,  \
                               const float *lse, const float *dlosses, int N, int V, int C,  \
                               int chunk, int threads);                                      \
int crossentropy_bwd_weight_##X(float *dw, const G *g, const T *h, int N, int V, int C,      \
                                int chunk, int threads);                                     \
/* *finite = 1 iff every element is finite; *sumsq = sum x^2 in double */                   \
int finite_sumsq_##X(int *finite, double *sumsq, const T *x, size_t n, int threads);
RT_DECLARE_LAYERS(f16, rt_half, float)
RT_DECLARE_LAYERS(bf16, rt_bf16, rt_bf16)
RT_DECLARE_LAYERS(f32, float, float)

/* ---- optimizer and casts (optim.c) ---- */
/* torch.optim.AdamW on f32 master/m/v [n] with f32 grad; writes the f16 view (may be NULL) */
int adamw_step_f32(float *master, float *m, float *v, rt_half *param_f16, const float *grad,
                   size_t n, float lr, float beta1, float beta2, float eps, float wd, int step);
/* the same step writing the bf16 view, rounded to nearest even (may be NULL) */
int adamw_step_f32_bf16(float *master, float *m, float *v, rt_bf16 *param_bf16,
                        const float *grad, size_t n, float lr, float beta1, float beta2,
                        float eps, float wd, int step);
int cast_f32_to_f16(rt_half *dst, const float *src, size_t n);
int cast_f16_to_f32(float *dst, const rt_half *src, size_t n);
/* fp32 -> bf16 rounds to nearest even (subnormals kept), NaN stays NaN (made quiet, sign and
 * top payload bits kept); bf16 -> fp32 is exact. Bit-identical on every path. */
int cast_f32_to_bf16(rt_bf16 *dst, const float *src, size_t n);
int cast_bf16_to_f32(float *dst, const rt_bf16 *src, size_t n);

/* ---- glue between kernels in generated programs (glue.c); fp16 computed in fp32 ---- */
int rt_add_f32(float *out, const float *a, const float *b, size_t n);
int rt_add_f16(rt_half *out, const rt_half *a, const rt_half *b, size_t n);
/* target (fp32) = value, or target += value */
int rt_accumulate_set_f32(float *target, const float *value, size_t n);
int rt_accumulate_add_f32(float *target, const float *value, size_t n);
int rt_accumulate_set_f16(float *target, const rt_half *value, size_t n);
int rt_accumulate_add_f16(float *target, const rt_half *value, size_t n);
/* out[c] = sum over rows of x[r, c] (x row-major [rows, cols]) */
int rt_column_sums_f32(float *out, const float *x, size_t rows, size_t cols);
int rt_column_sums_f16(rt_half *out, const rt_half *x, size_t rows, size_t cols);
int rt_add_bf16(rt_bf16 *out, const rt_bf16 *a, const rt_bf16 *b, size_t n);
int rt_accumulate_set_bf16(float *target, const rt_bf16 *value, size_t n);
int rt_accumulate_add_bf16(float *target, const rt_bf16 *value, size_t n);
int rt_column_sums_bf16(rt_bf16 *out, const rt_bf16 *x, size_t rows, size_t cols);
/* out[0] = mean of x[n] (summed in double); spread: out[i] = total[0] / n */
int rt_mean_into(float *out, const float *x, size_t n);
int rt_spread(const float *total, float *out, size_t n);

#endif
