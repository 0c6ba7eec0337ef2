"""Rules of the plain jax.lax primitives the tracer maps (add, mul, reshape, ...).

Each rule has an array-API reference (numpy or jax.numpy) and a VJP that emits IR nodes
through the autodiff builder: `vjp(b, node, cts) -> one cotangent (or None) per input`,
where `cts` holds one cotangent (or None) per output. Only the params listed in `keep`
survive tracing; the rest (shardings, weak types) carry no meaning here.
"""
from __future__ import annotations

import numpy as np

from ratrain.ir.graph import Literal
from ratrain.ir.rules import OpRule, register_rule


def _numel(in_shapes, out_shapes, **_):
    return int(np.prod(out_shapes[0], dtype=np.int64))


def _lax(name, fwd, vjp, keep=(), flops=_numel):
    register_rule(OpRule(name=name, fwd=fwd, bwd=None, vjp=vjp, keep_params=keep, flops=flops))


def _is_var(v) -> bool:
    return not isinstance(v, Literal)


def _fit(b, ct, x):
    """The cotangent of operand x. lax lets a scalar or a size-1 axis meet a full array
    (implicit broadcast), so the cotangent is summed back over those axes."""
    if not _is_var(x):
        return None
    if tuple(ct.shape) == tuple(x.shape):
        return ct
    padded = (1,) * (len(ct.shape) - len(x.shape)) + tuple(x.shape)
    axes = tuple(i for i, (n, m) in enumerate(zip(padded, ct.shape)) if n == 1 and m != 1)
    summed = b.emit1("reduce_sum", ct, axes=axes) if axes else ct
    return b.emit1("reshape", summed, new_sizes=tuple(x.shape))


# --- elementwise arithmetic -----------------------------------------------------------

def _vjp_add(b, node, cts):
    return tuple(_fit(b, cts[0], x) for x in node.inputs)


def _vjp_sub(b, node, cts):
    x, y = node.inputs
    return (_fit(b, cts[0], x), _fit(b, b.emit1("neg", cts[0]), y) if _is_var(y) else None)


def _vjp_mul(b, node, cts):
    x, y = node.inputs
    return (_fit(b, b.emit1("mul", cts[0], y), x) if _is_var(x) else None,
            _fit(b, b.emit1("mul", x, cts[0]), y) if _is_var(y) else None)


def _vjp_div(b, node, cts):
    x, y = node.inputs
    dx = b.emit1("div", cts[0], y)
    dy = b.emit1("neg", b.emit1("mul", dx, node.outputs[0])) if _is_var(y) else None
    return (_fit(b, dx, x), _fit(b, dy, y) if dy is not None else None)


def _vjp_neg(b, node, cts):
    return (b.emit1("neg", cts[0]),)


def _vjp_integer_pow(b, node, cts):
    x, = node.inputs
    y = node.param_dict["y"]
    if y == 0:
        return (None,)
    power = x if y == 2 else b.emit1("integer_pow", x, y=y - 1)
    scaled = b.emit1("mul", power, Literal(float(y), x.dtype))
    return (b.emit1("mul", cts[0], scaled),)


def _vjp_sqrt(b, node, cts):
    half = b.emit1("div", Literal(0.5, node.inputs[0].dtype), node.outputs[0])
    return (b.emit1("mul", cts[0], half),)


def _vjp_rsqrt(b, node, cts):
    x, = node.inputs
    # d/dx x^-1/2 = -1/2 * x^-1/2 / x
    factor = b.emit1("div", node.outputs[0], x)
    factor = b.emit1("mul", factor, Literal(-0.5, x.dtype))
    return (b.emit1("mul", cts[0], factor),)


def _vjp_exp(b, node, cts):
    return (b.emit1("mul", cts[0], node.outputs[0]),)


def _vjp_identity(b, node, cts):
    return (cts[0],)


def _rsqrt(xp, x):
    return 1 / xp.sqrt(x)


_lax("add", lambda xp, x, y: x + y, _vjp_add)
_lax("sub", lambda xp, x, y: x - y, _vjp_sub)
_lax("mul", lambda xp, x, y: x * y, _vjp_mul)
_lax("div", lambda xp, x, y: x / y, _vjp_div)
_lax("neg", lambda xp, x: -x, _vjp_neg)
_lax("integer_pow", lambda xp, x, *, y: x ** y, _vjp_integer_pow, keep=("y",))
_lax("sqrt", lambda xp, x: xp.sqrt(x), _vjp_sqrt)
_lax("rsqrt", _rsqrt, _vjp_rsqrt)
_lax("exp", lambda xp, x: xp.exp(x), _vjp_exp)
_lax("copy", lambda xp, x: x + 0, _vjp_identity, flops=lambda *a, **k: 0)
_lax("copy_p", lambda xp, x: x + 0, _vjp_identity, flops=lambda *a, **k: 0)


# --- dtype and layout ----------------------------------------------------------------

def _no_flops(*_, **__):
    return 0


def _convert(xp, x, *, new_dtype):
    return x.astype(new_dtype)


def _vjp_convert(b, node, cts):
    return (b.emit1("convert_element_type", cts[0], new_dtype=node.inputs[0].dtype),)


def _reshape(xp, x, *, new_sizes):
    return xp.reshape(x, new_sizes)


def _vjp_reshape(b, node, cts):
    return (b.emit1("reshape", cts[0], new_sizes=node.inputs[0].shape),)


def _transpose(xp, x, *, permutation):
    return xp.transpose(x, permutation)


