"""split_backward: a layer's backward graph as its input-gradient part (B) and its
weight-gradient part (W), the two halves a zb1 program runs as separate tasks.

Made once per layer kind from the graph autodiff produced (LayerKind.split). A coarse
GEMM backward (`matmul_bwd`, `matmul_bias_bwd`) becomes its two GEMMs: `matmul_bwd_input`
(dx = dy w) in B and `matmul_bwd_weight` / `matmul_bias_bwd_weight` (dw = dy^T x, the
bias's column sums) in W; the LM head's `cross_entropy_bwd` becomes
`cross_entropy_bwd_input` (the logits gradient G and dh = G w) in B and
`cross_entropy_bwd_weight` (dw = G^T h) in W; every other node goes to B when an input
cotangent needs it, else to W (NOTE [B/W split]).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ratrain.ir.graph import LayerGraph, Literal, Node, Var, is_cotangent_role, role
from ratrain.ir.rules import OpRule, register_rule


def _gemm(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def _input_flops(in_shapes, out_shapes, **params) -> int:
    (w, dy), (dx,) = in_shapes, out_shapes
    return _gemm(int(np.prod(dy[:-1])), w[1], w[0])


def _weight_flops(in_shapes, out_shapes, **params) -> int:
    x, dy = in_shapes
    return _gemm(int(np.prod(x[:-1])), x[-1], dy[-1])


CE_CHUNK = 4096   # vocabulary rows of logits the cross-entropy kernels hold at once


def _input_grad(xp, w, dy):
    return dy @ w


def _weight_grad(xp, x, dy):
    return dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])


def _weight_and_bias_grad(xp, x, dy):
    return _weight_grad(xp, x, dy), xp.sum(dy.reshape(-1, dy.shape[-1]), axis=0)


def _chunks(vocab: int):
    return [(v0, min(v0 + CE_CHUNK, vocab)) for v0 in range(0, vocab, CE_CHUNK)]


def head_logits(xp, h, w):
    """The LM head's logits [N, V] = h w^T in at least fp32 (h [..., C], w [V, C])."""
    dtype = xp.promote_types(h.dtype, xp.float32)
    return h.reshape(-1, h.shape[-1]).astype(dtype) @ w.T.astype(dtype)


def logits_gradient(xp, h, w, targets, lse, dloss):
    """G [N, V] = (softmax(h w^T) - onehot(targets)) * dloss / N in at least fp32: what the
    LM head's cross-entropy backward runs its dh and dw GEMMs on (ops/loss.py)."""
    logits = head_logits(xp, h, w)
    n_tokens, vocab = logits.shape
    onehot = targets.reshape(-1, 1) == xp.arange(vocab)[None, :]
    p = xp.exp(logits - lse.reshape(-1, 1))
    return (p - onehot.astype(p.dtype)) * (dloss / n_tokens)


def _logits_grad_input(xp, h, w, targets, lse, dloss):
    """(dh, g): g is G as the kernel keeps it, chunk by chunk (the chunk at v0 is its
    [N, vc] block at N * v0: NOTE [split logits gradient])."""
    g = logits_gradient(xp, h, w, targets, lse, dloss)
    dh = (g @ w.astype(g.dtype)).reshape(h.shape).astype(h.dtype)
    return dh, xp.concatenate([g[:, a:b].reshape(-1) for a, b in _chunks(g.shape[1])])


def _logits_grad_weight(xp, h, g):
    n, c = math.prod(h.shape[:-1]), h.shape[-1]
    vocab = g.shape[0] // n
    blocks = [g[n * a:n * b].reshape(n, b - a) for a, b in _chunks(vocab)]
    dlogits = xp.concatenate(blocks, axis=1).astype(xp.promote_types(g.dtype, xp.float32))
    return dlogits.T @ h.reshape(n, c).astype(dlogits.dtype)


def _logits_input_flops(in_shapes, out_shapes, **params) -> int:
    h, w = in_shapes[:2]
    return 2 * _gemm(math.prod(h[:-1]), w[0], w[1])


