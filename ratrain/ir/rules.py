"""Per-op rule tables: the facts passes look up instead of branching on op names.

A rule says how an op computes (an array-API reference usable with numpy or jax.numpy),
how it differentiates (which backward op, which residuals), and what it costs. Coarse ops
register theirs in `ratrain.ops`; the plain lax primitives the tracer maps register theirs
in `ratrain.ir.lax_rules`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class OpRule:
    name: str                           # IR op name, e.g. "rms_norm"
    fwd: Callable                       # fwd(xp, *inputs, **params) -> output(s)
    bwd: Callable | None                # bwd(xp, *residuals, *cts, **params) -> input cts
    n_visible: int = 1                  # outputs the user sees; the rest feed bwd only
    residuals: Callable | None = None   # (inputs, outputs) -> saved values
    nondiff: tuple[int, ...] = ()       # input positions with no cotangent (ids, targets)
    flops: Callable | None = None       # (in_shapes, out_shapes, **params) -> int
    kernel: str | None = None           # native kernel family that runs it
    bwd_flops: Callable | None = None   # (fwd in_shapes, fwd out_shapes, **params) -> int
    vjp: Callable | None = None         # lax ops: (builder, node, cts) -> input cts
    keep_params: tuple[str, ...] | None = None  # lax ops: jaxpr params the IR keeps


_RULES: dict[str, OpRule] = {}


def register_rule(rule: OpRule) -> None:
    _RULES[rule.name] = rule


def lookup_rule(name: str) -> OpRule | None:
    """The rule of `name`; `<op>_bwd` of a coarse op runs that op's backward reference."""
    if name in _RULES:
        return _RULES[name]
    base = _RULES.get(name.removesuffix("_bwd")) if name.endswith("_bwd") else None
    if base is None or base.bwd is None:
        return None
    # Costs of a backward are estimated from its forward node (see ratrain.ir.costs).
    return OpRule(name=name, fwd=base.bwd, bwd=None, kernel=base.kernel)