def _vjp_transpose(b, node, cts):
    inverse = tuple(int(i) for i in np.argsort(node.param_dict["permutation"]))
    return (b.emit1("transpose", cts[0], permutation=inverse),)


def _squeeze(xp, x, *, dimensions):
    return xp.reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in dimensions))


def _broadcast_in_dim(xp, x, *, shape, broadcast_dimensions):
    expanded = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        expanded[dst] = x.shape[src]
    return xp.broadcast_to(xp.reshape(x, expanded), shape)


def _vjp_broadcast_in_dim(b, node, cts):
    x, = node.inputs
    if not _is_var(x):
        return (None,)
    params = node.param_dict
    dims = params["broadcast_dimensions"]
    summed = tuple(i for i in range(len(params["shape"]))
                   if i not in dims or x.shape[dims.index(i)] != params["shape"][i])
    ct = b.emit1("reduce_sum", cts[0], axes=summed) if summed else cts[0]
    return (b.emit1("reshape", ct, new_sizes=x.shape),)


def _reduce_sum(xp, x, *, axes):
    return xp.sum(x, axis=tuple(axes))


def _vjp_reduce_sum(b, node, cts):
    x, = node.inputs
    axes = node.param_dict["axes"]
    kept = tuple(i for i in range(len(x.shape)) if i not in axes)
    return (b.emit1("broadcast_in_dim", cts[0], shape=x.shape, broadcast_dimensions=kept),)


def _reduce_max(xp, x, *, axes):
    return xp.max(x, axis=tuple(axes))


_lax("convert_element_type", _convert, _vjp_convert, keep=("new_dtype",), flops=_no_flops)
_lax("reshape", _reshape, _vjp_reshape, keep=("new_sizes",), flops=_no_flops)
_lax("transpose", _transpose, _vjp_transpose, keep=("permutation",), flops=_no_flops)
_lax("squeeze", _squeeze, _vjp_reshape, keep=("dimensions",), flops=_no_flops)
_lax("broadcast_in_dim", _broadcast_in_dim, _vjp_broadcast_in_dim,
     keep=("shape", "broadcast_dimensions"), flops=_no_flops)
_lax("reduce_sum", _reduce_sum, _vjp_reduce_sum, keep=("axes",),
     flops=lambda ins, outs, **_: int(np.prod(ins[0], dtype=np.int64)))
_lax("reduce_max", _reduce_max, None, keep=("axes",))


# --- slicing ---------------------------------------------------------------------------

def _slice(xp, x, *, start_indices, limit_indices, strides):
    steps = strides or (1,) * len(start_indices)
    return x[tuple(slice(a, z, s) for a, z, s in zip(start_indices, limit_indices, steps))]


def _pad(xp, x, *, padding_config):
    lo_hi = [(lo, hi) for lo, hi, _ in padding_config]
    return xp.pad(x, lo_hi)


def _vjp_slice(b, node, cts):
    params = node.param_dict
    if params["strides"] not in (None,) and any(s != 1 for s in params["strides"]):
        raise NotImplementedError("strided slice has no VJP rule in ratrain yet")
    x, = node.inputs
    config = tuple((a, d - z, 0) for a, z, d in
                   zip(params["start_indices"], params["limit_indices"], x.shape))
    return (b.emit1("pad", cts[0], padding_config=config),)


def _vjp_pad(b, node, cts):
    x, = node.inputs
    config = node.param_dict["padding_config"]
    starts = tuple(lo for lo, _, _ in config)
    limits = tuple(lo + d for (lo, _, _), d in zip(config, x.shape))
    return (b.emit1("slice", cts[0], start_indices=starts, limit_indices=limits, strides=None),)


def _concatenate(xp, *xs, dimension):
    return xp.concatenate(xs, axis=dimension)


def _vjp_concatenate(b, node, cts):
    axis = node.param_dict["dimension"]
    out, offset, result = node.outputs[0], 0, []
    for x in node.inputs:
        start = tuple(offset if i == axis else 0 for i in range(len(out.shape)))
        limit = tuple(offset + x.shape[axis] if i == axis else d
                      for i, d in enumerate(out.shape))
        result.append(b.emit1("slice", cts[0], start_indices=start, limit_indices=limit,
                              strides=None) if _is_var(x) else None)
        offset += x.shape[axis]
    return tuple(result)


def _split(xp, x, *, sizes, axis):
    bounds = np.cumsum((0,) + tuple(sizes))
    index = lambda a, z: tuple(slice(a, z) if i == axis else slice(None)
                               for i in range(x.ndim))
    return tuple(x[index(a, z)] for a, z in zip(bounds[:-1], bounds[1:]))


def _vjp_split(b, node, cts):
    cts = tuple(ct if ct is not None else b.zeros_like(out)
                for ct, out in zip(cts, node.outputs))
    return (b.emit1("concatenate", *cts, dimension=node.param_dict["axis"]),)


def _zeros(xp, *, shape, dtype):
    return xp.zeros(shape, dtype=dtype)


_lax("slice", _slice, _vjp_slice, keep=("start_indices", "limit_indices", "strides"),
     flops=_no_flops)
_lax("pad", _pad, _vjp_pad, keep=("padding_config",), flops=_no_flops)
_lax("concatenate", _concatenate, _vjp_concatenate, keep=("dimension",), flops=_no_flops)
_lax("split", _split, _vjp_split, keep=("sizes", "axis"), flops=_no_flops)
_lax("zeros", _zeros, None, keep=("shape", "dtype"), flops=_no_flops)
