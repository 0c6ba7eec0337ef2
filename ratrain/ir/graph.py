"""LayerGraph IR: typed SSA over coarse ops, one graph per layer kind and direction.

Values are `Var`s (dtype + shape, identity by id; names are given only when printing) or
`Literal` scalars. A `Node` applies one op (looked up in the rule tables) to values. Graphs
are frozen: passes build new ones (`dataclasses.replace`), never mutate.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
               "int32": "i32", "int64": "i64", "bool": "bool"}

_ids = itertools.count()


@dataclass(frozen=True)
class Var:
    dtype: str                          # numpy dtype name: "float32", "float16", "int32"
    shape: tuple[int, ...]              # static shape
    id: int = field(default_factory=lambda: next(_ids))  # identity; never printed

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def type_str(self) -> str:
        return f"{DTYPE_SHORT.get(self.dtype, self.dtype)}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Literal:
    value: float | int                  # a scalar constant
    dtype: str                          # numpy dtype name

    shape = ()

    def type_str(self) -> str:
        return DTYPE_SHORT.get(self.dtype, self.dtype) + "[]"


Value = Var | Literal


@dataclass(frozen=True)
class Node:
    op: str                             # rule-table name: "matmul", "rms_norm_bwd", "add"
    inputs: tuple[Value, ...]           # operands, in the rule's order
    outputs: tuple[Var, ...]            # results (a coarse op may have hidden ones, e.g. lse)
    params: tuple[tuple[str, object], ...] = ()   # sorted (name, value) pairs
    source: str = field(default="", compare=False)  # user source line, for errors

    @property
    def param_dict(self) -> dict:
        return dict(self.params)


@dataclass(frozen=True, eq=False)  # identity: graphs are compared by their text
class LayerGraph:
    name: str                           # "decoder fwd", "head bwd"
    params: tuple[Var, ...]             # parameter views, in `param_names` order
    param_names: tuple[str, ...]        # local HF names ("self_attn.q_proj.weight")
    inputs: tuple[Var, ...]             # activations, ids, residuals, cotangents
    input_names: tuple[str, ...]        # role of each input ("h", "ids", "res3", "ct:h")
    nodes: tuple[Node, ...]             # in execution order
    outputs: tuple[Value, ...]          # results
    output_names: tuple[str, ...]       # role of each output ("h", "loss", "grad:...")

    def __str__(self) -> str:
        from ratrain.ir.printer import format_graph
        return format_graph(self)

    def output(self, name: str) -> Value:
        return self.outputs[self.output_names.index(name)]


def make_params(pairs) -> tuple[tuple[str, object], ...]:
    """Canonical (sorted, hashable) params from a dict or pairs."""
    items = pairs.items() if isinstance(pairs, dict) else pairs
    return tuple(sorted((k, _hashable(v)) for k, v in items))


def _hashable(v):
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, np.dtype) or (isinstance(v, type) and issubclass(v, np.generic)):
        return np.dtype(v).name
    if isinstance(v, np.generic):
        return v.item()
    return v
