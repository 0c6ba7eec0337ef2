"""Op -> Cython template table: each IR op a lowered program runs natively becomes a few
lines calling a kernel of ratrain/kernels.pxd (nogil, status into `st`). Pointers come
from `arg(slot)`, the C expression of that slot's address in the arena; shapes, dtypes
and params are baked in, so the same op on the same shapes gives the same text whatever
the layer or micro-batch (what lets one function serve a whole class of tasks).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable

from ratrain.ir.split_backward import CE_CHUNK

C_TYPES = {"float32": "float", "float16": "unsigned short", "bfloat16": "unsigned short",
           "int32": "int32_t"}
SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
RT_DTYPE = {"float32": "RT_F32", "float16": "RT_F16", "bfloat16": "RT_BF16"}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}


@dataclass
class Emitted:
    lines: list[str]                    # statements setting `st` (0 = ok)
    scratch_floats: int = 0             # fp32 scratch the lines use (module buffer SCR)
    tables: dict = field(default_factory=dict)  # constant fp32 arrays: name -> values


Arg = Callable[[object], str]           # slot -> "<T *>(A + o[i])"


def comment_of(call) -> str:
    """The IR line of a call without its buffers (the same for every layer)."""
    params = " ".join(f"{k}={v}" for k, v in call.params)
    shapes = " ".join(f"{x.dtype}{list(x.shape)}" for x in (*call.outputs, *call.inputs)
                      if hasattr(x, "shape"))
    return f"{call.op}[{params}] {shapes}".replace("[] ", " ")


def _rows(shape) -> int:
    return math.prod(shape[:-1])


def _size(slot) -> int:
    return math.prod(slot.shape)


def _params(call) -> dict:
    return dict(call.params)


def _k(call) -> str:
    """Kernel suffix from the first floating input."""
    return SUFFIX[next(x.dtype for x in call.inputs if x.dtype in SUFFIX)]


def _adds_into(call, index: int) -> bool:
    """Output `index` is fused gradient accumulation in "add" mode (+= into grad.L)."""
    return dict(call.params).get("grad_into") == (index, "add")


def _f32_target(arg: Arg, slot, n: int, lines: list[str], at: int = 0,
                adds: bool = False) -> tuple[str, int]:
    """Where a kernel that accumulates (+=) in fp32 should write `slot`: the slot itself
    (zeroed unless the call adds into it) when it is fp32, else zeroed scratch at SCR + at,
    cast into it afterwards."""
    if slot.dtype == "float32":
        if not adds:
            lines.append(f"memset({arg(slot)}, 0, {4 * n})")
        return arg(slot), 0
    lines.append(f"memset(SCR + {at}, 0, {4 * n})")
    return f"SCR + {at}", n


def _cast_back(arg: Arg, slot, n: int, at: int = 0) -> list[str]:
    if slot.dtype == "float32":
        return []
    return [f"if st == 0: st = cast_f32_to_{SUFFIX[slot.dtype]}({arg(slot)}, SCR + {at}, {n})"]


def _accumulating(call, arg: Arg, index: int, kernel: Callable[[str], str],
                  before: tuple[str, ...] = (), at: int = 0) -> Emitted:
    """A kernel that adds (+=) output `index` in fp32: `kernel(target)` is its line, after
    `before` (which uses SCR[0:at]); the target is _f32_target's, cast back after."""
    slot, lines = call.outputs[index], list(before)
    target, scratch = _f32_target(arg, slot, _size(slot), lines, at=at,
                                  adds=_adds_into(call, index))
    lines.append(kernel(target))
    return Emitted(lines + _cast_back(arg, slot, _size(slot), at=at), at + scratch)


def matmul(call, arg: Arg) -> Emitted:
    (x, w), (out,) = call.inputs, call.outputs
    return Emitted([f"st = gemm_fwd_{_k(call)}({arg(out)}, {RT_DTYPE[out.dtype]}, {arg(x)}, "
                    f"{arg(w)}, NULL, {_rows(x.shape)}, {w.shape[0]}, {w.shape[1]}, "
                    "RT_TRANS_B, threads)"])


def matmul_bias(call, arg: Arg) -> Emitted:
    (x, w, b), (out,) = call.inputs, call.outputs
    n = b.shape[0]
    lines = [] if b.dtype == "float32" else [f"cast_{SUFFIX[b.dtype]}_to_f32(SCR, {arg(b)}, {n})"]
    bias = arg(b) if b.dtype == "float32" else "SCR"
    lines.append(f"st = gemm_fwd_{_k(call)}({arg(out)}, {RT_DTYPE[out.dtype]}, {arg(x)}, "
                 f"{arg(w)}, {bias}, {_rows(x.shape)}, {w.shape[0]}, {w.shape[1]}, "
                 "RT_TRANS_B, threads)")
    return Emitted(lines, 0 if b.dtype == "float32" else n)


