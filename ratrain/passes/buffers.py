"""What each task creates and reads, as named buffers: the memory model's ground truth.

plan_memory, the memory checker, the simulator and the runtime all derive lifetimes from
`task_effects`: a buffer lives from the task that creates it to the last task that reads
it. Persistent buffers (master params, optimizer state, parameter views) live all step.
Names: master.L7 opt.L7 view.L7 grad.L7 gshard.L7 act.L5.mb3 ckpt.L5.mb3 in.mb3 out.mb3
gin.mb3 gout.mb3 ws.<task>.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ratrain.ir.graph import LayerGraph, Literal
from ratrain.ir.tasks import Kind, Task

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


def _shard(nbytes: int, program, sharded: bool) -> int:
    dp = program.options.dp
    return -(-nbytes // dp) if sharded else nbytes


def layer_param_count(program, layer: int) -> int:
    itemsize = np.dtype(program.graph.dtype).itemsize
    return program.layer_cost(layer).param_bytes // itemsize


def persistent_buffers(program, stage: int) -> tuple[Buffer, ...]:
    """Master params, Adam state and parameter views of the stage's layers."""
    zero = program.options.zero
    out = []
    for layer in program.stages[stage]:
        n = layer_param_count(program, layer)
        out += [Buffer(f"master.L{layer}", "params", _shard(4 * n, program, zero >= 1)),
                Buffer(f"opt.L{layer}", "optimizer", _shard(8 * n, program, zero >= 1)),
                Buffer(f"view.L{layer}", "views", program.layer_cost(layer).param_bytes)]
    return tuple(out)


def residual_split(program, layer: int, micro_batch: int) -> tuple[int, int]:
    """(bytes kept from F to B, bytes dropped and rebuilt by REC) of one (layer, mb)."""
    from ratrain.passes.insert_recovery import kept_mask
    kind = program.graph.kinds[program.graph.layers[layer].kind]
    mode = program.recompute.get((layer, micro_batch), "none")
    mask = kept_mask(kind, mode)
    kept = sum(r.nbytes for r, k in zip(kind.residuals, mask) if k)
    return kept, sum(r.nbytes for r in kind.residuals) - kept


@lru_cache(maxsize=256)
def _peak_transient(graph: LayerGraph, keep: frozenset) -> int:
    """Most bytes of intermediates alive at once inside `graph` (liveness by position)."""
    last_use = {}
    for i, node in enumerate(graph.nodes):
        for x in node.inputs:
            if not isinstance(x, Literal):
                last_use[x.id] = i
    live, peak, sizes = set(), 0, {}
    for i, node in enumerate(graph.nodes):
        for o in node.outputs:
            if o.id not in keep:
                live.add(o.id)
                sizes[o.id] = o.nbytes
        peak = max(peak, sum(sizes[v] for v in live))
        live = {v for v in live if last_use.get(v, -1) > i}
    return peak


def workspace_bytes(program, stage: int, direction: str) -> int:
    """Transient bytes of the stage's F (or B): the largest layer's intermediates that are
    neither residuals nor outputs (those have buffers of their own)."""
    peaks = []
    for layer in program.stages[stage]:
        kind = program.graph.kinds[program.graph.layers[layer].kind]
        graph = kind.fwd if direction == "fwd" else kind.bwd
        keep = frozenset(v.id for v in kind.residuals + tuple(graph.outputs)
                         if not isinstance(v, Literal))
        peaks.append(_peak_transient(graph, keep))
    return max(peaks, default=0)


def _message_bytes(program, stage: int) -> int:
    """Bytes of the activation stage `stage` sends on (its last layer's output)."""
    return program.layer_cost(program.stages[stage][-1]).output_bytes


def _forward(program, task: Task) -> Effects:
    s, m, last = task.stage, task.micro_batch, len(program.stages) - 1
    layers = program.stages[s]
    creates = [Buffer(f"act.L{l}.mb{m}", "activations", residual_split(program, l, m)[0])
               for l in layers]
    if s < last:
        creates.append(Buffer(f"out.mb{m}", "comm", _message_bytes(program, s)))
    creates.append(Buffer(f"ws.{task}", "workspace", workspace_bytes(program, s, "fwd")))
    reads = [f"view.L{l}" for l in layers] + ([f"in.mb{m}"] if s > 0 else [])
    return Effects(tuple(creates), tuple(reads))


