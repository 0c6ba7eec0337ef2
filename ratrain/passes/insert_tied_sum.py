"""insert_tied_sum: one TIE per stage holding a layer that shares a weight with another
layer (tied input and output embeddings), summing the gradient halves before the DP sync.

Runs after insert_update (the SYNC/UPD/NORM order is known) and before insert_prefetch.
NOTE [tied weights]: every binding layer keeps its own copy of the shared weight (master,
Adam moments, view, gradient), as Megatron's embedding group does. TIE[L] adds the copies'
gradients: in place on one stage when both layers are there (pp 1), otherwise by a
blocking all-reduce between the ranks of the binding stages in the same replica. Every
copy then holds the whole gradient of the weight, is synced over its DP group and updated
once by the same AdamW step from the same values, so the copies stay bit-identical; the
global norm counts the weight once (its first layer's copy), and checkpoints hold it once.
The cost is the optimizer state of the weight on a second stage, and a transfer of the
weight's gradient between the two stages per step.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ratrain.ir.tasks import GRAD_PRODUCERS, Kind, Task
from ratrain.ir.vocab import stage_embed_layer, stage_vocab_layer


@dataclass(frozen=True)
class TiedWeight:
    name: str                           # HF name ("model.embed_tokens.weight")
    layers: tuple[int, ...]             # the layers binding it, in model order
    stages: tuple[int, ...]             # their stages, ascending, without repeats


def tied_weights(program) -> tuple[TiedWeight, ...]:
    """The weights more than one layer binds, with the stages holding those layers."""
    out = []
    for name, layers in program.graph.tied.items():
        stages = tuple(sorted({program.stage_of_layer(l) for l in layers}))
        out.append(TiedWeight(name, layers, stages))
    return tuple(out)


def tie_stages(program) -> tuple[int, ...]:
    """The stages that run a TIE (one group: every tied weight spans the same stages), or
    () where each tied weight's copies are all on one stage, each on its own (the rows of
    a vocabulary-parallel embedding and head: NOTE [vocabulary-parallel embedding])."""
    groups = {w.stages for w in tied_weights(program)}
    if len(groups) > 1 and all(len(g) == 1 for g in groups):
        return ()
    if len(groups) > 1:
        raise NotImplementedError(f"tied weights span different stage groups {sorted(groups)}; "
                                  "one group (embed and head stages) is supported")
    return groups.pop() if groups else ()


def weight_stages(program, weight: TiedWeight) -> tuple[int, ...]:
    """The stages a TIE of `weight` sums over: the program's tie stages, or the one stage
    holding all of its copies where each weight's are on one stage (tie_stages ())."""
    return tie_stages(program) or weight.stages


def produced_layers(program, task: Task) -> tuple[int, ...]:
    """The layers whose gradient a GRAD_PRODUCERS task writes: a B its stage's, a piece
    or a W its layer's, a T (G) its stage's shard of the LM head (of the embedding)."""
    if task.kind == Kind.T:
        return (stage_vocab_layer(program, task.stage),)
    if task.kind == Kind.G:
        return (stage_embed_layer(program, task.stage),)
    return tuple(program.stages[task.stage]) if task.layer is None else (task.layer,)


def tied_layers_on(program, stage: int) -> tuple[int, ...]:
    """Layers of `stage` binding a tied weight, in model order."""
    return tuple(sorted({l for w in tied_weights(program) for l in w.layers
                         if program.stage_of_layer(l) == stage}))


def _with_tie(program, stage: int, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    tied = tied_layers_on(program, stage)
    if not tied:
        return tasks
    moved = [t for t in tasks if t.kind == Kind.SYNC and t.layer in tied]
    kinds = [t.kind for t in tasks]
    # after-norm: the NORM precedes the UPDs; under the commit rule it ends the step
    norm_first = Kind.NORM in kinds and (Kind.UPD not in kinds or
                                         kinds.index(Kind.NORM) < kinds.index(Kind.UPD))
    if not norm_first:  # the tied UPDs follow their SYNCs to the end of the update block
        moved += [t for t in tasks if t.kind == Kind.UPD and t.layer in tied]
    first = min(tasks.index(t) for t in moved)
    rest = [t for t in tasks if t not in moved]
    if norm_first:
        at = next(i for i, t in enumerate(rest) if t.kind == Kind.NORM)
    else:
        updates = [i for i, t in enumerate(rest) if t.kind == Kind.UPD]
        # after the last task making a tied layer's gradient, where that comes later (a
        # stage whose layers are all tied; a shard of a vocabulary-parallel head syncs
        # after its last T, before the last B, and an embedding's after its last G,
        # which may follow every other update of the stage)
        made = [i for i, t in enumerate(rest) if t.kind in GRAD_PRODUCERS and
                set(produced_layers(program, t)) & set(tied)]
        at = max(updates[-1] + 1 if updates else first, made[-1] + 1 if made else 0)
    return tuple(rest[:at]) + (Task(stage, Kind.TIE, layer=tied[0]), *moved) + tuple(rest[at:])


def insert_tied_sum(program):
    """Add TIE[L] on every stage holding a layer that binds a tied weight (L: the first
    such layer of the stage).

    Requires: SYNC and UPD tasks (and NORM when global scalars rule). Guarantees: the TIE
    precedes the SYNCs of its stage's tied layers, which follow every other SYNC; with a
    NORM before the UPDs it comes right before it (the norm needs the summed gradient),
    otherwise (also under the commit rule) the tied SYNCs and UPDs end the stage's update
    block, before a NORM that ends the step (NOTE [tied weights]), so the other
    layers update while the TIE waits for the peer stage's backward.
    """
    if not program.graph.tied:
        return program
    tie_stages(program)  # one stage group, or refuse
    tasks = {s: _with_tie(program, s, ts) for s, ts in program.tasks.items()}
    return replace(program, tasks=tasks)
