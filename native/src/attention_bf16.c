/* bf16 causal attention on the AMX bf16 micro-kernel (the rt_bf16_gemm of gemm_bf16.c,
 * NOTE [bf16 attention path]): the five tile products run on bf16 operands with fp32
 * accumulation, softmax statistics (m, l, lse), scores, dP and dS stay fp32. Same tasks,
 * masking, ALiBi and GQA as attention_fwd.c / attention_bwd.c, with 64 x 64 tiles.
 * NOTE [bf16 attention rounding]: q, k, v, dO are bf16 inputs, exact in the products; the
 * only extra roundings against the fp32-tile kernels are P (for P V and P^T dO) and dS (for
 * dS K and dS^T Q) to bf16, as in FlashAttention's bf16 kernels. The scale 1/sqrt(D) is
 * applied to the fp32 scores (q is not pre-scaled, so no rounding of scale * q).
 * NOTE [bf16 scratch] (gemm_bf16.c) applies: tiles live in per-thread heap buffers, no DMA. */
#include <omp.h>
#include <stdlib.h>
#include "attention.h"

#define TILE 64                       /* query rows and key columns per tile */

typedef struct {
    const rt_bf16_gemm *P;
    int dk;                           /* D padded to 32: contraction over D, columns of O */
} bf16_plan;

/* NOTE [bf16 attention path]: only AMX's tiles pay here. VDPBF16PS issues once per cycle on
 * Sapphire Rapids, the rate of its two fp32 FMA ports, so on the avx512_bf16 path bf16 tiles
 * only add packing and the P/dS roundings: measured 64 vs 74 GFLOP/s for the widening fp32
 * tiles (fwd+bwd, B=4 T=1024 H=8 D=64, 1 thread). The packing below assumes the AMX layout:
 * A panels of [MR][kp] rows, MR dividing TILE, and a SIMD packer for transposed A. */
const rt_bf16_gemm *att_bf16_tiles(void) {
    const rt_bf16_gemm *P = rt_bf16_gemm_get();
    return P && P->a_rows && P->pack_a_trans && TILE % P->mr == 0 && TILE % P->nr == 0 &&
           32 % P->kstep == 0 ? P : NULL;
}

/* ---- packing into the micro-kernel's layouts (gemm_bf16.c: A panels, pair-interleaved B) ---- */

/* A = op(src), TILE rows x kp, as TILE/MR panels of [MR][kp] rows (the AMX layout): trans 0:
 * src rows [TILE][ld]; trans 1: src stored [kp][ld] (A row i is column i of src) */
static void pack_a(const bf16_plan *pl, rt_bf16 *dst, const rt_bf16 *src, int ld, int kp, int trans) {
    int mr = pl->P->mr;
    for (int i0 = 0; i0 < TILE; i0 += mr) {
        rt_bf16 *d = dst + (size_t)i0 * kp;
        if (trans) pl->P->pack_a_trans(d, src + i0, (size_t)ld, kp);
        else for (int r = 0; r < mr; r++) memcpy(d + (size_t)r * kp, src + (size_t)(i0 + r) * ld, (size_t)kp * 2);
    }
}

/* B = op(src), kp x n (n a multiple of 32 = NR): trans 0: src rows [kp][ld]; trans 1: src
 * stored [n][ld] (column j of B is row j). Strips of NR columns, [kp/2][NR] pairs each. */
static void pack_b(const bf16_plan *pl, rt_bf16 *dst, const rt_bf16 *src, int ld, int kp, int n,
                   int trans) {
    int nr = pl->P->nr;
    for (int j0 = 0; j0 < n; j0 += nr)
        pl->P->pack_b(dst + (size_t)j0 * kp, src + (trans ? (size_t)j0 * ld : (size_t)j0), (size_t)ld,
                      trans, kp / 2);
}

