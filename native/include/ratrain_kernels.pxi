# Included by ratrain/kernels.pyx: the C declarations of native/include/ratrain_kernels.h
# (prefixed c_) and the nogil forwarders that kernels.pxd exports to generated code.
from libc.stdint cimport int32_t, uint64_t

cdef extern from "ratrain_kernels.h" nogil:
    const char *rt_isa_name()
    int rt_set_isa(const char *name)
    int rt_scratch_config(size_t gsm_bytes, size_t am_bytes)
    size_t rt_gsm_bytes()
    size_t rt_am_bytes()
    void rt_dma_stats(uint64_t *counters)
    void rt_dma_reset()
    int c_gemm_fwd_f16 "gemm_fwd_f16"(void *out, int out_dtype, const unsigned short *a, const unsigned short *b, const float *bias, int M, int N, int K, int flags, int threads)
    int c_gemm_fwd_bf16 "gemm_fwd_bf16"(void *out, int out_dtype, const unsigned short *a, const unsigned short *b, const float *bias, int M, int N, int K, int flags, int threads)
    int c_gemm_fwd_f32 "gemm_fwd_f32"(void *out, int out_dtype, const float *a, const float *b, const float *bias, int M, int N, int K, int flags, int threads)
    int c_rt_gemm_plan "rt_gemm_plan"(int *plan, int M, int N, int K, int in_dtype, int flags)
    int c_attention_fwd_f16 "attention_fwd_f16"(unsigned short *o, float *lse, const unsigned short *q, const unsigned short *k, const unsigned short *v, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads)
    int c_attention_fwd_bf16 "attention_fwd_bf16"(unsigned short *o, float *lse, const unsigned short *q, const unsigned short *k, const unsigned short *v, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads)
    int c_attention_bwd_f16 "attention_bwd_f16"(unsigned short *dq, unsigned short *dk, unsigned short *dv, const unsigned short *q, const unsigned short *k, const unsigned short *v, const unsigned short *o, const float *lse, const unsigned short *dout, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads)
    int c_attention_bwd_bf16 "attention_bwd_bf16"(unsigned short *dq, unsigned short *dk, unsigned short *dv, const unsigned short *q, const unsigned short *k, const unsigned short *v, const unsigned short *o, const float *lse, const unsigned short *dout, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads)
    int c_rmsnorm_fwd_f16 "rmsnorm_fwd_f16"(unsigned short *out, float *rstd, const unsigned short *x, const unsigned short *w, int N, int C, float eps, int threads)
    int c_rmsnorm_fwd_bf16 "rmsnorm_fwd_bf16"(unsigned short *out, float *rstd, const unsigned short *x, const unsigned short *w, int N, int C, float eps, int threads)
    int c_rmsnorm_bwd_f16 "rmsnorm_bwd_f16"(unsigned short *dx, float *dw, const unsigned short *dout, const unsigned short *x, const unsigned short *w, const float *rstd, int N, int C, int threads)
    int c_rmsnorm_bwd_bf16 "rmsnorm_bwd_bf16"(unsigned short *dx, float *dw, const unsigned short *dout, const unsigned short *x, const unsigned short *w, const float *rstd, int N, int C, int threads)
    int c_rope_fwd_f16 "rope_fwd_f16"(unsigned short *out, const unsigned short *x, int B, int T, int H, int D, const float *inv_freq, float scale, int threads)
    int c_rope_fwd_bf16 "rope_fwd_bf16"(unsigned short *out, const unsigned short *x, int B, int T, int H, int D, const float *inv_freq, float scale, int threads)
    int c_rope_bwd_f16 "rope_bwd_f16"(unsigned short *dx, const unsigned short *dout, int B, int T, int H, int D, const float *inv_freq, float scale, int threads)
    int c_rope_bwd_bf16 "rope_bwd_bf16"(unsigned short *dx, const unsigned short *dout, int B, int T, int H, int D, const float *inv_freq, float scale, int threads)
    int c_swiglu_fwd_f16 "swiglu_fwd_f16"(unsigned short *out, const unsigned short *gate, const unsigned short *up, size_t n, int threads)
    int c_swiglu_fwd_bf16 "swiglu_fwd_bf16"(unsigned short *out, const unsigned short *gate, const unsigned short *up, size_t n, int threads)
    int c_swiglu_bwd_f16 "swiglu_bwd_f16"(unsigned short *dgate, unsigned short *dup, const unsigned short *dout, const unsigned short *gate, const unsigned short *up, size_t n, int threads)
    int c_swiglu_bwd_bf16 "swiglu_bwd_bf16"(unsigned short *dgate, unsigned short *dup, const unsigned short *dout, const unsigned short *gate, const unsigned short *up, size_t n, int threads)
    int c_embedding_fwd_f16 "embedding_fwd_f16"(unsigned short *out, const int32_t *ids, const unsigned short *table, int N, int V, int C, int threads)
    int c_embedding_fwd_bf16 "embedding_fwd_bf16"(unsigned short *out, const int32_t *ids, const unsigned short *table, int N, int V, int C, int threads)
    int c_embedding_bwd_f16 "embedding_bwd_f16"(float *dtable, const unsigned short *dout, const int32_t *ids, int N, int V, int C, int threads)
    int c_embedding_bwd_bf16 "embedding_bwd_bf16"(float *dtable, const unsigned short *dout, const int32_t *ids, int N, int V, int C, int threads)
    int c_crossentropy_fwd_f16 "crossentropy_fwd_f16"(float *losses, float *lse, const unsigned short *h, const unsigned short *w, const int32_t *targets, int N, int V, int C, int chunk, int threads)
    int c_crossentropy_fwd_bf16 "crossentropy_fwd_bf16"(float *losses, float *lse, const unsigned short *h, const unsigned short *w, const int32_t *targets, int N, int V, int C, int chunk, int threads)
    int c_crossentropy_bwd_f16 "crossentropy_bwd_f16"(unsigned short *dh, float *dw, const unsigned short *h, const unsigned short *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads)
    int c_crossentropy_bwd_input_f16 "crossentropy_bwd_input_f16"(unsigned short *dh, float *g, const unsigned short *h, const unsigned short *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads)
    int c_crossentropy_bwd_weight_f16 "crossentropy_bwd_weight_f16"(float *dw, const float *g, const unsigned short *h, int N, int V, int C, int chunk, int threads)
    int c_crossentropy_bwd_bf16 "crossentropy_bwd_bf16"(unsigned short *dh, float *dw, const unsigned short *h, const unsigned short *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads)
    int c_crossentropy_bwd_input_bf16 "crossentropy_bwd_input_bf16"(unsigned short *dh, unsigned short *g, const unsigned short *h, const unsigned short *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads)
    int c_crossentropy_bwd_weight_bf16 "crossentropy_bwd_weight_bf16"(float *dw, const unsigned short *g, const unsigned short *h, int N, int V, int C, int chunk, int threads)
    int c_finite_sumsq_f16 "finite_sumsq_f16"(int *finite, double *sumsq, const unsigned short *x, size_t n, int threads)
    int c_finite_sumsq_bf16 "finite_sumsq_bf16"(int *finite, double *sumsq, const unsigned short *x, size_t n, int threads)
    int c_attention_fwd_f32 "attention_fwd_f32"(float *o, float *lse, const float *q, const float *k, const float *v, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads)
    int c_attention_bwd_f32 "attention_bwd_f32"(float *dq, float *dk, float *dv, const float *q, const float *k, const float *v, const float *o, const float *lse, const float *dout, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads)
    int c_rmsnorm_fwd_f32 "rmsnorm_fwd_f32"(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps, int threads)
    int c_rmsnorm_bwd_f32 "rmsnorm_bwd_f32"(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, int N, int C, int threads)
    int c_rope_fwd_f32 "rope_fwd_f32"(float *out, const float *x, int B, int T, int H, int D, const float *inv_freq, float scale, int threads)
    int c_rope_bwd_f32 "rope_bwd_f32"(float *dx, const float *dout, int B, int T, int H, int D, const float *inv_freq, float scale, int threads)
    int c_swiglu_fwd_f32 "swiglu_fwd_f32"(float *out, const float *gate, const float *up, size_t n, int threads)
    int c_swiglu_bwd_f32 "swiglu_bwd_f32"(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n, int threads)
    int c_embedding_fwd_f32 "embedding_fwd_f32"(float *out, const int32_t *ids, const float *table, int N, int V, int C, int threads)
    int c_embedding_bwd_f32 "embedding_bwd_f32"(float *dtable, const float *dout, const int32_t *ids, int N, int V, int C, int threads)
    int c_crossentropy_fwd_f32 "crossentropy_fwd_f32"(float *losses, float *lse, const float *h, const float *w, const int32_t *targets, int N, int V, int C, int chunk, int threads)
    int c_crossentropy_bwd_f32 "crossentropy_bwd_f32"(float *dh, float *dw, const float *h, const float *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads)
    int c_crossentropy_bwd_input_f32 "crossentropy_bwd_input_f32"(float *dh, float *g, const float *h, const float *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads)
    int c_crossentropy_bwd_weight_f32 "crossentropy_bwd_weight_f32"(float *dw, const float *g, const float *h, int N, int V, int C, int chunk, int threads)
    int c_finite_sumsq_f32 "finite_sumsq_f32"(int *finite, double *sumsq, const float *x, size_t n, int threads)
    int c_adamw_step_f32 "adamw_step_f32"(float *master, float *m, float *v, unsigned short *param_f16, const float *grad, size_t n, float lr, float beta1, float beta2, float eps, float wd, int step)
    int c_adamw_step_f32_bf16 "adamw_step_f32_bf16"(float *master, float *m, float *v, unsigned short *param_bf16, const float *grad, size_t n, float lr, float beta1, float beta2, float eps, float wd, int step)
    int c_cast_f32_to_f16 "cast_f32_to_f16"(unsigned short *dst, const float *src, size_t n)
    int c_cast_f16_to_f32 "cast_f16_to_f32"(float *dst, const unsigned short *src, size_t n)
    int c_cast_f32_to_bf16 "cast_f32_to_bf16"(unsigned short *dst, const float *src, size_t n)
    int c_cast_bf16_to_f32 "cast_bf16_to_f32"(float *dst, const unsigned short *src, size_t n)
    int c_rt_add_f32 "rt_add_f32"(float *out, const float *a, const float *b, size_t n)
    int c_rt_add_f16 "rt_add_f16"(unsigned short *out, const unsigned short *a, const unsigned short *b, size_t n)
    int c_rt_accumulate_set_f32 "rt_accumulate_set_f32"(float *target, const float *value, size_t n)
    int c_rt_accumulate_add_f32 "rt_accumulate_add_f32"(float *target, const float *value, size_t n)
    int c_rt_accumulate_set_f16 "rt_accumulate_set_f16"(float *target, const unsigned short *value, size_t n)
    int c_rt_accumulate_add_f16 "rt_accumulate_add_f16"(float *target, const unsigned short *value, size_t n)
    int c_rt_column_sums_f32 "rt_column_sums_f32"(float *out, const float *x, size_t rows, size_t cols)
    int c_rt_column_sums_f16 "rt_column_sums_f16"(unsigned short *out, const unsigned short *x, size_t rows, size_t cols)
    int c_rt_add_bf16 "rt_add_bf16"(unsigned short *out, const unsigned short *a, const unsigned short *b, size_t n)
    int c_rt_accumulate_set_bf16 "rt_accumulate_set_bf16"(float *target, const unsigned short *value, size_t n)
    int c_rt_accumulate_add_bf16 "rt_accumulate_add_bf16"(float *target, const unsigned short *value, size_t n)
    int c_rt_column_sums_bf16 "rt_column_sums_bf16"(unsigned short *out, const unsigned short *x, size_t rows, size_t cols)
    int c_rt_mean_into "rt_mean_into"(float *out, const float *x, size_t n)
    int c_rt_spread "rt_spread"(const float *total, float *out, size_t n)