def _logits_weight_flops(in_shapes, out_shapes, **params) -> int:
    (h, _), (dw,) = in_shapes, out_shapes
    return _gemm(math.prod(h[:-1]), dw[0], dw[1])


for _rule in (OpRule("matmul_bwd_input", _input_grad, None, flops=_input_flops),
              OpRule("matmul_bwd_weight", _weight_grad, None, flops=_weight_flops),
              OpRule("matmul_bias_bwd_weight", _weight_and_bias_grad, None,
                     flops=_weight_flops),
              OpRule("cross_entropy_bwd_input", _logits_grad_input, None,
                     flops=_logits_input_flops),
              OpRule("cross_entropy_bwd_weight", _logits_grad_weight, None,
                     flops=_logits_weight_flops)):
    register_rule(_rule)

# fused backward op -> the op of its weight-gradient GEMM (its input GEMM: matmul_bwd_input)
WEIGHT_PART = {"matmul_bwd": "matmul_bwd_weight", "matmul_bias_bwd": "matmul_bias_bwd_weight"}
# the ops a split makes: the simulator costs each as its share of the op it comes from
# (BackwardSplit.origin, sim/kernels.graph_seconds), so calibration times only that op
SPLIT_OPS = frozenset({"matmul_bwd_input", *WEIGHT_PART.values(), "cross_entropy_bwd_input",
                       "cross_entropy_bwd_weight"})


# NOTE [B/W split]: B is what the input cotangent (`ct:*`, sent to the previous stage or
# passed to the layer below) needs; W is the rest: the weight GEMMs, the bias column sums
# and whatever only they read. A split GEMM runs the very two kernel calls the fused one
# runs, so B + W compute 1f1b's bits. The LM head's cross_entropy_bwd splits the same
# way: its kernel runs three GEMMs per vocabulary chunk (logits, dh = G w, dw = G^T h);
# B runs the first two and keeps G, W the third on the kept G (NOTE [split logits
# gradient], native/src/crossentropy.c), so W takes a third of the op, the part a
# 32000-word head makes the longest of a small model's backward. G is N x V elements (f32;
# bf16 in bf16, as the kernel rounds it): the price of a deferred head W. rms_norm_bwd
# stays whole in B: its norm-weight gradient is a sum in the same pass over the same
# operands, and a second pass would change its accumulation order. W reads `carried`:
# values B made or received (the output cotangent of each weight GEMM, the head's G),
# kept in the layer's `wop.L.mb` buffer until W; the residuals it reads in wact/rec.
@dataclass(frozen=True, eq=False)  # identity: one per layer kind
class BackwardSplit:
    input_part: LayerGraph              # B: the backward's inputs -> its ct:* outputs and
                                        # the gradients B's whole ops make
    weight_part: LayerGraph             # W: residuals it reads + carried -> other grads
    carried: tuple[Var, ...]            # what B hands W (inputs of weight_part after the
                                        # residuals)
    origin: tuple[tuple[int, float], ...]  # per node of input_part, then of weight_part:
                                        # (index of the backward node it comes from, the
                                        # share of that node's cost it runs)

    def weight_residuals(self, kind) -> tuple[int, ...]:
        """Indices into kind.residuals of the residuals W reads."""
        ids = {v.id for v in self.weight_part.inputs[:-len(self.carried) or None]}
        return tuple(i for i, r in enumerate(kind.residuals) if r.id in ids)


def _split_gemm(node: Node) -> list[tuple[Node, float]]:
    """matmul_bwd / matmul_bias_bwd as its two GEMMs: dx = dy w (B), dw = dy^T x (W)."""
    x, w, dy = node.inputs
    return [(Node("matmul_bwd_input", (w, dy), node.outputs[:1], node.params, node.source),
             0.5),
            (Node(WEIGHT_PART[node.op], (x, dy), node.outputs[1:], node.params, node.source),
             0.5)]


