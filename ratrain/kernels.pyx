# cython: language_level=3, wraparound=True, boundscheck=True
"""Python bindings of the native kernels (native/) over numpy arrays, used by tests, benchmarks
and the interpreter. Each function checks shapes and dtypes, releases the GIL around the C
call and raises on a non-zero status. float16, float32 and bf16 inputs pick the _f16, _f32 or
_bf16 kernel; numpy has no bfloat16, so bf16 tensors are uint16 arrays of the bits.
Generated code skips this layer and cimports the nogil forwarders declared in kernels.pxd."""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, uint64_t

include "../native/include/ratrain_kernels.pxi"

cnp.import_array()
_STATUS = {-1: "invalid arguments", -2: "scratch (GSM/AM) too small or out of memory",
           -3: "ISA not available on this CPU"}
_DMA_KEYS = ("ddr_to_gsm", "ddr_to_am", "gsm_to_ddr", "am_to_ddr", "gets", "puts")


cdef void *_p(object a) except NULL:
    """Data pointer of a C-contiguous float16/float32/int32 array (never copies)."""
    if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
        raise ValueError("expected a C-contiguous numpy array")
    if a.size == 0:
        raise ValueError("empty array")
    return cnp.PyArray_DATA(<cnp.ndarray>a)


cdef float *_opt_f32(object a) except? NULL:
    return NULL if a is None else <float *>_p(a)


def _check(int st, str name):
    if st != 0:
        raise RuntimeError(f"{name}: status {st} ({_STATUS.get(st, 'unknown')})")


def _fdt(x, name="input"):
    """1 for float16, 0 for float32; anything else is an error."""
    if x.dtype == np.float16:
        return 1
    if x.dtype == np.float32:
        return 0
    raise TypeError(f"{name}: expected float16 or float32, got {x.dtype}")


BF16 = np.dtype(np.uint16)      # dtype of bf16 arrays: the bits, fp32's top half


def _gdt(x, name="input"):
    """RT dtype code of a GEMM operand or a cast side: 0 float32, 1 float16, 2 bf16 (uint16)."""
    dt = np.dtype(x.dtype if isinstance(x, np.ndarray) else x)
    if dt == np.float32 or dt == np.float16 or dt == BF16:
        return 2 if dt == BF16 else int(dt == np.float16)
    raise TypeError(f"{name}: expected float16, float32 or uint16 (bf16 bits), got {dt}")


def _ldt(x, name="input"):
    """Storage code of a layer or attention tensor: 0 float32, 1 float16, 2 bf16 (uint16)."""
    if x.dtype == BF16:
        return 2
    if x.dtype == np.float16 or x.dtype == np.float32:
        return int(x.dtype == np.float16)
    raise TypeError(f"{name}: expected float16, float32 or uint16 (bf16 bits), got {x.dtype}")


def _c(x, dtype):
    return np.ascontiguousarray(x, dtype=dtype)


# ---- dispatch, scratch, DMA counters ----
def isa():
    """The path the kernels run on: 'amx', 'avx512_bf16', 'avx512', 'avx2' or 'scalar' (the
    first two are avx512 plus bf16 GEMM/cast instructions)."""
    return rt_isa_name().decode()


def set_isa(name):
    """Force a path (a name isa() returns) for this process, like RATRAIN_ISA."""
    _check(rt_set_isa(name.encode()), f"set_isa({name!r})")


def scratch_config(gsm_bytes, am_bytes):
    """Set on-chip scratch sizes (from the hardware profile): GSM per cluster, AM per core."""
    _check(rt_scratch_config(gsm_bytes, am_bytes), "scratch_config")


def scratch_sizes():
    return {"gsm": rt_gsm_bytes(), "am": rt_am_bytes()}


def dma_stats():
    """Bytes moved per level since the last dma_reset, and the number of transfers."""
    cdef uint64_t c[6]
    rt_dma_stats(c)
    return {k: int(c[i]) for i, k in enumerate(_DMA_KEYS)}


