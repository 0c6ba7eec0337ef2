/* Blocked GEMM with the MT-3000 structure: per column block (NC) the B panel is fetched by DMA
 * into GSM and packed by all cores; each core then streams its A blocks (MC x KC) into AM,
 * double buffered, runs the register micro-kernel into an FP32 C tile kept in AM, and puts
 * the finished tile back to DDR (cast to FP16, or added to an FP32 buffer when accumulating).
 * NOTE [gemm dma bytes]: DDR->GSM = K*N*eb, DDR->AM = M*K*ea*n_jc (+ M*N*4 if accumulating),
 * AM->DDR = M*N*eo, with n_jc = ceil(N / NC) from gemm_plan. tests/native checks this. */
#include <omp.h>
#include <stdlib.h>
#include "gemm.h"

#define MC_BLOCKS 8        /* MC = 8 micro-panels of MR rows */
#define KC_MAX 256         /* B micro-panel KC x NR fp32 stays in L1 */

typedef struct { int mr, nr, mc, kc, nc, njc, npc; } plan_t;

/* tile sizes for one (MC blocks, KC cap) choice; RT_ENOMEM if they do not fit GSM/AM */
static int try_plan(plan_t *p, const rt_simd *S, const rt_gemm_args *g, int mc_blocks, int kc_max) {
    size_t ea = rt_esize(g->a_dt), eb = rt_esize(g->b_dt);
    p->mr = S->mr; p->nr = S->nr; p->mc = mc_blocks * S->mr;
    p->npc = (g->K + kc_max - 1) / kc_max;
    p->kc = (int)rt_round_up((g->K + p->npc - 1) / p->npc, 4);
    p->npc = (g->K + p->kc - 1) / p->kc;
    size_t a_bytes = (size_t)p->mc * p->kc * (2 * ea + 8) + 4 * RT_ALIGN;
    if (a_bytes >= rt_am_bytes() || (size_t)p->nr * p->kc * 4 > rt_am_bytes()) return RT_ENOMEM;   /* + pack_b's tmp */
    size_t nc_am = (rt_am_bytes() - a_bytes) / ((size_t)p->mc * 4);
    size_t nc_gsm = rt_gsm_bytes() / (4 * rt_round_up(g->K, 4) + (size_t)p->kc * 2 * eb + 64);
    size_t nc_max = (nc_am < nc_gsm ? nc_am : nc_gsm) / p->nr * p->nr;
    if (nc_max < (size_t)p->nr) return RT_ENOMEM;
    p->njc = (int)((g->N + nc_max - 1) / nc_max);
    p->nc = (int)rt_round_up((g->N + p->njc - 1) / p->njc, p->nr);
    return RT_OK;
}

/* largest tiles that fit the profile's scratch: shrink KC first, then MC */
static int make_plan(plan_t *p, const rt_simd *S, const rt_gemm_args *g) {
    for (int mcb = MC_BLOCKS; mcb >= 1; mcb /= 2)
        for (int kc = KC_MAX; kc >= 32; kc /= 2)
            if (try_plan(p, S, g, mcb, kc) == RT_OK) return RT_OK;
    return RT_ENOMEM;
}

int rt_gemm_plan(int plan[4], int M, int N, int K, rt_dtype in_dtype, int flags) {
    rt_gemm_args g = {0};
    g.M = M; g.N = N; g.K = K; g.a_dt = g.b_dt = in_dtype; g.flags = flags;
    plan_t p;
    int st = make_plan(&p, rt_simd_get(), &g);
    if (st) return st;
    plan[0] = p.mc; plan[1] = p.kc; plan[2] = p.nc; plan[3] = p.mr * 65536 + p.nr;
    return RT_OK;
}