cdef int gemm_fwd_f16(void *out, int out_dtype, const unsigned short *a, const unsigned short *b, const float *bias, int M, int N, int K, int flags, int threads) noexcept nogil:
    return c_gemm_fwd_f16(out, out_dtype, a, b, bias, M, N, K, flags, threads)
cdef int gemm_fwd_bf16(void *out, int out_dtype, const unsigned short *a, const unsigned short *b, const float *bias, int M, int N, int K, int flags, int threads) noexcept nogil:
    return c_gemm_fwd_bf16(out, out_dtype, a, b, bias, M, N, K, flags, threads)
cdef int gemm_fwd_f32(void *out, int out_dtype, const float *a, const float *b, const float *bias, int M, int N, int K, int flags, int threads) noexcept nogil:
    return c_gemm_fwd_f32(out, out_dtype, a, b, bias, M, N, K, flags, threads)
cdef int rt_gemm_plan(int *plan, int M, int N, int K, int in_dtype, int flags) noexcept nogil:
    return c_rt_gemm_plan(plan, M, N, K, in_dtype, flags)
cdef int attention_fwd_f16(unsigned short *o, float *lse, const unsigned short *q, const unsigned short *k, const unsigned short *v, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads) noexcept nogil:
    return c_attention_fwd_f16(o, lse, q, k, v, alibi, B, T, Hq, Hkv, D, causal, threads)