def dma_reset():
    rt_dma_reset()


# ---- GEMM ----
def gemm_plan(M, N, K, *, dtype=np.float16, trans_a=False, trans_b=False):
    """Tiling the fp16/fp32 GEMM uses (and the bf16 one on paths that widen bf16 to fp32, see
    isa()): dict(mc, kc, nc, mr, nr)."""
    cdef int plan[4]
    flags = (1 if trans_a else 0) | (2 if trans_b else 0)
    _check(c_rt_gemm_plan(plan, M, N, K, _gdt(dtype, "dtype"), flags), "gemm_plan")
    return {"mc": plan[0], "kc": plan[1], "nc": plan[2], "mr": plan[3] >> 16, "nr": plan[3] & 0xffff}


def gemm(a, b, *, trans_a=False, trans_b=False, out=None, out_dtype=None,
         accumulate=False, bias=None, threads=1):
    """op(a) @ op(b) (+ bias) for float16, float32 or bf16 (uint16 bits) a, b (same dtype), fp32
    accumulation. op transposes when trans_*; accumulate adds into `out`, which must then be
    float32 [M, N]. out_dtype defaults to bf16 (uint16) for bf16 inputs, else float16."""
    cdef int dt = _gdt(a, "a")
    if (dt == 2) != (np.asarray(b).dtype == BF16):
        raise TypeError("gemm: bf16 (uint16) operands go together: a and b must both be uint16")
    if out_dtype is None:
        out_dtype = BF16 if dt == 2 else np.float16
    a = _c(a, a.dtype); b = _c(b, a.dtype)
    M, K = (a.shape[1], a.shape[0]) if trans_a else a.shape
    N, Kb = (b.shape[0], b.shape[1]) if trans_b else (b.shape[1], b.shape[0])
    if Kb != K:
        raise ValueError(f"gemm: inner sizes differ ({K} vs {Kb})")
    if accumulate and out is None:
        raise ValueError("gemm: accumulate=True needs out (float32)")
    if out is None:
        out = np.empty((M, N), out_dtype)
    if out.shape != (M, N) or (accumulate and out.dtype != np.float32):
        raise ValueError(f"gemm: out must be [{M}, {N}]" + (" float32" if accumulate else ""))
    if bias is not None:
        bias = _c(bias, np.float32)
    cdef int flags = (1 if trans_a else 0) | (2 if trans_b else 0) | (4 if accumulate else 0)
    cdef int od = _gdt(out, "out"), m = M, n = N, k = K, t = threads, st
    cdef void *po = _p(out)
    cdef void *pa = _p(a)
    cdef void *pb = _p(b)
    cdef const float *pbias = _opt_f32(bias)
    with nogil:
        if dt == 2:
            st = c_gemm_fwd_bf16(po, od, <unsigned short *>pa, <unsigned short *>pb, pbias, m, n, k, flags, t)
        elif dt:
            st = c_gemm_fwd_f16(po, od, <unsigned short *>pa, <unsigned short *>pb, pbias, m, n, k, flags, t)
        else:
            st = c_gemm_fwd_f32(po, od, <float *>pa, <float *>pb, pbias, m, n, k, flags, t)
    _check(st, "gemm")
    return out


# ---- attention ----
def _att_shapes(q, k, v, alibi_slopes):
    B, T, Hq, D = q.shape
    if k.shape != v.shape or k.shape[:2] != (B, T) or k.shape[3] != D or Hq % k.shape[2]:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} do not match")
    if alibi_slopes is not None and np.shape(alibi_slopes) != (Hq,):
        raise ValueError("attention: alibi_slopes must be [Hq]")
    return B, T, Hq, k.shape[2], D


