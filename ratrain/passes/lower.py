"""lower: every task becomes a list of calls over (buffer, offset) slots of the arena.

Runs last, after plan_memory fixed each buffer's arena offset. Compute tasks (F, REC, B)
become one call per IR node, with every value addressed: parameters in view.L, kept
residuals in act.L.mb, rebuilt ones in rec.L.mb (or in B's workspace when B recomputes
them), intermediates in the task's workspace (layout.py), messages in in/out/gin/gout.
Other tasks become one runtime call (the training-state ones in lower_state.py). This
is the input of codegen and of the reference executor; the types are in
program_format/lowered.py.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.ir.buffers import BufferKind, buffer_name, grad_accumulator, message_buffer
from ratrain.ir.graph import HIDDEN_COTANGENT, Literal, grad_role
from ratrain.ir.tasks import Kind, Task, backward_of
from ratrain.passes.layer_buffers import (GRAD_OUTPUT, backward_graph, backward_pinned,
                                          backward_workspace, cotangent_bytes, cotangent_slots,
                                          fused_grad_ids, grad_layout, handed_gradients,
                                          is_split, pinned_values, recovers_in_backward,
                                          residual_home, residual_layout, scatters_in_weight,
                                          view_layout, weight_operand_layout, weight_pinned)
from ratrain.passes.insert_gathers import view_buffer
from ratrain.passes.residuals import rebuild_node_indices
from ratrain.passes.layout import graph_workspace
from ratrain.passes.lower_embed import lower_embed_backward, lower_embed_forward
from ratrain.passes.lower_vocab import lower_shard_backward, lower_shard_forward
from ratrain.passes.vocab_buffers import holds_loss
from ratrain.passes.lower_state import (_loss_scaled, _lower_gather, _lower_norm, _lower_prefetch,
                                        _lower_sync, _lower_tie, _lower_update,
                                        _with_gathers_issued, state_slots)
from ratrain.program_format.call_ops import CallOp
from ratrain.program_format.lowered import (RECOMPUTE_TAG, Call, LoweredTask, Slot,
                                            flat_slot, message_tag, var_slot)


class _GraphSlots:
    """Var id -> Slot for one execution of one layer graph."""

    def __init__(self, graph, pinned, workspace: str, base: int = 0):
        self.graph, self.slots = graph, {}
        offsets, _ = graph_workspace(graph, pinned)
        for node in graph.nodes:
            for o in node.outputs:
                if o.id in offsets:
                    self.slots[o.id] = var_slot(workspace, base + offsets[o.id], o)

    def bind(self, var, slot: Slot) -> None:
        self.slots[var.id] = slot

    def calls(self, layer: int, tag: str = "") -> list[Call]:
        read = lambda x: x if isinstance(x, Literal) else self.slots[x.id]
        return [Call(n.op, tuple(self.slots[o.id] for o in n.outputs),
                     tuple(read(x) for x in n.inputs), n.params, f"L{layer} {n.op}{tag}",
                     layer=layer)
                for n in self.graph.nodes]


def _kind(program, layer: int):
    return program.graph.kinds[program.graph.layers[layer].kind]


def _bind_params(graph_slots: _GraphSlots, program, task: Task, layer: int, graph) -> None:
    offsets, _ = view_layout(program, layer)
    view = view_buffer(program, task, layer)  # view.L, or a ZeRO-3 view slot
    for var, offset in zip(graph.params, offsets):
        graph_slots.bind(var, var_slot(view, offset, var))


def residual_slot(program, layer: int, micro_batch: int, index: int,
                  rebuilt: tuple[str, int] | None = None) -> Slot:
    """Where residual `index` of (layer, micro_batch) lives: act.L.mb or wact.L.mb if kept
    (residual_home), else rec.L.mb, or (buffer, offset) `rebuilt` when its B recomputes it
    (NOTE [backward-time recovery])."""
    var = _kind(program, layer).residuals[index]
    home = residual_home(program, layer, micro_batch, index)
    offsets, _ = residual_layout(program, layer, micro_batch, home)
    name = buffer_name(home, layer=layer, micro_batch=micro_batch)
    if home != BufferKind.REC:
        return var_slot(name, offsets[index], var)
    buffer, base = rebuilt or (name, 0)
    return var_slot(buffer, base + offsets[index], var)


def _input_index(kind, position: int) -> int:
    var = kind.fwd.inputs[position]
    for i, r in enumerate(kind.residuals):
        if r.id == var.id:
            return i
    raise NotImplementedError(f"{kind.kind}: input '{kind.fwd.input_names[position]}' is not "
                              "read by the backward, so it has no buffer; lowering needs it")


def _bind_residuals(graph_slots: _GraphSlots, program, layer: int, m: int, keep,
                    rebuilt: tuple[str, int] | None = None) -> None:
    for i, var in enumerate(_kind(program, layer).residuals):
        if keep(i):
            graph_slots.bind(var, residual_slot(program, layer, m, i, rebuilt))


def _is_kept(program, layer: int, m: int):
    return lambda i: residual_home(program, layer, m, i) != BufferKind.REC


def _forward_inputs(program, task: Task, layer: int) -> list[Call]:
    kind, m = _kind(program, layer), task.micro_batch
    slot = lambda pos: residual_slot(program, layer, m, _input_index(kind, pos))
    if kind.kind == "embed":
        return [Call(CallOp.LOAD_IDS, (slot(0),), (), (("micro_batch", m),), f"L{layer} ids",
                     layer=layer)]
    calls = []
    if layer == program.stages[task.stage][0]:
        message = var_slot(buffer_name(BufferKind.IN, micro_batch=m), 0, kind.fwd.inputs[0])
        calls.append(Call(CallOp.COPY, (slot(0),), (message,), (), f"L{layer} input",
                          layer=layer))
    if kind.kind == "head":
        calls.append(Call(CallOp.LOAD_TARGETS, (slot(1),), (), (("micro_batch", m),),
                          f"L{layer} targets", layer=layer))
    return calls


def _lower_forward(program, task: Task) -> list[Call]:
    m, layers, calls = task.micro_batch, program.stages[task.stage], []
    for i, layer in enumerate(layers):
        kind = _kind(program, layer)
        mode = program.recompute.get((layer, m), "none")
        graph_slots = _GraphSlots(kind.fwd, pinned_values(kind, "F", mode),
                               buffer_name(BufferKind.WS, task=task))
        _bind_params(graph_slots, program, task, layer, kind.fwd)
        _bind_residuals(graph_slots, program, layer, m, _is_kept(program, layer, m))
        out = kind.fwd.outputs[0]
        if kind.kind != "head" and i + 1 < len(layers):
            nxt = _kind(program, layers[i + 1])
            graph_slots.bind(out, residual_slot(program, layers[i + 1], m, _input_index(nxt, 0)))
        elif kind.kind != "head":
            graph_slots.bind(out, var_slot(buffer_name(BufferKind.OUT, micro_batch=m), 0, out))
        calls += _forward_inputs(program, task, layer) + graph_slots.calls(layer)
        if kind.kind == "head":
            calls.append(Call(CallOp.RECORD_LOSS, (), (graph_slots.slots[out.id],),
                              (("micro_batch", m),), f"L{layer} loss", layer=layer))
    return calls


def _lower_recompute(program, task: Task) -> list[Call]:
    return _recompute_calls(program, task, task.layer, task.micro_batch,
                            buffer_name(BufferKind.WS, task=task))


def _recompute_calls(program, task: Task, layer: int, m: int, workspace: str, base: int = 0,
                     rebuilt_in: tuple[str, int] | None = None) -> list[Call]:
    """The forward calls that rebuild (layer, m)'s dropped residuals (into rec.L.mb, or
    at (buffer, offset) `rebuilt_in`), with intermediates in `workspace` from `base` on."""
    kind = _kind(program, layer)
    mode = program.recompute[(layer, m)]
    graph_slots = _GraphSlots(kind.fwd, pinned_values(kind, "REC", mode), workspace, base)
    _bind_params(graph_slots, program, task, layer, kind.fwd)
    _bind_residuals(graph_slots, program, layer, m, lambda i: True, rebuilt_in)
    needed = set(rebuild_node_indices(kind, mode))
    calls = graph_slots.calls(layer, RECOMPUTE_TAG if rebuilt_in else "")
    return [c for i, c in enumerate(calls) if i in needed]


def _cotangent_slots(program, task: Task, var) -> tuple[Slot, Slot]:
    size = cotangent_bytes(program)
    workspace = buffer_name(BufferKind.WS, task=task)
    return var_slot(workspace, 0, var), var_slot(workspace, size, var)


def _accumulate_grads(program, task: Task, layer: int, graph_slots: _GraphSlots,
                      graph=None, handed: dict | None = None) -> list[Call]:
    """Accumulate the gradients `graph` (default: the whole backward) makes; `handed`:
    W's operands in wop.L.mb (zb1)."""
    kind = _kind(program, layer)
    made = set((graph or kind.bwd).output_names)
    first_b = 0  # the step's first B (verify_schedule checks B's run in micro-batch order)
    if layer in program.scatter_grads:  # NOTE [gradient accumulation]
        if graph is not None and (graph is kind.split.input_part) == scatters_in_weight(kind):
            return []  # zb1: the other part reduce-scatters them all (NOTE [weight operands])
        slots = {**(handed or {}), **graph_slots.slots}
        grads = tuple(slots[kind.bwd.output(grad_role(n)).id] for n in kind.fwd.param_names)
        shard = state_slots(program, layer)[4]
        return [Call(CallOp.GRAD_SCATTER, (flat_slot(grad_accumulator(layer, True), shard),),
                     grads,
                     (("first", task.micro_batch == first_b), ("micro_batch", task.micro_batch)),
                     f"L{layer}", layer=layer)]
    targets = _grad_slots(program, layer)
    return [Call(CallOp.ACCUMULATE_GRAD, (targets[grad.id],), (graph_slots.slots[grad.id],),
                 (("first", task.micro_batch == first_b),), f"L{layer} {name}", layer=layer)
            for name in kind.fwd.param_names if grad_role(name) in made
            for grad in [kind.bwd.output(grad_role(name))]]


