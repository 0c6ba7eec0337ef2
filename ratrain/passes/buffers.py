"""What each task creates and reads, as named buffers: the memory model's ground truth.

plan_memory, the memory checker, the simulator and the runtime all derive lifetimes from
`task_effects`: a buffer lives from the task that creates it to the last task that reads
it. Persistent buffers (master params, optimizer state, parameter views) live all step.
Names (master.L7, act.L5.mb3, wact.L5.mb3 and wop.L5.mb3 under zb1, ws.<task>, ...) come
from ir/buffers.py's grammar.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from ratrain.ir.buffers import (BufferKind, buffer_name, grad_accumulator, message_buffer,
                                sync_buffers, update_grad)
from ratrain.ir.graph import Literal
from ratrain.ir.tasks import Kind, Task, backward_of
from ratrain.passes.insert_gathers import gather_of, view_buffer, view_slot_count
from ratrain.passes.insert_tied_sum import tied_layers_on
from ratrain.passes.insert_update import commits_updates
from ratrain.passes.layout import align_up, graph_workspace, pack
from ratrain.passes.residuals import kept_mask

CATEGORIES = ("params", "optimizer", "views", "grads", "activations", "comm", "workspace")


@dataclass(frozen=True)
class Buffer:
    name: str                           # unique within a rank's program ("act.L5.mb3")
    category: str                       # one of CATEGORIES
    nbytes: int                         # size in the arena


@dataclass(frozen=True)
class Effects:
    creates: tuple[Buffer, ...]         # buffers the task allocates and writes
    reads: tuple[str, ...]              # names of buffers the task reads (or updates)


def shard_elements(n: int, program, sharded: bool) -> int:
    """Elements of a flat fp32 state of n elements on one rank (ZeRO shards round up)."""
    return -(-n // program.options.dp) if sharded else n


def layer_param_count(program, layer: int) -> int:
    itemsize = np.dtype(program.graph.dtype).itemsize
    return program.layer_cost(layer).param_bytes // itemsize


def persistent_buffers(program, stage: int) -> tuple[Buffer, ...]:
    """Master params, Adam state and parameter views of the stage's layers; under ZeRO-3
    the ring of view slots instead of a view per layer (NOTE [ZeRO-3 lifecycle])."""
    zero = program.options.zero
    out = []
    for layer in program.stages[stage]:
        n = layer_param_count(program, layer)
        shard = shard_elements(n, program, zero >= 1)
        out += [Buffer(buffer_name(BufferKind.MASTER, layer=layer), "params", 4 * shard),
                Buffer(buffer_name(BufferKind.OPT, layer=layer), "optimizer",
                       2 * align_up(4 * shard))]
        if zero != 3:
            out.append(Buffer(buffer_name(BufferKind.VIEW, layer=layer), "views",
                              view_bytes(program, layer)))
    if zero == 3:
        slot = max(view_bytes(program, l) for l in program.stages[stage])
        out += [Buffer(buffer_name(BufferKind.ZVIEW, slot=k), "views", slot)
                for k in range(view_slot_count(program))]
    return tuple(out)


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


def kept_residuals(program, layer: int, micro_batch: int) -> tuple[Buffer, ...]:
    """The buffers F keeps (layer, micro_batch)'s residuals in: act.L.mb, and under zb1
    wact.L.mb (NOTE [weight operands])."""
    homes = (BufferKind.ACT, BufferKind.WACT) if is_split(program) else (BufferKind.ACT,)
    return tuple(Buffer(buffer_name(h, layer=layer, micro_batch=micro_batch), "activations",
                        residual_layout(program, layer, micro_batch, h)[1]) for h in homes)


def residual_ids(kind, mode: str, kept: bool) -> set[int]:
    return {r.id for r, k in zip(kind.residuals, kept_mask(kind, mode)) if k == kept}


# Output index of the parameter gradient of ops whose kernels can write it straight into
# the fp32 gradient buffer (GEMM with RT_ACCUMULATE; the others accumulate in fp32 anyway).
GRAD_OUTPUT = {"matmul_bwd": 1, "matmul_bias_bwd": 1, "rms_norm_bwd": 1,
               "embedding_bwd": 0, "cross_entropy_bwd": 1,
               "matmul_bwd_weight": 0, "matmul_bias_bwd_weight": 0}  # zb1's W GEMMs


def fused_grad_ids(kind) -> frozenset:
    """NOTE [fused gradient accumulation]: parameter gradients that a GRAD_OUTPUT op makes
    directly are written (first micro-batch) or added (later ones) by that op straight
    into grad.L in fp32, so they take no workspace. Layers whose gradients are
    reduce-scattered per micro-batch (ZeRO-2 "scatter") keep them in the workspace."""
    grads = {v.id for v, n in zip(kind.bwd.outputs, kind.bwd.output_names)
             if n.startswith("grad:")}
    nodes = kind.bwd.nodes + kind.split.weight_part.nodes  # the split's GEMMs make the same
    return frozenset(node.outputs[GRAD_OUTPUT[node.op]].id for node in nodes
                     if node.op in GRAD_OUTPUT and node.outputs[GRAD_OUTPUT[node.op]].id in grads)


def unfused_grad_elements(kind) -> int:
    """Elements of the layer kind's parameter gradients that no GRAD_OUTPUT op writes
    into grad.L (fused_grad_ids): each is accumulated by an `accumulate_grad` call."""
    fused = fused_grad_ids(kind)
    return sum(int(np.prod(v.shape)) for v, n in zip(kind.bwd.outputs, kind.bwd.output_names)
               if n.startswith("grad:") and v.id not in fused)


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
        ids |= {v.id for v in kind.fwd.outputs if kind.kind != "head" and not isinstance(v, Literal)}
    elif use == "REC":
        ids |= residual_ids(kind, mode, False)
    else:
        ids = {v.id for v in kind.bwd.inputs}
        ids |= {v.id for v, n in zip(kind.bwd.outputs, kind.bwd.output_names)
                if n.startswith("ct:") and not isinstance(v, Literal)}
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
    """pinned_values of B's graph; under zb1 also what B hands W (wop.L.mb)."""
    pinned = pinned_values(kind, "B", fused=fused)
    return pinned | {v.id for v in kind.split.carried} if split else pinned


