/* Runtime ISA dispatch: picks the widest SIMD path the CPU has (AVX-512, AVX2+F16C+FMA,
 * portable C) unless RATRAIN_ISA forces one; rt_set_isa lets tests switch paths in-process. */
#include <stdlib.h>
#include <string.h>
#include "internal.h"

static const rt_simd *chosen;

static int cpu_has(const char *isa) {
    __builtin_cpu_init();
    if (!strcmp(isa, "avx512"))
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
    if (!strcmp(isa, "avx2"))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    return !strcmp(isa, "scalar");
}

static const rt_simd *table_for(const char *isa) {
    if (!strcmp(isa, "avx512")) return &rt_simd_avx512;
    if (!strcmp(isa, "avx2")) return &rt_simd_avx2;
    return &rt_simd_scalar;
}

int rt_set_isa(const char *name) {
    if (!name || !cpu_has(name)) return RT_EISA;
    chosen = table_for(name);
    return RT_OK;
}

const rt_simd *rt_simd_get(void) {
    if (chosen) return chosen;
    const char *forced = getenv("RATRAIN_ISA");
    if (forced && rt_set_isa(forced) == RT_OK) return chosen;
    chosen = cpu_has("avx512") ? &rt_simd_avx512
           : cpu_has("avx2") ? &rt_simd_avx2 : &rt_simd_scalar;
    return chosen;
}

const char *rt_isa_name(void) { return rt_simd_get()->name; }