def _grad_slots(program, layer: int) -> dict:
    """Var id of each parameter gradient -> its fp32 slot in grad.L."""
    kind, (offsets, _) = _kind(program, layer), grad_layout(program, layer)
    return {kind.bwd.output(grad_role(name)).id:
            Slot(grad_accumulator(layer, False), 4 * offset, "float32", tuple(var.shape))
            for name, var, offset in zip(kind.fwd.param_names, kind.fwd.params, offsets)}


def _bind_fused_grads(graph_slots: _GraphSlots, program, layer: int) -> None:
    kind, targets = _kind(program, layer), _grad_slots(program, layer)
    for var in kind.bwd.outputs:
        if var.id in fused_grad_ids(kind):
            graph_slots.bind(var, targets[var.id])


def _lower_backward(program, task: Task) -> list[Call]:
    return [c for _, calls in _backward_layers(program, task, lambda layer: task)
            for c in calls]


def _backward_pieces(program, piece: Task) -> dict[int, list[Call]]:
    """See NOTE [sync issue point]: layer -> the calls of its piece of the B `piece` belongs
    to: exactly that layer's calls of the B, in the B's order (the stage's first piece
    also fills the loss cotangent), over the B's workspace."""
    use = lambda layer: replace(piece, layer=layer)  # each piece uses its layer's view
    return dict(_backward_layers(program, backward_of(piece), use))


