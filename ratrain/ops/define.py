"""Defining a coarse op: one JAX primitive for the forward, one for the backward, a
custom_vjp tying them together, and the rule-table entry the compiler reads.

Every coarse op is written once, as an array-API reference `fwd(xp, *inputs, **params)`
that runs under both `jax.numpy` (lowering of the primitive, the `jax.grad` oracle) and
`numpy` (the IR interpreter). Because the op is a real primitive, `jax.make_jaxpr` of a
model shows it as one equation with its params (`rms_norm[eps=1e-05] a b`), which is what
`ratrain.ir.trace` maps to an IR node.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import mlir

from ratrain.ir.rules import OpRule, register_rule


def _frozen(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def _make_primitive(name: str, ref: Callable) -> Primitive:
    """A multiple-result primitive whose meaning is `ref` under jax.numpy."""
    prim = Primitive(name)
    prim.multiple_results = True

    def as_tuple(out):
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def impl(*args, **params):
        return as_tuple(ref(jnp, *args, **params))

    def abstract_eval(*avals, **params):
        shapes = jax.eval_shape(lambda *a: impl(*a, **params), *avals)
        return [jax.core.ShapedArray(s.shape, s.dtype) for s in shapes]

    @functools.lru_cache(maxsize=None)
    def compiled(frozen: tuple) -> Callable:
        # one jit per params: a fresh partial per call would retrace every eager call
        return jax.jit(functools.partial(impl, **dict(frozen)))

    prim.def_impl(lambda *a, **p: compiled(_frozen(p))(*a))
    prim.def_abstract_eval(abstract_eval)
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=True))
    return prim


def define_op(name: str, *, fwd: Callable, bwd: Callable, n_visible: int = 1,
              residuals: Callable, nondiff: tuple[int, ...] = (),
              flops: Callable | None = None, bwd_flops: Callable | None = None,
              kernel: str | None = None) -> Callable:
    """Register coarse op `name` and return the user-facing JAX function.

    fwd(xp, *inputs, **params) -> outputs (tuple, or one array). The first `n_visible`
        outputs are what the user sees; the rest are saved for backward only (e.g. lse).
    bwd(xp, *residuals, *cotangents_of_visible_outputs, **params) -> one cotangent per
        differentiable input (inputs whose index is not in `nondiff`, in order).
    residuals(inputs, outputs) -> the values saved for backward, picked from the op's
        own inputs and outputs (so the IR knows exactly which buffers stay alive).
    flops(in_shapes, out_shapes, **params) -> int, for the cost model.
    bwd_flops(in_shapes, out_shapes, **params) -> int: FLOPs of the backward op, given
        the forward op's shapes (recomputation inside backward included).
    """
    fwd_p = _make_primitive(name, fwd)
    bwd_p = _make_primitive(name + "_bwd", bwd)

    @functools.lru_cache(maxsize=None)
    def vjp_function(n_inputs: int, frozen: tuple) -> Callable:
        params = dict(frozen)

        @jax.custom_vjp
        def op(*inputs):
            return _visible(fwd_p.bind(*inputs, **params))

        def op_fwd(*inputs):
            outputs = fwd_p.bind(*inputs, **params)
            return _visible(outputs), tuple(residuals(inputs, outputs))

        def op_bwd(saved, cotangent):
            cts = cotangent if n_visible > 1 else (cotangent,)
            grads = iter(bwd_p.bind(*saved, *cts, **params))
            return tuple(None if i in nondiff else next(grads) for i in range(n_inputs))

        op.defvjp(op_fwd, op_bwd)
        return op

    def _visible(outputs):
        return outputs[0] if n_visible == 1 else tuple(outputs[:n_visible])

    def user_op(*inputs, **params):
        return vjp_function(len(inputs), _frozen(params))(*inputs)

    user_op.__name__ = name
    register_rule(OpRule(name=name, fwd=fwd, bwd=bwd, n_visible=n_visible,
                         residuals=residuals, nondiff=nondiff, flops=flops,
                         bwd_flops=bwd_flops, kernel=kernel))
    return user_op
