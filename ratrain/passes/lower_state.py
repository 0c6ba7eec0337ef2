"""lower, part 2: the training-state tasks as calls (SYNC, UPD, NORM, PREF, GATH, TIE).

lower.py lowers the compute and message tasks and runs the pass; these are the
lifecycle tasks of DESIGN section 5 over the flat fp32 slots of master, moments and
gradients and the layers' view slots: gradient syncs, AdamW (speculative under the
commit rule, NOTE [commit rule]), the NORM that commits or rolls back, the views' casts
and gathers (NOTE [ZeRO-3 lifecycle]) and the tied weights' sums (NOTE [tied weights]).
"""
from __future__ import annotations

import math
from dataclasses import replace

from ratrain.ir.buffers import (BufferKind, buffer_name, is_grad_shard, parse_buffer,
                                sync_buffers, update_grad)
from ratrain.ir.tasks import Kind, Task
from ratrain.ir.vocab import base_name, parse_shard, state_layers
from ratrain.passes.layer_buffers import (gathers_in_place, grad_layout, shard_elements,
                                          view_gather_elements, view_layout)
from ratrain.passes.insert_gathers import gather_of, gathers_issued_in
from ratrain.passes.insert_tied_sum import tied_weights, weight_stages
from ratrain.passes.insert_update import commits_updates
from ratrain.passes.layout import part_stride
from ratrain.program_format.call_ops import CallOp
from ratrain.program_format.lowered import Call, Slot, flat_slot, var_slot


def state_slots(program, layer: int) -> tuple[Slot, Slot, Slot, int, int]:
    """master, m, v slots of a layer on this rank, the full size and the shard size."""
    _, n = grad_layout(program, layer)
    shard = shard_elements(n, program, program.options.zero >= 1)
    opt = buffer_name(BufferKind.OPT, layer=layer)
    return (flat_slot(buffer_name(BufferKind.MASTER, layer=layer), shard), flat_slot(opt, shard),
            flat_slot(opt, shard, part_stride(4 * shard)), n, shard)


def grad_slot(program, name: str) -> Slot:
    """A layer's flat fp32 gradient buffer `name` on this rank: grad.L whole, gshard.L
    this rank's shard of it."""
    _, _, _, n, shard = state_slots(program, parse_buffer(name).layer)
    return flat_slot(name, shard if is_grad_shard(name) else n)


def _lower_sync(program, task: Task) -> list[Call]:
    layer, zero, scattered = task.layer, program.options.zero, task.layer in program.scatter_grads
    source, target = sync_buffers(layer, zero, scattered)
    # scattered: already reduce-scattered inside each B, wait only
    op = "wait" if scattered else "reduce_scatter" if zero >= 2 else "allreduce"
    return [Call(CallOp.GRAD_SYNC, (grad_slot(program, target),), (grad_slot(program, source),),
                 (("op", op),), f"L{layer}", layer=layer)]


def _update_grad_slot(program, layer: int) -> Slot:
    return grad_slot(program, update_grad(layer, program.options.zero))


def undo_slots(program, layer: int) -> tuple[Slot, Slot, Slot]:
    """See NOTE [commit rule]: where a speculative UPD keeps the old master, m and v."""
    shard = state_slots(program, layer)[4]
    undo = buffer_name(BufferKind.UNDO, layer=layer)
    return tuple(flat_slot(undo, shard, k * part_stride(4 * shard)) for k in range(3))


def _lower_update(program, task: Task) -> list[Call]:
    """AdamW of one layer; under the commit rule a speculative one (NOTE [commit rule]):
    outputs master, m, v and their undo copies, params say how to take the layer's
    share of the norm (loss_scale: unscale first; skip: a tied weight's second copy)."""
    layer, zero = task.layer, program.options.zero
    master, m, v, _, _ = state_slots(program, layer)
    grad, params = _update_grad_slot(program, layer), (("zero", zero),)
    if not commits_updates(program.options):
        return [Call(CallOp.ADAMW, (master, m, v), (grad,), params, f"L{layer}", layer=layer)]
    skip = tuple(_norm_skips(program, layer))
    params += (("speculative", True),) + ((("skip", skip),) if skip else ())
    return [Call(CallOp.ADAMW, (master, m, v, *undo_slots(program, layer)), (grad,),
                 _loss_scaled(program, params), f"L{layer}", layer=layer)]