def workspace_bytes(program, stage: int, direction: str) -> int:
    layers = program.stages[stage]
    if direction == "bwd" and is_split(program):
        direction = "bwd_input"
    return _workspace_bytes(program.graph, layers, direction, cotangent_bytes(program),
                            tuple(l not in program.scatter_grads for l in layers),
                            stage == len(program.stages) - 1)


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
                            stage == len(program.stages) - 1) * cotangent_bytes(program)
    scratch = max(graph_workspace(k.fwd, pinned_values(k, "REC", mode))[1] for k, mode in kinds)
    base = max(plain, slots + align_up(scratch))
    return base, base + max(_residual_layout(k, mode, BufferKind.REC, False)[1]
                             for k, mode in kinds)


def cotangent_slots(kinds: list, last_stage: bool) -> int:
    """How many of B's two ping-pong cotangent slots (lower._lower_backward) are used:
    one per value passed inside the stage (the loss cotangent on the last stage, and the
    input cotangent of every layer but the stage's first), at most two."""
    passed = int(last_stage) + sum("ct:h" in k.bwd.output_names for k in kinds[1:])
    return min(2, passed)


def message_bytes(program, stage: int) -> int:
    """Bytes of the activation stage `stage` sends on (its last layer's output)."""
    return program.layer_cost(program.stages[stage][-1]).output_bytes


def _forward(program, task: Task) -> Effects:
    s, m, last = task.stage, task.micro_batch, len(program.stages) - 1
    layers = program.stages[s]
    creates = [b for l in layers for b in kept_residuals(program, l, m)]
    if s < last:
        creates.append(Buffer(buffer_name(BufferKind.OUT, micro_batch=m), "comm",
                              message_bytes(program, s)))
    creates.append(Buffer(buffer_name(BufferKind.WS, task=task), "workspace",
                          workspace_bytes(program, s, "fwd")))
    reads = [view_buffer(program, task, l) for l in layers] + \
        ([buffer_name(BufferKind.IN, micro_batch=m)] if s > 0 else [])
    return Effects(tuple(creates), tuple(reads))


def grad_buffer(program, layer: int) -> Buffer:
    """The gradient accumulator of a layer: the full fp32 gradient, or under scatter
    accumulation (NOTE [gradient accumulation]) this rank's shard of it."""
    n, scattered = grad_layout(program, layer)[1], layer in program.scatter_grads
    return Buffer(grad_accumulator(layer, scattered), "grads",
                  4 * shard_elements(n, program, scattered))


