# Included by ratrain/kernels.pyx: numpy bindings of the layer, loss and optimizer kernels
# (RMSNorm, RoPE, SwiGLU, embedding, LM-head cross-entropy, AdamW, casts, finite check);
# float16, float32 or bf16 (uint16 bits) tensors pick the _f16, _f32 or _bf16 kernel.
ctypedef unsigned short half_t


def rmsnorm_fwd(x, w, *, eps=1e-5, threads=1):
    """x [N, C], w [C] -> (y [N, C], rstd [N] f32)."""
    cdef int dt = _ldt(x, "x")
    x = _c(x, x.dtype); w = _c(w, x.dtype)
    C = x.shape[-1]; N = x.size // C
    y = np.empty_like(x); rstd = np.empty(x.shape[:-1], np.float32)
    cdef void *py = _p(y), *px = _p(x), *pw = _p(w)
    cdef float *pr = <float *>_p(rstd)
    cdef int n = N, c = C, t = threads, st
    cdef float e = eps
    with nogil:
        if dt == 2: st = c_rmsnorm_fwd_bf16(<half_t *>py, pr, <half_t *>px, <half_t *>pw, n, c, e, t)
        elif dt: st = c_rmsnorm_fwd_f16(<half_t *>py, pr, <half_t *>px, <half_t *>pw, n, c, e, t)
        else: st = c_rmsnorm_fwd_f32(<float *>py, pr, <float *>px, <float *>pw, n, c, e, t)
    _check(st, "rmsnorm_fwd")
    return y, rstd


def rmsnorm_bwd(dy, x, w, rstd, *, dw=None, threads=1):
    """-> (dx like x, dw [C] f32); dw, when given, is accumulated into (+=)."""
    cdef int dt = _ldt(x, "x")
    x = _c(x, x.dtype); w = _c(w, x.dtype); dy = _c(dy, x.dtype)
    rstd = _c(rstd, np.float32)
    C = x.shape[-1]; N = x.size // C
    dw = np.zeros(C, np.float32) if dw is None else dw
    dx = np.empty_like(x)
    cdef void *pdx = _p(dx), *pdy = _p(dy), *px = _p(x), *pw = _p(w)
    cdef float *pdw = <float *>_p(dw), *pr = <float *>_p(rstd)
    cdef int n = N, c = C, t = threads, st
    with nogil:
        if dt == 2: st = c_rmsnorm_bwd_bf16(<half_t *>pdx, pdw, <half_t *>pdy, <half_t *>px, <half_t *>pw, pr, n, c, t)
        elif dt: st = c_rmsnorm_bwd_f16(<half_t *>pdx, pdw, <half_t *>pdy, <half_t *>px, <half_t *>pw, pr, n, c, t)
        else: st = c_rmsnorm_bwd_f32(<float *>pdx, pdw, <float *>pdy, <float *>px, <float *>pw, pr, n, c, t)
    _check(st, "rmsnorm_bwd")
    return dx, dw


