/* Causal attention backward, flash style: one task per (batch, kv head, key block) so dK and
 * dV are owned by one core; for every query head of the GQA group and every query block that
 * sees the keys, P is recomputed from the saved lse (no T x T matrix), and the dQ tile is
 * added under a per-(b, h, query block) lock into an FP32 workspace, cast at the end.
 *   forward:  S = scale q k^T + alibi,  P = exp(S - lse),  O = P V
 *   backward: dV += P^T dO;  dP = dO V^T;  dS = P (dP - rowsum(dO o));  dK += dS^T (scale q);
 *             dQ += scale dS K */
#include <omp.h>
#include <stdlib.h>
#include "attention.h"

typedef struct {
    float *k32, *kt, *vt, *dk, *dv, *qs, *dos, *dqt, *st, *dp, *pt, *dst, *lse, *delta;
    char *rawq[2], *rawdo[2], *rawkv;
} bwd_tiles;

static void carve_bwd(bwd_tiles *w, char *am, const att_shape *s) {
    size_t wide = (size_t)s->br * s->Dp, sq = (size_t)s->br * s->bc;
    float **wides[] = {&w->k32, &w->kt, &w->vt, &w->dk, &w->dv, &w->qs, &w->dos, &w->dqt};
    for (int i = 0; i < 8; i++) *wides[i] = att_carve(&am, wide);
    w->st = att_carve(&am, sq); w->dp = att_carve(&am, sq);
    w->pt = att_carve(&am, sq); w->dst = att_carve(&am, sq);
    w->lse = att_carve(&am, s->br); w->delta = att_carve(&am, s->br);
    for (int i = 0; i < 2; i++) { w->rawq[i] = (char *)att_carve(&am, wide); w->rawdo[i] = (char *)att_carve(&am, wide); }
    w->rawkv = (char *)att_carve(&am, wide);
}

typedef struct {
    const void *q, *k, *v, *dout;
    const float *lse, *delta;     /* [B,Hq,T] */
    float *dq_ws;                 /* [B,Hq,T,Dp] f32 */
    omp_lock_t *locks;            /* [B*Hq*nq] */
} bwd_io;

/* P, dS for one (query block, key block) pair; accumulates dK, dV and the dQ workspace */
static void bwd_pair(const bwd_io *io, const att_shape *s, bwd_tiles *w, int b, int h, int i0,
                     int rq, int j0, const rt_simd *S) {
    S->mm(w->st, s->bc, w->qs, s->Dp, w->kt, s->bc, rq, s->bc, s->Dp, 0);      /* S = Qs K^T */
    int any = att_bias_mask(w->st, s, h, i0, rq, j0);
    for (int r = 0; r < rq; r++) S->exp_sub_sum(w->st + (size_t)r * s->bc, s->bc, w->lse[r]);
    if (any) att_zero_masked(w->st, s, i0, rq, j0);
    att_transpose(w->pt, s->br, w->st, s->bc, rq, s->bc);
    S->mm(w->dv, s->Dp, w->pt, s->br, w->dos, s->Dp, s->bc, s->Dp, rq, 1);       /* dV += P^T dO */
    S->mm(w->dp, s->bc, w->dos, s->Dp, w->vt, s->bc, rq, s->bc, s->Dp, 0);       /* dP = dO V^T */
    for (int r = 0; r < rq; r++) {
        float *p = w->st + (size_t)r * s->bc, *dp = w->dp + (size_t)r * s->bc, d = w->delta[r];
        for (int c = 0; c < s->bc; c++) dp[c] = p[c] * (dp[c] - d);              /* dS */
    }
    att_transpose(w->dst, s->br, w->dp, s->bc, rq, s->bc);
    S->mm(w->dk, s->Dp, w->dst, s->br, w->qs, s->Dp, s->bc, s->Dp, rq, 1);       /* dK += dS^T Qs */
    S->mm(w->dqt, s->Dp, w->dp, s->bc, w->k32, s->Dp, rq, s->Dp, s->bc, 0);      /* dQ~ = dS K */
    int nq = (s->T + s->br - 1) / s->br;
    omp_lock_t *lock = &io->locks[((size_t)b * s->Hq + h) * nq + i0 / s->br];
    float *dq = io->dq_ws + (((size_t)b * s->Hq + h) * s->T + i0) * s->Dp;
    omp_set_lock(lock);
    for (int r = 0; r < rq; r++) S->axpy(dq + (size_t)r * s->Dp, w->dqt + (size_t)r * s->Dp, s->Dp, s->scale);
    omp_unset_lock(lock);
}