def view_slots(program, layer: int, buffer: str | None = None) -> tuple[Slot, ...]:
    """The layer's parameters in its view buffer (view.L, or `buffer`), in parameter order."""
    offsets, _ = view_layout(program, layer)
    params = program.graph.kinds[program.graph.layers[layer].kind].fwd.params
    buffer = buffer or buffer_name(BufferKind.VIEW, layer=layer)
    return tuple(var_slot(buffer, o, p) for o, p in zip(offsets, params))


def _lower_prefetch(program, task: Task) -> list[Call]:
    """The view from the master: cast, and all-gathered under ZeRO 1/2, into view.L as one
    flat slot of D shards where that is the view (NOTE [views gathered in place])."""
    layer = task.layer
    master = state_slots(program, layer)[0]
    views, in_place = _gather_target(program, layer, buffer_name(BufferKind.VIEW, layer=layer))
    return [Call(CallOp.PREFETCH_VIEW, views, (master,),
                 (("gather", program.options.zero >= 1),) + in_place, f"L{layer}",
                 layer=layer)]


def gather_call(program, gather) -> Call:
    """See NOTE [ZeRO-3 lifecycle]: cast this rank's master shard, all-gather the cast shards
    into the layer's view slot (non-blocking: the first call touching the slot waits)."""
    layer = gather.task.layer
    views, in_place = _gather_target(program, layer,
                                     buffer_name(BufferKind.ZVIEW, slot=gather.slot))
    return Call(CallOp.GATHER_VIEW, views, (state_slots(program, layer)[0],),
                (("use", str(gather.uses[0][0])),) + in_place, f"L{layer} gather",
                layer=layer)


def _gather_target(program, layer: int, buffer: str) -> tuple[tuple[Slot, ...], tuple]:
    """What a PREF or GATH of `layer` into `buffer` writes, and its extra params: the
    parameters' view slots, or one flat slot of D shards received in place (NOTE [views
    gathered in place])."""
    if not gathers_in_place(program, layer):
        return view_slots(program, layer, buffer), ()
    flat = Slot(buffer, 0, program.graph.dtype, (view_gather_elements(program, layer),))
    return (flat,), (("in_place", True),)


def _lower_gather(program, task: Task) -> list[Call]:
    """A gather at the step start runs at its row; every other one is a call of the task
    holding its issue point (_with_gathers_issued)."""
    gather = gather_of(program, task)
    return [gather_call(program, gather)] if gather.after is None else []


def _with_gathers_issued(program, task: Task, calls: list[Call]) -> list[Call]:
    """See NOTE [ZeRO-3 lifecycle]: a compute task's calls with the gathers it issues, each
    right after the last call of the layer whose use frees the gather's view slot, or
    first when that use was the previous piece of a B (insert_gathers.issuing_task)."""
    issued = gathers_issued_in(program, task)
    if not issued:
        return calls
    ends = {c.layer: i for i, c in enumerate(calls)}
    after: dict[int, list[Call]] = {}
    for g in issued:
        at = ends[g.after[1]] if g.after[0] == task else -1
        after.setdefault(at, []).append(gather_call(program, g))
    return after.get(-1, []) + \
        [c for i, call in enumerate(calls) for c in [call] + after.get(i, [])]


def _loss_scaled(program, params: tuple) -> tuple:
    """fp16 programs scale the loss cotangent by the dynamic loss scale, and their
    global_norm unscales the gradients (in place) and checks them for overflow."""
    if program.options.precision != "fp16":
        return params
    return tuple(sorted(params + (("loss_scale", True),)))


def _norm_skips(program, layer: int):
    """(lo, hi, n) of each tied weight's copy the norm does not count in `layer`."""
    return ((*tied_range(program, layer, w.name), grad_layout(program, layer)[1])
            for w in tied_weights(program) if layer in w.layers[1:])