def _input_grad(sfx: str, dx, w, dy, arg: Arg) -> str:
    """dx[M,K] = dy[M,N] @ w[N,K]."""
    (n, k) = w.shape
    return (f"st = gemm_fwd_{sfx}({arg(dx)}, {RT_DTYPE[dx.dtype]}, {arg(dy)}, {arg(w)}, NULL, "
            f"{_rows(dy.shape)}, {k}, {n}, 0, threads)")


def _weight_grad(sfx: str, dw, x, dy, arg: Arg, adds: bool) -> str:
    """dw[N,K] = dy^T x (a = dy stored [M,N] = [K',M'])."""
    m, (n, k) = _rows(x.shape), dw.shape
    return (f"st = gemm_fwd_{sfx}({arg(dw)}, {RT_DTYPE[dw.dtype]}, {arg(dy)}, "
            f"{arg(x)}, NULL, {n}, {k}, {m}, RT_TRANS_A"
            f"{' | RT_ACCUMULATE' if adds else ''}, threads)")


def _column_sums(call, db, dy, arg: Arg) -> str:
    return (f"if st == 0: st = rt_column_sums_{_k(call)}({arg(db)}, {arg(dy)}, "
            f"{_rows(dy.shape)}, {dy.shape[-1]})")


def _matmul_grads(call, arg: Arg) -> list[str]:
    (x, w, dy), (dx, dw) = call.inputs, call.outputs[:2]
    return [_input_grad(_k(call), dx, w, dy, arg),
            "if st == 0: " + _weight_grad(_k(call), dw, x, dy, arg, _adds_into(call, 1))]


def matmul_bwd(call, arg: Arg) -> Emitted:
    return Emitted(_matmul_grads(call, arg))


def matmul_bias_bwd(call, arg: Arg) -> Emitted:
    dy, db = call.inputs[2], call.outputs[2]
    return Emitted(_matmul_grads(call, arg) + [_column_sums(call, db, dy, arg)])


# zb1's halves of matmul_bwd (NOTE [B/W split]): the same kernel calls, one per task
def matmul_bwd_input(call, arg: Arg) -> Emitted:
    (w, dy), (dx,) = call.inputs, call.outputs
    return Emitted([_input_grad(_k(call), dx, w, dy, arg)])


def matmul_bwd_weight(call, arg: Arg) -> Emitted:
    (x, dy), (dw,) = call.inputs, call.outputs
    return Emitted([_weight_grad(_k(call), dw, x, dy, arg, _adds_into(call, 0))])


def matmul_bias_bwd_weight(call, arg: Arg) -> Emitted:
    (x, dy), (dw, db) = call.inputs, call.outputs
    return Emitted([_weight_grad(_k(call), dw, x, dy, arg, _adds_into(call, 0)),
                    _column_sums(call, db, dy, arg)])


def _alibi(call, heads: int) -> tuple[str, dict]:
    """The slopes argument: NULL, or a module table ALIBI_<heads> (models/alibi.py's)."""
    if not _params(call)["alibi"]:
        return "NULL", {}
    from ratrain.models.alibi import alibi_slopes
    return f"ALIBI_{heads}", {f"ALIBI_{heads}": alibi_slopes(heads)}


def attention(call, arg: Arg) -> Emitted:
    (q, k, v), (o, lse) = call.inputs, call.outputs
    b, t, hq, d = q.shape
    slopes, tables = _alibi(call, hq)
    return Emitted([f"st = attention_fwd_{_k(call)}({arg(o)}, {arg(lse)}, {arg(q)}, {arg(k)}, "
                    f"{arg(v)}, {slopes}, {b}, {t}, {hq}, {k.shape[2]}, {d}, "
                    f"{int(_params(call)['causal'])}, threads)"], tables=tables)


def attention_bwd(call, arg: Arg) -> Emitted:
    (q, k, v, o, lse, do), (dq, dk, dv) = call.inputs, call.outputs
    b, t, hq, d = q.shape
    slopes, tables = _alibi(call, hq)
    return Emitted([f"st = attention_bwd_{_k(call)}({arg(dq)}, {arg(dk)}, {arg(dv)}, {arg(q)}, "
                    f"{arg(k)}, {arg(v)}, {arg(o)}, {arg(lse)}, {arg(do)}, "
                    f"{slopes}, {b}, {t}, {hq}, {k.shape[2]}, {d}, "
                    f"{int(_params(call)['causal'])}, threads)"], tables=tables)


