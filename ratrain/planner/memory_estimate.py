"""Closed-form memory estimate of a partitioned candidate: the bytes of each stage at its
peak, by plan_memory's categories. It follows what plan_memory will see (the persistent
state of buffers.py, gradient buffers, activations in flight, one micro-batch's
recomputed residuals, messages, the backward workspace) and the choices
choose_grad_accumulation and insert_recovery(auto) will make; per-layer kept bytes come
from the Estimator's kind times (estimate.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ratrain.passes.buffers import CATEGORIES, persistent_buffers, undo_buffer
from ratrain.passes.choose_grad_accumulation import accumulates_locally
from ratrain.passes.insert_recovery import RECOMPUTE_LEVELS as LEVELS, auto_recompute_level
from ratrain.passes.insert_update import commits_updates
from ratrain.passes.layer_buffers import (backward_workspace, layer_param_count, message_bytes,
                                          recovers_in_backward, shard_elements)
from ratrain.passes.partition_stages import in_flight_micro_batches


@dataclass(frozen=True)
class StagePlan:
    local_grads: bool                   # full fp32 gradients (else reduce-scattered shards)
    level: str                          # recompute level of most (layer, mb) pairs
    lowered: int                        # pairs of the last window kept one level lower
    need: dict                          # estimated bytes at the peak, by category


def stage_bytes(est, program, stage: int, level: str, local: bool) -> dict[str, int]:
    """Bytes of the stage at its peak, by plan_memory's CATEGORIES, with every decoder
    pair recomputed at `level` and full (`local`) or sharded fp32 gradients."""
    layers = program.stages[stage]
    need = dict.fromkeys(CATEGORIES, 0)
    for b in persistent_buffers(program, stage):
        need[b.category] += b.nbytes
    need["grads"] = sum(4 * shard_elements(layer_param_count(program, l), program, not local)
                        for l in layers)
    decoder = [program.graph.layers[l].kind == "decoder" for l in layers]
    times = [est.times(program, l) for l in layers]
    kept = sum(t.kept[level if d else "none"] for t, d in zip(times, decoder))
    if program.options.recompute == "auto":  # leaves to B what FSR cannot fit
        program = replace(program, backward_recovery=frozenset(  # NOTE [where recovery runs]
            (stage, m) for m in range(program.options.micro_batches)))
    in_backward = recovers_in_backward(program, stage, 0)  # NOTE [backward-time recovery]
    rebuilt = 0 if in_backward else \
        sum(t.kept["none"] - t.kept[level] for t, d in zip(times, decoder) if d)
    need["activations"] = in_flight_micro_batches(program, stage) * kept + rebuilt
    # at the peak: the message received, the one sent, and a cotangent posted or sent back
    peers = neighbours(program, stage)
    need["comm"] = (1 + peers) * stage_message_bytes(program, stage) if peers else 0
    scatter = frozenset() if local else frozenset(layers)  # scattered grads stay in ws
    modes = {l: level for l, d in zip(layers, decoder) if d and level != "none"}
    need["workspace"] = backward_workspace(replace(program, scatter_grads=scatter), stage, 0,
                                           modes)[1]  # the modes count only in backward
    return max(need, _sync_need(program, stage, need, local, kept + rebuilt),
               _commit_need(program, stage, need), key=total)


def _commit_need(program, stage: int, need: dict) -> dict:
    """The bytes at the NORM under the commit rule (NOTE [commit rule]): the persistent
    state, every gradient the updates read and every layer's undo copy."""
    if not commits_updates(program.options):
        return need
    o, layers = program.options, program.stages[stage]
    counts = [layer_param_count(program, l) for l in layers]
    persistent = {c: b for c, b in need.items() if c in ("params", "optimizer", "views")}
    grads = sum(4 * shard_elements(n, program, o.zero >= 2) for n in counts)
    undo = sum(undo_buffer(program, l).nbytes for l in layers)
    return {**dict.fromkeys(CATEGORIES, 0), **persistent, "grads": grads,
            "optimizer": persistent.get("optimizer", 0) + undo}