def _rope(x, inv_freq, scale, threads, int inverse):
    cdef int dt = _ldt(x, "x")
    x = _c(x, x.dtype)
    inv_freq = _c(inv_freq, np.float32)
    y = np.empty_like(x)
    cdef int B, T, H, D, t = threads, st
    B, T, H, D = x.shape
    if inv_freq.shape != (D // 2,):
        raise ValueError(f"rope: inv_freq has shape {inv_freq.shape}, want ({D // 2},)")
    cdef void *py = _p(y), *px = _p(x)
    cdef const float *pf = <const float *>_p(inv_freq)
    cdef float s = scale
    with nogil:
        if dt == 2 and not inverse: st = c_rope_fwd_bf16(<half_t *>py, <half_t *>px, B, T, H, D, pf, s, t)
        elif dt == 2: st = c_rope_bwd_bf16(<half_t *>py, <half_t *>px, B, T, H, D, pf, s, t)
        elif dt and not inverse: st = c_rope_fwd_f16(<half_t *>py, <half_t *>px, B, T, H, D, pf, s, t)
        elif dt: st = c_rope_bwd_f16(<half_t *>py, <half_t *>px, B, T, H, D, pf, s, t)
        elif not inverse: st = c_rope_fwd_f32(<float *>py, <float *>px, B, T, H, D, pf, s, t)
        else: st = c_rope_bwd_f32(<float *>py, <float *>px, B, T, H, D, pf, s, t)
    _check(st, "rope")
    return y


def rope_fwd(x, inv_freq, *, scale=1.0, threads=1):
    """HF LLaMA rotary embedding of x [B, T, H, D] at positions 0..T-1: frequencies
    inv_freq [D/2] (ratrain.models.rope.inv_freq), cos and sin times `scale`."""
    return _rope(x, inv_freq, scale, threads, 0)


def rope_bwd(dy, inv_freq, *, scale=1.0, threads=1):
    """Gradient of rope_fwd: the inverse rotation of dy times the same scale."""
    return _rope(dy, inv_freq, scale, threads, 1)


def swiglu_fwd(gate, up, *, threads=1):
    """silu(gate) * up, elementwise."""
    cdef int dt = _ldt(gate, "gate")
    gate = _c(gate, gate.dtype); up = _c(up, gate.dtype)
    if up.shape != gate.shape: raise ValueError("swiglu: gate and up differ in shape")
    y = np.empty_like(gate)
    cdef void *py = _p(y), *pg = _p(gate), *pu = _p(up)
    cdef size_t n = gate.size
    cdef int t = threads, st
    with nogil:
        if dt == 2: st = c_swiglu_fwd_bf16(<half_t *>py, <half_t *>pg, <half_t *>pu, n, t)
        elif dt: st = c_swiglu_fwd_f16(<half_t *>py, <half_t *>pg, <half_t *>pu, n, t)
        else: st = c_swiglu_fwd_f32(<float *>py, <float *>pg, <float *>pu, n, t)
    _check(st, "swiglu_fwd")
    return y


def swiglu_bwd(dy, gate, up, *, threads=1):
    """-> (dgate, dup)."""
    cdef int dt = _ldt(gate, "gate")
    gate = _c(gate, gate.dtype); up = _c(up, gate.dtype); dy = _c(dy, gate.dtype)
    dg = np.empty_like(gate); du = np.empty_like(gate)
    cdef void *pdg = _p(dg), *pdu = _p(du), *pdy = _p(dy), *pg = _p(gate), *pu = _p(up)
    cdef size_t n = gate.size
    cdef int t = threads, st
    with nogil:
        if dt == 2: st = c_swiglu_bwd_bf16(<half_t *>pdg, <half_t *>pdu, <half_t *>pdy, <half_t *>pg, <half_t *>pu, n, t)
        elif dt: st = c_swiglu_bwd_f16(<half_t *>pdg, <half_t *>pdu, <half_t *>pdy, <half_t *>pg, <half_t *>pu, n, t)
        else: st = c_swiglu_bwd_f32(<float *>pdg, <float *>pdu, <float *>pdy, <float *>pg, <float *>pu, n, t)
    _check(st, "swiglu_bwd")
    return dg, du


def embedding_fwd(ids, table, *, threads=1):
    """table [V, C] rows picked by ids (any shape) -> [*ids.shape, C]."""
    cdef int dt = _ldt(table, "table")
    table = _c(table, table.dtype); ids = _c(ids, np.int32)
    V, C = table.shape
    y = np.empty(ids.shape + (C,), table.dtype)
    cdef void *py = _p(y), *pt = _p(table)
    cdef int32_t *pi = <int32_t *>_p(ids)
    cdef int n = ids.size, v = V, c = C, t = threads, st
    with nogil:
        if dt == 2: st = c_embedding_fwd_bf16(<half_t *>py, pi, <half_t *>pt, n, v, c, t)
        elif dt: st = c_embedding_fwd_f16(<half_t *>py, pi, <half_t *>pt, n, v, c, t)
        else: st = c_embedding_fwd_f32(<float *>py, pi, <float *>pt, n, v, c, t)
    _check(st, "embedding_fwd")
    return y


def embedding_bwd(dy, ids, vocab, *, dtable=None, threads=1):
    """Scatter-add dy [*ids.shape, C] into dtable [vocab, C] f32 (accumulated when given)."""
    cdef int dt = _ldt(dy, "dy")
    dy = _c(dy, dy.dtype); ids = _c(ids, np.int32)
    C = dy.shape[-1]
    dtable = np.zeros((vocab, C), np.float32) if dtable is None else dtable
    cdef void *pdy = _p(dy)
    cdef float *pdt = <float *>_p(dtable)
    cdef int32_t *pi = <int32_t *>_p(ids)
    cdef int n = ids.size, v = vocab, c = C, t = threads, st
    with nogil:
        if dt == 2: st = c_embedding_bwd_bf16(pdt, <half_t *>pdy, pi, n, v, c, t)
        elif dt: st = c_embedding_bwd_f16(pdt, <half_t *>pdy, pi, n, v, c, t)
        else: st = c_embedding_bwd_f32(pdt, <float *>pdy, pi, n, v, c, t)
    _check(st, "embedding_bwd")
    return dtable


def cross_entropy_fwd(h, w, targets, *, chunk=4096, threads=1):
    """LM head + cross-entropy: h [N, C], w [V, C], targets [N] (<0 ignored) ->
    (losses [N] f32, lse [N] f32); logits are computed `chunk` vocabulary rows at a time."""
    cdef int dt = _ldt(h, "h")
    h = _c(h, h.dtype); w = _c(w, h.dtype); targets = _c(targets, np.int32)
    N, C = h.shape; V = w.shape[0]
    losses = np.empty(N, np.float32); lse = np.empty(N, np.float32)
    cdef void *ph = _p(h), *pw = _p(w)
    cdef float *pl = <float *>_p(losses), *plse = <float *>_p(lse)
    cdef int32_t *pt = <int32_t *>_p(targets)
    cdef int n = N, v = V, c = C, ch = chunk, t = threads, st
    with nogil:
        if dt == 2: st = c_crossentropy_fwd_bf16(pl, plse, <half_t *>ph, <half_t *>pw, pt, n, v, c, ch, t)
        elif dt: st = c_crossentropy_fwd_f16(pl, plse, <half_t *>ph, <half_t *>pw, pt, n, v, c, ch, t)
        else: st = c_crossentropy_fwd_f32(pl, plse, <float *>ph, <float *>pw, pt, n, v, c, ch, t)
    _check(st, "cross_entropy_fwd")
    return losses, lse


def cross_entropy_bwd(h, w, targets, lse, dlosses, *, dw=None, chunk=4096, threads=1):
    """-> (dh like h, dw [V, C] f32 accumulated when given); dlosses [N] = dL/dloss[n]."""
    cdef int dt = _ldt(h, "h")
    h = _c(h, h.dtype); w = _c(w, h.dtype); targets = _c(targets, np.int32)
    lse = _c(lse, np.float32); dlosses = _c(np.broadcast_to(dlosses, lse.shape), np.float32)
    N, C = h.shape; V = w.shape[0]
    dw = np.zeros((V, C), np.float32) if dw is None else dw
    dh = np.empty_like(h)
    cdef void *pdh = _p(dh), *ph = _p(h), *pw = _p(w)
    cdef float *pdw = <float *>_p(dw), *plse = <float *>_p(lse), *pdl = <float *>_p(dlosses)
    cdef int32_t *pt = <int32_t *>_p(targets)
    cdef int n = N, v = V, c = C, ch = chunk, t = threads, st
    with nogil:
        if dt == 2: st = c_crossentropy_bwd_bf16(<half_t *>pdh, pdw, <half_t *>ph, <half_t *>pw, pt, plse, pdl, n, v, c, ch, t)
        elif dt: st = c_crossentropy_bwd_f16(<half_t *>pdh, pdw, <half_t *>ph, <half_t *>pw, pt, plse, pdl, n, v, c, ch, t)
        else: st = c_crossentropy_bwd_f32(<float *>pdh, pdw, <float *>ph, <float *>pw, pt, plse, pdl, n, v, c, ch, t)
    _check(st, "cross_entropy_bwd")
    return dh, dw


def cross_entropy_bwd_input(h, w, targets, lse, dlosses, *, chunk=4096, threads=1):
    """zb1's B half of cross_entropy_bwd -> (dh like h, g): g [N*V] is the logits gradient
    chunk by chunk (f32; bf16 bits for bf16 h), what cross_entropy_bwd_weight reads."""
    cdef int dt = _ldt(h, "h")
    h = _c(h, h.dtype); w = _c(w, h.dtype); targets = _c(targets, np.int32)
    lse = _c(lse, np.float32); dlosses = _c(np.broadcast_to(dlosses, lse.shape), np.float32)
    N, C = h.shape; V = w.shape[0]
    g = np.empty(N * V, BF16 if dt == 2 else np.float32)
    dh = np.empty_like(h)
    cdef void *pdh = _p(dh), *pg = _p(g), *ph = _p(h), *pw = _p(w)
    cdef float *plse = <float *>_p(lse), *pdl = <float *>_p(dlosses)
    cdef int32_t *pt = <int32_t *>_p(targets)
    cdef int n = N, v = V, c = C, ch = chunk, t = threads, st
    with nogil:
        if dt == 2: st = c_crossentropy_bwd_input_bf16(<half_t *>pdh, <half_t *>pg, <half_t *>ph, <half_t *>pw, pt, plse, pdl, n, v, c, ch, t)
        elif dt: st = c_crossentropy_bwd_input_f16(<half_t *>pdh, <float *>pg, <half_t *>ph, <half_t *>pw, pt, plse, pdl, n, v, c, ch, t)
        else: st = c_crossentropy_bwd_input_f32(<float *>pdh, <float *>pg, <float *>ph, <float *>pw, pt, plse, pdl, n, v, c, ch, t)
    _check(st, "cross_entropy_bwd_input")
    return dh, g


def cross_entropy_bwd_weight(g, h, V, *, dw=None, chunk=4096, threads=1):
    """zb1's W half: dw [V, C] f32 (accumulated when given) from cross_entropy_bwd_input's g."""
    cdef int dt = _ldt(h, "h")
    h = _c(h, h.dtype); g = _c(g, BF16 if dt == 2 else np.float32)
    N, C = h.shape
    if g.size != N * V:
        raise ValueError(f"cross_entropy_bwd_weight: g has {g.size} elements, not N*V = {N * V}")
    dw = np.zeros((V, C), np.float32) if dw is None else dw
    cdef void *pg = _p(g), *ph = _p(h)
    cdef float *pdw = <float *>_p(dw)
    cdef int n = N, v = V, c = C, ch = chunk, t = threads, st
    with nogil:
        if dt == 2: st = c_crossentropy_bwd_weight_bf16(pdw, <half_t *>pg, <half_t *>ph, n, v, c, ch, t)
        elif dt: st = c_crossentropy_bwd_weight_f16(pdw, <float *>pg, <half_t *>ph, n, v, c, ch, t)
        else: st = c_crossentropy_bwd_weight_f32(pdw, <float *>pg, <float *>ph, n, v, c, ch, t)
    _check(st, "cross_entropy_bwd_weight")
    return dw


def adamw_step(master, m, v, grad, *, param_f16=None, param_bf16=None, lr, beta1=0.9,
               beta2=0.999, eps=1e-8, weight_decay=0.0, step):
    """In-place torch.optim.AdamW step on float32 master/m/v; writes the 16-bit view given:
    param_f16 (float16) or param_bf16 (uint16 bf16 bits, rounded to nearest even)."""
    for name, arr in (("master", master), ("m", m), ("v", v), ("grad", grad)):
        if arr.dtype != np.float32 or arr.shape != master.shape or not arr.flags.c_contiguous:
            raise ValueError(f"adamw_step: {name} must be float32 shaped like master")
    if param_f16 is not None and (param_f16.dtype != np.float16 or param_f16.shape != master.shape):
        raise ValueError("adamw_step: param_f16 must be float16 shaped like master")
    if param_bf16 is not None and (param_bf16.dtype != BF16 or param_bf16.shape != master.shape):
        raise ValueError("adamw_step: param_bf16 must be uint16 (bf16 bits) shaped like master")
    if param_f16 is not None and param_bf16 is not None:
        raise ValueError("adamw_step: give param_f16 or param_bf16, not both")
    cdef float *pp = <float *>_p(master), *pm = <float *>_p(m), *pv = <float *>_p(v)
    cdef float *pg = <float *>_p(grad)
    view = param_f16 if param_bf16 is None else param_bf16
    cdef half_t *ph = NULL if view is None else <half_t *>_p(view)
    cdef int bf = param_bf16 is not None
    cdef size_t n = master.size
    cdef float a = lr, b1 = beta1, b2 = beta2, e = eps, wd = weight_decay
    cdef int s = step, st
    with nogil:
        if bf: st = c_adamw_step_f32_bf16(pp, pm, pv, ph, pg, n, a, b1, b2, e, wd, s)
        else: st = c_adamw_step_f32(pp, pm, pv, ph, pg, n, a, b1, b2, e, wd, s)
    _check(st, "adamw_step")


def cast(x, dtype):
    """float32 <-> float16 or bf16 (uint16 bits) with the kernels' converters (round to
    nearest even; bf16 NaN stays NaN, made quiet)."""
    cdef int src_dt = _gdt(x, "x"), dst_dt = _gdt(dtype, "dtype")
    x = _c(x, x.dtype)
    y = np.empty(x.shape, dtype)
    cdef void *py = _p(y), *px = _p(x)
    cdef size_t n = x.size
    if dst_dt == src_dt:
        y[...] = x
    elif src_dt and dst_dt:
        raise TypeError("cast: float16 <-> bf16 goes through float32")
    elif src_dt == 2:
        _check(c_cast_bf16_to_f32(<float *>py, <half_t *>px, n), "cast")
    elif dst_dt == 2:
        _check(c_cast_f32_to_bf16(<half_t *>py, <float *>px, n), "cast")
    elif src_dt:
        _check(c_cast_f16_to_f32(<float *>py, <half_t *>px, n), "cast")
    else:
        _check(c_cast_f32_to_f16(<half_t *>py, <float *>px, n), "cast")
    return y


def finite_sumsq(x, *, threads=1):
    """-> (all elements finite, sum of squares as a Python float)."""
    cdef int dt = _ldt(x, "x")
    x = _c(x, x.dtype)
    cdef int finite = 0, t = threads, st
    cdef double ss = 0.0
    cdef void *px = _p(x)
    cdef size_t n = x.size
    with nogil:
        if dt == 2: st = c_finite_sumsq_bf16(&finite, &ss, <half_t *>px, n, t)
        elif dt: st = c_finite_sumsq_f16(&finite, &ss, <half_t *>px, n, t)
        else: st = c_finite_sumsq_f32(&finite, &ss, <float *>px, n, t)
    _check(st, "finite_sumsq")
    return bool(finite), ss