cdef int attention_fwd_bf16(unsigned short *o, float *lse, const unsigned short *q, const unsigned short *k, const unsigned short *v, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads) noexcept nogil:
    return c_attention_fwd_bf16(o, lse, q, k, v, alibi, B, T, Hq, Hkv, D, causal, threads)
cdef int attention_bwd_f16(unsigned short *dq, unsigned short *dk, unsigned short *dv, const unsigned short *q, const unsigned short *k, const unsigned short *v, const unsigned short *o, const float *lse, const unsigned short *dout, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads) noexcept nogil:
    return c_attention_bwd_f16(dq, dk, dv, q, k, v, o, lse, dout, alibi, B, T, Hq, Hkv, D, causal, threads)
cdef int attention_bwd_bf16(unsigned short *dq, unsigned short *dk, unsigned short *dv, const unsigned short *q, const unsigned short *k, const unsigned short *v, const unsigned short *o, const float *lse, const unsigned short *dout, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads) noexcept nogil:
    return c_attention_bwd_bf16(dq, dk, dv, q, k, v, o, lse, dout, alibi, B, T, Hq, Hkv, D, causal, threads)
cdef int rmsnorm_fwd_f16(unsigned short *out, float *rstd, const unsigned short *x, const unsigned short *w, int N, int C, float eps, int threads) noexcept nogil:
    return c_rmsnorm_fwd_f16(out, rstd, x, w, N, C, eps, threads)
