/* bf16 GEMM (gemm_fwd_bf16): on the amx and avx512_bf16 paths a blocked GEMM over the path's
 * bf16 micro-kernel (bf16_amx.c, bf16_avx512.c); elsewhere the fp32 GEMM of gemm.c, widening
 * bf16 to fp32 as it packs. Per column block the threads pack op(b) for the whole K into
 * pair-interleaved strips, then take MC row blocks from a shared counter, pack A chunk by
 * chunk and accumulate an fp32 C tile, which is finished (bias, +=, cast) into `out`.
 * NOTE [bf16 scratch]: this is a CPU-training kernel, not a model of the device: it packs
 * straight from the arrays into its own cache-sized buffers (no DMA, no GSM/AM budget). */
#include <omp.h>
#include <stdlib.h>
#include "gemm.h"

#define MC_PANELS 4                /* MC = 4 micro-panels of MR rows */
#define B_PANEL_BYTES (8u << 20)   /* packed op(b) per column block: one block for a layer's
                                      * K x N up to 4M elements, so A is packed once */

typedef struct {
    int mr, nr, mc;            /* micro-tile; rows per block (MC_PANELS micro-panels) */
    int kp, kc;                /* K padded to the kernel's kstep; K chunk per packed A block */
    int nc;                    /* columns per block, an NR multiple: C tile row stride too */
    size_t b_elems, a_elems, c_floats;   /* packed B (shared), packed A and C tile (per thread) */
} plan_bf16;

static void *workspace;            /* grown on demand; calls must not overlap (as scratch) */
static size_t workspace_bytes;

static void make_plan(plan_bf16 *p, const rt_bf16_gemm *P, const rt_gemm_args *g, int threads) {
    /* threads share the row blocks: fewer rows per block when M is short, so each gets one */
    int rows_per_thread = (int)rt_round_up((g->M + threads - 1) / threads, P->mr);
    p->mr = P->mr; p->nr = P->nr; p->mc = rt_min(MC_PANELS * P->mr, rows_per_thread);
    p->kp = (int)rt_round_up(g->K, P->kstep);
    p->kc = rt_min(P->kc, p->kp);
    size_t strips = B_PANEL_BYTES / (2 * (size_t)p->kp * p->nr), nc_max = (strips ? strips : 1) * p->nr;
    int njc = (int)((g->N + nc_max - 1) / nc_max);
    p->nc = (int)rt_round_up((g->N + njc - 1) / njc, p->nr);
    p->b_elems = (size_t)p->kp * p->nc;
    p->a_elems = (size_t)p->mc * p->kc;
    p->c_floats = (size_t)p->mc * p->nc;
}

static size_t thread_bytes(const plan_bf16 *p) {
    return rt_round_up(p->a_elems * 2, RT_ALIGN) + rt_round_up(p->c_floats * 4, RT_ALIGN);
}

static char *get_workspace(size_t bytes) {
    if (bytes > workspace_bytes) {
        free(workspace);
        workspace = aligned_alloc(RT_ALIGN, rt_round_up(bytes, RT_ALIGN));
        workspace_bytes = workspace ? bytes : 0;
    }
    return workspace;
}

/* strip of NR columns from j0, whole padded K: [kp/2][NR] words (b[2p][j], b[2p+1][j]),
 * i.e. element (k, j) at bf16 index (k/2)*2NR + 2j + k%2; zero past the matrix */
static void pack_b_strip(rt_bf16 *dst, const rt_gemm_args *g, const plan_bf16 *p,
                         const rt_bf16_gemm *P, int j0) {
    int nr = p->nr, w = rt_min(nr, g->N - j0), trans = g->flags & RT_TRANS_B, k_first = 0;
    const rt_bf16 *b = g->b;
    if (w < nr || p->kp > g->K) memset(dst, 0, (size_t)p->kp * nr * 2);
    if (w == nr && P->pack_b) {                    /* SIMD for the whole pairs, loop for the rest */
        P->pack_b(dst, b + (trans ? (size_t)j0 * g->ldb : (size_t)j0), (size_t)g->ldb, trans, g->K / 2);
        k_first = g->K & ~1;
    }
    if (trans)                                     /* b [N, K]: column j is row j */
        for (int c = 0; c < w; c++) {
            const rt_bf16 *src = b + (size_t)(j0 + c) * g->ldb;
            for (int k = k_first; k < g->K; k++) dst[(size_t)(k >> 1) * 2 * nr + 2 * c + (k & 1)] = src[k];
        }
    else
        for (int k = k_first; k < g->K; k++) {
            const rt_bf16 *src = b + (size_t)k * g->ldb + j0;
            rt_bf16 *d = dst + (size_t)(k >> 1) * 2 * nr + (k & 1);
            for (int c = 0; c < w; c++) d[2 * c] = src[c];
        }
}

/* rows [i0, i0+MR) x K chunk [k0, k0+kc) of op(a) as the path's A micro-panel: [MR][kc] rows
 * (element (i, k) at i*kc + k) or [kc/2][MR] pairs (at (k/2)*2MR + 2i + k%2); zero padded */