def rms_norm(call, arg: Arg) -> Emitted:
    (x, w), (out, rstd) = call.inputs, call.outputs
    return Emitted([f"st = rmsnorm_fwd_{_k(call)}({arg(out)}, {arg(rstd)}, {arg(x)}, {arg(w)}, "
                    f"{_rows(x.shape)}, {x.shape[-1]}, {_params(call)['eps']!r}, threads)"])


def rms_norm_bwd(call, arg: Arg) -> Emitted:
    (x, w, rstd, dy), (dx, _) = call.inputs, call.outputs
    return _accumulating(call, arg, 1, lambda dw: (
        f"st = rmsnorm_bwd_{_k(call)}({arg(dx)}, {dw}, {arg(dy)}, {arg(x)}, {arg(w)}, "
        f"{arg(rstd)}, {_rows(x.shape)}, {x.shape[-1]}, threads)"))


def _rope_args(call, head_dim: int) -> tuple[str, dict]:
    """The `inv_freq, scale` arguments: a module table INV_FREQ_<D>_<digest> holding
    ratrain.models.rope's frequencies of the op's spec, and the cos/sin scale."""
    from ratrain.models.rope import attention_scaling, inv_freq, spec_of
    spec = spec_of(**_params(call))
    digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:8]
    name = f"INV_FREQ_{head_dim}_{digest}"
    values = [float(v) for v in inv_freq(spec, head_dim)]
    return f"{name}, {attention_scaling(spec)!r}", {name: values}


def rope(call, arg: Arg) -> Emitted:
    (x,), (out,) = call.inputs, call.outputs
    dims = ", ".join(map(str, x.shape))
    freqs, tables = _rope_args(call, x.shape[-1])
    return Emitted([f"st = rope_fwd_{_k(call)}({arg(out)}, {arg(x)}, {dims}, {freqs}, threads)"],
                   tables=tables)


def rope_bwd(call, arg: Arg) -> Emitted:
    (dy,), (dx,) = call.inputs, call.outputs
    dims = ", ".join(map(str, dy.shape))
    freqs, tables = _rope_args(call, dy.shape[-1])
    return Emitted([f"st = rope_bwd_{_k(call)}({arg(dx)}, {arg(dy)}, {dims}, {freqs}, threads)"],
                   tables=tables)


def swiglu(call, arg: Arg) -> Emitted:
    (gate, up), (out,) = call.inputs, call.outputs
    return Emitted([f"st = swiglu_fwd_{_k(call)}({arg(out)}, {arg(gate)}, {arg(up)}, "
                    f"{_size(gate)}, threads)"])


def swiglu_bwd(call, arg: Arg) -> Emitted:
    (gate, up, dy), (dgate, dup) = call.inputs, call.outputs
    return Emitted([f"st = swiglu_bwd_{_k(call)}({arg(dgate)}, {arg(dup)}, {arg(dy)}, "
                    f"{arg(gate)}, {arg(up)}, {_size(gate)}, threads)"])


def embedding(call, arg: Arg) -> Emitted:
    (table, ids), (out,) = call.inputs, call.outputs
    return Emitted([f"st = embedding_fwd_{_k(call)}({arg(out)}, {arg(ids)}, {arg(table)}, "
                    f"{_size(ids)}, {table.shape[0]}, {table.shape[1]}, threads)"])


def embedding_bwd(call, arg: Arg) -> Emitted:
    (ids, dy), (dtable,) = call.inputs, call.outputs
    return _accumulating(call, arg, 0, lambda target: (
        f"st = embedding_bwd_{_k(call)}({target}, {arg(dy)}, {arg(ids)}, {_size(ids)}, "
        f"{dtable.shape[0]}, {dtable.shape[1]}, threads)"))


def cross_entropy(call, arg: Arg) -> Emitted:
    """The IR's loss is the mean of the kernel's per-token losses (kept in SCR)."""
    (h, w, targets), (loss, lse) = call.inputs, call.outputs
    n = _size(targets)
    return Emitted([f"st = crossentropy_fwd_{_k(call)}(SCR, {arg(lse)}, {arg(h)}, {arg(w)}, "
                    f"{arg(targets)}, {n}, {w.shape[0]}, {w.shape[1]}, {CE_CHUNK}, threads)",
                    f"if st == 0: st = rt_mean_into({arg(loss)}, SCR, {n})"], n)


