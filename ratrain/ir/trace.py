"""Tracing: a JAX layer function -> LayerGraph, via jax.make_jaxpr on abstract shapes.

Coarse ops arrive as their own primitives (wrapped in custom_vjp calls, which are inlined);
plain jax.lax primitives map through `ratrain.ir.lax_rules`. Anything else is rejected with
the primitive's name and the user's source line. No parameter memory is ever allocated.
"""
from __future__ import annotations

import jax
import jax.extend.core
import numpy as np
from jax._src import source_info_util

import ratrain.ir.lax_rules  # noqa: F401  (registers the lax rules)
from ratrain.ir.graph import LayerGraph, Literal, Node, Var, make_params
from ratrain.ir.rules import lookup_rule

# Primitives whose body is inlined: the body is what the layer computes.
_INLINED = {"custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
            "custom_jvp_call": "call_jaxpr", "pjit": "jaxpr", "jit": "jaxpr",
            "closed_call": "call_jaxpr", "remat": "jaxpr", "checkpoint": "jaxpr"}


class UnsupportedPrimitive(TypeError):
    """A model used a JAX primitive that ratrain has no rule for."""


def trace_layer(fn, name: str, param_names, param_avals, input_names, input_avals) -> LayerGraph:
    """Trace fn(weights: dict[local name, array], *inputs) into a LayerGraph."""
    n = len(param_names)

    def flat_fn(*flat):
        return fn(dict(zip(param_names, flat[:n])), *flat[n:])

    closed = jax.make_jaxpr(flat_fn)(*param_avals, *input_avals)
    env: dict = {}
    params = tuple(_bind_new(env, v) for v in closed.jaxpr.invars[:n])
    inputs = tuple(_bind_new(env, v) for v in closed.jaxpr.invars[n:])
    nodes: list[Node] = []
    _check_consts(closed, name)
    _convert(closed.jaxpr, env, nodes)
    outputs = tuple(_read(env, v) for v in closed.jaxpr.outvars)
    output_names = ("out",) if len(outputs) == 1 else tuple(f"out{i}" for i in range(len(outputs)))
    return LayerGraph(name, params, tuple(param_names), inputs, tuple(input_names),
                      tuple(nodes), outputs, output_names)


def _bind_new(env: dict, jax_var) -> Var:
    aval = jax_var.aval
    env[jax_var] = Var(np.dtype(aval.dtype).name, tuple(int(d) for d in aval.shape))
    return env[jax_var]


def _read(env: dict, atom):
    if isinstance(atom, jax.extend.core.Literal):
        value = np.asarray(atom.val)
        return Literal(value.item(), value.dtype.name)
    return env[atom]


def _check_consts(closed, name: str) -> None:
    if closed.consts:
        shapes = [np.shape(c) for c in closed.consts]
        raise TypeError(f"{name}: the layer function captures array constants {shapes}; "
                        "pass them as parameters or compute them inside a ratrain op")


def _convert(jaxpr, env: dict, nodes: list) -> None:
    for eqn in jaxpr.eqns:
        inputs = [_read(env, v) for v in eqn.invars]
        prim = eqn.primitive.name
        if prim in _INLINED:
            outputs = _inline(eqn, _INLINED[prim], inputs, nodes)
        else:
            node = _to_node(eqn, prim, inputs)
            nodes.append(node)
            outputs = node.outputs
        for jax_var, value in zip(eqn.outvars, outputs):
            env[jax_var] = value


def _inline(eqn, key: str, inputs, nodes) -> list:
    body = eqn.params[key]
    closed = body if hasattr(body, "jaxpr") else jax.extend.core.ClosedJaxpr(body, ())
    _check_consts(closed, eqn.primitive.name)
    sub_env = dict(zip(closed.jaxpr.invars, inputs[len(inputs) - len(closed.jaxpr.invars):]))
    _convert(closed.jaxpr, sub_env, nodes)
    return [_read(sub_env, v) for v in closed.jaxpr.outvars]


def _to_node(eqn, prim: str, inputs) -> Node:
    rule = lookup_rule(prim)
    source = source_info_util.summarize(eqn.source_info)
    if rule is None:
        raise UnsupportedPrimitive(
            f"unsupported JAX primitive '{prim}' at {source}: ratrain has no rule for it; "
            "write the computation with ratrain.ops or the lax primitives in "
            "ratrain/ir/lax_rules.py")
    params = eqn.params
    if rule.keep_params is not None:
        params = {k: params.get(k) for k in rule.keep_params}
    outputs = tuple(Var(np.dtype(v.aval.dtype).name, tuple(int(d) for d in v.aval.shape))
                    for v in eqn.outvars)
    return Node(prim, tuple(inputs), outputs, make_params(params), source)
