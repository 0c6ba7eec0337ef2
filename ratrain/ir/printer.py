"""The one canonical text form of a LayerGraph, in the style of a jaxpr.

Parameters print under their local HF names, every other value gets a letter name in
order of first appearance, params are sorted, and nothing depends on ids or addresses,
so the text is deterministic and serves as the golden format of tests.
"""
from __future__ import annotations

from ratrain.ir.graph import LayerGraph, Literal, Node, Var


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
