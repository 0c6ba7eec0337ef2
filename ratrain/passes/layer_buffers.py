"""Per-layer buffer contents: how big each of a layer's buffers is and where its tensors
sit inside (views, flat gradients, residuals kept in act/wact/rec, zb1's W operands), which
values of its graphs live in buffers of their own, and the workspaces of F, REC, B and W.

passes/buffers.py builds the buffers of every task from these; lower places the calls'
operands by the same layouts, so the plan and the lowered calls agree byte for byte.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ratrain.ir.buffers import BufferKind
from ratrain.ir.graph import HIDDEN_COTANGENT, Literal, is_cotangent_role, is_grad_role
from ratrain.passes.layout import align_up, graph_workspace, pack
from ratrain.passes.residuals import kept_mask
from ratrain.passes.vocab_buffers import holds_loss
from ratrain.program_format.shards import shard_size


def shard_elements(n: int, program, sharded: bool) -> int:
    """Elements of a flat fp32 state of n elements on one rank (ZeRO shards round up)."""
    return shard_size(n, program.options.dp) if sharded else n


def layer_param_count(program, layer: int) -> int:
    itemsize = np.dtype(program.graph.dtype).itemsize
    return program.layer_cost(layer).param_bytes // itemsize


# NOTE [views gathered in place]: under ZeRO 1/2 PREF all-gathers the cast master shards,
# which concatenate to the layer's parameters in order, padded to D equal shards. When the
# view layout packs the parameters with no gap (every parameter's bytes a multiple of the
# alignment, true of every LLaMA-family layer) that concatenation *is* the view, so the
# gather receives straight into view.L, made as large as D shards, and no copy follows it:
# measured in the simulator on LLaMA-2-7B, pp 1 x dp 1024, ZeRO 2, the copies were 0.90 s
# of a 1.38 s exposed tail (the next step's forwards wait for each view in turn). ZeRO 3's
# GATHs receive the same way into their zview slot, sized for the largest D shards of the
# stage: on the 2-core machine of bench/predict.py (tiny, dp 2) each of a step's 18
# gathers had allocated a fresh 3 MB array (new pages every call) and copied it into the
# slot when waited for, inside the next layer's compute.
def gathers_in_place(program, layer: int) -> bool:
    """Does PREF or GATH all-gather layer's view straight into its view buffer (view.L,
    or a zview slot) (NOTE [views gathered in place])?"""
    o = program.options
    return o.zero >= 1 and o.dp > 1 and _packs_without_gaps(_kind(program, layer))


@lru_cache(maxsize=256)
def _packs_without_gaps(kind) -> bool:
    _, size = _view_layout(kind)
    return size == sum(p.nbytes for p in kind.fwd.params)


def view_gather_elements(program, layer: int) -> int:
    """Elements an all-gather of the layer's view shards delivers: D equal shards."""
    return program.options.dp * shard_elements(layer_param_count(program, layer), program, True)


def view_bytes(program, layer: int) -> int:
    """Bytes of view.L: the packed parameters, or D gathered shards when larger and
    gathered in place."""
    size = view_layout(program, layer)[1]
    if not gathers_in_place(program, layer):
        return size
    itemsize = np.dtype(program.graph.dtype).itemsize
    return max(size, align_up(view_gather_elements(program, layer) * itemsize))


def view_layout(program, layer: int) -> tuple[tuple[int, ...], int]:
    """Offsets of a layer's parameters in its view buffer (parameter order), and size."""
    return _view_layout(_kind(program, layer))


def grad_layout(program, layer: int) -> tuple[tuple[int, ...], int]:
    """Offsets (in elements) of a layer's parameters in its flat fp32 gradient."""
    return _grad_layout(_kind(program, layer))


@lru_cache(maxsize=256)
def _view_layout(kind) -> tuple[tuple[int, ...], int]:
    return pack(p.nbytes for p in kind.fwd.params)


@lru_cache(maxsize=256)
def _grad_layout(kind) -> tuple[tuple[int, ...], int]:
    sizes = [p.size for p in kind.fwd.params]
    offsets = tuple(sum(sizes[:i]) for i in range(len(sizes)))
    return offsets, sum(sizes)


def _kind(program, layer: int):
    return program.graph.kinds[program.graph.layers[layer].kind]


def residual_layout(program, layer: int, micro_batch: int,
                    home: BufferKind) -> tuple[dict, int]:
    """residual index -> offset in the buffer `home` holds them in: act.L.mb (kept from F
    to B), wact.L.mb (under zb1, the kept residuals W[L] reads: NOTE [weight operands]) or
    rec.L.mb (the dropped ones REC rebuilds); and that buffer's bytes."""
    mode = program.recompute.get((layer, micro_batch), "none")
    return _residual_layout(_kind(program, layer), mode, home, is_split(program))


