"""choose_grad_accumulation: how each layer's gradient is accumulated under ZeRO-2.

Runs before insert_recovery, whose budget search must see the gradient buffers.
NOTE [gradient accumulation]: `local` keeps the full fp32 gradient from the first B of
the step to its SYNC (one reduce-scatter per step, a full-size buffer alive); `scatter`
reduce-scatters each micro-batch's gradient right after the layer's backward inside B
(under zb1 inside W[L], the last to make one of them) and accumulates only this rank's
shard (M collectives, a shard alive). It trades link
bandwidth for memory; for the largest models under 20 GB it decides feasibility.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.passes import what_if
from ratrain.passes.buffers import stage_peak


def _fits_locally(program, stage: int) -> bool:
    """Does the stage fit with local accumulation even when recomputing everything?"""
    candidate = what_if.with_syncs_and_updates(what_if.recompute_everything(program, stage))
    return stage_peak(candidate, stage) <= program.options.budget


def choose_grad_accumulation(program):
    """Set `program.scatter_grads`.

    Requires: stages and the pipeline's tasks. Guarantees: empty unless ZeRO-2 or 3;
    `scatter` puts every layer there; `auto` puts a stage's layers there only if the stage
    cannot fit the budget with local accumulation under any recompute policy. A layer
    binding a tied weight always accumulates locally: its TIE sums the full gradient (NOTE
    [tied weights]). Under zb1 a layer's W[L] starts its reduce-scatter (NOTE [weight
    operands]).
    """
    o = program.options
    if o.zero < 2 or o.grad_accum == "local":
        return replace(program, scatter_grads=frozenset())
    tied = {l for layers in program.graph.tied.values() for l in layers}
    layers = lambda stages: frozenset(l for s in stages for l in program.stages[s]
                                      if l not in tied)
    if o.grad_accum == "scatter":
        return replace(program, scatter_grads=layers(range(len(program.stages))))
    if o.budget is None:
        return replace(program, scatter_grads=frozenset())
    tight = [s for s in range(len(program.stages)) if not _fits_locally(program, s)]
    return replace(program, scatter_grads=layers(tight))
