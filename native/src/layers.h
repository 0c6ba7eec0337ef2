/* dtype-generic forms of the elementwise layer kernels; entry.c gives them the public
 * <op>_<fwd|bwd>_<dtype> names. Sizes and accumulation contracts as in ratrain_kernels.h. */
#ifndef RATRAIN_LAYERS_H
#define RATRAIN_LAYERS_H
#include "internal.h"

int rt_rmsnorm_fwd(void *out, float *rstd, const void *x, const void *w, int N, int C,
                   float eps, rt_dtype dt, int threads);
int rt_rmsnorm_bwd(void *dx, float *dw, const void *dout, const void *x, const void *w,
                   const float *rstd, int N, int C, rt_dtype dt, int threads);
int rt_rope(void *out, const void *x, int B, int T, int H, int D, const float *inv_freq,
            float scale, int inverse, rt_dtype dt, int threads);
int rt_swiglu_fwd(void *out, const void *gate, const void *up, size_t n, rt_dtype dt, int threads);
int rt_swiglu_bwd(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                  size_t n, rt_dtype dt, int threads);
int rt_embedding_fwd(void *out, const int32_t *ids, const void *table, int N, int V, int C,
                     rt_dtype dt, int threads);
int rt_embedding_bwd(float *dtable, const void *dout, const int32_t *ids, int N, int V, int C,
                     rt_dtype dt, int threads);
int rt_crossentropy_fwd(float *losses, float *lse, const void *h, const void *w,
                        const int32_t *targets, int N, int V, int C, int chunk, rt_dtype dt,
                        int threads);
int rt_crossentropy_bwd(void *dh, float *dw, const void *h, const void *w,
                        const int32_t *targets, const float *lse, const float *dlosses, int N,
                        int V, int C, int chunk, rt_dtype dt, int threads);
int rt_crossentropy_bwd_input(void *dh, void *g, const void *h, const void *w,
                              const int32_t *targets, const float *lse, const float *dlosses,
                              int N, int V, int C, int chunk, rt_dtype dt, int threads);
int rt_crossentropy_bwd_weight(float *dw, const void *g, const void *h, int N, int V, int C,
                               int chunk, rt_dtype dt, int threads);
int rt_finite_sumsq(double *sumsq, const void *x, size_t n, rt_dtype dt, int threads);
#endif
