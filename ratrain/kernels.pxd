# ratrain.kernels C-level interface for generated code: `from ratrain.kernels cimport *`.
# Every function is a nogil forwarder to the native kernel of the same name (see
# native/include/ratrain_kernels.h for shapes and accumulation contracts); it returns an
# rt_status (0 ok, -1 bad arguments, -2 scratch too small, -3 ISA unavailable). Calls go
# through the module's C-API table, so cimporting modules need no header and no linking.
from libc.stdint cimport int32_t

cdef enum:
    RT_OK = 0
    RT_EINVAL = -1
    RT_ENOMEM = -2
    RT_EISA = -3
    RT_F32 = 0
    RT_F16 = 1
    RT_BF16 = 2
    RT_TRANS_A = 1
    RT_TRANS_B = 2
    RT_ACCUMULATE = 4

cdef int gemm_fwd_f16(void *out, int out_dtype, const unsigned short *a, const unsigned short *b, const float *bias, int M, int N, int K, int flags, int threads) noexcept nogil
cdef int gemm_fwd_bf16(void *out, int out_dtype, const unsigned short *a, const unsigned short *b, const float *bias, int M, int N, int K, int flags, int threads) noexcept nogil
cdef int gemm_fwd_f32(void *out, int out_dtype, const float *a, const float *b, const float *bias, int M, int N, int K, int flags, int threads) noexcept nogil
cdef int rt_gemm_plan(int *plan, int M, int N, int K, int in_dtype, int flags) noexcept nogil
cdef int attention_fwd_f16(unsigned short *o, float *lse, const unsigned short *q, const unsigned short *k, const unsigned short *v, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads) noexcept nogil
cdef int attention_fwd_bf16(unsigned short *o, float *lse, const unsigned short *q, const unsigned short *k, const unsigned short *v, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads) noexcept nogil
cdef int attention_bwd_f16(unsigned short *dq, unsigned short *dk, unsigned short *dv, const unsigned short *q, const unsigned short *k, const unsigned short *v, const unsigned short *o, const float *lse, const unsigned short *dout, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads) noexcept nogil
cdef int attention_bwd_bf16(unsigned short *dq, unsigned short *dk, unsigned short *dv, const unsigned short *q, const unsigned short *k, const unsigned short *v, const unsigned short *o, const float *lse, const unsigned short *dout, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads) noexcept nogil
cdef int rmsnorm_fwd_f16(unsigned short *out, float *rstd, const unsigned short *x, const unsigned short *w, int N, int C, float eps, int threads) noexcept nogil
cdef int rmsnorm_fwd_bf16(unsigned short *out, float *rstd, const unsigned short *x, const unsigned short *w, int N, int C, float eps, int threads) noexcept nogil
cdef int rmsnorm_bwd_f16(unsigned short *dx, float *dw, const unsigned short *dout, const unsigned short *x, const unsigned short *w, const float *rstd, int N, int C, int threads) noexcept nogil
cdef int rmsnorm_bwd_bf16(unsigned short *dx, float *dw, const unsigned short *dout, const unsigned short *x, const unsigned short *w, const float *rstd, int N, int C, int threads) noexcept nogil
cdef int rope_fwd_f16(unsigned short *out, const unsigned short *x, int B, int T, int H, int D, const float *inv_freq, float scale, int threads) noexcept nogil
cdef int rope_fwd_bf16(unsigned short *out, const unsigned short *x, int B, int T, int H, int D, const float *inv_freq, float scale, int threads) noexcept nogil
cdef int rope_bwd_f16(unsigned short *dx, const unsigned short *dout, int B, int T, int H, int D, const float *inv_freq, float scale, int threads) noexcept nogil
cdef int rope_bwd_bf16(unsigned short *dx, const unsigned short *dout, int B, int T, int H, int D, const float *inv_freq, float scale, int threads) noexcept nogil
cdef int swiglu_fwd_f16(unsigned short *out, const unsigned short *gate, const unsigned short *up, size_t n, int threads) noexcept nogil
cdef int swiglu_fwd_bf16(unsigned short *out, const unsigned short *gate, const unsigned short *up, size_t n, int threads) noexcept nogil
cdef int swiglu_bwd_f16(unsigned short *dgate, unsigned short *dup, const unsigned short *dout, const unsigned short *gate, const unsigned short *up, size_t n, int threads) noexcept nogil
cdef int swiglu_bwd_bf16(unsigned short *dgate, unsigned short *dup, const unsigned short *dout, const unsigned short *gate, const unsigned short *up, size_t n, int threads) noexcept nogil
cdef int embedding_fwd_f16(unsigned short *out, const int32_t *ids, const unsigned short *table, int N, int V, int C, int threads) noexcept nogil
cdef int embedding_fwd_bf16(unsigned short *out, const int32_t *ids, const unsigned short *table, int N, int V, int C, int threads) noexcept nogil
cdef int embedding_bwd_f16(float *dtable, const unsigned short *dout, const int32_t *ids, int N, int V, int C, int threads) noexcept nogil
cdef int embedding_bwd_bf16(float *dtable, const unsigned short *dout, const int32_t *ids, int N, int V, int C, int threads) noexcept nogil
cdef int crossentropy_fwd_f16(float *losses, float *lse, const unsigned short *h, const unsigned short *w, const int32_t *targets, int N, int V, int C, int chunk, int threads) noexcept nogil
cdef int crossentropy_fwd_bf16(float *losses, float *lse, const unsigned short *h, const unsigned short *w, const int32_t *targets, int N, int V, int C, int chunk, int threads) noexcept nogil
cdef int crossentropy_bwd_f16(unsigned short *dh, float *dw, const unsigned short *h, const unsigned short *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads) noexcept nogil
cdef int crossentropy_bwd_input_f16(unsigned short *dh, float *g, const unsigned short *h, const unsigned short *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads) noexcept nogil
cdef int crossentropy_bwd_weight_f16(float *dw, const float *g, const unsigned short *h, int N, int V, int C, int chunk, int threads) noexcept nogil
cdef int crossentropy_bwd_bf16(unsigned short *dh, float *dw, const unsigned short *h, const unsigned short *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads) noexcept nogil
cdef int crossentropy_bwd_input_bf16(unsigned short *dh, unsigned short *g, const unsigned short *h, const unsigned short *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads) noexcept nogil
cdef int crossentropy_bwd_weight_bf16(float *dw, const unsigned short *g, const unsigned short *h, int N, int V, int C, int chunk, int threads) noexcept nogil
cdef int finite_sumsq_f16(int *finite, double *sumsq, const unsigned short *x, size_t n, int threads) noexcept nogil
cdef int finite_sumsq_bf16(int *finite, double *sumsq, const unsigned short *x, size_t n, int threads) noexcept nogil
cdef int attention_fwd_f32(float *o, float *lse, const float *q, const float *k, const float *v, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads) noexcept nogil
cdef int attention_bwd_f32(float *dq, float *dk, float *dv, const float *q, const float *k, const float *v, const float *o, const float *lse, const float *dout, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads) noexcept nogil
cdef int rmsnorm_fwd_f32(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps, int threads) noexcept nogil
cdef int rmsnorm_bwd_f32(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, int N, int C, int threads) noexcept nogil
cdef int rope_fwd_f32(float *out, const float *x, int B, int T, int H, int D, const float *inv_freq, float scale, int threads) noexcept nogil
cdef int rope_bwd_f32(float *dx, const float *dout, int B, int T, int H, int D, const float *inv_freq, float scale, int threads) noexcept nogil
cdef int swiglu_fwd_f32(float *out, const float *gate, const float *up, size_t n, int threads) noexcept nogil
cdef int swiglu_bwd_f32(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n, int threads) noexcept nogil
cdef int embedding_fwd_f32(float *out, const int32_t *ids, const float *table, int N, int V, int C, int threads) noexcept nogil
cdef int embedding_bwd_f32(float *dtable, const float *dout, const int32_t *ids, int N, int V, int C, int threads) noexcept nogil
cdef int crossentropy_fwd_f32(float *losses, float *lse, const float *h, const float *w, const int32_t *targets, int N, int V, int C, int chunk, int threads) noexcept nogil
cdef int crossentropy_bwd_f32(float *dh, float *dw, const float *h, const float *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads) noexcept nogil
cdef int crossentropy_bwd_input_f32(float *dh, float *g, const float *h, const float *w, const int32_t *targets, const float *lse, const float *dlosses, int N, int V, int C, int chunk, int threads) noexcept nogil
cdef int crossentropy_bwd_weight_f32(float *dw, const float *g, const float *h, int N, int V, int C, int chunk, int threads) noexcept nogil
cdef int finite_sumsq_f32(int *finite, double *sumsq, const float *x, size_t n, int threads) noexcept nogil
cdef int adamw_step_f32(float *master, float *m, float *v, unsigned short *param_f16, const float *grad, size_t n, float lr, float beta1, float beta2, float eps, float wd, int step) noexcept nogil
cdef int adamw_step_f32_bf16(float *master, float *m, float *v, unsigned short *param_bf16, const float *grad, size_t n, float lr, float beta1, float beta2, float eps, float wd, int step) noexcept nogil
cdef int cast_f32_to_f16(unsigned short *dst, const float *src, size_t n) noexcept nogil
cdef int cast_f16_to_f32(float *dst, const unsigned short *src, size_t n) noexcept nogil
cdef int cast_f32_to_bf16(unsigned short *dst, const float *src, size_t n) noexcept nogil
cdef int cast_bf16_to_f32(float *dst, const unsigned short *src, size_t n) noexcept nogil
cdef int rt_add_f32(float *out, const float *a, const float *b, size_t n) noexcept nogil
cdef int rt_add_f16(unsigned short *out, const unsigned short *a, const unsigned short *b, size_t n) noexcept nogil
cdef int rt_accumulate_set_f32(float *target, const float *value, size_t n) noexcept nogil
cdef int rt_accumulate_add_f32(float *target, const float *value, size_t n) noexcept nogil
cdef int rt_accumulate_set_f16(float *target, const unsigned short *value, size_t n) noexcept nogil
cdef int rt_accumulate_add_f16(float *target, const unsigned short *value, size_t n) noexcept nogil
cdef int rt_column_sums_f32(float *out, const float *x, size_t rows, size_t cols) noexcept nogil
cdef int rt_column_sums_f16(unsigned short *out, const unsigned short *x, size_t rows, size_t cols) noexcept nogil
cdef int rt_add_bf16(unsigned short *out, const unsigned short *a, const unsigned short *b, size_t n) noexcept nogil
cdef int rt_accumulate_set_bf16(float *target, const unsigned short *value, size_t n) noexcept nogil
cdef int rt_accumulate_add_bf16(float *target, const unsigned short *value, size_t n) noexcept nogil
cdef int rt_column_sums_bf16(unsigned short *out, const unsigned short *x, size_t rows, size_t cols) noexcept nogil
cdef int rt_mean_into(float *out, const float *x, size_t n) noexcept nogil
cdef int rt_spread(const float *total, float *out, size_t n) noexcept nogil