cdef int rmsnorm_fwd_bf16(unsigned short *out, float *rstd, const unsigned short *x, const unsigned short *w, int N, int C, float eps, int threads) noexcept nogil:
    return c_rmsnorm_fwd_bf16(out, rstd, x, w, N, C, eps, threads)
cdef int rmsnorm_bwd_f16(unsigned short *dx, float *dw, const unsigned short *dout, const unsigned short *x, const unsigned short *w, const float *rstd, int N, int C, int threads) noexcept nogil:
    return c_rmsnorm_bwd_f16(dx, dw, dout, x, w, rstd, N, C, threads)
cdef int rmsnorm_bwd_bf16(unsigned short *dx, float *dw, const unsigned short *dout, const unsigned short *x, const unsigned short *w, const float *rstd, int N, int C, int threads) noexcept nogil:
    return c_rmsnorm_bwd_bf16(dx, dw, dout, x, w, rstd, N, C, threads)
cdef int rope_fwd_f16(unsigned short *out, const unsigned short *x, int B, int T, int H, int D, const float *inv_freq, float scale, int threads) noexcept nogil:
    return c_rope_fwd_f16(out, x, B, T, H, D, inv_freq, scale, threads)
cdef int rope_fwd_bf16(unsigned short *out, const unsigned short *x, int B, int T, int H, int D, const float *inv_freq, float scale, int threads) noexcept nogil:
    return c_rope_fwd_bf16(out, x, B, T, H, D, inv_freq, scale, threads)
cdef int rope_bwd_f16(unsigned short *dx, const unsigned short *dout, int B, int T, int H, int D, const float *inv_freq, float scale, int threads) noexcept nogil:
    return c_rope_bwd_f16(dx, dout, B, T, H, D, inv_freq, scale, threads)
