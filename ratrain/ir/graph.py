"""LayerGraph IR: typed SSA over coarse ops, one graph per layer kind and direction.

Values are `Var`s (dtype + shape, identity by id; names are given only when printing) or
`Literal` scalars. A `Node` applies one op (looked up in the rule tables) to values. Graphs
are frozen: passes build new ones (`dataclasses.replace`), never mutate. The text form
(format_graph, the golden format of tests) is at the end.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import ml_dtypes  # noqa: F401  (gives numpy the "bfloat16" dtype the IR names)
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
        return format_graph(self)

    def output(self, name: str) -> Value:
        return self.outputs[self.output_names.index(name)]


# ---- roles: the names of a LayerGraph's inputs and outputs -------------------------------
# NOTE [value roles]: a graph names each input and output by its role, built and read
# only through ROLE_FORMS (as ir/buffers.py's NAME_FORMS builds buffer names):
# 1. a forward graph's roles are the model's ("h", "ids", "targets", "loss");
# 2. a backward graph (ir/autodiff.py) reads residuals, named by their forward role or
#    `res<i>`, then `ct:<role>` of each float forward output; it writes `ct:<role>` of
#    each float forward input, then `grad:<name>` of each parameter;
# 3. zb1's weight part (ir/split_backward.py) reads the residuals B hands it as `res:<i>`
#    and the values it carries as `carried:<i>`.
ROLE_FORMS = {"cotangent": "ct:{of}", "grad": "grad:{of}", "residual": "res{of}",
              "handed": "res:{of}", "carried": "carried:{of}"}
HIDDEN = "h"                            # the hidden state a layer passes on


def role(form: str, of) -> str:
    """The role of `form` (ROLE_FORMS) of `of`: role("grad", "w") == "grad:w"."""
    return ROLE_FORMS[form].format(of=of)


def grad_role(param: str) -> str:
    """The backward output holding parameter `param`'s gradient."""
    return role("grad", param)


def cotangent_role(of: str) -> str:
    """The cotangent of the forward value of role `of`."""
    return role("cotangent", of)


HIDDEN_COTANGENT = cotangent_role(HIDDEN)   # the input gradient a stage sends back


def is_grad_role(name: str) -> bool:
    return name.startswith(role("grad", ""))


def is_cotangent_role(name: str) -> bool:
    return name.startswith(role("cotangent", ""))


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


# ---- text form ----------------------------------------------------------------------
# The one canonical text form of a LayerGraph, in the style of a jaxpr. Parameters print
# under their local HF names, every other value gets a letter name in order of first
# appearance, params are sorted, and nothing depends on ids or addresses, so the text is
# deterministic and serves as the golden format of tests (`str(graph)`).

def _letters(n: int) -> str:
    name = ""
    n += 1
    while n:
        n, r = divmod(n - 1, 26)
        name = chr(ord("a") + r) + name
    return name


class _Namer:
    def __init__(self, param_vars, param_names):
        self.names = {v.id: p for v, p in zip(param_vars, param_names)}
        self.count = 0

    def __call__(self, value) -> str:
        if isinstance(value, Literal):
            return f"{_format_scalar(value.value)}:{value.type_str()}"
        if value.id not in self.names:
            self.names[value.id] = _letters(self.count)
            self.count += 1
        return self.names[value.id]

    def typed(self, var: Var) -> str:
        return f"{self(var)}:{var.type_str()}"


def _format_scalar(x) -> str:
    return repr(float(x)) if isinstance(x, float) else str(x)


def format_param(value) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "(" + ",".join(format_param(v) for v in value) + ")"
    return str(value)


def format_node(node: Node, name) -> str:
    outs = " ".join(name.typed(v) for v in node.outputs)
    params = " ".join(f"{k}={format_param(v)}" for k, v in node.params)
    op = f"{node.op}[{params}]" if params else node.op
    args = " ".join(name(v) for v in node.inputs)
    return f"{outs} = {op} {args}".rstrip()


def format_graph(graph: LayerGraph) -> str:
    name = _Namer(graph.params, graph.param_names)
    lines = [f"{{ {graph.name}"]
    lines += [f"  param  {name.typed(v)}" for v in graph.params]
    lines += [f"  input  {role}={name.typed(v)}"
              for role, v in zip(graph.input_names, graph.inputs)]
    lines.append("  let")
    lines += ["    " + format_node(n, name) for n in graph.nodes]
    outs = " ".join(f"{role}={name(v)}" for role, v in zip(graph.output_names, graph.outputs))
    lines.append(f"  in ({outs}) }}")
    return "\n".join(lines)