def _sync_need(program, stage: int, need: dict, local: bool, one_micro_batch: int) -> dict:
    """The bytes while ZeRO-2 SYNCs reduce-scatter full gradients (activations and
    workspaces are gone by then, and the B workspace can be the smaller peak): during
    the k-th SYNC (reverse layer order) the gradients of the layers not yet synced and
    the shards of those synced, not yet consumed by their UPD, are alive. In ratrain
    mode every SYNC but the first layer's stands between the pieces of the step's last B
    (NOTE [sync issue point]), which keep that B's buffers alive: every full gradient,
    its activations (`one_micro_batch`), messages and workspace; the first layer's SYNC
    follows them, with every other layer's shard."""
    if program.options.zero < 2 or not local:
        return need
    counts = [layer_param_count(program, l) for l in reversed(program.stages[stage])]
    full = [4 * n for n in counts]
    shard = [4 * shard_elements(n, program, True) for n in counts]
    persistent = {c: b for c, b in need.items() if c in ("params", "optimizer", "views")}
    base = {**dict.fromkeys(CATEGORIES, 0), **persistent}
    if program.options.schedule != "ratrain" or len(full) == 1:
        return {**base, "grads": max(sum(full[k:]) + sum(shard[:k + 1])
                                     for k in range(len(full)))}
    inside = {**base, "grads": sum(full) + sum(shard[:-1]), "activations": one_micro_batch,
              "workspace": need["workspace"],
              "comm": neighbours(program, stage) * stage_message_bytes(program, stage)}
    return max(inside, {**base, "grads": full[-1] + sum(shard)}, key=total)


def neighbours(program, stage: int) -> int:
    """Stages the stage sends messages to."""
    return (stage > 0) + (stage < program.options.pp - 1)


def stage_message_bytes(program, stage: int) -> int:
    """One activation or cotangent message of the stage: its output, or for the last
    stage (whose output is the loss) the previous stage's."""
    if program.options.pp == 1:
        return 0
    return message_bytes(program, stage if stage < program.options.pp - 1 else stage - 1)


def stage_plan(est, program, stage: int) -> StagePlan:
    """What choose_grad_accumulation and insert_recovery will likely pick, and the peak."""
    o = program.options
    budget = np.inf if o.budget is None else o.budget
    local = accumulates_locally(  # the compiler's rule, on the estimated bytes
        o, lambda: total(stage_bytes(est, program, stage, "full", True)) <= budget)
    need = lambda level: stage_bytes(est, program, stage, level, local)
    if o.recompute != "auto":
        return StagePlan(local, o.recompute, 0, need(o.recompute))
    level = auto_recompute_level(lambda lv: total(need(lv)) <= budget)  # the compiler's rule
    if level == "none":
        return StagePlan(local, level, 0, need(level))
    return _auto_plan(est, program, stage, local, level, need(level))


def total(need: dict) -> int:
    return sum(need.values())


# NOTE [auto estimate]: insert_recovery's auto escalates (layer, micro-batch) pairs in
# micro-batch-major order, first to selective, then to full with the rest selective. The
# peak sits in the last window of min(P - s, M) micro-batches in flight, whose pairs come
# last in that order; so the first level whose all-pairs estimate fits is used for every
# pair but the k of the last window that the remaining headroom keeps one level lower.
def _auto_plan(est, program, stage: int, local: bool, level: str, need: dict) -> StagePlan:
    o, layers = program.options, program.stages[stage]
    decoders = [est.times(program, l) for l in layers if program.graph.layers[l].kind == "decoder"]
    lower = LEVELS[LEVELS.index(level) - 1]
    extra = sum(t.kept[lower] - t.kept[level] for t in decoders) / max(len(decoders), 1)
    window = in_flight_micro_batches(program, stage) * len(decoders)
    headroom = o.budget - total(need)
    lowered = min(window, int(headroom // extra)) if extra > 0 and headroom >= 0 else 0
    return StagePlan(local, level, max(lowered, 0), need)
