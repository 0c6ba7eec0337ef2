"""The verifier accepts traced graphs and rejects each broken invariant by name."""
from dataclasses import replace

import jax
import numpy as np
import pytest

from ratrain import ops
from ratrain.ir.graph import Var
from ratrain.ir.trace import trace_layer
from ratrain.ir.verify import VerifyError, verify_graph

H = jax.ShapeDtypeStruct((2, 3, 8), np.float32)
W = jax.ShapeDtypeStruct((8,), np.float32)


@pytest.fixture
def graph():
    def layer(w, h):
        return ops.rms_norm(h, w["norm.weight"], eps=1e-5) + h
    return trace_layer(layer, "toy fwd", ("norm.weight",), (W,), ("h",), (H,))


def test_traced_graph_verifies(graph):
    verify_graph(graph)


def test_unknown_op(graph):
    nodes = (replace(graph.nodes[0], op="frobnicate"),) + graph.nodes[1:]
    with pytest.raises(VerifyError, match="op 'frobnicate' has no rule"):
        verify_graph(replace(graph, nodes=nodes))


def test_use_before_definition(graph):
    with pytest.raises(VerifyError, match="before it is defined"):
        verify_graph(replace(graph, nodes=graph.nodes[::-1]))


def test_double_assignment(graph):
    first = graph.nodes[0]
    again = replace(graph.nodes[1], outputs=(first.outputs[0],))
    with pytest.raises(VerifyError, match="assigned twice"):
        verify_graph(replace(graph, nodes=(first, again)))


def test_wrong_output_shape(graph):
    add = graph.nodes[-1]
    bad = replace(add, outputs=(Var("float32", (2, 3, 9)),))
    with pytest.raises(VerifyError, match="rule gives"):
        verify_graph(replace(graph, nodes=graph.nodes[:-1] + (bad,), outputs=bad.outputs))


def test_undefined_output(graph):
    with pytest.raises(VerifyError, match="never defined"):
        verify_graph(replace(graph, outputs=(Var("float32", (1,)),)))
