"""The LayerGraph verifier, run after tracing, autodiff and every pass in tests.

Invariants: every op has a rule; every value is assigned exactly once and defined before
it is read; every node's output types are what its rule computes on its input types;
every graph output is defined.
"""
from __future__ import annotations

from ratrain.ir.autodiff import output_types
from ratrain.ir.graph import LayerGraph, Literal, _Namer, format_node
from ratrain.ir.rules import lookup_rule


class VerifyError(ValueError):
    """A graph breaks an IR invariant; the message names the graph and the node."""


def verify_graph(graph: LayerGraph) -> None:
    name = _Namer(graph.params, graph.param_names)
    defined: set[int] = set()
    for var in graph.params + graph.inputs:
        _define(graph, defined, var, "an input")
    for node in graph.nodes:
        where = f"{graph.name}: `{format_node(node, name)}`"
        if lookup_rule(node.op) is None:
            raise VerifyError(f"{where}: op '{node.op}' has no rule")
        for x in node.inputs:
            if not isinstance(x, Literal) and x.id not in defined:
                raise VerifyError(f"{where}: reads a value before it is defined")
        _check_types(node, where)
        for var in node.outputs:
            _define(graph, defined, var, where)
    for x in graph.outputs:
        if not isinstance(x, Literal) and x.id not in defined:
            raise VerifyError(f"{graph.name}: an output is never defined")


def _define(graph: LayerGraph, defined: set, var, where: str) -> None:
    if var.id in defined:
        raise VerifyError(f"{graph.name}: a value is assigned twice ({where})")
    defined.add(var.id)


def _check_types(node, where: str) -> None:
    expected = output_types(node.op, node.inputs, node.params)
    actual = tuple((v.dtype, tuple(v.shape)) for v in node.outputs)
    if expected != actual:
        raise VerifyError(f"{where}: outputs {actual} but the rule gives {expected}")