def residual_home(program, layer: int, micro_batch: int, index: int) -> BufferKind:
    """The buffer residual `index` of (layer, micro_batch) lives in (residual_layout)."""
    mode = program.recompute.get((layer, micro_batch), "none")
    return _residual_homes(_kind(program, layer), mode, is_split(program))[index]


@lru_cache(maxsize=4096)
def _residual_homes(kind, mode: str, split: bool) -> tuple[BufferKind, ...]:
    weight = set(kind.split.weight_residuals(kind)) if split else set()
    return tuple(BufferKind.REC if not kept else
                 BufferKind.WACT if i in weight else BufferKind.ACT
                 for i, kept in enumerate(kept_mask(kind, mode)))


@lru_cache(maxsize=4096)
def _residual_layout(kind, mode: str, home: BufferKind, split: bool) -> tuple[dict, int]:
    chosen = [i for i, h in enumerate(_residual_homes(kind, mode, split)) if h == home]
    offsets, total = pack(kind.residuals[i].nbytes for i in chosen)
    return dict(zip(chosen, offsets)), total


def residual_ids(kind, mode: str, kept: bool) -> set[int]:
    return {r.id for r, k in zip(kind.residuals, kept_mask(kind, mode)) if k == kept}


# Output index of the parameter gradient of ops whose kernels can write it straight into
# the fp32 gradient buffer (GEMM with RT_ACCUMULATE; the others accumulate in fp32 anyway).
GRAD_OUTPUT = {"matmul_bwd": 1, "matmul_bias_bwd": 1, "rms_norm_bwd": 1,
               "embedding_bwd": 0, "cross_entropy_bwd": 1,
               "matmul_bwd_weight": 0, "matmul_bias_bwd_weight": 0,   # zb1's W GEMMs
               "cross_entropy_bwd_weight": 0}


@lru_cache(maxsize=256)
def fused_grad_ids(kind) -> frozenset:
    """NOTE [fused gradient accumulation]: parameter gradients that a GRAD_OUTPUT op makes
    directly are written (first micro-batch) or added (later ones) by that op straight
    into grad.L in fp32, so they take no workspace. Layers whose gradients are
    reduce-scattered per micro-batch (ZeRO-2 "scatter") keep them in the workspace."""
    grads = {v.id for v, n in zip(kind.bwd.outputs, kind.bwd.output_names)
             if is_grad_role(n)}
    nodes = kind.bwd.nodes + kind.split.weight_part.nodes  # the split's GEMMs make the same
    return frozenset(node.outputs[GRAD_OUTPUT[node.op]].id for node in nodes
                     if node.op in GRAD_OUTPUT and node.outputs[GRAD_OUTPUT[node.op]].id in grads)


def unfused_grad_elements(kind) -> int:
    """Elements of the layer kind's parameter gradients that no GRAD_OUTPUT op writes
    into grad.L (fused_grad_ids): each is accumulated by an `accumulate_grad` call."""
    fused = fused_grad_ids(kind)
    return sum(int(np.prod(v.shape)) for v, n in zip(kind.bwd.outputs, kind.bwd.output_names)
               if is_grad_role(n) and v.id not in fused)


def pinned_values(kind, use: str, mode: str = "none", fused: bool = False) -> frozenset:
    """Values of a layer graph that live in buffers of their own, not in the workspace.

    "F": inputs, kept residuals (act) and the output passed on (the head's loss stays in
    the workspace); "REC": inputs and the dropped residuals it rebuilds (rec); "B": its
    inputs, the cotangent passed on and, with `fused`, the parameter gradients written
    straight into grad.L (the others stay in the workspace until accumulated).
    """
    ids = {v.id for v in kind.fwd.inputs}
    if use == "F":
        ids |= residual_ids(kind, mode, True)
        ids |= {v.id for v in kind.fwd.outputs
                if kind.kind != "head" and not isinstance(v, Literal)}
    elif use == "REC":
        ids |= residual_ids(kind, mode, False)
    else:
        ids = {v.id for v in kind.bwd.inputs}
        ids |= {v.id for v, n in zip(kind.bwd.outputs, kind.bwd.output_names)
                if is_cotangent_role(n) and not isinstance(v, Literal)}
        if fused:
            ids |= fused_grad_ids(kind)
    return frozenset(ids)


def cotangent_bytes(program) -> int:
    """One hidden-state cotangent [B, T, H] in the compute dtype."""
    g = program.graph
    return align_up(g.micro_batch_size * g.seq_len * int(g.config["hidden_size"])
                    * np.dtype(g.dtype).itemsize)