def _split_logits_grad(node: Node) -> list[tuple[Node, float]]:
    """cross_entropy_bwd as its B and W kernels: two of its three GEMMs, then the third."""
    (h, w, targets, lse, dloss), (dh, dw) = node.inputs, node.outputs
    g = Var("bfloat16" if h.dtype == "bfloat16" else "float32",
            (math.prod(h.shape[:-1]) * w.shape[0],))
    return [(Node("cross_entropy_bwd_input", node.inputs, (dh, g), node.params, node.source),
             2 / 3),
            (Node("cross_entropy_bwd_weight", (h, g), (dw,), node.params, node.source),
             1 / 3)]


# fused backward op -> its parts, each with the share of the op's cost it runs
SPLITS = {"matmul_bwd": _split_gemm, "matmul_bias_bwd": _split_gemm,
          "cross_entropy_bwd": _split_logits_grad}


def _split_nodes(bwd: LayerGraph) -> list[tuple[Node, int, float]]:
    return [(part, i, share) for i, node in enumerate(bwd.nodes)
            for part, share in (SPLITS[node.op](node) if node.op in SPLITS else [(node, 1.0)])]


def _needed_by(nodes: list[Node], wanted: set[int]) -> set[int]:
    """Positions of the nodes that the values `wanted` (var ids) depend on."""
    wanted, keep = set(wanted), set()
    for i in range(len(nodes) - 1, -1, -1):
        if any(o.id in wanted for o in nodes[i].outputs):
            keep.add(i)
            wanted |= {x.id for x in nodes[i].inputs if isinstance(x, Var)}
    return keep


def split_backward(kind) -> BackwardSplit:
    """Split kind.bwd (NOTE [B/W split]).

    Requires: kind.bwd as autodiff made it. Guarantees: input_part and weight_part
    together run every node of kind.bwd once (a split GEMM as its two halves), outputs
    keep their Vars (so grad:<name> ids are kind.bwd's), input_part makes every ct:*
    output, weight_part reads only residuals, params and `carried`.
    """
    bwd = kind.bwd
    split = _split_nodes(bwd)
    nodes = [n for n, _, _ in split]
    cts = {v.id for v, n in zip(bwd.outputs, bwd.output_names)
           if is_cotangent_role(n) and isinstance(v, Var)}
    in_b = _needed_by(nodes, cts)
    b_nodes = [split[i] for i in range(len(split)) if i in in_b]
    w_nodes = [split[i] for i in range(len(split)) if i not in in_b]
    made_by_b = {o.id for n, _, _ in b_nodes for o in n.outputs}
    w_reads = [x for n, _, _ in w_nodes for x in n.inputs if isinstance(x, Var)]
    residual_ids = {v.id for v in kind.residuals}
    param_ids = {p.id for p in bwd.params}
    carried = _unique([x for x in w_reads if x.id not in residual_ids | param_ids])
    residuals = [r for r in kind.residuals if r.id in {x.id for x in w_reads}]
    outputs = [(v, n) for v, n in zip(bwd.outputs, bwd.output_names)]
    b_out = [(v, n) for v, n in outputs if isinstance(v, Literal) or v.id in made_by_b
             or is_cotangent_role(n)]
    w_out = [(v, n) for v, n in outputs if (v, n) not in b_out]
    input_part = LayerGraph(bwd.name + " input", bwd.params, bwd.param_names, bwd.inputs,
                            bwd.input_names, tuple(n for n, _, _ in b_nodes),
                            tuple(v for v, _ in b_out), tuple(n for _, n in b_out))
    weight_part = LayerGraph(bwd.name + " weight", bwd.params, bwd.param_names,
                             tuple(residuals) + tuple(carried),
                             tuple(role("handed", i) for i in range(len(residuals)))
                             + tuple(role("carried", i) for i in range(len(carried))),
                             tuple(n for n, _, _ in w_nodes),
                             tuple(v for v, _ in w_out), tuple(n for _, n in w_out))
    origin = tuple((i, share) for _, i, share in b_nodes + w_nodes)
    return BackwardSplit(input_part, weight_part, tuple(carried), origin)


def _unique(values: list[Var]) -> list[Var]:
    seen, out = set(), []
    for v in values:
        if v.id not in seen:
            seen.add(v.id)
            out.append(v)
    return out