# NOTE [weight operands]: under zb1 F keeps the residuals W[L] reads apart from the rest:
# those in `wact.L.mb`, which lives until W[L], the others in act.L.mb, which dies with
# B, so a micro-batch waiting for its W's holds only what they read. B hands its W's what
# else they read that is not a parameter: the output cotangent of every weight GEMM
# (BackwardSplit.carried) and, where B rebuilds the layer's dropped residuals in its own
# workspace (NOTE [backward-time recovery]), copies of those W reads. They live in
# `wop.L.mb` from B to W[L]. Residuals a REC rebuilt before B (rec.L.mb) live until W[L]
# whole: they are not split.
def weight_operand_layout(program, layer: int, micro_batch: int) -> tuple[dict, int]:
    """var id -> offset in wop.L.mb (NOTE [weight operands]), and its bytes."""
    kind = _kind(program, layer)
    mode = program.recompute.get((layer, micro_batch), "none")
    copied = mode != "none" and recovers_in_backward(program, program.stage_of_layer(layer),
                                                     micro_batch)
    return _weight_operand_layout(kind, mode, copied)


@lru_cache(maxsize=1024)
def _weight_operand_layout(kind, mode: str, copied: bool) -> tuple[dict, int]:
    values = list(kind.split.carried)
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


def _weight(program, task: Task) -> Effects:
    l, m = task.layer, task.micro_batch
    reads = [buffer_name(kind, layer=l, micro_batch=m) for kind in (BufferKind.WACT,
                                                                     BufferKind.WOP)]
    reads.append(grad_buffer(program, l).name)
    if (l, m) in program.recompute and not recovers_in_backward(program, task.stage, m):
        reads.append(buffer_name(BufferKind.REC, layer=l, micro_batch=m))
    return Effects((Buffer(buffer_name(BufferKind.WS, task=task), "workspace",
                           weight_workspace(program, l)),),
                   tuple(reads))


def _backward(program, task: Task, use=None) -> Effects:
    """`use(layer)`: the task reading the layer's view (default: `task`; a B's pieces
    each read their own layer's)."""
    s, m = task.stage, task.micro_batch
    use = use or (lambda layer: task)
    layers = program.stages[s]
    # The step's first B is micro-batch 0's (verify_schedule checks B's run in order).
    creates = [grad_buffer(program, l) for l in layers] if m == 0 else []
    if is_split(program):
        creates += [Buffer(buffer_name(BufferKind.WOP, layer=l, micro_batch=m), "activations",
                           weight_operand_layout(program, l, m)[1]) for l in layers]
    if s > 0:
        creates.append(Buffer(buffer_name(BufferKind.GOUT, micro_batch=m), "comm",
                              message_bytes(program, s - 1)))
    creates.append(Buffer(buffer_name(BufferKind.WS, task=task), "workspace",
                          backward_workspace(program, s, m)[1]))
    reads = [view_buffer(program, use(l), l) for l in layers] + \
        [b.name for l in layers for b in kept_residuals(program, l, m)]
    if not recovers_in_backward(program, s, m):
        reads += [buffer_name(BufferKind.REC, layer=l, micro_batch=m)
                  for l in layers if (l, m) in program.recompute]
    reads += [grad_buffer(program, l).name for l in layers] if m != 0 else []
    reads += [buffer_name(BufferKind.GIN, micro_batch=m)] if s < len(program.stages) - 1 else []
    return Effects(tuple(creates), tuple(reads))


def _backward_piece(program, task: Task) -> Effects:
    """A per-layer piece of a B (NOTE [sync issue point]) addresses its B's workspace,
    whose cotangent slots pass from layer to layer: the stage's first piece (its last
    layer's) creates what the B creates, and every piece reads what the B reads and
    creates, so the pieces hold the B's buffers alive from the first to the last."""
    whole = _backward(program, backward_of(task), lambda layer: replace(task, layer=layer))
    if task.layer == program.stages[task.stage][-1]:
        return whole
    return Effects((), whole.reads + tuple(b.name for b in whole.creates))


def _recompute(program, task: Task) -> Effects:
    l, m = task.layer, task.micro_batch
    dropped = residual_layout(program, l, m, BufferKind.REC)[1]
    return Effects((Buffer(buffer_name(BufferKind.REC, layer=l, micro_batch=m), "activations",
                           dropped),
                    Buffer(buffer_name(BufferKind.WS, task=task), "workspace",
                           workspace_bytes(program, task.stage, "fwd"))),
                   (*(b.name for b in kept_residuals(program, l, m)),
                    view_buffer(program, task, l)))


def _shard_of(program, layer: int) -> Buffer:
    shard = shard_elements(grad_layout(program, layer)[1], program, True)
    return Buffer(buffer_name(BufferKind.GSHARD, layer=layer), "grads", 4 * shard)