RECOVERY_MODES = ("none", "full", "selective")


def is_split(program) -> bool:
    """Does B run only the input gradient, W[L] the weight gradients (zb1, NOTE [B/W
    split])?"""
    return program.options.pipeline_schedule == "zb1"


def backward_graph(kind, split: bool):
    """The graph a B task runs of a layer: its whole backward, or zb1's input part."""
    return kind.split.input_part if split else kind.bwd


def backward_pinned(kind, split: bool, fused: bool) -> frozenset:
    """pinned_values of B's graph; under zb1 also what B hands W (wop.L.mb): the carried
    values, and B's parameter gradients where they are reduce-scattered (not `fused`)."""
    pinned = pinned_values(kind, "B", fused=fused)
    if not split:
        return pinned
    handed = () if fused else handed_gradients(kind)
    return pinned | {v.id for v in kind.split.carried} | {v.id for v in handed}


def input_gradients(kind) -> tuple:
    """The parameter gradients zb1's B makes (the whole ops' own: NOTE [B/W split])."""
    part = kind.split.input_part
    return tuple(v for v, n in zip(part.outputs, part.output_names)
                 if is_grad_role(n) and not isinstance(v, Literal))


def scatters_in_weight(kind) -> bool:
    """Does W[L] make any of the layer's parameter gradients, and so reduce-scatter them
    all under scatter accumulation (NOTE [weight operands])? Else B makes them all and
    reduce-scatters them itself (a layer whose weight part is empty)."""
    return any(is_grad_role(n) for n in kind.split.weight_part.output_names)


def handed_gradients(kind) -> tuple:
    """The gradients B hands W[L] under scatter accumulation: B's own, where W[L]
    reduce-scatters."""
    return input_gradients(kind) if scatters_in_weight(kind) else ()


def workspace_bytes(program, stage: int, direction: str) -> int:
    layers = program.stages[stage]
    if direction == "bwd" and is_split(program):
        direction = "bwd_input"
    return _workspace_bytes(program.graph, layers, direction, cotangent_bytes(program),
                            tuple(l not in program.scatter_grads for l in layers),
                            holds_loss(program, stage))


@lru_cache(maxsize=4096)
def _workspace_bytes(graph, layers: tuple, direction: str, cotangent: int,
                     fused: tuple, last_stage: bool) -> int:
    """Workspace of the stage's F and REC (direction "fwd") or B ("bwd"): the largest
    layer's intermediates under any recovery mode (REC: decoders only, the layers
    insert_recovery may recompute); B also holds the cotangent slots passed from layer
    to layer (cotangent_slots) and, per layer, the gradients that are not fused
    (`fused[i]`: layer i's are)."""
    kinds = [graph.kinds[graph.layers[l].kind] for l in layers]
    if direction in ("bwd", "bwd_input"):
        split = direction == "bwd_input"
        peaks = [graph_workspace(backward_graph(k, split), backward_pinned(k, split, f))[1]
                 for k, f in zip(kinds, fused)]
        return cotangent_slots(kinds, last_stage) * cotangent + max(peaks, default=0)
    peaks = [graph_workspace(k.fwd, pinned_values(k, use, mode))[1]
             for k in kinds for use in ("F", "REC") for mode in RECOVERY_MODES
             if use == "F" or k.kind == "decoder"]
    return max(peaks, default=0)


def recovers_in_backward(program, stage: int, micro_batch: int) -> bool:
    """NOTE [backward-time recovery]: does the stage's B of `micro_batch` rebuild its
    dropped residuals itself, layer by layer, instead of REC tasks? A REC on the forward
    side (ratrain mode, every stage but the last) runs in the wait for the gradient, so
    it must rebuild all of the micro-batch's layers before B starts and they stay alive
    through B. Where recovery runs at backward time anyway (baseline mode, and the last
    stage, which never waits for a gradient) nothing is gained by that: B recomputes
    layer l right before l's backward into its own workspace, so one layer's rebuilt
    residuals are alive at a time, as in the per-layer activation checkpointing of GPU
    trainers. In ratrain mode insert_recovery's auto may also leave a micro-batch to its
    B where rebuilding it early would not fit (NOTE [where recovery runs])."""
    return stage_recovers_in_backward(program, stage) or \
        (stage, micro_batch) in program.backward_recovery


def stage_recovers_in_backward(program, stage: int) -> bool:
    """Does every B of the stage recover at backward time, whatever insert_recovery
    chose (baseline mode, the last stage)?"""
    return program.options.schedule != "ratrain" or stage == len(program.stages) - 1