/* ---- B side: panel [k0, k0+kc) x [j0, j1) of op(b) into GSM, packed as kc x NR strips ---- */
static void fetch_b(char *raw, const rt_gemm_args *g, int k0, int kc, int j0, int j1,
                    rt_dma_handle *h) {
    size_t eb = rt_esize(g->b_dt);
    const char *b = (const char *)g->b;
    if (g->flags & RT_TRANS_B)   /* b stored [N,K]: rows j, kc elements each */
        dma_get_2d(raw, kc * eb, b + ((size_t)j0 * g->ldb + k0) * eb, g->ldb * eb, j1 - j0, kc * eb, RT_GSM, h);
    else                         /* b stored [K,N]: rows k, (j1-j0) elements each */
        dma_get_2d(raw, (j1 - j0) * eb, b + ((size_t)k0 * g->ldb + j0) * eb, g->ldb * eb, kc, (j1 - j0) * eb, RT_GSM, h);
}

/* pack the raw chunk (kc x cols of op(b), still in the input dtype, in GSM) into kc x NR fp32
 * strips, widening on the way; trans: raw is [cols][kc], each strip goes through tmp (AM) */
static void pack_b(float *dst, const char *raw, float *tmp, const rt_simd *S, const rt_gemm_args *g,
                   int kc, int cols, int nr) {
    size_t eb = rt_esize(g->b_dt);
    int trans = g->flags & RT_TRANS_B;
    for (int p0 = 0; p0 < cols; p0 += nr, dst += (size_t)kc * nr) {
        int w = rt_min(nr, cols - p0);
        if (trans) {
            rt_load_f32(S, tmp, raw + (size_t)p0 * kc * eb, 0, (size_t)w * kc, g->b_dt);
            for (int k = 0; k < kc; k++) {
                float *d = dst + (size_t)k * nr;
                for (int c = 0; c < w; c++) d[c] = tmp[(size_t)c * kc + k];
                for (int c = w; c < nr; c++) d[c] = 0.0f;
            }
        } else {
            for (int k = 0; k < kc; k++) {
                float *d = dst + (size_t)k * nr;
                rt_load_f32(S, d, raw + ((size_t)k * cols + p0) * eb, 0, (size_t)w, g->b_dt);
                for (int c = w; c < nr; c++) d[c] = 0.0f;
            }
        }
    }
}

/* this thread's share [j0, j1) of the NR strips of one column block, for every K chunk; the
 * fp32 panel for the whole K is the only fp32 copy in GSM (widening goes straight into it), so
 * GSM holds 4*K + 2*kc*eb bytes per column */
static void stage_b(float *bpack, char *gsm_raw, float *tmp, const rt_simd *S,
                    const rt_gemm_args *g, const plan_t *p, int jc0, int nc, int tid, int nt) {
    int nstrips = (nc + p->nr - 1) / p->nr, ncp = (int)rt_round_up(nc, p->nr);
    int s0 = nstrips * tid / nt, s1 = nstrips * (tid + 1) / nt;
    int j0 = s0 * p->nr, j1 = rt_min(s1 * p->nr, nc);
    if (j0 >= j1) return;
    size_t eb = rt_esize(g->b_dt), raw_sz = (size_t)p->kc * ncp * eb;
    char *raw[2] = {gsm_raw + (size_t)p->kc * j0 * eb, gsm_raw + raw_sz + (size_t)p->kc * j0 * eb};
    rt_dma_handle h[2];
    fetch_b(raw[0], g, 0, rt_min(p->kc, g->K), jc0 + j0, jc0 + j1, &h[0]);
    for (int pc = 0, k0 = 0; k0 < g->K; pc++, k0 += p->kc) {
        int kc = rt_min(p->kc, g->K - k0);
        if (k0 + kc < g->K)   /* double buffering: next chunk in flight while packing this one */
            fetch_b(raw[(pc + 1) & 1], g, k0 + kc, rt_min(p->kc, g->K - k0 - kc), jc0 + j0, jc0 + j1, &h[(pc + 1) & 1]);
        dma_wait(&h[pc & 1]);
        pack_b(bpack + (size_t)k0 * ncp + (size_t)kc * j0, raw[pc & 1], tmp, S, g, kc, j1 - j0, p->nr);
    }
}

