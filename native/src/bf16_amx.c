/* AMX-BF16 path: the 32x32 bf16 GEMM micro-kernel on tiles (TDPBF16PS), 2 A tiles x 2 B
 * tiles into 4 fp32 C tiles, and the per-thread tile configuration. Compiled for amx-tile and
 * amx-bf16 via a file-wide target pragma; dispatch.c selects it only when the CPU has AMX
 * and the kernel granted this process the tile data state (Linux arch_prctl). */
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw")
#include <immintrin.h>
#include "internal.h"
#include "bf16_simd.h"

#define MR 32
#define NR 32
#define TK 32               /* K per tile step: 16 rows of 32-bit pairs in a B tile */

/* the LDTILECFG memory operand: palette 1, then bytes per row and rows of tiles 0..15 */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* tiles 0-3: C (16 x 16 fp32); 4,5: A (16 rows x 32 bf16); 6,7: B (16 pair rows x 16 cols);
 * every one is 16 rows of 64 bytes. A static object: GCC 12 drops stores into a local config
 * before LDTILECFG (it does not see the instruction read them), which then faults. */
static const tile_config CONFIG = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16},
};
static int begin_amx(void) {
    _tile_loadconfig(&CONFIG);
    return RT_OK;
}
static void end_amx(void) { _tile_release(); }

/* a: [MR][kcp] bf16 rows; b: [kcp/2][NR] pairs; kcp a multiple of TK. C tile (r, t) covers
 * rows 16r.. and columns 16t.. of the 32x32 block. */
static void ukr_amx(int kcp, const rt_bf16 *a, const rt_bf16 *b, float *c, int ldc, int first) {
    size_t lda = (size_t)kcp * 2, ldcb = (size_t)ldc * 4;
    if (first) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
    else {
        _tile_loadd(0, c, ldcb); _tile_loadd(1, c + 16, ldcb);
        _tile_loadd(2, c + 16 * ldc, ldcb); _tile_loadd(3, c + 16 * ldc + 16, ldcb);
    }
    for (int k = 0; k < kcp; k += TK) {
        const rt_bf16 *bk = b + (size_t)k * NR;          /* pair row k/2, NR pairs of 2 */
        _tile_loadd(4, a + k, lda);
        _tile_loadd(6, bk, NR * 4);
        _tile_loadd(7, bk + 32, NR * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a + 16 * (size_t)kcp + k, lda);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, ldcb); _tile_stored(1, c + 16, ldcb);
    _tile_stored(2, c + 16 * ldc, ldcb); _tile_stored(3, c + 16 * ldc + 16, ldcb);
}

/* the TN (weight gradient) A panel: rows k, k+1 of a [K, M] make 16 pair words per 16 rows of
 * op(a); a word transpose turns them into 16 rows of 32 bf16 of the [MR][kc] panel */
static void pack_a_trans_amx(rt_bf16 *dst, const rt_bf16 *a, size_t lda, int kc) {
    for (int k = 0; k < kc; k += TK)
        for (int h = 0; h < MR; h += 16) {
            __m512i w[16];
            for (int p = 0; p < 16; p++) {
                const rt_bf16 *r0 = a + (size_t)(k + 2 * p) * lda + h;
                __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)r0));
                __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + lda)));
                w[p] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
            }
            transpose_16x16_epi32(w);
            for (int r = 0; r < 16; r++) _mm512_storeu_si512(dst + (size_t)(h + r) * kc + k, w[r]);
        }
}

const rt_bf16_gemm rt_bf16_gemm_amx = {
    "amx", MR, NR, TK, 512, 1, begin_amx, end_amx, pack_a_trans_amx, rt_bf16_pack_b_avx512,
    ukr_amx,
};
