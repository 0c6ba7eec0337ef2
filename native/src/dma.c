/* The DMA layer and the on-chip scratch arenas. On MT-3000, dma_get_2d/dma_put_2d move
 * strided rows between DDR and GSM (per cluster) or AM (per core) while the cores compute;
 * on x86 the transfer is a copy into a fixed scratch buffer performed when it is issued, and
 * dma_wait only reports its status. Byte counters per level let tests check the tiling. */
#include <stdlib.h>
#include "internal.h"

static size_t gsm_size = 6u << 20;            /* MT-3000: GSM 6 MB per cluster */
static size_t am_size = 768u << 10;           /* MT-3000: AM 768 KB per DSP core */
static void *gsm_buf;
static void *am_buf[RT_MAX_THREADS];
static uint64_t counters[6];                  /* see rt_dma_stats */

int rt_scratch_config(size_t gsm_bytes, size_t am_bytes) {
    if (gsm_bytes < (64u << 10) || am_bytes < (64u << 10)) return RT_EINVAL;
    free(gsm_buf);
    gsm_buf = NULL;
    for (int t = 0; t < RT_MAX_THREADS; t++) { free(am_buf[t]); am_buf[t] = NULL; }
    gsm_size = gsm_bytes;
    am_size = am_bytes;
    return RT_OK;
}
size_t rt_gsm_bytes(void) { return gsm_size; }
size_t rt_am_bytes(void) { return am_size; }

/* Allocated on first use (single-threaded callers allocate before a parallel region). */
void *rt_gsm(void) {
    if (!gsm_buf) gsm_buf = aligned_alloc(RT_ALIGN, rt_round_up(gsm_size, RT_ALIGN));
    return gsm_buf;
}
void *rt_am(int tid) {
    if (tid < 0 || tid >= RT_MAX_THREADS) return NULL;
    if (!am_buf[tid]) am_buf[tid] = aligned_alloc(RT_ALIGN, rt_round_up(am_size, RT_ALIGN));
    return am_buf[tid];
}

static void copy_2d(char *dst, size_t dst_stride, const char *src, size_t src_stride,
                    size_t rows, size_t row_bytes) {
    if (dst_stride == row_bytes && src_stride == row_bytes) {
        memcpy(dst, src, rows * row_bytes);
        return;
    }
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * dst_stride, src + r * src_stride, row_bytes);
}

int dma_get_2d(void *scratch, size_t scratch_stride, const void *ddr, size_t ddr_stride,
               size_t rows, size_t row_bytes, rt_level level, rt_dma_handle *h) {
    if (!scratch || !ddr || !h || scratch_stride < row_bytes) return RT_EINVAL;
    copy_2d(scratch, scratch_stride, ddr, ddr_stride, rows, row_bytes);
    __atomic_fetch_add(&counters[level == RT_GSM ? 0 : 1], rows * row_bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&counters[4], 1, __ATOMIC_RELAXED);
    h->pending = 1;
    h->status = RT_OK;
    return RT_OK;
}

int dma_put_2d(void *ddr, size_t ddr_stride, const void *scratch, size_t scratch_stride,
               size_t rows, size_t row_bytes, rt_level level, rt_dma_handle *h) {
    if (!scratch || !ddr || !h || ddr_stride < row_bytes) return RT_EINVAL;
    copy_2d(ddr, ddr_stride, scratch, scratch_stride, rows, row_bytes);
    __atomic_fetch_add(&counters[level == RT_GSM ? 2 : 3], rows * row_bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&counters[5], 1, __ATOMIC_RELAXED);
    h->pending = 1;
    h->status = RT_OK;
    return RT_OK;
}

int dma_wait(rt_dma_handle *h) {
    if (!h) return RT_EINVAL;
    h->pending = 0;
    return h->status;
}

void rt_dma_stats(uint64_t out[6]) {
    for (int i = 0; i < 6; i++) out[i] = __atomic_load_n(&counters[i], __ATOMIC_RELAXED);
}
void rt_dma_reset(void) {
    for (int i = 0; i < 6; i++) __atomic_store_n(&counters[i], 0, __ATOMIC_RELAXED);
}
