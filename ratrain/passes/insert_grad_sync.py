"""insert_grad_sync: one SYNC per layer per step, issued after the layer's last backward.

Runs after insert_recovery (the F/B/REC order is final). In `ratrain` mode it splits the
step's last B into per-layer pieces and puts each SYNC[L] right after L's piece, where the
runtime and the simulator start it (NOTE [sync issue point]); in `baseline` the syncs run
blocking at the step end. All-reduce under ZeRO 0/1, reduce-scatter under ZeRO 2, over
the stage's DP group.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.ir.tasks import Kind, Task
from ratrain.ir.vocab import stage_embed_layer, stage_vocab_layer, state_layers

# NOTE [sync issue point]: the task list says where every SYNC starts, and every consumer
# (runtime, simulator, plan_memory, verifier) reads it there. A stage's B runs its layers
# last to first, so in ratrain mode the step's last B is written as its per-layer pieces
# `sB[L]m` (last layer first; lower gives each piece exactly that layer's calls of the B,
# in the B's order, so the numbers do not change), and SYNC[L] stands right after L's
# piece: its non-blocking collective starts as soon as layer L's gradient is complete and
# crosses the link while the backward of the layers before it runs. The first layer's
# piece is followed by the B's SEND_B (the previous stage waits for it), then by the SYNCs
# that could not start earlier, in reverse layer order: the first layer's, and those that
# only wait for the reduce-scatters each B already started (scatter accumulation, NOTE
# [gradient accumulation]; waiting inside the backward would stall it). Only the last B
# is split: an earlier B is never followed by a SYNC. The split happens here because it
# exists for the SYNCs; the passes after this one (update, tied sum, prefetch, gathers,
# plan_memory, lower) treat a piece as the part of its B that touches its layer. The
# baseline starts the SYNCs only after every task of the stage is done, and waits for each.


def last_backward_index(tasks) -> int:
    return max(i for i, t in enumerate(tasks) if t.kind == Kind.B)


def backward_pieces(program, backward: Task) -> tuple[Task, ...]:
    """The per-layer pieces of a B, in the order it runs its layers (last first)."""
    return tuple(Task(backward.stage, Kind.BL, micro_batch=backward.micro_batch, layer=l)
                 for l in reversed(program.stages[backward.stage]))


def _starts_after_piece(program, stage: int, layer: int) -> bool:
    """Does SYNC[layer] stand right after its piece (NOTE [sync issue point])? Not the
    stage's first layer (its SEND_B goes first) nor a layer synced by per-micro-batch
    reduce-scatters (its SYNC only waits)."""
    return layer != program.stages[stage][0] and \
        layer not in program.scatter_grads


def _split_with_syncs(program, stage: int, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    last = last_backward_index(tasks)
    out = list(tasks[:last])
    for piece in backward_pieces(program, tasks[last]):
        out.append(piece)
        if _starts_after_piece(program, stage, piece.layer):
            out.append(Task(stage, Kind.SYNC, layer=piece.layer))
    rest = tasks[last + 1:]
    # what the stages before wait for: the SEND_B, or stage 0's G of a vocabulary-parallel
    # embedding, which broadcasts the gradient every other stage's G waits for
    send = rest[:1] if rest and rest[0].kind in (Kind.SEND_B, Kind.G) else ()
    late = [Task(stage, Kind.SYNC, layer=l) for l in reversed(program.stages[stage])
            if not _starts_after_piece(program, stage, l)]
    return tuple(out) + send + tuple(late) + rest[len(send):]


def last_weight_indices(tasks) -> dict[int, int]:
    """layer -> index of its step's last W (zb1 programs; NOTE [zb1 schedule])."""
    return {t.layer: i for i, t in enumerate(tasks) if t.kind == Kind.W}


def last_shard_index(tasks, kind: Kind = Kind.T) -> int:
    """Index of the step's last T (-1: none; NOTE [vocabulary-parallel head]), or of
    another kind's last task (G: NOTE [vocabulary-parallel embedding])."""
    return max((i for i, t in enumerate(tasks) if t.kind == kind), default=-1)


def _after_last_weights(stage: int, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    """See NOTE [zb1 schedule]: SYNC[L] right after the step's last W of layer L."""
    last = {i: layer for layer, i in last_weight_indices(tasks).items()}
    out = []
    for i, task in enumerate(tasks):
        out.append(task)
        if i in last:
            out.append(Task(stage, Kind.SYNC, layer=last[i]))
    return tuple(out)


def _with_syncs(program, stage: int, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    if program.options.schedule == "baseline":
        return tasks + tuple(Task(stage, Kind.SYNC, layer=l)
                             for l in reversed(state_layers(program, stage)))
    tasks = _after_last_shard_task(program, stage, tasks, stage_vocab_layer, Kind.T)
    tasks = _after_last_shard_task(program, stage, tasks, stage_embed_layer, Kind.G)
    if program.options.pipeline_schedule == "zb1":
        return _after_last_weights(stage, tasks)
    return _split_with_syncs(program, stage, tasks)


def _after_last_shard_task(program, stage: int, tasks: tuple[Task, ...], shard_of,
                           kind: Kind) -> tuple[Task, ...]:
    """See NOTE [vocabulary-parallel head]: the stage's shard of the LM head (`shard_of`:
    stage_vocab_layer) syncs right after its last T, the task that completes its
    gradient; of the embedding (stage_embed_layer) after its last G."""
    layer = shard_of(program, stage)
    if layer is None:
        return tasks
    last = last_shard_index(tasks, kind)
    return tasks[:last + 1] + (Task(stage, Kind.SYNC, layer=layer),) + tasks[last + 1:]


def insert_grad_sync(program):
    """Add SYNC[L] for every layer L of every stage.

    Requires: F/B(/W) tasks (and RECs) in final order. Guarantees: each layer has
    exactly one SYNC, after the last task producing its gradient; in ratrain mode under
    1f1b the stage's last B is replaced by its per-layer pieces (backward_pieces) and each
    SYNC stands where NOTE [sync issue point] starts it, under zb1 each SYNC[L] follows
    its layer's last W; in baseline mode they end the stage's list.
    """
    tasks = {s: _with_syncs(program, s, ts) for s, ts in program.tasks.items()}
    return replace(program, tasks=tasks)
