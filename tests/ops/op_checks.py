"""Numerical checks shared by the op tests: VJP dot-product test in float64, numpy vs
jax.numpy references, and jax.grad through the custom_vjp vs the pure jnp reference.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ratrain.ir.rules import lookup_rule


def as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def is_float(a):
    return np.issubdtype(np.asarray(a).dtype, np.floating)


def diff_positions(rule, inputs):
    return [i for i in range(len(inputs)) if i not in rule.nondiff]


def _with(inputs, positions, values):
    full = list(inputs)
    for i, a in zip(positions, values):
        full[i] = a
    return full


def vjp_dot_gap(name, inputs, params, seed=0):
    """<J u, v> and <u, J^T v> (float64): Ju by jax.jvp of the jnp reference, J^T v by
    the rule's bwd under numpy."""
    rule, rng = lookup_rule(name), np.random.default_rng(seed)
    x64 = [a.astype(np.float64) if is_float(a) else a for a in inputs]
    diff = diff_positions(rule, x64)
    u = [rng.standard_normal(x64[i].shape) for i in diff]
    with jax.enable_x64(True):
        f = lambda *d: as_tuple(rule.fwd(jnp, *_with(x64, diff, d), **params))[:rule.n_visible]
        jvp = jax.jit(lambda d, t: jax.jvp(f, d, t)[1])     # one compile, not per-op
        ju = jvp(tuple(jnp.asarray(x64[i]) for i in diff),
                 tuple(jnp.asarray(t) for t in u))
        ju = [np.asarray(t) for t in ju]
    outputs = as_tuple(rule.fwd(np, *x64, **params))
    v = [rng.standard_normal(np.shape(o)) for o in outputs[:rule.n_visible]]
    jtv = rule.bwd(np, *rule.residuals(x64, outputs), *v, **params)
    lhs = sum(float(np.sum(a * b)) for a, b in zip(ju, v))
    rhs = sum(float(np.sum(a * b)) for a, b in zip(u, jtv))
    assert all(np.shape(g) == x64[i].shape for g, i in zip(jtv, diff))
    return lhs, rhs


def numpy_vs_jax(name, inputs, params):
    """All outputs (hidden ones too) of the reference under numpy and under jax.numpy."""
    rule = lookup_rule(name)
    out_np = as_tuple(rule.fwd(np, *inputs, **params))
    reference = jax.jit(lambda *a: as_tuple(rule.fwd(jnp, *a, **params)))
    out_jx = reference(*[jnp.asarray(a) for a in inputs])
    return [np.asarray(a) for a in out_np], [np.asarray(b) for b in out_jx]


def grads_vs_reference(name, user_fn, inputs, params, seed=1):
    """jax.grad of <user_fn(inputs), v> through the custom_vjp, and of the pure jnp
    reference; returns both gradient tuples (differentiable inputs only)."""
    rule, rng = lookup_rule(name), np.random.default_rng(seed)
    diff = diff_positions(rule, inputs)
    visible = as_tuple(rule.fwd(np, *inputs, **params))[0]
    v = jnp.asarray(rng.standard_normal(np.shape(visible)).astype(np.float32))
    def through_op(*d):
        return jnp.sum(user_fn(*_with(inputs, diff, d)) * v)
    def through_reference(*d):
        return jnp.sum(as_tuple(rule.fwd(jnp, *_with(inputs, diff, d), **params))[0] * v)
    args = tuple(jnp.asarray(inputs[i]) for i in diff)
    argnums = tuple(range(len(diff)))
    got = jax.jit(jax.grad(through_op, argnums=argnums))(*args)
    want = jax.jit(jax.grad(through_reference, argnums=argnums))(*args)
    return [np.asarray(g) for g in got], [np.asarray(w) for w in want]