/* c[TILE, n] (row stride ldc) = (first ? 0 : c) + A (packed, kp) @ B (packed, n columns) */
static void mm(const bf16_plan *pl, float *c, int ldc, const rt_bf16 *a, const rt_bf16 *b, int kp,
               int n, int first) {
    const rt_bf16_gemm *P = pl->P;
    for (int i0 = 0; i0 < TILE; i0 += P->mr)
        for (int j0 = 0; j0 < n; j0 += P->nr)
            P->ukr(kp, a + (size_t)i0 * kp, b + (size_t)j0 * kp, c + (size_t)i0 * ldc + j0, ldc, first);
}

/* rows [t0, t0+TILE) of head `head` of batch b into dst [TILE][dk] bf16, zero outside T x D */
static void load_tile(rt_bf16 *dst, const rt_bf16 *x, const att_shape *s, int dk, int b, int head,
                      int heads, int t0) {
    int valid = rt_max(0, rt_min(TILE, s->T - t0));
    for (int r = 0; r < TILE; r++) {
        rt_bf16 *d = dst + (size_t)r * dk;
        if (r < valid) {
            memcpy(d, x + (((size_t)b * s->T + t0 + r) * heads + head) * s->D, (size_t)s->D * 2);
            memset(d + s->D, 0, (size_t)(dk - s->D) * 2);
        } else {
            memset(d, 0, (size_t)dk * 2);
        }
    }
}

/* src [rows][ld] f32 -> rows [t0, t0+rows) of head `head`, bf16 (round to nearest even) */
static void store_rows(rt_bf16 *x, const float *src, int ld, const att_shape *s, int b, int head,
                       int heads, int t0, int rows, const rt_simd *S) {
    for (int r = 0; r < rows; r++)
        S->f2bf(x + (((size_t)b * s->T + t0 + r) * heads + head) * s->D, src + (size_t)r * ld, s->D);
}

/* f32 [TILE][TILE] -> bf16 rows, rows >= rows_valid zero */
static void tile_to_bf16(rt_bf16 *dst, const float *src, int rows_valid, const rt_simd *S) {
    S->f2bf(dst, src, (size_t)rows_valid * TILE);
    memset(dst + (size_t)rows_valid * TILE, 0, (size_t)(TILE - rows_valid) * TILE * 2);
}

/* n per-thread buffers of sizes[i] bytes carved from one allocation into out[0..n): a tile
 * struct whose members are n pointers; returns the allocation to free, or NULL */
static char *carve_all(size_t *sizes, void **out, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += rt_round_up(sizes[i], RT_ALIGN);
    char *base = aligned_alloc(RT_ALIGN, total), *p = base;
    if (!base) return NULL;
    for (int i = 0; i < n; i++) { out[i] = p; p += rt_round_up(sizes[i], RT_ALIGN); }
    return base;
}

static void plan_for(bf16_plan *pl, att_shape *s) {
    pl->P = att_bf16_tiles();
    pl->dk = (int)rt_round_up(s->D, 32);
    s->br = s->bc = TILE;             /* att_bias_mask / att_zero_masked read the tile sizes */
}

/* ---- forward ---- */
typedef struct {
    rt_bf16 *tq, *tk, *tv, *qa, *kb, *vb, *pa, *p16;
    float *st, *o, *m, *l;
} fwd_buf;