def backward_workspace(program, stage: int, micro_batch: int,
                       modes: dict | None = None) -> tuple[int, int]:
    """(offset of the rebuilt residuals, bytes) of a B's workspace on the stage: the
    cotangent slots and the largest layer's backward intermediates (workspace_bytes),
    and under backward-time recovery the REC intermediates (sharing the layers' region:
    a layer's backward starts after its recompute ends) and then the largest rebuilt
    residuals of the micro-batch's recomputed layers. `modes` (layer -> recovery mode)
    stands in for the program's choices (the planner's estimate)."""
    plain = workspace_bytes(program, stage, "bwd")
    if modes is None:
        modes = {l: program.recompute[(l, micro_batch)] for l in program.stages[stage]
                 if (l, micro_batch) in program.recompute}
    if not modes or not recovers_in_backward(program, stage, micro_batch):
        return plain, plain
    kinds = [(_kind(program, l), mode) for l, mode in modes.items()]
    layers = program.stages[stage]
    slots = cotangent_slots([_kind(program, l) for l in layers],
                            holds_loss(program, stage)) * cotangent_bytes(program)
    scratch = max(graph_workspace(k.fwd, pinned_values(k, "REC", mode))[1] for k, mode in kinds)
    base = max(plain, slots + align_up(scratch))
    return base, base + max(_residual_layout(k, mode, BufferKind.REC, False)[1]
                             for k, mode in kinds)


def cotangent_slots(kinds: list, last_stage: bool) -> int:
    """How many of B's two ping-pong cotangent slots (lower._lower_backward) are used:
    one per value passed inside the stage (the loss cotangent on the last stage, and the
    input cotangent of every layer but the stage's first), at most two."""
    passed = int(last_stage) + sum(HIDDEN_COTANGENT in k.bwd.output_names for k in kinds[1:])
    return min(2, passed)


def message_bytes(program, stage: int) -> int:
    """Bytes of the activation stage `stage` sends on (its last layer's output)."""
    return program.layer_cost(program.stages[stage][-1]).output_bytes


# NOTE [weight operands]: under zb1 F keeps the residuals W[L] reads apart from the rest:
# those in `wact.L.mb`, which lives until W[L], the others in act.L.mb, which dies with
# B, so a micro-batch waiting for its W's holds only what they read. B hands its W's what
# else they read that is not a parameter: the output cotangent of every weight GEMM
# (BackwardSplit.carried) and, where B rebuilds the layer's dropped residuals in its own
# workspace (NOTE [backward-time recovery]), copies of those W reads. They live in
# `wop.L.mb` from B to W[L]. Residuals a REC rebuilt before B (rec.L.mb) live until W[L]
# whole: they are not split. Where the layer's gradients are reduce-scattered per
# micro-batch (NOTE [gradient accumulation]), the part that makes the last of them starts
# that one reduce-scatter of them all: W[L] where it makes any, and then B hands it its
# own (handed_gradients: a decoder's norm weights, the head's final norm) in wop.L.mb
# too; else B (a layer whose W makes no gradient).
def weight_operand_layout(program, layer: int, micro_batch: int) -> tuple[dict, int]:
    """var id -> offset in wop.L.mb (NOTE [weight operands]), and its bytes."""
    kind = _kind(program, layer)
    mode = program.recompute.get((layer, micro_batch), "none")
    copied = mode != "none" and recovers_in_backward(program, program.stage_of_layer(layer),
                                                     micro_batch)
    return _weight_operand_layout(kind, mode, copied, layer in program.scatter_grads)


@lru_cache(maxsize=1024)
def _weight_operand_layout(kind, mode: str, copied: bool,
                           scattered: bool) -> tuple[dict, int]:
    values = list(kind.split.carried) + list(handed_gradients(kind) if scattered else ())
    if copied:
        dropped = residual_ids(kind, mode, False)
        values += [kind.residuals[i] for i in kind.split.weight_residuals(kind)
                   if kind.residuals[i].id in dropped]
    offsets, total = pack(v.nbytes for v in values)
    return {v.id: o for v, o in zip(values, offsets)}, total


def weight_workspace(program, layer: int) -> int:
    """Bytes of W[L]'s workspace: the weight part's unpinned intermediates."""
    kind = _kind(program, layer)
    return graph_workspace(kind.split.weight_part, weight_pinned(
        kind, layer not in program.scatter_grads))[1]


def weight_pinned(kind, fused: bool) -> frozenset:
    part = kind.split.weight_part
    return frozenset({v.id for v in part.inputs} | (fused_grad_ids(kind) if fused else set()))