static void pack_a_panel(rt_bf16 *dst, const rt_gemm_args *g, const plan_bf16 *p,
                         const rt_bf16_gemm *P, int i0, int k0, int kc) {
    int mr = p->mr, rows = rt_max(0, rt_min(mr, g->M - i0)), ks = rt_max(0, rt_min(kc, g->K - k0));
    int rows_layout = P->a_rows;
    const rt_bf16 *a = g->a;
    if ((g->flags & RT_TRANS_A) && P->pack_a_trans && rows == mr && ks == kc) {
        P->pack_a_trans(dst, a + (size_t)k0 * g->lda + i0, (size_t)g->lda, kc);
        return;
    }
    if (rows < mr || ks < kc) memset(dst, 0, (size_t)mr * kc * 2);
    size_t rs = rows_layout ? (size_t)kc : 2, kpair = rows_layout ? 2 : (size_t)2 * mr;
    if (rows_layout && !(g->flags & RT_TRANS_A)) {
        for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * kc, a + (size_t)(i0 + r) * g->lda + k0, (size_t)ks * 2);
    } else if (g->flags & RT_TRANS_A) {            /* a [K, M]: row k holds the MR values */
        for (int k = 0; k < ks; k++) {
            const rt_bf16 *src = a + (size_t)(k0 + k) * g->lda + i0;
            rt_bf16 *d = dst + (size_t)(k >> 1) * kpair + (k & 1);
            for (int r = 0; r < rows; r++) d[r * rs] = src[r];
        }
    } else {                                       /* pairs from rows of a [M, K] */
        for (int r = 0; r < rows; r++) {
            const rt_bf16 *src = a + (size_t)(i0 + r) * g->lda + k0;
            for (int k = 0; k < ks; k++) dst[(size_t)(k >> 1) * kpair + 2 * r + (k & 1)] = src[k];
        }
    }
}

/* finished C tile (mc x nc fp32) -> out rows i0.., columns j0..: + bias, += old C, cast */
static void put_c(const rt_gemm_args *g, const rt_simd *S, float *ctile, int ldct, int i0, int mc,
                  int j0, int nc) {
    for (int r = 0; r < mc; r++) {
        float *cr = ctile + (size_t)r * ldct;
        size_t off = (size_t)(i0 + r) * g->ldc + j0;
        if (g->bias) S->axpy(cr, g->bias + j0, nc, 1.0f);
        if (g->flags & RT_ACCUMULATE) S->axpy((float *)g->out + off, cr, nc, 1.0f);
        else rt_store_f32(S, g->out, off, cr, (size_t)nc, g->out_dt);
    }
}

/* one MC row block against the packed column block: K chunk by chunk, every strip */
static void run_block(const rt_gemm_args *g, const rt_bf16_gemm *P, const plan_bf16 *p,
                      const rt_bf16 *bpack, rt_bf16 *apack, float *ctile, int i0, int nc) {
    int mc = rt_min(p->mc, g->M - i0), mcp = (int)rt_round_up(mc, p->mr);
    int strips = (nc + p->nr - 1) / p->nr;
    for (int k0 = 0; k0 < p->kp; k0 += p->kc) {
        int kc = rt_min(p->kc, p->kp - k0);
        for (int i = 0; i < mcp; i += p->mr)
            pack_a_panel(apack + (size_t)i * kc, g, p, P, i0 + i, k0, kc);
        for (int s = 0; s < strips; s++) {
            const rt_bf16 *bs = bpack + (size_t)s * p->kp * p->nr + (size_t)k0 * p->nr;
            for (int i = 0; i < mcp; i += p->mr)
                P->ukr(kc, apack + (size_t)i * kc, bs, ctile + (size_t)i * p->nc + s * p->nr, p->nc, k0 == 0);
        }
    }
}

static int gemm_bf16_tiled(const rt_gemm_args *g_in, const rt_bf16_gemm *P, int threads) {
    rt_gemm_args g = *g_in;
    if (rt_gemm_prepare(&g, threads)) return RT_EINVAL;
    const rt_simd *S = rt_simd_get();
    plan_bf16 p;
    make_plan(&p, P, &g, threads);
    size_t b_bytes = rt_round_up(p.b_elems * 2, RT_ALIGN), t_bytes = thread_bytes(&p);
    char *ws = get_workspace(b_bytes + t_bytes * threads);
    if (!ws) return RT_ENOMEM;
    rt_bf16 *bpack = (rt_bf16 *)ws;
    int fail = 0, next_block = 0, nblocks = (g.M + p.mc - 1) / p.mc;
    #pragma omp parallel num_threads(threads)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        rt_bf16 *apack = (rt_bf16 *)(ws + b_bytes + t_bytes * tid);
        float *ctile = (float *)((char *)apack + rt_round_up(p.a_elems * 2, RT_ALIGN));
        if (P->begin() != RT_OK) __atomic_store_n(&fail, 1, __ATOMIC_RELAXED);
        #pragma omp barrier
        for (int jc0 = 0; jc0 < g.N && !fail; jc0 += p.nc) {
            int nc = rt_min(p.nc, g.N - jc0), strips = (nc + p.nr - 1) / p.nr;
            for (int s = tid; s < strips; s += nt)
                pack_b_strip(bpack + (size_t)s * p.kp * p.nr, &g, &p, P, jc0 + s * p.nr);
            if (tid == 0) next_block = 0;     /* previous block's users passed the barrier */
            #pragma omp barrier
            for (int ib; (ib = __atomic_fetch_add(&next_block, 1, __ATOMIC_RELAXED)) < nblocks;) {
                int i0 = ib * p.mc;
                run_block(&g, P, &p, bpack, apack, ctile, i0, nc);
                put_c(&g, S, ctile, p.nc, i0, rt_min(p.mc, g.M - i0), jc0, nc);
            }
            #pragma omp barrier
        }
        P->end();
    }
    return fail ? RT_EISA : RT_OK;
}

int gemm_fwd_bf16(void *out, rt_dtype out_dtype, const rt_bf16 *a, const rt_bf16 *b,
                  const float *bias, int M, int N, int K, int flags, int threads) {
    rt_gemm_args g = {out, out_dtype, a, RT_BF16, b, RT_BF16, bias, M, N, K, flags, 0, 0, 0};
    const rt_bf16_gemm *P = rt_bf16_gemm_get();
    return P ? gemm_bf16_tiled(&g, P, threads) : rt_gemm(&g, threads);
}