cdef int rope_bwd_bf16(unsigned short *dx, const unsigned short *dout, int B, int T, int H, int D, const float *inv_freq, float scale, int threads) noexcept nogil:
    return c_rope_bwd_bf16(dx, dout, B, T, H, D, inv_freq, scale, threads)
cdef int swiglu_fwd_f16(unsigned short *out, const unsigned short *gate, const unsigned short *up, size_t n, int threads) noexcept nogil:
    return c_swiglu_fwd_f16(out, gate, up, n, threads)
cdef int swiglu_fwd_bf16(unsigned short *out, const unsigned short *gate, const unsigned short *up, size_t n, int threads) noexcept nogil:
    return c_swiglu_fwd_bf16(out, gate, up, n, threads)
cdef int swiglu_bwd_f16(unsigned short *dgate, unsigned short *dup, const unsigned short *dout, const unsigned short *gate, const unsigned short *up, size_t n, int threads) noexcept nogil:
    return c_swiglu_bwd_f16(dgate, dup, dout, gate, up, n, threads)
cdef int swiglu_bwd_bf16(unsigned short *dgate, unsigned short *dup, const unsigned short *dout, const unsigned short *gate, const unsigned short *up, size_t n, int threads) noexcept nogil:
    return c_swiglu_bwd_bf16(dgate, dup, dout, gate, up, n, threads)
cdef int embedding_fwd_f16(unsigned short *out, const int32_t *ids, const unsigned short *table, int N, int V, int C, int threads) noexcept nogil:
    return c_embedding_fwd_f16(out, ids, table, N, V, C, threads)
cdef int embedding_fwd_bf16(unsigned short *out, const int32_t *ids, const unsigned short *table, int N, int V, int C, int threads) noexcept nogil:
    return c_embedding_fwd_bf16(out, ids, table, N, V, C, threads)
cdef int embedding_bwd_f16(float *dtable, const unsigned short *dout, const int32_t *ids, int N, int V, int C, int threads) noexcept nogil:
    return c_embedding_bwd_f16(dtable, dout, ids, N, V, C, threads)
cdef int embedding_bwd_bf16(float *dtable, const unsigned short *dout, const int32_t *ids, int N, int V, int C, int threads) noexcept nogil:
    return c_embedding_bwd_bf16(dtable, dout, ids, N, V, C, threads)
cdef int crossentropy_fwd_f16(float *losses, float *lse, const unsigned short *h, const unsigned short *w, const int32_t *targets, int N, int V, int C, int chunk, int threads) noexcept nogil:
    return c_crossentropy_fwd_f16(losses, lse, h, w, targets, N, V, C, chunk, threads)
cdef int crossentropy_fwd_bf16(float *losses, float *lse, const unsigned short *h, const unsigned short *w, const int32_t *targets, int N, int V, int C, int chunk, int threads) noexcept nogil:
    return c_crossentropy_fwd_bf16(losses, lse, h, w, targets, N, V, C, chunk, threads)
cdef int crossentropy_bwd_f16(unsigned short *dh, float *dw, const unsigned short *h, const unsigned short *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads) noexcept nogil:
    return c_crossentropy_bwd_f16(dh, dw, h, w, targets, lse, dlosses, N, V, C, chunk, threads)
cdef int crossentropy_bwd_input_f16(unsigned short *dh, float *g, const unsigned short *h, const unsigned short *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads) noexcept nogil:
    return c_crossentropy_bwd_input_f16(dh, g, h, w, targets, lse, dlosses, N, V, C, chunk, threads)
cdef int crossentropy_bwd_weight_f16(float *dw, const float *g, const unsigned short *h, int N, int V, int C, int chunk, int threads) noexcept nogil:
    return c_crossentropy_bwd_weight_f16(dw, g, h, N, V, C, chunk, threads)
cdef int crossentropy_bwd_bf16(unsigned short *dh, float *dw, const unsigned short *h, const unsigned short *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads) noexcept nogil:
    return c_crossentropy_bwd_bf16(dh, dw, h, w, targets, lse, dlosses, N, V, C, chunk, threads)