static void fwd_task(rt_bf16 *o, float *lse, const rt_bf16 *q, const rt_bf16 *k, const rt_bf16 *v,
                     const att_shape *s, const bf16_plan *pl, fwd_buf *w, int b, int h, int i0,
                     const rt_simd *S) {
    int rq = rt_min(TILE, s->T - i0), kvh = h / (s->Hq / s->Hkv), jend = att_key_end(s, i0, rq);
    int dk = pl->dk;
    load_tile(w->tq, q, s, dk, b, h, s->Hq, i0);
    pack_a(pl, w->qa, w->tq, dk, dk, 0);
    memset(w->o, 0, (size_t)TILE * dk * 4);
    for (int r = 0; r < rq; r++) { w->m[r] = -INFINITY; w->l[r] = 0.0f; }
    for (int j0 = 0; j0 < jend; j0 += TILE) {
        load_tile(w->tk, k, s, dk, b, kvh, s->Hkv, j0);
        load_tile(w->tv, v, s, dk, b, kvh, s->Hkv, j0);
        pack_b(pl, w->kb, w->tk, dk, dk, TILE, 1);                 /* K^T: [dk, TILE] */
        pack_b(pl, w->vb, w->tv, dk, TILE, dk, 0);                 /* V: [TILE, dk] */
        mm(pl, w->st, TILE, w->qa, w->kb, dk, TILE, 1);            /* S = Q K^T */
        for (int r = 0; r < rq; r++) S->scale(w->st + (size_t)r * TILE, TILE, s->scale);
        int any = att_bias_mask(w->st, s, h, i0, rq, j0);
        for (int r = 0; r < rq; r++) {                             /* online softmax */
            float *sr = w->st + (size_t)r * TILE;
            float mx = fmaxf(w->m[r], S->row_max(sr, TILE));
            float sum = S->exp_sub_sum(sr, TILE, mx), alpha = expf(w->m[r] - mx);
            w->l[r] = w->l[r] * alpha + sum;
            if (alpha != 1.0f) S->scale(w->o + (size_t)r * dk, dk, alpha);
            w->m[r] = mx;
        }
        if (any) att_zero_masked(w->st, s, i0, rq, j0);
        tile_to_bf16(w->p16, w->st, rq, S);
        pack_a(pl, w->pa, w->p16, TILE, TILE, 0);
        mm(pl, w->o, dk, w->pa, w->vb, TILE, dk, 0);               /* O += P V */
    }
    float *lse_row = lse + ((size_t)b * s->Hq + h) * s->T + i0;
    for (int r = 0; r < rq; r++) {
        S->scale(w->o + (size_t)r * dk, dk, 1.0f / w->l[r]);
        lse_row[r] = w->m[r] + logf(w->l[r]);
    }
    store_rows(o, w->o, dk, s, b, h, s->Hq, i0, rq, S);
}

int att_bf16_fwd(rt_bf16 *o, float *lse, const rt_bf16 *q, const rt_bf16 *k, const rt_bf16 *v,
                 att_shape *s, int threads) {
    bf16_plan pl;
    plan_for(&pl, s);
    const rt_simd *S = rt_simd_get();
    int dk = pl.dk, nq = (s->T + TILE - 1) / TILE, ntask = s->B * s->Hq * nq, fail = RT_OK;
    size_t t16 = (size_t)TILE * dk * 2, sq16 = (size_t)TILE * TILE * 2;
    size_t sizes[12] = {t16, t16, t16, t16, t16, t16, sq16, sq16, 2 * sq16, 2 * t16, TILE * 4,
                        TILE * 4};                       /* in fwd_buf's member order */
    #pragma omp parallel num_threads(threads)
    {
        fwd_buf w;
        char *mem = carve_all(sizes, (void **)&w, 12);
        int st = mem ? pl.P->begin() : RT_ENOMEM;     /* RT_EISA: no tile permission */
        if (st) __atomic_store_n(&fail, st, __ATOMIC_RELAXED);
        #pragma omp barrier
        #pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < ntask; t++) {   /* longest (last) query blocks first */
            int qb = nq - 1 - t / (s->B * s->Hq), bh = t % (s->B * s->Hq);
            if (!fail) fwd_task(o, lse, q, k, v, s, &pl, &w, bh / s->Hq, bh % s->Hq, qb * TILE, S);
        }
        pl.P->end();
        free(mem);
    }
    return fail;
}

/* ---- backward ---- */
typedef struct {
    rt_bf16 *tk, *tv, *tq, *tdo, *kbt, *kb, *vbt, *qa, *qb, *doa, *dob, *p16, *pa;
    float *st, *dp, *dq, *dk, *dv;
} bwd_buf;