static void load_query_side(const bwd_io *io, const att_shape *s, bwd_tiles *w, int slot, int b,
                            int h, int i0, int rq, const rt_simd *S) {
    att_convert_rows(w->qs, w->rawq[slot], s, i0, rq, s->scale, S);
    att_convert_rows(w->dos, w->rawdo[slot], s, i0, rq, 1.0f, S);
    size_t off = ((size_t)b * s->Hq + h) * s->T + i0;
    memcpy(w->lse, io->lse + off, (size_t)rq * 4);
    memcpy(w->delta, io->delta + off, (size_t)rq * 4);
}

static void bwd_task(const bwd_io *io, void *dk, void *dv, const att_shape *s, bwd_tiles *w,
                     int b, int kvh, int j0, const rt_simd *S) {
    int group = s->Hq / s->Hkv, rk = rt_min(s->bc, s->T - j0);
    att_load_rows(w->k32, w->rawkv, io->k, s, b, kvh, s->Hkv, j0, s->bc, 1.0f, S);
    att_transpose(w->kt, s->bc, w->k32, s->Dp, s->bc, s->Dp);
    att_load_rows(w->dv, w->rawkv, io->v, s, b, kvh, s->Hkv, j0, s->bc, 1.0f, S);
    att_transpose(w->vt, s->bc, w->dv, s->Dp, s->bc, s->Dp);
    memset(w->dk, 0, (size_t)s->bc * s->Dp * 4);
    memset(w->dv, 0, (size_t)s->bc * s->Dp * 4);
    int ib0 = s->causal ? j0 / s->br : 0, nq = (s->T + s->br - 1) / s->br, n = group * (nq - ib0);
    rt_dma_handle hq[2][2];
    for (int it = 0; it <= n; it++) {          /* item it+1 is fetched while item it computes */
        if (it < n) {
            int h = kvh * group + it / (nq - ib0), i0 = (ib0 + it % (nq - ib0)) * s->br;
            att_fetch_rows(w->rawq[it & 1], io->q, s, b, h, s->Hq, i0, s->br, &hq[it & 1][0]);
            att_fetch_rows(w->rawdo[it & 1], io->dout, s, b, h, s->Hq, i0, s->br, &hq[it & 1][1]);
        }
        if (it == 0) continue;
        int p = it - 1, h = kvh * group + p / (nq - ib0), i0 = (ib0 + p % (nq - ib0)) * s->br;
        int rq = rt_min(s->br, s->T - i0);
        dma_wait(&hq[p & 1][0]); dma_wait(&hq[p & 1][1]);
        load_query_side(io, s, w, p & 1, b, h, i0, rq, S);
        bwd_pair(io, s, w, b, h, i0, rq, j0, S);
    }
    att_store_rows(dk, w->rawkv, w->dk, s, b, kvh, s->Hkv, j0, rk, S);
    att_store_rows(dv, w->rawkv, w->dv, s, b, kvh, s->Hkv, j0, rk, S);
}

/* delta[b,h,t] = dot(dO[b,t,h,:], O[b,t,h,:]) in f32 */
static void compute_delta(float *delta, const void *o, const void *dout, const att_shape *s,
                          int threads, const rt_simd *S) {
    size_t rows = (size_t)s->B * s->T * s->Hq;
    #pragma omp parallel num_threads(threads)
    {
        float *buf = (float *)rt_am(omp_get_thread_num());
        #pragma omp for schedule(static)
        for (size_t r = 0; r < rows; r++) {
            size_t b = r / ((size_t)s->T * s->Hq), t = r / s->Hq % s->T, h = r % s->Hq;
            rt_load_f32(S, buf, o, r * s->D, s->D, s->dt);
            rt_load_f32(S, buf + s->Dp, dout, r * s->D, s->D, s->dt);
            delta[(b * s->Hq + h) * s->T + t] = S->dot(buf, buf + s->Dp, s->D);
        }
    }
}

