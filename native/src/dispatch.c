/* Runtime ISA dispatch: picks the widest path the CPU has (AMX-BF16, AVX512_BF16, AVX-512,
 * AVX2+F16C+FMA, portable C) unless RATRAIN_ISA forces one; rt_set_isa lets tests switch paths
 * in-process. A path is a SIMD primitive table plus, on the two bf16 paths, a bf16 GEMM kernel. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

typedef struct {
    const char *name;
    const rt_simd *simd;
    const rt_bf16_gemm *bf16;     /* NULL: bf16 GEMMs widen to fp32 on `simd` */
} rt_path;

static const rt_path PATHS[] = {
    {"amx", &rt_simd_avx512, &rt_bf16_gemm_amx},
    {"avx512_bf16", &rt_simd_avx512, &rt_bf16_gemm_avx512},
    {"avx512", &rt_simd_avx512, NULL},
    {"avx2", &rt_simd_avx2, NULL},
    {"scalar", &rt_simd_scalar, NULL},
};
#define N_PATHS (int)(sizeof PATHS / sizeof PATHS[0])

static const rt_path *chosen;
static rt_simd active;            /* chosen->simd, with the VCVTNEPS2BF16 cast on bf16 paths */

static int cpuid_bit(unsigned leaf, unsigned sub, int reg, int bit) {
    unsigned r[4];
    if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3])) return 0;
    return (r[reg] >> bit) & 1;
}

/* NOTE [amx permission]: the tile data state (XTILEDATA, xfeature 18) is off until the process
 * asks Linux for it (ARCH_REQ_XCOMP_PERM); a tile instruction without it kills the process
 * with SIGILL. So AMX counts as present only if CPUID says so, XCR0 enables the tile state
 * and the request succeeds; on other systems the path is never chosen. */
static int amx_permitted(void) {
#ifdef __linux__
    unsigned lo, hi;
    if (!cpuid_bit(1, 0, 2, 27)) return 0;                  /* OSXSAVE: xgetbv is usable */
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;          /* XTILECFG and XTILEDATA */
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
#else
    return 0;
#endif
}

static int cpu_has(const char *isa) {
    __builtin_cpu_init();
    if (!strcmp(isa, "amx"))       /* EDX bits 22, 24 of leaf 7: AMX-BF16, AMX-TILE */
        return cpu_has("avx512_bf16") && cpuid_bit(7, 0, 3, 22) && cpuid_bit(7, 0, 3, 24) &&
               amx_permitted();
    if (!strcmp(isa, "avx512_bf16"))   /* EAX bit 5 of leaf 7 sub-leaf 1 */
        return cpu_has("avx512") && cpuid_bit(7, 1, 0, 5);
    if (!strcmp(isa, "avx512"))
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
    if (!strcmp(isa, "avx2"))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    return !strcmp(isa, "scalar");
}

static void choose(const rt_path *p) {
    active = *p->simd;
    if (p->bf16) active.f2bf = rt_f2bf_avx512bf16;
    chosen = p;
}

int rt_set_isa(const char *name) {
    if (!name) return RT_EISA;
    for (int i = 0; i < N_PATHS; i++)
        if (!strcmp(name, PATHS[i].name)) {
            if (!cpu_has(name)) return RT_EISA;
            choose(&PATHS[i]);
            return RT_OK;
        }
    return RT_EISA;
}

static const rt_path *path_get(void) {
    if (chosen) return chosen;
    const char *forced = getenv("RATRAIN_ISA");
    if (forced && rt_set_isa(forced) == RT_OK) return chosen;
    for (int i = 0; i < N_PATHS; i++)
        if (cpu_has(PATHS[i].name)) { choose(&PATHS[i]); break; }
    return chosen;
}

const rt_simd *rt_simd_get(void) { path_get(); return &active; }
const rt_bf16_gemm *rt_bf16_gemm_get(void) { return path_get()->bf16; }
const char *rt_isa_name(void) { return path_get()->name; }