typedef struct {
    const rt_bf16 *q, *k, *v, *dout;
    const float *lse, *delta;         /* [B,Hq,T] */
    float *dq_ws;                     /* [B,Hq,T,dk] f32 */
    omp_lock_t *locks;                /* [B*Hq*nq] */
} bwd_io;

/* one (query block, key block) pair: P and dS from the packed K, V of the task */
static void bwd_pair(const bwd_io *io, const att_shape *s, const bf16_plan *pl, bwd_buf *w,
                     int b, int h, int i0, int j0, const rt_simd *S) {
    int rq = rt_min(TILE, s->T - i0), dk = pl->dk;
    size_t row0 = ((size_t)b * s->Hq + h) * s->T + i0;
    load_tile(w->tq, io->q, s, dk, b, h, s->Hq, i0);
    load_tile(w->tdo, io->dout, s, dk, b, h, s->Hq, i0);
    pack_a(pl, w->qa, w->tq, dk, dk, 0);
    pack_b(pl, w->qb, w->tq, dk, TILE, dk, 0);
    pack_a(pl, w->doa, w->tdo, dk, dk, 0);
    pack_b(pl, w->dob, w->tdo, dk, TILE, dk, 0);
    mm(pl, w->st, TILE, w->qa, w->kbt, dk, TILE, 1);                 /* S = Q K^T */
    for (int r = 0; r < rq; r++) S->scale(w->st + (size_t)r * TILE, TILE, s->scale);
    int any = att_bias_mask(w->st, s, h, i0, rq, j0);
    for (int r = 0; r < rq; r++) S->exp_sub_sum(w->st + (size_t)r * TILE, TILE, io->lse[row0 + r]);
    if (any) att_zero_masked(w->st, s, i0, rq, j0);
    tile_to_bf16(w->p16, w->st, rq, S);
    pack_a(pl, w->pa, w->p16, TILE, TILE, 1);
    mm(pl, w->dv, dk, w->pa, w->dob, TILE, dk, 0);                   /* dV += P^T dO */
    mm(pl, w->dp, TILE, w->doa, w->vbt, dk, TILE, 1);                /* dP = dO V^T */
    for (int r = 0; r < rq; r++) {
        float *p = w->st + (size_t)r * TILE, *dp = w->dp + (size_t)r * TILE, d = io->delta[row0 + r];
        for (int c = 0; c < TILE; c++) dp[c] = p[c] * (dp[c] - d);   /* dS */
    }
    tile_to_bf16(w->p16, w->dp, rq, S);
    pack_a(pl, w->pa, w->p16, TILE, TILE, 0);
    mm(pl, w->dq, dk, w->pa, w->kb, TILE, dk, 1);                    /* dQ~ = dS K */
    pack_a(pl, w->pa, w->p16, TILE, TILE, 1);
    mm(pl, w->dk, dk, w->pa, w->qb, TILE, dk, 0);                    /* dK~ += dS^T Q */
    omp_lock_t *lock = &io->locks[((size_t)b * s->Hq + h) * ((s->T + TILE - 1) / TILE) + i0 / TILE];
    float *dq = io->dq_ws + row0 * dk;
    omp_set_lock(lock);
    for (int r = 0; r < rq; r++) S->axpy(dq + (size_t)r * dk, w->dq + (size_t)r * dk, dk, s->scale);
    omp_unset_lock(lock);
}