def _backward(program, task: Task) -> Effects:
    s, m = task.stage, task.micro_batch
    layers = program.stages[s]
    first_b = min(t.micro_batch for t in program.tasks[s] if t.kind == Kind.B)
    creates = [Buffer(f"grad.L{l}", "grads", 4 * layer_param_count(program, l))
               for l in layers] if m == first_b else []
    if s > 0:
        creates.append(Buffer(f"gout.mb{m}", "comm", _message_bytes(program, s - 1)))
    creates.append(Buffer(f"ws.{task}", "workspace", workspace_bytes(program, s, "bwd")))
    reads = [f"view.L{l}" for l in layers] + [f"act.L{l}.mb{m}" for l in layers]
    reads += [f"rec.L{l}.mb{m}" for l in layers if (l, m) in program.recompute]
    reads += [f"grad.L{l}" for l in layers] if m != first_b else []
    reads += [f"gin.mb{m}"] if s < len(program.stages) - 1 else []
    return Effects(tuple(creates), tuple(reads))


def _recompute(program, task: Task) -> Effects:
    l, m = task.layer, task.micro_batch
    dropped = residual_split(program, l, m)[1]
    return Effects((Buffer(f"rec.L{l}.mb{m}", "activations", dropped),
                    Buffer(f"ws.{task}", "workspace", workspace_bytes(program, task.stage, "fwd"))),
                   (f"act.L{l}.mb{m}", f"view.L{l}"))


def _grad_sync(program, task: Task) -> Effects:
    l = task.layer
    if program.options.zero == 2:
        shard = _shard(4 * layer_param_count(program, l), program, True)
        return Effects((Buffer(f"gshard.L{l}", "grads", shard),), (f"grad.L{l}",))
    return Effects((), (f"grad.L{l}",))


def _update(program, task: Task) -> Effects:
    l = task.layer
    grad = f"gshard.L{l}" if program.options.zero == 2 else f"grad.L{l}"
    return Effects((), (grad, f"master.L{l}", f"opt.L{l}"))


_EFFECTS = {
    Kind.F: _forward,
    Kind.B: _backward,
    Kind.REC: _recompute,
    Kind.SYNC: _grad_sync,
    Kind.UPD: _update,
    Kind.PREF: lambda p, t: Effects((), (f"master.L{t.layer}", f"view.L{t.layer}")),
    Kind.SEND_F: lambda p, t: Effects((), (f"out.mb{t.micro_batch}",)),
    Kind.SEND_B: lambda p, t: Effects((), (f"gout.mb{t.micro_batch}",)),
    Kind.POST_F: lambda p, t: Effects(
        (Buffer(f"in.mb{t.micro_batch}", "comm", _message_bytes(p, t.stage - 1)),), ()),
    Kind.POST_B: lambda p, t: Effects(
        (Buffer(f"gin.mb{t.micro_batch}", "comm", _message_bytes(p, t.stage)),), ()),
    Kind.RECV_F: lambda p, t: Effects((), (f"in.mb{t.micro_batch}",)),
    Kind.RECV_B: lambda p, t: Effects((), (f"gin.mb{t.micro_batch}",)),
    Kind.NORM: lambda p, t: Effects((), ()),
    Kind.FREE: lambda p, t: Effects((), ()),
}


def task_effects(program, task: Task) -> Effects:
    """Buffers `task` creates and reads on its stage (every DP replica alike)."""
    return _EFFECTS[task.kind](program, task)


def live_bytes_timeline(program, stage: int) -> list[dict[str, int]]:
    """Bytes alive during each task of the stage, by category (persistent included).

    A buffer is alive from the task that creates it through the last task that reads
    it; one created and never read lives only during its own task (workspace).
    """
    tasks = program.tasks[stage]
    effects = [task_effects(program, t) for t in tasks]
    last_read = {}
    for i, e in enumerate(effects):
        for name in e.reads:
            last_read[name] = i
    base = dict.fromkeys(CATEGORIES, 0)
    for b in persistent_buffers(program, stage):
        base[b.category] += b.nbytes
    intervals = [(i, max(i, last_read.get(b.name, i)), b)
                 for i, e in enumerate(effects) for b in e.creates]
    timeline = []
    for i in range(len(tasks)):
        row = dict(base)
        for start, end, b in intervals:
            if start <= i <= end:
                row[b.category] += b.nbytes
        timeline.append(row)
    return timeline


def stage_peak(program, stage: int) -> int:
    return max((sum(row.values()) for row in live_bytes_timeline(program, stage)), default=0)
