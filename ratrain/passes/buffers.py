"""What each task creates and reads, as named buffers: the memory model's ground truth.

plan_memory, the memory checker, the simulator and the runtime all derive lifetimes from
`task_effects`: a buffer lives from the task that creates it to the last task that reads
it. Persistent buffers (master params, optimizer state, parameter views) live all step.
Names (master.L7, act.L5.mb3, wact.L5.mb3 and wop.L5.mb3 under zb1, ws.<task>, ...) come
from ir/buffers.py's grammar.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ratrain.ir.buffers import (BufferKind, buffer_name, grad_accumulator, message_buffer,
                                sync_buffers, update_grad)
from ratrain.ir.tasks import Kind, Task, backward_of
from ratrain.passes.insert_gathers import gather_of, view_buffer, view_slot_count
from ratrain.passes.insert_tied_sum import tied_layers_on
from ratrain.passes.insert_update import commits_updates
from ratrain.passes.layer_buffers import (backward_workspace, grad_layout, is_split,
                                          layer_param_count, message_bytes,
                                          recovers_in_backward, residual_layout,
                                          shard_elements, view_bytes, weight_operand_layout,
                                          weight_workspace, workspace_bytes)
from ratrain.passes.layout import part_stride
from ratrain.passes.vocab_buffers import (embed_workspace_bytes, hidden_bytes, holds_ids,
                                          holds_loss, vocab_bytes)
from ratrain.ir.vocab import stage_embed_layer, stage_vocab_layer, state_layers

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


def persistent_buffers(program, stage: int) -> tuple[Buffer, ...]:
    """Master params, Adam state and parameter views of the stage's layers; under ZeRO-3
    the ring of view slots instead of a view per layer (NOTE [ZeRO-3 lifecycle])."""
    zero = program.options.zero
    out = []
    for layer in state_layers(program, stage):
        n = layer_param_count(program, layer)
        shard = shard_elements(n, program, zero >= 1)
        out += [Buffer(buffer_name(BufferKind.MASTER, layer=layer), "params", 4 * shard),
                Buffer(buffer_name(BufferKind.OPT, layer=layer), "optimizer",
                       2 * part_stride(4 * shard))]
        if zero != 3:
            out.append(Buffer(buffer_name(BufferKind.VIEW, layer=layer), "views",
                              view_bytes(program, layer)))
    if zero == 3:
        slot = max(view_bytes(program, l) for l in state_layers(program, stage))
        out += [Buffer(buffer_name(BufferKind.ZVIEW, slot=k), "views", slot)
                for k in range(view_slot_count(program))]
    return tuple(out)


def kept_residuals(program, layer: int, micro_batch: int) -> tuple[Buffer, ...]:
    """The buffers F keeps (layer, micro_batch)'s residuals in: act.L.mb, and under zb1
    wact.L.mb (NOTE [weight operands])."""
    homes = (BufferKind.ACT, BufferKind.WACT) if is_split(program) else (BufferKind.ACT,)
    return tuple(Buffer(buffer_name(h, layer=layer, micro_batch=micro_batch), "activations",
                        residual_layout(program, layer, micro_batch, h)[1]) for h in homes)


def _forward(program, task: Task) -> Effects:
    s, m = task.stage, task.micro_batch
    layers = program.stages[s]
    creates = [b for l in layers for b in kept_residuals(program, l, m)]
    if not holds_loss(program, s):  # hn goes on to S (NOTE [vocabulary-parallel head])
        creates.append(Buffer(buffer_name(BufferKind.OUT, micro_batch=m), "comm",
                              message_bytes(program, s)))
    creates.append(Buffer(buffer_name(BufferKind.WS, task=task), "workspace",
                          workspace_bytes(program, s, "fwd")))
    reads = [view_buffer(program, task, l) for l in layers] + \
        ([buffer_name(BufferKind.IN, micro_batch=m)] if not holds_ids(program, s) else [])
    return Effects(tuple(creates), tuple(reads))


def grad_buffer(program, layer: int) -> Buffer:
    """The gradient accumulator of a layer: the full fp32 gradient, or under scatter
    accumulation (NOTE [gradient accumulation]) this rank's shard of it."""
    n, scattered = grad_layout(program, layer)[1], layer in program.scatter_grads
    return Buffer(grad_accumulator(layer, scattered), "grads",
                  4 * shard_elements(n, program, scattered))


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
    if not holds_ids(program, s):  # stage 0's goes to G (NOTE [vocabulary-parallel embedding])
        creates.append(Buffer(buffer_name(BufferKind.GOUT, micro_batch=m), "comm",
                              message_bytes(program, s - 1) if s else hidden_bytes(program)))
    creates.append(Buffer(buffer_name(BufferKind.WS, task=task), "workspace",
                          backward_workspace(program, s, m)[1]))
    reads = [view_buffer(program, use(l), l) for l in layers] + \
        [b.name for l in layers for b in kept_residuals(program, l, m)]
    if not recovers_in_backward(program, s, m):
        reads += [buffer_name(BufferKind.REC, layer=l, micro_batch=m)
                  for l in layers if (l, m) in program.recompute]
    reads += [grad_buffer(program, l).name for l in layers] if m != 0 else []
    reads += [buffer_name(BufferKind.GIN, micro_batch=m)] if not holds_loss(program, s) else []
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
    master and Adam moments, [master | m | v] each part_stride apart."""
    shard = shard_elements(layer_param_count(program, layer), program, program.options.zero >= 1)
    return Buffer(buffer_name(BufferKind.UNDO, layer=layer), "optimizer",
                  3 * part_stride(4 * shard))


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
    layers, views = state_layers(program, task.stage), program.options.zero < 3  # ZeRO-3: none
    kinds = (BufferKind.UNDO, BufferKind.MASTER, BufferKind.OPT) + \
        ((BufferKind.VIEW,) if views else ())
    return Effects((), tuple(name for l in layers for name in (_update_grad(program, l),) +
                             tuple(buffer_name(kind, layer=l) for kind in kinds)))


def _message_posted(program, task: Task, sender: int) -> Effects:
    """A POST creates the message buffer its RECV fills, sized for what the sending stage
    (the task's stage + `sender`) sends."""
    return Effects((Buffer(message_buffer(task), "comm",
                           message_bytes(program, task.stage + sender)),), ())


def shard_effects(program, task: Task, forward: bool):
    """Effects of S (`forward`) or T: S creates vocab.mb (reading the stage's view of its
    shard, and on the last stage out.mb, hn from its F); T reads them and the shard's
    gradient (micro-batch 0's creates it) and on the last stage creates gin.mb, where
    the parts of hn's gradient are summed."""
    s, m = task.stage, task.micro_batch
    layer, last = stage_vocab_layer(program, s), s == len(program.stages) - 1
    vocab = buffer_name(BufferKind.VOCAB, micro_batch=m)
    view = view_buffer(program, task, layer)
    if forward:
        reads = (view,) + ((buffer_name(BufferKind.OUT, micro_batch=m),) if last else ())
        return Effects((Buffer(vocab, "activations", vocab_bytes(program)),), reads)
    grad = grad_buffer(program, layer)
    creates = ((grad,) if m == 0 else ()) + \
        ((Buffer(buffer_name(BufferKind.GIN, micro_batch=m), "comm",
                 message_bytes(program, s)),) if last else ())
    return Effects(creates, (vocab, view) + (() if m == 0 else (grad.name,)))


def embed_effects(program, task: Task, forward: bool) -> Effects:
    """Effects of E (`forward`) or G (NOTE [vocabulary-parallel embedding]): each creates
    its workspace (the ids; G off stage 0 the gradient it receives too). E reads the
    stage's view of its shard and on stage 0 creates in.mb, where the shards' lookups
    are summed for its F; G reads the shard's gradient (micro-batch 0's creates it) and
    on stage 0 its B's gout.mb, which it broadcasts."""
    s, m = task.stage, task.micro_batch
    layer = stage_embed_layer(program, s)
    workspace = Buffer(buffer_name(BufferKind.WS, task=task), "workspace",
                       embed_workspace_bytes(program, task))
    if forward:
        summed = (Buffer(buffer_name(BufferKind.IN, micro_batch=m), "comm",
                         hidden_bytes(program)),) if s == 0 else ()
        return Effects((workspace,) + summed, (view_buffer(program, task, layer),))
    grad = grad_buffer(program, layer)
    reads = (() if m == 0 else (grad.name,)) + \
        ((buffer_name(BufferKind.GOUT, micro_batch=m),) if s == 0 else ())
    return Effects((workspace,) + ((grad,) if m == 0 else ()), reads)


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
    Kind.S: lambda p, t: shard_effects(p, t, forward=True),
    Kind.T: lambda p, t: shard_effects(p, t, forward=False),
    Kind.E: lambda p, t: embed_effects(p, t, forward=True),
    Kind.G: lambda p, t: embed_effects(p, t, forward=False),
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