static void bwd_task(const bwd_io *io, rt_bf16 *dk, rt_bf16 *dv, const att_shape *s,
                     const bf16_plan *pl, bwd_buf *w, int b, int kvh, int j0, const rt_simd *S) {
    int group = s->Hq / s->Hkv, rk = rt_min(TILE, s->T - j0), d = pl->dk;
    load_tile(w->tk, io->k, s, d, b, kvh, s->Hkv, j0);
    load_tile(w->tv, io->v, s, d, b, kvh, s->Hkv, j0);
    pack_b(pl, w->kbt, w->tk, d, d, TILE, 1);                        /* K^T: [d, TILE] */
    pack_b(pl, w->kb, w->tk, d, TILE, d, 0);                         /* K: [TILE, d] */
    pack_b(pl, w->vbt, w->tv, d, d, TILE, 1);                        /* V^T: [d, TILE] */
    memset(w->dk, 0, (size_t)TILE * d * 4);
    memset(w->dv, 0, (size_t)TILE * d * 4);
    int ib0 = s->causal ? j0 / TILE : 0, nq = (s->T + TILE - 1) / TILE;
    for (int g = 0; g < group; g++)
        for (int ib = ib0; ib < nq; ib++) bwd_pair(io, s, pl, w, b, kvh * group + g, ib * TILE, j0, S);
    for (int r = 0; r < rk; r++) S->scale(w->dk + (size_t)r * d, d, s->scale);  /* dK = scale dK~ */
    store_rows(dk, w->dk, d, s, b, kvh, s->Hkv, j0, rk, S);
    store_rows(dv, w->dv, d, s, b, kvh, s->Hkv, j0, rk, S);
}

int att_bf16_bwd(rt_bf16 *dq, rt_bf16 *dk, rt_bf16 *dv, const rt_bf16 *q, const rt_bf16 *k,
                 const rt_bf16 *v, const float *lse, const float *delta, const rt_bf16 *dout,
                 att_shape *s, int threads) {
    bf16_plan pl;
    plan_for(&pl, s);
    const rt_simd *S = rt_simd_get();
    int dkp = pl.dk, nq = (s->T + TILE - 1) / TILE, ntask = s->B * s->Hkv * nq, fail = RT_OK;
    size_t nlock = (size_t)s->B * s->Hq * nq, rows = (size_t)s->B * s->Hq * s->T;
    float *ws = calloc(rows * dkp, 4);
    omp_lock_t *locks = malloc(nlock * sizeof(omp_lock_t));
    if (!ws || !locks) { free(ws); free(locks); return RT_ENOMEM; }
    for (size_t i = 0; i < nlock; i++) omp_init_lock(&locks[i]);
    bwd_io io = {q, k, v, dout, lse, delta, ws, locks};
    size_t t16 = (size_t)TILE * dkp * 2, sq16 = (size_t)TILE * TILE * 2;
    size_t sizes[18] = {t16, t16, t16, t16, t16, t16, t16, t16, t16, t16, t16, sq16, sq16,
                        2 * sq16, 2 * sq16, 2 * t16, 2 * t16, 2 * t16};   /* bwd_buf's order */
    #pragma omp parallel num_threads(threads)
    {
        bwd_buf w;
        char *mem = carve_all(sizes, (void **)&w, 18);
        int st = mem ? pl.P->begin() : RT_ENOMEM;     /* RT_EISA: no tile permission */
        if (st) __atomic_store_n(&fail, st, __ATOMIC_RELAXED);
        #pragma omp barrier
        #pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < ntask; t++) {    /* causal: first key blocks see the most queries */
            int jb = t / (s->B * s->Hkv), bk = t % (s->B * s->Hkv);
            if (!fail) bwd_task(&io, dk, dv, s, &pl, &w, bk / s->Hkv, bk % s->Hkv, jb * TILE, S);
        }
        pl.P->end();
        free(mem);
    }
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t r = 0; r < rows; r++) {      /* dq[b,t,h,:] = ws[b,h,t,:D] rounded to bf16 */
        size_t b = r / ((size_t)s->T * s->Hq), t = r / s->Hq % s->T, h = r % s->Hq;
        S->f2bf(dq + r * s->D, ws + ((b * s->Hq + h) * s->T + t) * dkp, s->D);
    }
    for (size_t i = 0; i < nlock; i++) omp_destroy_lock(&locks[i]);
    free(ws); free(locks);
    return fail;
}
