"""Which of a layer kind's forward values (residuals) survive from F to B under each
recovery policy, which forward nodes rebuild the dropped ones, and the FLOPs a rebuild
spends. insert_recovery chooses the policy per (layer, micro-batch); buffers sizes what is
kept, lower emits the rebuild, and the planner and the cost model estimate both.
"""
from __future__ import annotations

from functools import lru_cache

from ratrain.ir.costs import node_flops
from ratrain.ir.rules import lookup_rule


@lru_cache(maxsize=1024)
def kept_mask(kind, mode: str) -> tuple[bool, ...]:
    """Which of a layer kind's residuals survive from F to B under `mode`.

    none: all; full: only the layer's inputs; selective: as the next note says.

    NOTE [selective keeps what a GEMM made]: selective keeps the inputs and every residual
    whose rebuild would run a GEMM, so a REC recomputes only norms, RoPE, attention,
    SwiGLU and the like. A value computed from a GEMM output through cheap ops (reshape,
    RoPE, the residual add) counts as made by that GEMM: the GEMM output itself is often
    not a residual, so dropping the value would mean running the GEMM again.
    """
    inputs = {v.id for v in kind.fwd.inputs}
    if mode != "selective":
        return tuple(mode == "none" or r.id in inputs for r in kind.residuals)
    available = set(inputs)
    for r in kind.residuals:  # forward order: later values may rebuild from earlier kept ones
        if r.id not in available and any(_is_gemm(n) for n in
                                          nodes_rebuilding(kind.fwd, {r.id}, available)):
            available.add(r.id)
    return tuple(r.id in available for r in kind.residuals)


def _is_gemm(node) -> bool:
    return (lookup_rule(node.op).kernel or "") == "gemm"


def nodes_rebuilding(graph, targets: set, available: set) -> list:
    """NOTE [selective recovery]: the forward nodes that rebuild the values `targets`
    from the `available` ones, in graph order: walking backwards, a node is needed if it
    makes a target or a value a needed node reads that is not available (a kept
    residual is read, never recomputed)."""
    wanted, needed = set(targets), []
    for node in reversed(graph.nodes):
        if not any(o.id in wanted for o in node.outputs):
            continue
        needed.append(node)
        wanted |= {x.id for x in node.inputs if hasattr(x, "id") and x.id not in available}
    return needed[::-1]


@lru_cache(maxsize=1024)
def rebuild_node_indices(kind, mode: str) -> tuple[int, ...]:
    """Indices in `kind.fwd.nodes` of the nodes a rebuild under `mode` runs: those that
    remake the residuals `mode` drops from the ones it keeps (nodes_rebuilding), what a
    REC and a B recovering in backward lower to, and what the cost model charges them."""
    mask = kept_mask(kind, mode)
    dropped = {r.id for r, kept in zip(kind.residuals, mask) if not kept}
    kept = {r.id for r, k in zip(kind.residuals, mask) if k}
    needed = {id(n) for n in nodes_rebuilding(kind.fwd, dropped, kept)}
    return tuple(i for i, n in enumerate(kind.fwd.nodes) if id(n) in needed)


def recompute_flops(program, layer: int, micro_batch: int) -> int:
    """FLOPs a REC spends: the whole forward under full recompute; under selective only
    the non-GEMM ops (GEMM outputs are kept, see kept_mask)."""
    mode = program.recompute.get((layer, micro_batch), "full")
    kind = program.graph.kinds[program.graph.layers[layer].kind]
    return _forward_flops(kind.fwd, skip_gemm=mode == "selective")


@lru_cache(maxsize=64)
def _forward_flops(graph, skip_gemm: bool) -> int:
    return sum(node_flops(n) for n in graph.nodes
               if not (skip_gemm and _is_gemm(n)))
