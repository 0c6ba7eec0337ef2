"""Per-layer costs read off the traced graphs: FLOPs, parameter and activation bytes.

FLOPs come from each op's rule. Backward FLOPs: a coarse op's rule gives them from the
forward shapes (`bwd_flops`, else twice the forward); lax nodes of the backward graph are
counted where they stand.
Activation bytes are the residuals one micro-batch leaves alive between F and B.
"""
from __future__ import annotations

from dataclasses import dataclass

from ratrain.ir.graph import LayerGraph
from ratrain.ir.rules import lookup_rule


@dataclass(frozen=True)
class LayerCost:
    fwd_flops: int                      # one micro-batch forward
    bwd_flops: int                      # one micro-batch backward
    param_bytes: int                    # parameters in the compute dtype
    residual_bytes: int                 # activations kept from F to B, one micro-batch
    output_bytes: int                   # what F sends on (the pipeline message size)
    weight_flops: int = 0               # the part of bwd_flops a zb1 W runs (NOTE [B/W
                                        # split]); B runs the rest


def node_flops(node) -> int:
    """FLOPs of one node by its rule; coarse `<op>_bwd` nodes have no rule of their own."""
    rule = lookup_rule(node.op)
    if rule is None or rule.flops is None:
        return 0
    ins = [tuple(x.shape) for x in node.inputs]
    outs = [tuple(o.shape) for o in node.outputs]
    return int(rule.flops(ins, outs, **node.param_dict))


def graph_flops(graph: LayerGraph) -> int:
    return sum(node_flops(n) for n in graph.nodes)


def coarse_bwd_flops(node) -> int:
    """Backward FLOPs of a coarse forward node, from its forward shapes."""
    rule = lookup_rule(node.op)
    if rule.bwd_flops is None:
        return 2 * node_flops(node)
    return int(rule.bwd_flops([tuple(x.shape) for x in node.inputs],
                              [tuple(o.shape) for o in node.outputs], **node.param_dict))


def layer_cost(kind) -> LayerCost:
    """Costs of one layer of `kind` (a LayerKind) on one micro-batch."""
    coarse = sum(coarse_bwd_flops(n) for n in kind.fwd.nodes if lookup_rule(n.op).vjp is None)
    return LayerCost(graph_flops(kind.fwd), coarse + graph_flops(kind.bwd),
                     sum(p.nbytes for p in kind.fwd.params),
                     sum(r.nbytes for r in kind.residuals),
                     sum(o.nbytes for o in kind.fwd.outputs),
                     graph_flops(kind.split.weight_part))