/* dq[b,t,h,:] = dq_ws[b,h,t,:D] cast to the storage dtype */
static void write_dq(void *dq, const float *ws, const att_shape *s, int threads, const rt_simd *S) {
    size_t rows = (size_t)s->B * s->T * s->Hq;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t r = 0; r < rows; r++) {
        size_t b = r / ((size_t)s->T * s->Hq), t = r / s->Hq % s->T, h = r % s->Hq;
        rt_store_f32(S, dq, r * s->D, ws + ((b * s->Hq + h) * s->T + t) * s->Dp, s->D, s->dt);
    }
}

static int attention_bwd(void *dq, void *dk, void *dv, const void *q, const void *k,
                         const void *v, const void *o, const float *lse, const void *dout,
                         const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal,
                         int threads, rt_dtype dt) {
    att_shape s;
    int st = att_setup(&s, B, T, Hq, Hkv, D, causal, alibi, dt, 13, 5);
    if (st) return st;
    if (threads < 1 || threads > RT_MAX_THREADS) return RT_EINVAL;
    const rt_simd *S = rt_simd_get();
    int nq = (T + s.br - 1) / s.br, nk = (T + s.bc - 1) / s.bc, ntask = B * Hkv * nk;
    size_t nlock = (size_t)B * Hq * nq;
    float *delta = malloc((size_t)B * Hq * T * 4);
    float *ws = calloc((size_t)B * Hq * T * s.Dp, 4);
    omp_lock_t *locks = malloc(nlock * sizeof(omp_lock_t));
    for (int t = 0; t < threads; t++) if (!rt_am(t)) st = RT_ENOMEM;
    if (!delta || !ws || !locks || st) { free(delta); free(ws); free(locks); return RT_ENOMEM; }
    compute_delta(delta, o, dout, &s, threads, S);
    if (dt == RT_BF16 && att_bf16_tiles()) {      /* bf16 tile products (attention_bf16.c) */
        free(ws); free(locks);
        st = att_bf16_bwd(dq, dk, dv, q, k, v, lse, delta, dout, &s, threads);
        free(delta);
        return st;
    }
    for (size_t i = 0; i < nlock; i++) omp_init_lock(&locks[i]);
    bwd_io io = {q, k, v, dout, lse, delta, ws, locks};
    #pragma omp parallel num_threads(threads)
    {
        bwd_tiles w;
        carve_bwd(&w, rt_am(omp_get_thread_num()), &s);
        #pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < ntask; t++) {    /* causal: first key blocks see the most queries */
            int jb = t / (B * Hkv), bk = t % (B * Hkv);
            bwd_task(&io, dk, dv, &s, &w, bk / Hkv, bk % Hkv, jb * s.bc, S);
        }
    }
    write_dq(dq, ws, &s, threads, S);
    for (size_t i = 0; i < nlock; i++) omp_destroy_lock(&locks[i]);
    free(delta); free(ws); free(locks);
    return RT_OK;
}

int attention_bwd_f16(rt_half *dq, rt_half *dk, rt_half *dv, const rt_half *q,
                      const rt_half *k, const rt_half *v, const rt_half *o, const float *lse,
                      const rt_half *dout, const float *alibi, int B, int T, int Hq, int Hkv,
                      int D, int causal, int threads) {
    return attention_bwd(dq, dk, dv, q, k, v, o, lse, dout, alibi, B, T, Hq, Hkv, D, causal,
                         threads, RT_F16);
}
int attention_bwd_bf16(rt_bf16 *dq, rt_bf16 *dk, rt_bf16 *dv, const rt_bf16 *q,
                       const rt_bf16 *k, const rt_bf16 *v, const rt_bf16 *o, const float *lse,
                       const rt_bf16 *dout, const float *alibi, int B, int T, int Hq, int Hkv,
                       int D, int causal, int threads) {
    return attention_bwd(dq, dk, dv, q, k, v, o, lse, dout, alibi, B, T, Hq, Hkv, D, causal,
                         threads, RT_BF16);
}
int attention_bwd_f32(float *dq, float *dk, float *dv, const float *q, const float *k,
                      const float *v, const float *o, const float *lse, const float *dout,
                      const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal,
                      int threads) {
    return attention_bwd(dq, dk, dv, q, k, v, o, lse, dout, alibi, B, T, Hq, Hkv, D, causal,
                         threads, RT_F32);
}
