/* ratrain native kernels: public C interface (see native/README in the kernels issue). */
#ifndef RATRAIN_KERNELS_H
#define RATRAIN_KERNELS_H

/* Name of the SIMD path chosen at run time: "avx512", "avx2" or "scalar". */
const char *rt_isa_name(void);

#endif