def attention_fwd(q, k, v, *, causal=True, alibi_slopes=None, threads=1):
    """Flash-style attention. q [B,T,Hq,D], k, v [B,T,Hkv,D] -> (o [B,T,Hq,D], lse [B,Hq,T] f32);
    float32, float16 or bf16 (uint16 bits) storage, o in q's dtype."""
    cdef int dt = _ldt(q, "q")
    q, k, v = (_c(x, q.dtype) for x in (q, k, v))
    cdef int B, T, Hq, Hkv, D, st, c = bool(causal), t = threads
    B, T, Hq, Hkv, D = _att_shapes(q, k, v, alibi_slopes)
    al = None if alibi_slopes is None else _c(alibi_slopes, np.float32)
    o = np.empty_like(q); lse = np.empty((B, Hq, T), np.float32)
    cdef void *po = _p(o), *pq = _p(q), *pk = _p(k), *pv = _p(v)
    cdef float *pl = <float *>_p(lse)
    cdef const float *pal = _opt_f32(al)
    with nogil:
        if dt == 2:
            st = c_attention_fwd_bf16(<unsigned short *>po, pl, <unsigned short *>pq, <unsigned short *>pk,
                                      <unsigned short *>pv, pal, B, T, Hq, Hkv, D, c, t)
        elif dt:
            st = c_attention_fwd_f16(<unsigned short *>po, pl, <unsigned short *>pq, <unsigned short *>pk,
                                     <unsigned short *>pv, pal, B, T, Hq, Hkv, D, c, t)
        else:
            st = c_attention_fwd_f32(<float *>po, pl, <float *>pq, <float *>pk, <float *>pv, pal,
                                     B, T, Hq, Hkv, D, c, t)
    _check(st, "attention_fwd")
    return o, lse


def attention_bwd(q, k, v, o, lse, do, *, causal=True, alibi_slopes=None, threads=1):
    """Gradients (dq, dk, dv) of attention_fwd given its output o, saved lse and dL/do."""
    cdef int dt = _ldt(q, "q")
    q, k, v, o, do = (_c(x, q.dtype) for x in (q, k, v, o, do))
    lse = _c(lse, np.float32)
    cdef int B, T, Hq, Hkv, D, st, c = bool(causal), t = threads
    B, T, Hq, Hkv, D = _att_shapes(q, k, v, alibi_slopes)
    if o.shape != q.shape or do.shape != q.shape or lse.shape != (B, Hq, T):
        raise ValueError("attention_bwd: o/do must match q and lse be [B,Hq,T]")
    al = None if alibi_slopes is None else _c(alibi_slopes, np.float32)
    dq = np.empty_like(q); dk = np.empty_like(k); dv = np.empty_like(v)
    cdef void *pdq = _p(dq), *pdk = _p(dk), *pdv = _p(dv), *pq = _p(q), *pk = _p(k)
    cdef void *pv = _p(v), *po = _p(o), *pdo = _p(do)
    cdef float *pl = <float *>_p(lse)
    cdef const float *pal = _opt_f32(al)
    with nogil:
        if dt == 2:
            st = c_attention_bwd_bf16(<unsigned short *>pdq, <unsigned short *>pdk, <unsigned short *>pdv,
                                      <unsigned short *>pq, <unsigned short *>pk, <unsigned short *>pv,
                                      <unsigned short *>po, pl, <unsigned short *>pdo, pal,
                                      B, T, Hq, Hkv, D, c, t)
        elif dt:
            st = c_attention_bwd_f16(<unsigned short *>pdq, <unsigned short *>pdk, <unsigned short *>pdv,
                                     <unsigned short *>pq, <unsigned short *>pk, <unsigned short *>pv,
                                     <unsigned short *>po, pl, <unsigned short *>pdo, pal,
                                     B, T, Hq, Hkv, D, c, t)
        else:
            st = c_attention_bwd_f32(<float *>pdq, <float *>pdk, <float *>pdv, <float *>pq,
                                     <float *>pk, <float *>pv, <float *>po, pl, <float *>pdo, pal,
                                     B, T, Hq, Hkv, D, c, t)
    _check(st, "attention_bwd")
    return dq, dk, dv

include "../native/include/ratrain_layers.pxi"