def _backward_layers(program, task: Task, use) -> list[tuple[int, list[Call]]]:
    """(layer, its calls) of the B `task`, in the order B runs them (last layer first);
    `use(layer)`: the task whose use of the layer's view the calls read (the B, or its
    piece of that layer)."""
    m, stage = task.micro_batch, task.stage
    layers, calls, per_layer = program.stages[stage], [], []
    last_stage, workspace = holds_loss(program, stage), buffer_name(BufferKind.WS, task=task)
    hidden = _kind(program, layers[0]).fwd.outputs[0] if _kind(program, layers[0]).kind != "head" \
        else _kind(program, layers[0]).fwd.inputs[0]
    ping_pong = _cotangent_slots(program, task, hidden)
    base = cotangent_slots([_kind(program, l) for l in layers], last_stage) * \
        cotangent_bytes(program)  # the layers' workspace starts after the slots used
    turn = 0
    if last_stage:
        loss = _kind(program, layers[-1]).bwd.inputs[-1]
        current = var_slot(workspace, 0, loss)
        calls.append(Call(CallOp.FILL, (current,), (), _loss_scaled(
            program, (("value", 1.0 / program.options.micro_batches),)), "loss cotangent"))
        turn = 1
    else:
        current = var_slot(buffer_name(BufferKind.GIN, micro_batch=m), 0,
                           _kind(program, layers[-1]).fwd.outputs[0])
    rebuilt = (workspace, backward_workspace(program, stage, m)[0]) \
        if recovers_in_backward(program, stage, m) else None
    split = is_split(program)
    for j, layer in enumerate(reversed(layers)):
        kind = _kind(program, layer)
        if rebuilt and (layer, m) in program.recompute:  # NOTE [backward-time recovery]
            calls += _recompute_calls(program, use(layer), layer, m, workspace, base, rebuilt)
        fused = layer not in program.scatter_grads
        graph = backward_graph(kind, split)
        graph_slots = _GraphSlots(graph, backward_pinned(kind, split, fused), workspace,
                               base=base)
        _bind_params(graph_slots, program, use(layer), layer, graph)
        if fused:
            _bind_fused_grads(graph_slots, program, layer)
        n_res = len(kind.residuals)
        for i, var in enumerate(kind.bwd.inputs[:n_res]):
            graph_slots.bind(var, residual_slot(program, layer, m, i, rebuilt))
        for var in kind.bwd.inputs[n_res:]:
            graph_slots.bind(var, replace(current, dtype=var.dtype, shape=tuple(var.shape)))
        if HIDDEN_COTANGENT in kind.bwd.output_names:
            out = kind.bwd.output(HIDDEN_COTANGENT)
            first_layer = j == len(layers) - 1
            current = var_slot(buffer_name(BufferKind.GOUT, micro_batch=m), 0, out) \
                if first_layer else \
                replace(ping_pong[turn % 2], dtype=out.dtype, shape=tuple(out.shape))
            graph_slots.bind(out, current)
            turn += 1
        handed = _hand_to_weight(program, graph_slots, layer, m) if split else []
        calls += fuse_grad_accumulation(graph_slots.calls(layer) + handed + _accumulate_grads(
            program, task, layer, graph_slots, graph if split else None))
        per_layer.append((layer, calls))
        calls = []
    return per_layer