/* ---- A side: block [i0, i0+mc) x [k0, k0+kc) of op(a) into AM, packed as MR x kc strips ---- */
static void fetch_a(char *raw, const rt_gemm_args *g, int i0, int mc, int k0, int kc,
                    rt_dma_handle *h) {
    size_t ea = rt_esize(g->a_dt);
    const char *a = (const char *)g->a;
    if (g->flags & RT_TRANS_A)   /* a stored [K,M] */
        dma_get_2d(raw, mc * ea, a + ((size_t)k0 * g->lda + i0) * ea, g->lda * ea, kc, mc * ea, RT_AM, h);
    else
        dma_get_2d(raw, kc * ea, a + ((size_t)i0 * g->lda + k0) * ea, g->lda * ea, mc, kc * ea, RT_AM, h);
}

static void pack_a(float *dst, const float *a32, int trans, int mc, int kc, int mr) {
    for (int r0 = 0; r0 < mc; r0 += mr, dst += (size_t)kc * mr) {
        int h = rt_min(mr, mc - r0);
        if (trans)          /* a32 is [kc][mc]: each k row gives MR contiguous values */
            for (int k = 0; k < kc; k++) memcpy(dst + (size_t)k * mr, a32 + (size_t)k * mc + r0, h * sizeof(float));
        else
            for (int r = 0; r < h; r++)
                for (int k = 0; k < kc; k++) dst[(size_t)k * mr + r] = a32[(size_t)(r0 + r) * kc + k];
        for (int r = h; r < mr; r++) for (int k = 0; k < kc; k++) dst[(size_t)k * mr + r] = 0.0f;
    }
}

static void compute_block(float *ctile, int ldct, const float *apack, const float *bpack_k,
                          const rt_simd *S, int mc, int nc, int kc, int first) {
    int ncp = (int)rt_round_up(nc, S->nr);
    for (int j = 0; j < ncp; j += S->nr) {
        const float *bs = bpack_k + (size_t)kc * j;
        for (int i = 0; i < mc; i += S->mr)
            S->gemm_ukr(kc, apack + (size_t)kc * i, bs, ctile + (size_t)i * ldct + j, ldct, first);
    }
}

/* finished C tile (mc x nc, f32 in AM) -> DDR: + bias, += old C if accumulating, cast */
static void put_c(const rt_gemm_args *g, const rt_simd *S, float *ctile, int ldct, float *stage,
                  size_t stage_floats, int i0, int mc, int j0, int nc) {
    size_t eo = rt_esize(g->out_dt);
    int slab = rt_max(1, (int)(stage_floats / (size_t)nc));
    char *out = (char *)g->out;
    for (int r0 = 0; r0 < mc; r0 += slab) {
        int rows = rt_min(slab, mc - r0);
        rt_dma_handle h;
        char *dst = out + ((size_t)(i0 + r0) * g->ldc + j0) * eo;
        if (g->flags & RT_ACCUMULATE) {
            dma_get_2d(stage, nc * 4, dst, g->ldc * 4, rows, nc * 4, RT_AM, &h);
            dma_wait(&h);
        }
        for (int r = 0; r < rows; r++) {
            float *cr = ctile + (size_t)(r0 + r) * ldct, *sr = stage + (size_t)r * nc;
            if (g->bias) S->axpy(cr, g->bias + j0, nc, 1.0f);
            if (g->flags & RT_ACCUMULATE) S->axpy(sr, cr, nc, 1.0f);
            else rt_store_f32(S, stage, (size_t)r * nc, cr, nc, g->out_dt);
        }
        dma_put_2d(dst, g->ldc * eo, stage, nc * eo, rows, nc * eo, RT_AM, &h);
        dma_wait(&h);
    }
}

/* MC row blocks of one column block are handed out dynamically (a shared counter), so a
 * core slowed by other work takes fewer blocks; the next block is claimed one step early so
 * its first A tile can be in flight while the current block computes */