cdef int crossentropy_bwd_input_bf16(unsigned short *dh, unsigned short *g, const unsigned short *h, const unsigned short *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads) noexcept nogil:
    return c_crossentropy_bwd_input_bf16(dh, g, h, w, targets, lse, dlosses, N, V, C, chunk, threads)
cdef int crossentropy_bwd_weight_bf16(float *dw, const unsigned short *g, const unsigned short *h, int N, int V, int C, int chunk, int threads) noexcept nogil:
    return c_crossentropy_bwd_weight_bf16(dw, g, h, N, V, C, chunk, threads)
cdef int finite_sumsq_f16(int *finite, double *sumsq, const unsigned short *x, size_t n, int threads) noexcept nogil:
    return c_finite_sumsq_f16(finite, sumsq, x, n, threads)
cdef int finite_sumsq_bf16(int *finite, double *sumsq, const unsigned short *x, size_t n, int threads) noexcept nogil:
    return c_finite_sumsq_bf16(finite, sumsq, x, n, threads)
cdef int attention_fwd_f32(float *o, float *lse, const float *q, const float *k, const float *v, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads) noexcept nogil:
    return c_attention_fwd_f32(o, lse, q, k, v, alibi, B, T, Hq, Hkv, D, causal, threads)
cdef int attention_bwd_f32(float *dq, float *dk, float *dv, const float *q, const float *k, const float *v, const float *o, const float *lse, const float *dout, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads) noexcept nogil:
    return c_attention_bwd_f32(dq, dk, dv, q, k, v, o, lse, dout, alibi, B, T, Hq, Hkv, D, causal, threads)
cdef int rmsnorm_fwd_f32(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps, int threads) noexcept nogil:
    return c_rmsnorm_fwd_f32(out, rstd, x, w, N, C, eps, threads)
cdef int rmsnorm_bwd_f32(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, int N, int C, int threads) noexcept nogil:
    return c_rmsnorm_bwd_f32(dx, dw, dout, x, w, rstd, N, C, threads)
cdef int rope_fwd_f32(float *out, const float *x, int B, int T, int H, int D, const float *inv_freq, float scale, int threads) noexcept nogil:
    return c_rope_fwd_f32(out, x, B, T, H, D, inv_freq, scale, threads)
cdef int rope_bwd_f32(float *dx, const float *dout, int B, int T, int H, int D, const float *inv_freq, float scale, int threads) noexcept nogil:
    return c_rope_bwd_f32(dx, dout, B, T, H, D, inv_freq, scale, threads)
cdef int swiglu_fwd_f32(float *out, const float *gate, const float *up, size_t n, int threads) noexcept nogil:
    return c_swiglu_fwd_f32(out, gate, up, n, threads)
cdef int swiglu_bwd_f32(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n, int threads) noexcept nogil:
    return c_swiglu_bwd_f32(dgate, dup, dout, gate, up, n, threads)
cdef int embedding_fwd_f32(float *out, const int32_t *ids, const float *table, int N, int V, int C, int threads) noexcept nogil:
    return c_embedding_fwd_f32(out, ids, table, N, V, C, threads)
cdef int embedding_bwd_f32(float *dtable, const float *dout, const int32_t *ids, int N, int V, int C, int threads) noexcept nogil:
    return c_embedding_bwd_f32(dtable, dout, ids, N, V, C, threads)
cdef int crossentropy_fwd_f32(float *losses, float *lse, const float *h, const float *w, const int32_t *targets, int N, int V, int C, int chunk, int threads) noexcept nogil:
    return c_crossentropy_fwd_f32(losses, lse, h, w, targets, N, V, C, chunk, threads)
cdef int crossentropy_bwd_f32(float *dh, float *dw, const float *h, const float *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads) noexcept nogil:
    return c_crossentropy_bwd_f32(dh, dw, h, w, targets, lse, dlosses, N, V, C, chunk, threads)
cdef int crossentropy_bwd_input_f32(float *dh, float *g, const float *h, const float *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads) noexcept nogil:
    return c_crossentropy_bwd_input_f32(dh, g, h, w, targets, lse, dlosses, N, V, C, chunk, threads)