def _grad_sync(program, task: Task) -> Effects:
    l = task.layer
    source, target = sync_buffers(l, program.options.zero, l in program.scatter_grads)
    if source == target:
        return Effects((), (source,))
    # a reduce-scatter's shard lives from where the list starts it on
    return Effects((_shard_of(program, l),), (source,))


def _update_grad(program, layer: int) -> str:
    return update_grad(layer, program.options.zero)


def undo_buffer(program, layer: int) -> Buffer:
    """NOTE [commit rule] (insert_update.py): a speculative UPD's copy of the layer's
    master and Adam moments, [master | m | v] each at an aligned offset."""
    shard = shard_elements(layer_param_count(program, layer), program, program.options.zero >= 1)
    return Buffer(buffer_name(BufferKind.UNDO, layer=layer), "optimizer", 3 * align_up(4 * shard))


def _update(program, task: Task) -> Effects:
    l = task.layer
    undo = (undo_buffer(program, l),) if commits_updates(program.options) else ()
    return Effects(undo, (_update_grad(program, l), buffer_name(BufferKind.MASTER, layer=l),
                          buffer_name(BufferKind.OPT, layer=l)))


def _norm(program, task: Task) -> Effects:
    """Under the commit rule the NORM may redo every update: it reads their gradients
    and undo copies, which so live until it (NOTE [commit rule])."""
    if not commits_updates(program.options):
        return Effects((), ())
    layers, views = program.stages[task.stage], program.options.zero < 3  # ZeRO-3: none
    kinds = (BufferKind.UNDO, BufferKind.MASTER, BufferKind.OPT) + \
        ((BufferKind.VIEW,) if views else ())
    return Effects((), tuple(name for l in layers for name in (_update_grad(program, l),) +
                             tuple(buffer_name(kind, layer=l) for kind in kinds)))


def _message_posted(program, task: Task, sender: int) -> Effects:
    """A POST creates the message buffer its RECV fills, sized for what the sending stage
    (the task's stage + `sender`) sends."""
    return Effects((Buffer(message_buffer(task), "comm",
                           message_bytes(program, task.stage + sender)),), ())


_EFFECTS = {
    Kind.F: _forward,
    Kind.B: _backward,
    Kind.BL: _backward_piece,
    Kind.W: _weight,
    Kind.REC: _recompute,
    Kind.SYNC: _grad_sync,
    Kind.UPD: _update,
    Kind.PREF: lambda p, t: Effects((), (buffer_name(BufferKind.MASTER, layer=t.layer),
                                         buffer_name(BufferKind.VIEW, layer=t.layer))),
    **dict.fromkeys((Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B),
                    lambda p, t: Effects((), (message_buffer(t),))),
    Kind.POST_F: lambda p, t: _message_posted(p, t, -1),
    Kind.POST_B: lambda p, t: _message_posted(p, t, 0),
    Kind.NORM: _norm,
    Kind.TIE: lambda p, t: Effects((), tuple(buffer_name(BufferKind.GRAD, layer=l)
                                             for l in tied_layers_on(p, t.stage))),
    Kind.FREE: lambda p, t: Effects((), ()),
    **dict.fromkeys((Kind.GATH_F, Kind.GATH_R, Kind.GATH_B), lambda p, t: Effects(
        (), (buffer_name(BufferKind.MASTER, layer=t.layer),
             buffer_name(BufferKind.ZVIEW, slot=gather_of(p, t).slot)))),
}


def task_effects(program, task: Task) -> Effects:
    """Buffers `task` creates and reads on its stage (every DP replica alike)."""
    return _EFFECTS[task.kind](program, task)


def _intervals(program, stage: int):
    """(first, last, buffer) of every non-persistent buffer of the stage's tasks."""
    effects = [task_effects(program, t) for t in program.tasks[stage]]
    last_read = {}
    for i, e in enumerate(effects):
        for name in e.reads:
            last_read[name] = i
    return [(i, max(i, last_read.get(b.name, i)), b)
            for i, e in enumerate(effects) for b in e.creates]


def stage_peak(program, stage: int) -> int:
    """Most bytes alive during any one task of the stage."""
    n = len(program.tasks[stage])
    delta = np.zeros(n + 1, np.int64)
    for first, last, b in _intervals(program, stage):
        delta[first] += b.nbytes
        delta[last + 1] -= b.nbytes
    persistent = sum(b.nbytes for b in persistent_buffers(program, stage))
    return persistent + int(np.cumsum(delta[:n]).max(initial=0))