def cross_entropy_bwd(call, arg: Arg) -> Emitted:
    """d loss / d loss[n] = dloss / N for every token (SCR[0:N]); dw staged after it."""
    (h, w, targets, lse, dloss), (dh, _) = call.inputs, call.outputs
    n = _size(targets)
    return _accumulating(call, arg, 1, lambda dw: (
        f"st = crossentropy_bwd_{_k(call)}({arg(dh)}, {dw}, {arg(h)}, {arg(w)}, "
        f"{arg(targets)}, {arg(lse)}, SCR, {n}, {w.shape[0]}, {w.shape[1]}, "
        f"{CE_CHUNK}, threads)"), before=(f"st = rt_spread({arg(dloss)}, SCR, {n})",), at=n)


# zb1's halves of cross_entropy_bwd (NOTE [split logits gradient]): B keeps G in `g`
def cross_entropy_bwd_input(call, arg: Arg) -> Emitted:
    (h, w, targets, lse, dloss), (dh, g) = call.inputs, call.outputs
    n = _size(targets)
    return Emitted([f"st = rt_spread({arg(dloss)}, SCR, {n})",
                    f"st = crossentropy_bwd_input_{_k(call)}({arg(dh)}, {arg(g)}, {arg(h)}, "
                    f"{arg(w)}, {arg(targets)}, {arg(lse)}, SCR, {n}, {w.shape[0]}, "
                    f"{w.shape[1]}, {CE_CHUNK}, threads)"], n)


def cross_entropy_bwd_weight(call, arg: Arg) -> Emitted:
    (h, g), (dw,) = call.inputs, call.outputs
    return _accumulating(call, arg, 0, lambda target: (
        f"st = crossentropy_bwd_weight_{_k(call)}({target}, {arg(g)}, {arg(h)}, "
        f"{_rows(h.shape)}, {dw.shape[0]}, {dw.shape[1]}, {CE_CHUNK}, threads)"))


def add(call, arg: Arg) -> Emitted:
    (a, b), (out,) = call.inputs, call.outputs
    if not (a.shape == b.shape == out.shape and a.dtype == b.dtype == out.dtype):
        raise NotImplementedError("add with broadcasting or mixed dtypes")
    return Emitted([f"st = rt_add_{_k(call)}({arg(out)}, {arg(a)}, {arg(b)}, {_size(out)})"])


def reshape(call, arg: Arg) -> Emitted:
    (x,), (out,) = call.inputs, call.outputs
    nbytes = _size(x) * ITEMSIZE[x.dtype]
    return Emitted([f"memmove({arg(out)}, {arg(x)}, {nbytes})"])


def copy(call, arg: Arg) -> Emitted:
    return reshape(call, arg)


def accumulate_grad(call, arg: Arg) -> Emitted:
    """target f32 (=|+=) value (f32 or f16)."""
    (value,), (target,) = call.inputs, call.outputs
    mode = "set" if _params(call)["first"] else "add"
    return Emitted([f"st = rt_accumulate_{mode}_{SUFFIX[value.dtype]}({arg(target)}, "
                    f"{arg(value)}, {_size(value)})"])


EMITTERS: dict[str, Callable[[object, Arg], Emitted]] = {
    "matmul": matmul, "matmul_bias": matmul_bias, "matmul_bwd": matmul_bwd,
    "matmul_bias_bwd": matmul_bias_bwd, "matmul_bwd_input": matmul_bwd_input,
    "matmul_bwd_weight": matmul_bwd_weight, "matmul_bias_bwd_weight": matmul_bias_bwd_weight,
    "attention": attention, "attention_bwd": attention_bwd,
    "rms_norm": rms_norm, "rms_norm_bwd": rms_norm_bwd, "rope": rope, "rope_bwd": rope_bwd,
    "swiglu": swiglu, "swiglu_bwd": swiglu_bwd, "embedding": embedding,
    "embedding_bwd": embedding_bwd, "cross_entropy": cross_entropy,
    "cross_entropy_bwd": cross_entropy_bwd, "cross_entropy_bwd_input": cross_entropy_bwd_input,
    "cross_entropy_bwd_weight": cross_entropy_bwd_weight, "add": add, "reshape": reshape,
    "copy": copy, "accumulate_grad": accumulate_grad,
}


def emit_call(call, arg: Arg) -> Emitted | None:
    """The call's lines, or None when it has no native template (it runs in Python)."""
    emitter = EMITTERS.get(call.op)
    if emitter is None or any(not hasattr(x, "buffer") or x.dtype not in C_TYPES
                              for x in (*call.inputs, *call.outputs)):
        return None
    try:
        return emitter(call, arg)
    except NotImplementedError:
        return None
