/* Shared pieces of the flash-style attention kernels: tile sizes chosen to fit AM, row DMA
 * with conversion to zero-padded FP32 tiles, the causal/ALiBi score fix-up and a transpose.
 * Layout: q,o [B,T,Hq,D], k,v [B,T,Hkv,D]; query head h reads kv head h / (Hq/Hkv). */
#ifndef RATRAIN_ATTENTION_H
#define RATRAIN_ATTENTION_H
#include "internal.h"

typedef struct {
    int B, T, Hq, Hkv, D, Dp;   /* Dp = D padded to 16 lanes */
    int br, bc;                 /* query rows and key columns per tile */
    int causal;
    float scale;                /* 1/sqrt(D) */
    const float *alibi;         /* [Hq] or NULL */
    rt_dtype dt;
} att_shape;

/* fills s; returns RT_ENOMEM when even 16x16 tiles of `tiles` Dp-wide and `sq` square
 * buffers do not fit in AM */
int att_setup(att_shape *s, int B, int T, int Hq, int Hkv, int D, int causal,
              const float *alibi, rt_dtype dt, int wide_tiles, int square_tiles);

/* rows [t0, t0+rows) of head `head` (of `heads`) of batch b from x into dst [rows, Dp] f32,
 * through a DMA get into `raw`; rows beyond T and columns beyond D are zero; dst *= mul */
void att_load_rows(float *dst, void *raw, const void *x, const att_shape *s, int b, int head,
                   int heads, int t0, int rows, float mul, const rt_simd *S);
/* the two halves of att_load_rows, for double buffering: issue the DMA, then convert */
void att_fetch_rows(void *raw, const void *x, const att_shape *s, int b, int head, int heads,
                    int t0, int rows, rt_dma_handle *h);
void att_convert_rows(float *dst, const void *raw, const att_shape *s, int t0, int rows,
                      float mul, const rt_simd *S);
/* bump allocator over a thread's AM buffer, 64-byte aligned pieces */
static inline float *att_carve(char **p, size_t floats) {
    float *r = (float *)*p;
    *p += rt_round_up(floats * 4, RT_ALIGN);
    return r;
}
/* src [rows, Dp] f32 -> x rows [t0, t0+rows) of head `head`, cast, through a DMA put */
void att_store_rows(void *x, void *raw, const float *src, const att_shape *s, int b,
                    int head, int heads, int t0, int rows, const rt_simd *S);
/* score tile s[rows, bc] for queries i0.. and keys j0..: adds ALiBi slope*(j-i), sets
 * masked (causal j > i, or j >= T) entries to -inf; returns 1 if any entry was masked */
int att_bias_mask(float *st, const att_shape *s, int h, int i0, int rows, int j0);
/* zero the entries att_bias_mask masked (after exp) */
void att_zero_masked(float *p, const att_shape *s, int i0, int rows, int j0);
/* dst[c, r] = src[r, c] for an r x c tile with row strides lds, ldd */
void att_transpose(float *dst, int ldd, const float *src, int lds, int rows, int cols);
/* last key block index (exclusive key bound) a query block [i0, i0+rows) needs */
/* bf16 storage on the AMX bf16 micro-kernel (attention_bf16.c); s from att_setup, its tile
 * sizes replaced; call only when att_bf16_tiles() is not NULL. delta [B,Hq,T] = rowsum(dO o) */
const rt_bf16_gemm *att_bf16_tiles(void);   /* the kernel, or NULL: widen to fp32 tiles */
int att_bf16_fwd(rt_bf16 *o, float *lse, const rt_bf16 *q, const rt_bf16 *k, const rt_bf16 *v,
                 att_shape *s, int threads);
int att_bf16_bwd(rt_bf16 *dq, rt_bf16 *dk, rt_bf16 *dv, const rt_bf16 *q, const rt_bf16 *k,
                 const rt_bf16 *v, const float *lse, const float *delta, const rt_bf16 *dout,
                 att_shape *s, int threads);
static inline int att_key_end(const att_shape *s, int i0, int rows) {
    return s->causal ? rt_min(s->T, i0 + rows) : s->T;
}
#endif