def _weight_operands(program, layer: int, m: int) -> dict:
    """var id -> its slot in wop.L.mb (NOTE [weight operands])."""
    offsets, _ = weight_operand_layout(program, layer, m)
    kind = _kind(program, layer)
    values = {v.id: v for v in kind.split.weight_part.inputs + handed_gradients(kind)}
    wop = buffer_name(BufferKind.WOP, layer=layer, micro_batch=m)
    return {i: var_slot(wop, o, values[i]) for i, o in offsets.items()}


def _hand_to_weight(program, graph_slots: _GraphSlots, layer: int, m: int) -> list[Call]:
    """Bind the values B makes for W to wop.L.mb; copy there those B receives (its output
    cotangent, the rebuilt residuals W reads: NOTE [weight operands])."""
    kind, calls = _kind(program, layer), []
    made = {o.id: o for n in kind.split.input_part.nodes for o in n.outputs}
    for var_id, slot in _weight_operands(program, layer, m).items():
        if var_id in made:
            graph_slots.bind(made[var_id], slot)
        else:
            calls.append(Call(CallOp.COPY, (slot,), (graph_slots.slots[var_id],), (),
                              f"L{layer} W operand", layer=layer))
    return calls


def _lower_weight(program, task: Task) -> list[Call]:
    """W[L] of a micro-batch (zb1): the weight part of L's backward (NOTE [B/W split])."""
    layer, m = task.layer, task.micro_batch
    kind, fused = _kind(program, layer), task.layer not in program.scatter_grads
    graph = kind.split.weight_part
    graph_slots = _GraphSlots(graph, weight_pinned(kind, fused), buffer_name(BufferKind.WS,
                                                                          task=task))
    if fused:
        _bind_fused_grads(graph_slots, program, layer)
    handed = _weight_operands(program, layer, m)
    for var, index in zip(graph.inputs, kind.split.weight_residuals(kind)):
        graph_slots.bind(var, handed.get(var.id) or residual_slot(program, layer, m, index))
    for var in kind.split.carried:
        graph_slots.bind(var, handed[var.id])
    return fuse_grad_accumulation(graph_slots.calls(layer) + _accumulate_grads(
        program, task, layer, graph_slots, graph, handed))


