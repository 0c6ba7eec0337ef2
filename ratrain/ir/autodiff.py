"""Reverse-mode autodiff of a forward LayerGraph into its backward LayerGraph.

Coarse ops differentiate into one `<op>_bwd` node fed by the residuals their rule names;
lax ops emit small VJP graphs from `lax_rules`. The result says exactly which forward
values the backward reads (the residual list): that is what activation memory, recovery
and recompute are about.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ratrain.ir.graph import (LayerGraph, Literal, Node, Var, cotangent_role, grad_role,
                              make_params, role)
from ratrain.ir.rules import lookup_rule


def is_float(value) -> bool:
    # bfloat16 (ml_dtypes) is floating point but not a numpy np.floating subtype
    return value.dtype == "bfloat16" or np.issubdtype(np.dtype(value.dtype), np.floating)


@functools.lru_cache(maxsize=4096)
def _abstract_eval(op: str, signature: tuple, params: tuple) -> tuple:
    rule = lookup_rule(op)
    args = [np.asarray(0, dtype) if lit else jax.ShapeDtypeStruct(shape, dtype)
            for lit, dtype, shape in signature]
    out = jax.eval_shape(lambda *a: rule.fwd(jnp, *a, **dict(params)), *args)
    out = out if isinstance(out, (tuple, list)) else (out,)
    return tuple((np.dtype(o.dtype).name, tuple(o.shape)) for o in out)


def output_types(op: str, inputs, params: tuple) -> tuple:
    """(dtype, shape) of each output of `op` on `inputs`, from its reference."""
    signature = tuple((isinstance(x, Literal), x.dtype, tuple(x.shape)) for x in inputs)
    return _abstract_eval(op, signature, params)


class Builder:
    """Appends nodes whose output types come from the op's own reference."""

    def __init__(self):
        self.nodes: list[Node] = []

    def emit(self, op: str, *inputs, **params) -> tuple[Var, ...]:
        frozen = make_params(params)
        outputs = tuple(Var(d, s) for d, s in output_types(op, inputs, frozen))
        self.nodes.append(Node(op, tuple(inputs), outputs, frozen))
        return outputs

    def emit1(self, op: str, *inputs, **params) -> Var:
        return self.emit(op, *inputs, **params)[0]

    def zeros_like(self, var: Var) -> Var:
        return self.emit1("zeros", shape=var.shape, dtype=var.dtype)


def _coarse_vjp(b: Builder, node: Node, cts) -> tuple:
    rule = lookup_rule(node.op)
    saved = tuple(rule.residuals(node.inputs, node.outputs))
    visible = [ct if ct is not None else b.zeros_like(out)
               for ct, out in zip(cts[:rule.n_visible], node.outputs)]
    grads = iter(b.emit(node.op + "_bwd", *saved, *visible, **node.param_dict))
    return tuple(None if i in rule.nondiff else next(grads) for i in range(len(node.inputs)))


def _node_vjp(b: Builder, node: Node, cts) -> tuple:
    rule = lookup_rule(node.op)
    if rule.vjp is not None:
        return rule.vjp(b, node, cts)
    if rule.bwd is None:
        raise NotImplementedError(f"op '{node.op}' has no VJP rule ({node.source})")
    return _coarse_vjp(b, node, cts)


def _backpropagate(fwd: LayerGraph, b: Builder, seeds: dict) -> dict:
    cts = dict(seeds)
    for node in reversed(fwd.nodes):
        out_cts = [cts.get(o.id) for o in node.outputs]
        if all(ct is None for ct in out_cts):
            continue
        for x, ct in zip(node.inputs, _node_vjp(b, node, out_cts)):
            if ct is None or isinstance(x, Literal) or not is_float(x):
                continue
            cts[x.id] = b.emit1("add", cts[x.id], ct) if x.id in cts else ct
    return cts


def differentiate(fwd: LayerGraph) -> tuple[LayerGraph, tuple[Var, ...]]:
    """The backward graph of `fwd` and the forward values it reads (residuals).

    Backward inputs: residuals (named after the forward input they are, else `resK`),
    then one cotangent per float forward output (`ct:<role>`). Backward outputs: one
    cotangent per float forward input (`ct:<role>`), then one gradient per parameter
    (`grad:<name>`): see NOTE [value roles] (ir/graph.py). Parameters are read directly,
    never saved as residuals.
    """
    b = Builder()
    out_cts = {o.id: Var(o.dtype, o.shape) for o in fwd.outputs if is_float(o)}
    cts = _backpropagate(fwd, b, out_cts)
    residuals = _residuals(fwd, b.nodes, {v.id for v in out_cts.values()})
    res_names = _residual_names(fwd, residuals)
    ct_in = [(cotangent_role(r), out_cts[o.id]) for o, r in zip(fwd.outputs, fwd.output_names)
             if o.id in out_cts]
    outs = [(cotangent_role(r), cts.get(x.id) or b.zeros_like(x))
            for x, r in zip(fwd.inputs, fwd.input_names) if is_float(x)]
    outs += [(grad_role(n), cts.get(p.id) or b.zeros_like(p))
             for p, n in zip(fwd.params, fwd.param_names)]
    bwd = LayerGraph(fwd.name.replace("fwd", "bwd"), fwd.params, fwd.param_names,
                     tuple(residuals) + tuple(v for _, v in ct_in),
                     tuple(res_names) + tuple(n for n, _ in ct_in), tuple(b.nodes),
                     tuple(v for _, v in outs), tuple(n for n, _ in outs))
    return bwd, tuple(residuals)


def _residuals(fwd: LayerGraph, bwd_nodes, cotangent_ids: set) -> list[Var]:
    produced = {o.id for n in bwd_nodes for o in n.outputs} | cotangent_ids
    params = {p.id for p in fwd.params}
    read = {x.id for n in bwd_nodes for x in n.inputs if isinstance(x, Var)}
    needed = read - produced - params
    in_fwd_order = list(fwd.inputs) + [o for n in fwd.nodes for o in n.outputs]
    return [v for v in in_fwd_order if v.id in needed]


def _residual_names(fwd: LayerGraph, residuals) -> list[str]:
    roles = {v.id: r for v, r in zip(fwd.inputs, fwd.input_names)}
    return [roles.get(v.id, role("residual", i)) for i, v in enumerate(residuals)]