def _lower_commit(program, task: Task) -> list[Call]:
    """See NOTE [commit rule]: the world sum of the UPDs' norm shares decides; on a rollback
    every layer redoes its update from undo.L and rebuilds its view (no-ops otherwise).
    Under ZeRO-3 there are no views to rebuild: each use gathers from the master shards
    (NOTE [ZeRO-3 lifecycle])."""
    layers = state_layers(program, task.stage)
    params = (("clip", program.options.clip), ("layers", tuple(layers)))
    calls = [Call(CallOp.GLOBAL_NORM, (), (), _loss_scaled(program, params), "step")]
    for layer in layers:
        master, m, v, _, _ = state_slots(program, layer)
        calls.append(Call(CallOp.REDO_UPDATE, (master, m, v),
                          (_update_grad_slot(program, layer), *undo_slots(program, layer)),
                          (("zero", program.options.zero),), f"L{layer}", layer=layer))
    for layer in layers if program.options.zero < 3 else ():
        prefetch = _lower_prefetch(program, Task(task.stage, Kind.PREF, layer=layer))[0]
        calls.append(replace(prefetch, params=tuple(sorted(prefetch.params + (("redo", True),)))))
    return calls


def _lower_norm(program, task: Task) -> list[Call]:
    if commits_updates(program.options):
        return _lower_commit(program, task)
    layers = state_layers(program, task.stage)
    grads = tuple(_update_grad_slot(program, l) for l in layers)
    unscaled = grads if program.options.precision == "fp16" else ()  # written in place
    params = (("clip", program.options.clip),)
    skip = tuple((i, *tied_range(program, l, w.name), grad_layout(program, l)[1])
                 for i, l in enumerate(layers) for w in tied_weights(program)
                 if l in w.layers[1:])
    if skip:  # see NOTE [tied weights]: the norm counts a shared weight's gradient once
        params += (("skip", skip),)
    return [Call(CallOp.GLOBAL_NORM, unscaled, grads, _loss_scaled(program, params), "step")]


def tied_range(program, layer: int, name: str) -> tuple[int, int]:
    """[lo, hi) of parameter `name` (or its rows a shard binds) in the layer's flat
    parameter order (elements)."""
    offsets, _ = grad_layout(program, layer)
    for (param, shape), offset in zip(program.layer_params(layer), offsets):
        if name in (param, base_name(param)):
            return offset, offset + math.prod(shape)
    raise KeyError(f"layer {layer} does not bind {name}")


def _tied_rows(program, layer: int, name: str) -> tuple[tuple[int, int], tuple]:
    """([lo, hi) of the weight's rows the layer binds, the shape it binds them in)."""
    param, shape = next((p, s) for p, s in program.layer_params(layer)
                        if name in (p, base_name(p)))
    shard = parse_shard(param)
    return ((0, shape[0]) if shard is None else shard[1:]), tuple(shape)


def _lower_tie(program, task: Task) -> list[Call]:
    """See NOTE [tied weights]: the stage's copies of each tied weight's gradient, summed
    in place with the copies on the other tie stages. A copy of some rows (a row shard
    of a vocabulary-parallel head) is summed at its rows of the whole weight; copies of
    the same rows (the head's and the embedding's shard, NOTE [vocabulary-parallel
    embedding]) are summed as whole ones, on their one stage."""
    calls = []
    for w in tied_weights(program):
        here = [l for l in w.layers if program.stage_of_layer(l) == task.stage]
        rows = tuple(_tied_rows(program, l, w.name) for l in here)
        slots = tuple(Slot(buffer_name(BufferKind.GRAD, layer=l),
                           4 * tied_range(program, l, w.name)[0], "float32", shape)
                      for l, (_, shape) in zip(here, rows))
        params = (("stages", weight_stages(program, w)), ("weight", w.name))
        if parse_shard(w.name) is None and \
                any(parse_shard(p) for l in w.layers for p, _ in program.layer_params(l)):
            params += (("rows", tuple(r for r, _ in rows)),
                       ("vocab", int(program.graph.config["vocab_size"])))
        if slots:
            calls.append(Call(CallOp.TIE_SUM, slots, slots, params, f"L{task.layer}",
                              layer=task.layer))
    return calls
