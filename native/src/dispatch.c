/* Runtime ISA dispatch: picks the widest SIMD path the CPU has, unless RATRAIN_ISA forces one. */
#include <stdlib.h>
#include <string.h>
#include "ratrain_kernels.h"

const char *rt_isa_name(void) {
    const char *forced = getenv("RATRAIN_ISA");
    if (forced && (!strcmp(forced, "avx512") || !strcmp(forced, "avx2") || !strcmp(forced, "scalar")))
        return forced;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return "avx512";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
    return "scalar";
}
