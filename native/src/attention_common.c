/* Helpers shared by attention_fwd.c and attention_bwd.c (see attention.h). */
#include "attention.h"

int att_setup(att_shape *s, int B, int T, int Hq, int Hkv, int D, int causal,
              const float *alibi, rt_dtype dt, int wide_tiles, int square_tiles) {
    if (B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0 || Hq % Hkv) return RT_EINVAL;
    s->B = B; s->T = T; s->Hq = Hq; s->Hkv = Hkv; s->D = D; s->Dp = (int)rt_round_up(D, 16);
    s->causal = causal; s->scale = 1.0f / sqrtf((float)D); s->alibi = alibi; s->dt = dt;
    for (int t = 64; t >= 16; t /= 2) {
        size_t need = (size_t)wide_tiles * t * s->Dp * 4 + (size_t)square_tiles * t * t * 4
                      + 16 * (size_t)RT_ALIGN;
        if (need <= rt_am_bytes()) { s->br = s->bc = t; return RT_OK; }
    }
    return RT_ENOMEM;
}

void att_fetch_rows(void *raw, const void *x, const att_shape *s, int b, int head, int heads,
                    int t0, int rows, rt_dma_handle *h) {
    size_t row = (size_t)s->D * rt_esize(s->dt);
    int valid = rt_max(0, rt_min(rows, s->T - t0));
    h->pending = 0; h->status = RT_OK;
    if (valid <= 0) return;
    const char *src = (const char *)x + (((size_t)b * s->T + t0) * heads + head) * row;
    dma_get_2d(raw, row, src, (size_t)heads * row, valid, row, RT_AM, h);
}

void att_convert_rows(float *dst, const void *raw, const att_shape *s, int t0, int rows,
                      float mul, const rt_simd *S) {
    int valid = rt_max(0, rt_min(rows, s->T - t0));
    for (int r = 0; r < rows; r++) {
        float *d = dst + (size_t)r * s->Dp;
        if (r < valid) {
            rt_load_f32(S, d, raw, (size_t)r * s->D, s->D, s->dt);
            if (mul != 1.0f) S->scale(d, s->D, mul);
            memset(d + s->D, 0, (size_t)(s->Dp - s->D) * 4);
        } else {
            memset(d, 0, (size_t)s->Dp * 4);
        }
    }
}

void att_load_rows(float *dst, void *raw, const void *x, const att_shape *s, int b, int head,
                   int heads, int t0, int rows, float mul, const rt_simd *S) {
    rt_dma_handle h;
    att_fetch_rows(raw, x, s, b, head, heads, t0, rows, &h);
    dma_wait(&h);
    att_convert_rows(dst, raw, s, t0, rows, mul, S);
}

void att_store_rows(void *x, void *raw, const float *src, const att_shape *s, int b,
                    int head, int heads, int t0, int rows, const rt_simd *S) {
    size_t e = rt_esize(s->dt), row = (size_t)s->D * e;
    int valid = rt_max(0, rt_min(rows, s->T - t0));
    if (valid <= 0) return;
    for (int r = 0; r < valid; r++)
        rt_store_f32(S, raw, (size_t)r * s->D, src + (size_t)r * s->Dp, s->D, s->dt);
    rt_dma_handle h;
    char *dst = (char *)x + (((size_t)b * s->T + t0) * heads + head) * row;
    dma_put_2d(dst, (size_t)heads * row, raw, row, valid, row, RT_AM, &h);
    dma_wait(&h);
}

static inline int masked(const att_shape *s, int i, int j) {
    return j >= s->T || (s->causal && j > i);
}

int att_bias_mask(float *st, const att_shape *s, int h, int i0, int rows, int j0) {
    int any = (j0 + s->bc > s->T) || (s->causal && j0 + s->bc - 1 > i0);
    if (s->alibi) {
        float slope = s->alibi[h];
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < s->bc; c++) st[(size_t)r * s->bc + c] += slope * (float)(j0 + c - i0 - r);
    }
    if (!any) return 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < s->bc; c++)
            if (masked(s, i0 + r, j0 + c)) st[(size_t)r * s->bc + c] = -INFINITY;
    return 1;
}

void att_zero_masked(float *p, const att_shape *s, int i0, int rows, int j0) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < s->bc; c++)
            if (masked(s, i0 + r, j0 + c)) p[(size_t)r * s->bc + c] = 0.0f;
}

void att_transpose(float *dst, int ldd, const float *src, int lds, int rows, int cols) {
    for (int r0 = 0; r0 < rows; r0 += 8)
        for (int c = 0; c < cols; c++)
            for (int r = r0; r < rt_min(rows, r0 + 8); r++)
                dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
}