cdef int crossentropy_bwd_weight_f32(float *dw, const float *g, const float *h, int N, int V, int C, int chunk, int threads) noexcept nogil:
    return c_crossentropy_bwd_weight_f32(dw, g, h, N, V, C, chunk, threads)
cdef int finite_sumsq_f32(int *finite, double *sumsq, const float *x, size_t n, int threads) noexcept nogil:
    return c_finite_sumsq_f32(finite, sumsq, x, n, threads)
cdef int adamw_step_f32(float *master, float *m, float *v, unsigned short *param_f16, const float *grad, size_t n, float lr, float beta1, float beta2, float eps, float wd, int step) noexcept nogil:
    return c_adamw_step_f32(master, m, v, param_f16, grad, n, lr, beta1, beta2, eps, wd, step)
cdef int adamw_step_f32_bf16(float *master, float *m, float *v, unsigned short *param_bf16, const float *grad, size_t n, float lr, float beta1, float beta2, float eps, float wd, int step) noexcept nogil:
    return c_adamw_step_f32_bf16(master, m, v, param_bf16, grad, n, lr, beta1, beta2, eps, wd, step)
cdef int cast_f32_to_f16(unsigned short *dst, const float *src, size_t n) noexcept nogil:
    return c_cast_f32_to_f16(dst, src, n)
cdef int cast_f16_to_f32(float *dst, const unsigned short *src, size_t n) noexcept nogil:
    return c_cast_f16_to_f32(dst, src, n)
cdef int cast_f32_to_bf16(unsigned short *dst, const float *src, size_t n) noexcept nogil:
    return c_cast_f32_to_bf16(dst, src, n)
cdef int cast_bf16_to_f32(float *dst, const unsigned short *src, size_t n) noexcept nogil:
    return c_cast_bf16_to_f32(dst, src, n)
cdef int rt_add_f32(float *out, const float *a, const float *b, size_t n) noexcept nogil:
    return c_rt_add_f32(out, a, b, n)
cdef int rt_add_f16(unsigned short *out, const unsigned short *a, const unsigned short *b, size_t n) noexcept nogil:
    return c_rt_add_f16(out, a, b, n)
cdef int rt_accumulate_set_f32(float *target, const float *value, size_t n) noexcept nogil:
    return c_rt_accumulate_set_f32(target, value, n)
cdef int rt_accumulate_add_f32(float *target, const float *value, size_t n) noexcept nogil:
    return c_rt_accumulate_add_f32(target, value, n)
cdef int rt_accumulate_set_f16(float *target, const unsigned short *value, size_t n) noexcept nogil:
    return c_rt_accumulate_set_f16(target, value, n)
cdef int rt_accumulate_add_f16(float *target, const unsigned short *value, size_t n) noexcept nogil:
    return c_rt_accumulate_add_f16(target, value, n)
cdef int rt_column_sums_f32(float *out, const float *x, size_t rows, size_t cols) noexcept nogil:
    return c_rt_column_sums_f32(out, x, rows, cols)
cdef int rt_column_sums_f16(unsigned short *out, const unsigned short *x, size_t rows, size_t cols) noexcept nogil:
    return c_rt_column_sums_f16(out, x, rows, cols)
cdef int rt_add_bf16(unsigned short *out, const unsigned short *a, const unsigned short *b, size_t n) noexcept nogil:
    return c_rt_add_bf16(out, a, b, n)
cdef int rt_accumulate_set_bf16(float *target, const unsigned short *value, size_t n) noexcept nogil:
    return c_rt_accumulate_set_bf16(target, value, n)
cdef int rt_accumulate_add_bf16(float *target, const unsigned short *value, size_t n) noexcept nogil:
    return c_rt_accumulate_add_bf16(target, value, n)
cdef int rt_column_sums_bf16(unsigned short *out, const unsigned short *x, size_t rows, size_t cols) noexcept nogil:
    return c_rt_column_sums_bf16(out, x, rows, cols)
cdef int rt_mean_into(float *out, const float *x, size_t n) noexcept nogil:
    return c_rt_mean_into(out, x, n)
cdef int rt_spread(const float *total, float *out, size_t n) noexcept nogil:
    return c_rt_spread(total, out, n)
