/* Public <op>_<fwd|bwd>_<dtype> entry points of the dtype-generic layer kernels (layers.c,
 * crossentropy.c, optim.c): one line per name, so the C interface reads like llm.c. */
#include "layers.h"

/* threads stand for a cluster's cores; each needs its own AM buffer */
#define BAD_THREADS(t) ((t) < 1 || (t) > RT_MAX_THREADS)

/* every storage dtype; bf16 has the fp16 code path: load to f32, fp32 math, store RNE; G: the
 * element of the cross-entropy's kept logits gradient (NOTE [split logits gradient]) */
#define BOTH(X) X(f16, rt_half, RT_F16, float) X(bf16, rt_bf16, RT_BF16, rt_bf16)              \
                X(f32, float, RT_F32, float)

#define DEFINE(sfx, T, DT, G)                                                                 \
int rmsnorm_fwd_##sfx(T *out, float *rstd, const T *x, const T *w, int N, int C, float eps,   \
                      int threads) {\
    if (BAD_THREADS(threads)) return RT_EINVAL; \
    return rt_rmsnorm_fwd(out, rstd, x, w, N, C, eps, DT, threads); }                         \
int rmsnorm_bwd_##sfx(T *dx, float *dw, const T *dout, const T *x, const T *w,                \
                      const float *rstd, int N, int C, int threads) {\
    if (BAD_THREADS(threads)) return RT_EINVAL; \
    return rt_rmsnorm_bwd(dx, dw, dout, x, w, rstd, N, C, DT, threads); }                     \
int rope_fwd_##sfx(T *out, const T *x, int B, int T_, int H, int D, const float *inv_freq,   \
                   float scale, int threads) {\
    if (BAD_THREADS(threads)) return RT_EINVAL; \
    return rt_rope(out, x, B, T_, H, D, inv_freq, scale, 0, DT, threads); }                   \
int rope_bwd_##sfx(T *dx, const T *dout, int B, int T_, int H, int D, const float *inv_freq,  \
                   float scale, int threads) {\
    if (BAD_THREADS(threads)) return RT_EINVAL; \
    return rt_rope(dx, dout, B, T_, H, D, inv_freq, scale, 1, DT, threads); }                 \
int swiglu_fwd_##sfx(T *out, const T *gate, const T *up, size_t n, int threads) {\
    if (BAD_THREADS(threads)) return RT_EINVAL; \
    return rt_swiglu_fwd(out, gate, up, n, DT, threads); }                                    \
int swiglu_bwd_##sfx(T *dgate, T *dup, const T *dout, const T *gate, const T *up, size_t n,   \
                     int threads) {\
    if (BAD_THREADS(threads)) return RT_EINVAL; \
    return rt_swiglu_bwd(dgate, dup, dout, gate, up, n, DT, threads); }                       \
int embedding_fwd_##sfx(T *out, const int32_t *ids, const T *table, int N, int V, int C,      \
                        int threads) {\
    if (BAD_THREADS(threads)) return RT_EINVAL; \
    return rt_embedding_fwd(out, ids, table, N, V, C, DT, threads); }                         \
int embedding_bwd_##sfx(float *dtable, const T *dout, const int32_t *ids, int N, int V, int C,\
                        int threads) {\
    if (BAD_THREADS(threads)) return RT_EINVAL; \
    return rt_embedding_bwd(dtable, dout, ids, N, V, C, DT, threads); }                       \
int crossentropy_fwd_##sfx(float *losses, float *lse, const T *h, const T *w,                 \
                           const int32_t *targets, int N, int V, int C, int chunk,            \
                           int threads) {\
    if (BAD_THREADS(threads)) return RT_EINVAL; \
    return rt_crossentropy_fwd(losses, lse, h, w, targets, N, V, C, chunk, DT, threads); }    \
int crossentropy_bwd_##sfx(T *dh, float *dw, const T *h, const T *w, const int32_t *targets,  \
                           const float *lse, const float *dlosses, int N, int V, int C,       \
                           int chunk, int threads) {\
    if (BAD_THREADS(threads)) return RT_EINVAL; \
    return rt_crossentropy_bwd(dh, dw, h, w, targets, lse, dlosses, N, V, C, chunk, DT,       \
                               threads); }                                                    \
int crossentropy_bwd_input_##sfx(T *dh, G *g, const T *h, const T *w, const int32_t *targets, \
                                 const float *lse, const float *dlosses, int N, int V, int C, \
                                 int chunk, int threads) {\
    if (BAD_THREADS(threads)) return RT_EINVAL; \
    return rt_crossentropy_bwd_input(dh, g, h, w, targets, lse, dlosses, N, V, C, chunk, DT,  \
                                     threads); }                                              \
int crossentropy_bwd_weight_##sfx(float *dw, const G *g, const T *h, int N, int V, int C,     \
                                  int chunk, int threads) {\
    if (BAD_THREADS(threads)) return RT_EINVAL; \
    return rt_crossentropy_bwd_weight(dw, g, h, N, V, C, chunk, DT, threads); }               \
int finite_sumsq_##sfx(int *finite, double *sumsq, const T *x, size_t n, int threads) {       \
    if (BAD_THREADS(threads)) return RT_EINVAL;                                               \
    *finite = rt_finite_sumsq(sumsq, x, n, DT, threads);                                      \
    return RT_OK; }

BOTH(DEFINE)
