"""insert_update: per-layer (shard) AdamW after the layer's gradient sync.

Runs after insert_grad_sync. Without global couplings each UPD[L] follows its SYNC
(ratrain mode: the UPDs follow the SYNCs in the same order, so UPD[L] overlaps the
transfer of the next layer's SYNC). With global-norm clipping or fp16 overflow checks a
NORM task (scalar all-reduce over all ranks) decides the step: under the commit rule it
ends the step and commits or redoes the speculative UPDs before it (NOTE [commit rule]);
under after-norm it comes before any UPD, so the math is that of a whole-model step.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.ir.tasks import Kind, Task


def needs_global_norm(options) -> bool:
    return options.clip is not None or options.precision == "fp16"


def commits_updates(options) -> bool:
    """Do the UPDs run speculatively before the NORM (NOTE [commit rule])? Only with a
    NORM, in the ratrain schedule, under --update-rule commit."""
    return needs_global_norm(options) and options.schedule == "ratrain" and \
        options.update_rule == "commit"


# NOTE [commit rule]: Zero Bubble PP's optimizer post-validation, under --update-rule
# commit.
# 1. Speculative update. Each UPD[L] runs as soon as its SYNC is done, as without a NORM:
#    its AdamW call first takes the layer's share of the global norm from the synced
#    gradient (sum of squares and finite flag of the part this rank owns; fp16: unscaled
#    in place with the known loss scale first, as the NORM of after-norm would), copies
#    the layer's master and Adam moments into undo.L, then steps in place with clip
#    coefficient 1; PREF[L] builds the next view from it at once.
# 2. The decision. The NORM at the step end sums the layers' shares in the stage's layer
#    order (the same float additions as after-norm's) and all-reduces them:
#    - commit (neither clipped nor overflowing, every step in steady state): nothing to do;
#    - roll back (clip coefficient < 1, or a non-finite gradient): every layer copies
#      undo.L back and redoes after-norm's AdamW (with the coefficient; an overflow skips
#      it and lowers the loss scale, as before), then its view is rebuilt.
# 3. Exactness. The redo reads the same gradient, master and moments as after-norm's UPD,
#    so losses and weights are bit-identical under both rules. The rollback-only calls
#    (redo_update, prefetch_view[redo]) are skipped on a committed step before the
#    runtime's hazard rule would wait for the views' all-gathers.
# 4. Memory. undo.L (3 x the shard's fp32 bytes) lives from UPD[L] to the NORM, the
#    gradients until the NORM as under after-norm. It is the least that stays exact: a
#    staging copy of the new state costs the same bytes plus a copy on every commit,
#    updating only the views speculatively would leave the whole AdamW pass for the tail,
#    and AdamW cannot be inverted bit-exactly. undo.L lives in the step's tail, where the
#    activations are gone, so under ZeRO 1/2 it rarely raises the peak; under ZeRO 0 it
#    can (plan_memory counts it, the budget error names --update-rule after-norm).
# 5. Simulation. The simulator assumes every step commits: the rollback calls cost
#    nothing there, the speculative AdamW the copy and the norm share it adds, the NORM
#    its world sum.


def _update_order(program, layers: list[int]) -> list[int]:
    # NOTE [update order after NORM]: with a NORM before them every UPD waits for the
    # whole step's gradients, so the order of the updates (and of the PREFs behind them)
    # is free. The ratrain schedule then runs them in layer order, the order in which
    # the next step's forwards read the views: the runtime does not wait for a PREF's
    # all-gather at the step end, only when a task touches its view, so the next step's
    # F of the first layer starts once that one layer's view is gathered. Under the
    # commit rule an UPD waits for its own SYNC only, so SYNC order is best.
    o = program.options
    if needs_global_norm(o) and o.schedule == "ratrain" and not commits_updates(o):
        return sorted(layers)
    return layers


def _with_updates(program, stage: int, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    syncs = [i for i, t in enumerate(tasks) if t.kind == Kind.SYNC]
    at = syncs[-1] + 1
    layers = _update_order(program, [tasks[i].layer for i in syncs])
    updates = [Task(stage, Kind.UPD, layer=l) for l in layers]
    if commits_updates(program.options):
        updates.append(Task(stage, Kind.NORM))
    elif needs_global_norm(program.options):
        updates.insert(0, Task(stage, Kind.NORM))
    return tasks[:at] + tuple(updates) + tasks[at:]


def insert_update(program):
    """Add UPD[L] (and a NORM when clipping or loss scaling needs global scalars).

    Requires: one SYNC per layer. Guarantees: every UPD comes after its SYNC, in the
    SYNC order, or after a NORM in layer order in ratrain mode under after-norm (NOTE
    [update order after NORM]); a NORM, when present, precedes every UPD of the stage,
    or under the commit rule follows all of them (NOTE [commit rule]).
    """
    tasks = {s: _with_updates(program, s, ts) for s, ts in program.tasks.items()}
    return replace(program, tasks=tasks)
