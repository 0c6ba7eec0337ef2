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

cdef extern from "ratrain_kernels.h" nogil:
    int c_attention_fwd_f16 "attention_fwd_f16"(void *o, float *lse, const void *q, const void *k, const void *v, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads)
    int c_attention_fwd_f32 "attention_fwd_f32"(void *o, float *lse, const void *q, const void *k, const void *v, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads)
    int c_attention_bwd_f16 "attention_bwd_f16"(void *dq, void *dk, void *dv, const void *q, const void *k, const void *v, const void *o, const float *lse, const void *do, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads)
    int c_attention_bwd_f32 "attention_bwd_f32"(void *dq, void *dk, void *dv, const void *q, const void *k, const void *v, const void *o, const float *lse, const void *do, const float *alibi, int B, int T, int Hq, int Hkv, int D, int causal, int threads)

cdef void *P(cnp.ndarray x):
    return <void*>x.data

def attention_fwd(q, k, v, *, causal=True, alibi_slopes=None, threads=1):
    B, T, Hq, D = q.shape; Hkv = k.shape[2]
    o = np.empty_like(q); lse = np.empty((B, Hq, T), np.float32)
    cdef const float *al = NULL
    cdef cnp.ndarray a
    if alibi_slopes is not None:
        a = np.ascontiguousarray(alibi_slopes, np.float32); al = <float*>a.data
    if q.dtype == np.float16:
        st = c_attention_fwd_f16(P(o), <float*>P(lse), P(q), P(k), P(v), al, B, T, Hq, Hkv, D, causal, threads)
    else:
        st = c_attention_fwd_f32(P(o), <float*>P(lse), P(q), P(k), P(v), al, B, T, Hq, Hkv, D, causal, threads)
    if st: raise RuntimeError(st)
    return o, lse

def attention_bwd(q, k, v, o, lse, do, *, causal=True, alibi_slopes=None, threads=1):
    B, T, Hq, D = q.shape; Hkv = k.shape[2]
    dq = np.empty_like(q); dk = np.empty_like(k); dv = np.empty_like(v)
    cdef const float *al = NULL
    cdef cnp.ndarray a
    if alibi_slopes is not None:
        a = np.ascontiguousarray(alibi_slopes, np.float32); al = <float*>a.data
    if q.dtype == np.float16:
        st = c_attention_bwd_f16(P(dq), P(dk), P(dv), P(q), P(k), P(v), P(o), <float*>P(lse), P(do), al, B, T, Hq, Hkv, D, causal, threads)
    else:
        st = c_attention_bwd_f32(P(dq), P(dk), P(dv), P(q), P(k), P(v), P(o), <float*>P(lse), P(do), al, B, T, Hq, Hkv, D, causal, threads)
    if st: raise RuntimeError(st)
    return dq, dk, dv