def fuse_grad_accumulation(calls: list[Call]) -> list[Call]:
    """NOTE [fused gradient accumulation] (layer_buffers.py): `accumulate_grad` of a
    gradient a GRAD_OUTPUT op wrote into its grad.L slot is folded into that op, param
    grad_into=(output index, "set"|"add"). That saves a write and a read of every weight
    gradient per micro-batch through DDR, and fp16 weight gradients are no longer rounded
    to half before they are summed."""
    producer = {c.outputs[GRAD_OUTPUT[c.op]]: i for i, c in enumerate(calls) if c.op in GRAD_OUTPUT}
    out, fused = list(calls), set()
    for i, call in enumerate(calls):
        if call.op != CallOp.ACCUMULATE_GRAD or call.inputs[0] not in producer:
            continue
        p = producer[call.inputs[0]]
        index = GRAD_OUTPUT[calls[p].op]
        mode = "set" if dict(call.params)["first"] else "add"
        outputs = tuple(call.outputs[0] if k == index else o for k, o in enumerate(out[p].outputs))
        out[p] = replace(out[p], outputs=outputs,
                         params=tuple(sorted(out[p].params + (("grad_into", (index, mode)),))))
        fused.add(i)
    return [c for i, c in enumerate(out) if i not in fused]


def _message(program, task: Task) -> Slot:
    layers = program.stages[task.stage]
    first, last = _kind(program, layers[0]), _kind(program, layers[-1])
    var = {Kind.SEND_F: last.fwd.outputs[0],
           Kind.RECV_F: first.fwd.inputs[0], Kind.POST_F: first.fwd.inputs[0],
           Kind.SEND_B: first.fwd.inputs[0],
           Kind.RECV_B: last.fwd.outputs[0],
           Kind.POST_B: last.fwd.outputs[0]}[task.kind]
    return var_slot(message_buffer(task), 0, var)


_PEER = {Kind.SEND_F: 1, Kind.RECV_F: -1, Kind.POST_F: -1,
         Kind.SEND_B: -1, Kind.RECV_B: 1, Kind.POST_B: 1}
_COMM_OP = {Kind.SEND_F: CallOp.SEND, Kind.SEND_B: CallOp.SEND,
            Kind.POST_F: CallOp.POST_RECV, Kind.POST_B: CallOp.POST_RECV,
            Kind.RECV_F: CallOp.WAIT_RECV, Kind.RECV_B: CallOp.WAIT_RECV}


def _lower_comm(program, task: Task) -> list[Call]:
    slot = _message(program, task)
    params = (("peer", _PEER[task.kind]), ("tag", message_tag(task)))
    if task.kind in (Kind.SEND_F, Kind.SEND_B):
        return [Call(CallOp.SEND, (), (slot,), params, str(task))]
    return [Call(_COMM_OP[task.kind], (slot,), (), params, str(task))]


_LOWER = {Kind.F: _lower_forward, Kind.B: _lower_backward, Kind.W: _lower_weight,
          Kind.REC: _lower_recompute,
          Kind.SYNC: _lower_sync, Kind.UPD: _lower_update, Kind.PREF: _lower_prefetch,
          Kind.NORM: _lower_norm, Kind.TIE: _lower_tie, Kind.FREE: lambda p, t: [],
          Kind.S: lower_shard_forward, Kind.T: lower_shard_backward,
          Kind.E: lower_embed_forward, Kind.G: lower_embed_backward,
          **dict.fromkeys((Kind.GATH_F, Kind.GATH_R, Kind.GATH_B), _lower_gather),
          **{k: _lower_comm for k in _PEER}}


def lower(program):
    """Turn every stage's tasks into calls over arena slots.

    Requires: plan_memory has run (FREEs in place, offsets known). Guarantees:
    `program.lowered[stage]` has one LoweredTask per task, in order; every slot names a
    buffer of the stage's memory plan and lies inside it.
    """
    lowered = {s: tuple(LoweredTask(t, tuple(_with_gathers_issued(program, t, calls)))
                        for t, calls in _stage_calls(program, tasks))
               for s, tasks in program.tasks.items()}
    return replace(program, lowered=lowered)


def _stage_calls(program, tasks):
    """(task, its calls) of a stage's tasks; a B's pieces are lowered with their B once."""
    pieces: dict = {}
    for t in tasks:
        if t.kind == Kind.BL:
            if t.micro_batch not in pieces:
                pieces[t.micro_batch] = _backward_pieces(program, t)
            yield t, pieces[t.micro_batch][t.layer]
        else:
            yield t, _LOWER[t.kind](program, t)


LOWERED_HEADER = "# lowered program of stage {stage}"


def format_lowered(program, stage: int) -> str:
    """Stage `stage`'s lowered calls: a header line (LOWERED_HEADER), then each task
    (`0F1:`) with its calls indented below it, one per line, as Call prints them."""
    lines = [LOWERED_HEADER.format(stage=stage)]
    for item in program.lowered[stage]:
        lines.append(f"{item.task}:")
        lines += [f"    {call}" for call in item.calls]
    return "\n".join(lines)