static void run_rows(const rt_gemm_args *g, const rt_simd *S, const plan_t *p, char *am,
                     const float *bpack, int *next_block, int jc0, int nc) {
    size_t ea = rt_esize(g->a_dt), ablk = (size_t)p->mc * p->kc;
    int ldct = (int)rt_round_up(nc, p->nr), nblocks = (g->M + p->mc - 1) / p->mc;
    char *raw[2] = {am, am + rt_round_up(ablk * ea, RT_ALIGN)};
    float *a32 = (float *)(raw[1] + rt_round_up(ablk * ea, RT_ALIGN));
    float *apack = a32 + ablk, *ctile = apack + ablk;
    int trans = g->flags & RT_TRANS_A, slot = 0;
    int ib = __atomic_fetch_add(next_block, 1, __ATOMIC_RELAXED);
    rt_dma_handle h[2];
    if (ib < nblocks) fetch_a(raw[0], g, ib * p->mc, rt_min(p->mc, g->M - ib * p->mc), 0, rt_min(p->kc, g->K), &h[0]);
    while (ib < nblocks) {
        int i0 = ib * p->mc, mc = rt_min(p->mc, g->M - i0), nb = ib;
        for (int pc = 0; pc < p->npc; pc++, slot ^= 1) {
            int k0 = pc * p->kc, kc = rt_min(p->kc, g->K - k0), nk0 = 0;
            if (pc + 1 < p->npc) nk0 = k0 + kc;                      /* next K chunk, same rows */
            else nb = __atomic_fetch_add(next_block, 1, __ATOMIC_RELAXED);
            if (nb < nblocks)
                fetch_a(raw[slot ^ 1], g, nb * p->mc, rt_min(p->mc, g->M - nb * p->mc), nk0,
                        rt_min(p->kc, g->K - nk0), &h[slot ^ 1]);
            dma_wait(&h[slot]);
            rt_load_f32(S, a32, raw[slot], 0, (size_t)mc * kc, g->a_dt);
            pack_a(apack, a32, trans, mc, kc, p->mr);
            compute_block(ctile, ldct, apack, bpack + (size_t)k0 * ldct, S, (int)rt_round_up(mc, p->mr), nc, kc, pc == 0);
        }
        put_c(g, S, ctile, ldct, a32, ablk, i0, mc, jc0, nc);
        ib = nb;
    }
}

int rt_gemm(const rt_gemm_args *g_in, int threads) {
    rt_gemm_args g = *g_in;
    if (rt_gemm_prepare(&g, threads)) return RT_EINVAL;
    const rt_simd *S = rt_simd_get();
    plan_t p;
    int st = make_plan(&p, S, &g);
    if (st) return st;
    char *gsm = rt_gsm();
    if (!gsm) return RT_ENOMEM;
    int ncp = (int)rt_round_up(p.nc, p.nr);
    float *bpack = (float *)gsm;
    char *braw = gsm + rt_round_up((size_t)4 * rt_round_up(g.K, 4) * ncp, RT_ALIGN);
    int fail = 0, next_block = 0;
    #pragma omp parallel num_threads(threads)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        char *am = rt_am(tid);
        if (!am) { __atomic_store_n(&fail, 1, __ATOMIC_RELAXED); }
        #pragma omp barrier
        for (int jc0 = 0; jc0 < g.N && !fail; jc0 += p.nc) {
            int nc = rt_min(p.nc, g.N - jc0);
            stage_b(bpack, braw, (float *)am, S, &g, &p, jc0, nc, tid, nt);   /* AM is free here */
            if (tid == 0) next_block = 0;     /* previous block's users passed the barrier */
            #pragma omp barrier
            run_rows(&g, S, &p, am, bpack, &next_block, jc0, nc);
            #pragma omp barrier
        }
    }
    return fail ? RT_ENOMEM : RT_OK;
}

int gemm_fwd_f16(void *out, rt_dtype out_dtype, const rt_half *a, const rt_half *b,
                 const float *bias, int M, int N, int K, int flags, int threads) {
    rt_gemm_args g = {out, out_dtype, a, RT_F16, b, RT_F16, bias, M, N, K, flags, 0, 0, 0};
    return rt_gemm(&g, threads);
}
int gemm_fwd_f32(void *out, rt_dtype out_dtype, const float *a, const float *b,
                 const float *bias, int M, int N, int K, int flags, int threads) {
    rt_gemm_args g = {out, out_dtype, a, RT_F32, b, RT_F32, bias, M, N, K, flags, 0, 0, 0};
    return rt_gemm(&g, threads);
}
