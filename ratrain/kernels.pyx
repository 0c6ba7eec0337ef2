# cython: language_level=3
"""Python bindings of the native kernels (native/): numpy in, numpy out."""
import numpy as np
cimport numpy as cnp

cdef extern from "ratrain_kernels.h" nogil:
    const char *rt_isa_name()
    int rt_set_isa(const char *name)
    int c_gemm_fwd_f16 "gemm_fwd_f16"(void *out, int out_dtype, const unsigned short *a, const unsigned short *b, const float *bias, int M, int N, int K, int flags, int threads)
    int c_gemm_fwd_f32 "gemm_fwd_f32"(void *out, int out_dtype, const float *a, const float *b, const float *bias, int M, int N, int K, int flags, int threads)

def isa():
    return rt_isa_name().decode()

def gemm(a, b, *, trans_a=False, trans_b=False, out=None, out_dtype=np.float16, accumulate=False, threads=1):
    a = np.ascontiguousarray(a); b = np.ascontiguousarray(b)
    M, K = (a.shape[1], a.shape[0]) if trans_a else a.shape
    N = b.shape[0] if trans_b else b.shape[1]
    if out is None:
        out = np.zeros((M, N), np.float32 if accumulate else out_dtype)
    cdef cnp.ndarray ca = a, cb = b, co = out
    flags = (1 if trans_a else 0) | (2 if trans_b else 0) | (4 if accumulate else 0)
    od = 1 if out.dtype == np.float16 else 0
    if a.dtype == np.float16:
        st = c_gemm_fwd_f16(<void*>co.data, od, <unsigned short*>ca.data, <unsigned short*>cb.data, NULL, M, N, K, flags, threads)
    else:
        st = c_gemm_fwd_f32(<void*>co.data, od, <float*>ca.data, <float*>cb.data, NULL, M, N, K, flags, threads)
    if st: raise RuntimeError(st)
    return out
