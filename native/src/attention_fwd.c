/* Causal attention forward, flash style: one task per (batch, query head, query block); the
 * key/value blocks stream through AM by DMA (double buffered) and an online softmax keeps
 * the running max and sum, so no T x T matrix exists. Saves lse = m + log(l) per query row.
 *   o[b,i,h,:] = sum_j softmax_j(scale * q.k_j + slope_h * (j - i)) v_j,  j <= i if causal */
#include <omp.h>
#include "attention.h"

typedef struct {
    float *qs, *o, *k32, *kt, *v32, *st, *m, *l;
    char *rawq, *rawk[2], *rawv[2];
} fwd_tiles;

static void carve_fwd(fwd_tiles *w, char *am, const att_shape *s) {
    size_t wide = (size_t)s->br * s->Dp, sq = (size_t)s->br * s->bc;
    w->qs = att_carve(&am, wide); w->o = att_carve(&am, wide); w->k32 = att_carve(&am, wide);
    w->kt = att_carve(&am, wide); w->v32 = att_carve(&am, wide); w->st = att_carve(&am, sq);
    w->m = att_carve(&am, s->br); w->l = att_carve(&am, s->br);
    w->rawq = (char *)att_carve(&am, wide);
    for (int i = 0; i < 2; i++) { w->rawk[i] = (char *)att_carve(&am, wide); w->rawv[i] = (char *)att_carve(&am, wide); }
}

/* online softmax over one score tile; rescales the output rows already accumulated */
static void softmax_update(fwd_tiles *w, const att_shape *s, int rq, const rt_simd *S) {
    for (int r = 0; r < rq; r++) {
        float *sr = w->st + (size_t)r * s->bc;
        float mx = fmaxf(w->m[r], S->row_max(sr, s->bc));
        float sum = S->exp_sub_sum(sr, s->bc, mx);
        float alpha = expf(w->m[r] - mx);
        w->l[r] = w->l[r] * alpha + sum;
        if (alpha != 1.0f) S->scale(w->o + (size_t)r * s->Dp, s->Dp, alpha);
        w->m[r] = mx;
    }
}

static void fetch_kv(fwd_tiles *w, int slot, const void *k, const void *v, const att_shape *s,
                     int b, int kvh, int j0, rt_dma_handle h[2]) {
    att_fetch_rows(w->rawk[slot], k, s, b, kvh, s->Hkv, j0, s->bc, &h[0]);
    att_fetch_rows(w->rawv[slot], v, s, b, kvh, s->Hkv, j0, s->bc, &h[1]);
}

static void fwd_task(void *o, float *lse, const void *q, const void *k, const void *v,
                     const att_shape *s, fwd_tiles *w, int b, int h, int i0, const rt_simd *S) {
    int rq = rt_min(s->br, s->T - i0), kvh = h / (s->Hq / s->Hkv), jend = att_key_end(s, i0, rq);
    att_load_rows(w->qs, w->rawq, q, s, b, h, s->Hq, i0, rq, s->scale, S);
    memset(w->o, 0, (size_t)rq * s->Dp * 4);
    for (int r = 0; r < rq; r++) { w->m[r] = -INFINITY; w->l[r] = 0.0f; }
    rt_dma_handle hk[2][2];
    fetch_kv(w, 0, k, v, s, b, kvh, 0, hk[0]);
    for (int jb = 0, j0 = 0; j0 < jend; jb++, j0 += s->bc) {
        int cur = jb & 1;
        if (j0 + s->bc < jend) fetch_kv(w, cur ^ 1, k, v, s, b, kvh, j0 + s->bc, hk[cur ^ 1]);
        dma_wait(&hk[cur][0]); dma_wait(&hk[cur][1]);
        att_convert_rows(w->k32, w->rawk[cur], s, j0, s->bc, 1.0f, S);
        att_convert_rows(w->v32, w->rawv[cur], s, j0, s->bc, 1.0f, S);
        att_transpose(w->kt, s->bc, w->k32, s->Dp, s->bc, s->Dp);
        S->mm(w->st, s->bc, w->qs, s->Dp, w->kt, s->bc, rq, s->bc, s->Dp, 0);   /* S = Qs K^T */
        int any = att_bias_mask(w->st, s, h, i0, rq, j0);
        softmax_update(w, s, rq, S);
        if (any) att_zero_masked(w->st, s, i0, rq, j0);
        S->mm(w->o, s->Dp, w->st, s->bc, w->v32, s->Dp, rq, s->Dp, s->bc, 1);   /* O += P V */
    }
    float *lse_row = lse + ((size_t)b * s->Hq + h) * s->T + i0;
    for (int r = 0; r < rq; r++) {
        S->scale(w->o + (size_t)r * s->Dp, s->Dp, 1.0f / w->l[r]);
        lse_row[r] = w->m[r] + logf(w->l[r]);
    }
    att_store_rows(o, w->rawq, w->o, s, b, h, s->Hq, i0, rq, S);
}

static int attention_fwd(void *o, float *lse, const void *q, const void *k, const void *v,
                         const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal,
                         int threads, rt_dtype dt) {
    att_shape s;
    int st = att_setup(&s, B, T, Hq, Hkv, D, causal, alibi, dt, 10, 2);
    if (st) return st;
    if (threads < 1 || threads > RT_MAX_THREADS) return RT_EINVAL;
    if (dt == RT_BF16 && att_bf16_tiles()) return att_bf16_fwd(o, lse, q, k, v, &s, threads);
    const rt_simd *S = rt_simd_get();
    int nq = (T + s.br - 1) / s.br, ntask = B * Hq * nq, fail = 0;
    #pragma omp parallel num_threads(threads)
    {
        char *am = rt_am(omp_get_thread_num());
        fwd_tiles w = {0};
        if (am) carve_fwd(&w, am, &s); else __atomic_store_n(&fail, 1, __ATOMIC_RELAXED);
        #pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < ntask; t++) {   /* longest (last) query blocks first */
            int qb = nq - 1 - t / (B * Hq), bh = t % (B * Hq);
            if (am) fwd_task(o, lse, q, k, v, &s, &w, bh / Hq, bh % Hq, qb * s.br, S);
        }
    }
    return fail ? RT_ENOMEM : RT_OK;
}

int attention_fwd_f16(rt_half *o, float *lse, const rt_half *q, const rt_half *k,
                      const rt_half *v, const float *alibi, int B, int T, int Hq, int Hkv,
                      int D, int causal, int threads) {
    return attention_fwd(o, lse, q, k, v, alibi, B, T, Hq, Hkv, D, causal, threads, RT_F16);
}
int attention_fwd_bf16(rt_bf16 *o, float *lse, const rt_bf16 *q, const rt_bf16 *k,
                       const rt_bf16 *v, const float *alibi, int B, int T, int Hq, int Hkv,
                       int D, int causal, int threads) {
    return attention_fwd(o, lse, q, k, v, alibi, B, T, Hq, Hkv, D, causal, threads, RT_BF16);
}
int attention_fwd_f32(float *o, float *lse, const float *q, const float *k, const float *v,
                      const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal,
                      int threads) {
    return attention_fwd(o, lse, q, k, v, alibi, B, T, Hq, Hkv, D, causal, threads, RT_F32);
}
