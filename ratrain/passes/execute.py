"""Reference execution: every rank's task list run in one process with numpy, with
simulated point-to-point messages and DP collectives. The semantic oracle for the
passes until the MPI runtime lands, and after: both must give the same numbers.

Ranks take turns; a task that waits (RECV without its message, a collective without all
members) yields to the next rank. Master params and Adam state are flat fp32 per layer,
sharded over the DP group under ZeRO 1/2 exactly as the runtime shards them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ratrain.ir.interp import run_graph
from ratrain.ir.tasks import Kind
from ratrain.optim import AdamW, adamw_step
from ratrain.passes.insert_recovery import kept_mask
from ratrain.passes.lower_comms import message_tag


class _Wait(Exception):
    """The task cannot run yet (message or collective peers missing)."""


@dataclass
class LayerState:
    names: tuple[str, ...]              # HF names, in the layer's parameter order
    shapes: tuple[tuple[int, ...], ...] # their shapes
    master: np.ndarray                  # flat fp32 (this replica's shard under ZeRO>=1)
    m: np.ndarray                       # Adam first moment, like master
    v: np.ndarray                       # Adam second moment, like master
    decay: np.ndarray                   # 1 where weight decay applies, like master
    view: list = field(default_factory=list)  # full params in the compute dtype
    grad: np.ndarray | None = None      # flat fp32 gradient (full, or shard after ZeRO-2 sync)


@dataclass
class RankState:
    rank: int
    stage: int
    replica: int
    layers: dict[int, LayerState]
    buffers: dict = field(default_factory=dict)   # act/rec/in/out/gin/gout by name
    losses: list = field(default_factory=list)    # per micro-batch loss of this step
    pc: int = 0                                    # next task index


def _flat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float32).ravel() for a in arrays])


def _shard_bounds(n: int, dp: int, replica: int) -> tuple[int, int]:
    size = -(-n // dp)
    return min(n, replica * size), min(n, (replica + 1) * size)


def _unflatten(flat, shapes):
    out, at = [], 0
    for shape in shapes:
        n = int(np.prod(shape, dtype=np.int64))
        out.append(flat[at:at + n].reshape(shape))
        at += n
    return out


class Executor:
    """Runs a compiled Program's steps for all ranks in this process."""

    def __init__(self, program, params: dict, optimizer: AdamW):
        self.program, self.optimizer = program, optimizer
        self.graph, self.options = program.graph, program.options
        self.mailbox: dict = {}
        self.pending: dict = {}
        self.results: dict = {}
        self.step = 0
        self.ranks = [self._rank_state(r, params) for r in range(self.options.world_size)]

    # --- set-up -------------------------------------------------------------------------

    def _rank_state(self, rank: int, params: dict) -> RankState:
        stage, replica = self.program.coords(rank)
        layers = {l: self._layer_state(l, replica, params) for l in self.program.stages[stage]}
        return RankState(rank, stage, replica, layers)

    def _layer_state(self, layer: int, replica: int, params: dict) -> LayerState:
        names = self.graph.layers[layer].param_names
        flat = _flat(params[n] for n in names)
        decay = _flat(np.full(np.shape(params[n]), float(np.ndim(params[n]) >= 2)) for n in names)
        lo, hi = self._shard(flat.size, replica)
        view = [np.asarray(params[n]).astype(self.graph.dtype) for n in names]
        return LayerState(names, tuple(np.shape(params[n]) for n in names), flat[lo:hi].copy(),
                          np.zeros(hi - lo, np.float32), np.zeros(hi - lo, np.float32),
                          decay[lo:hi], view)

    def _shard(self, n: int, replica: int) -> tuple[int, int]:
        if self.options.zero == 0:
            return 0, n
        return _shard_bounds(n, self.options.dp, replica)

    # --- driving ------------------------------------------------------------------------

    def run_step(self, tokens) -> float:
        """One training step on tokens [G, T+1], G = dp * M * micro-batch size."""
        o = self.options
        expected = (o.dp * o.micro_batches * o.micro_batch_size, o.seq_len + 1)
        if tuple(np.shape(tokens)) != expected:
            raise ValueError(f"a step takes tokens of shape {expected}, got {np.shape(tokens)}")
        self.step, self.tokens = self.step + 1, np.asarray(tokens, np.int32)
        for st in self.ranks:
            st.pc, st.losses = 0, []
        while not all(st.pc == len(self.program.tasks[st.stage]) for st in self.ranks):
            if not any([self._advance(st) for st in self.ranks]):
                raise RuntimeError("reference execution is stuck: " + ", ".join(
                    f"rank {st.rank} at {self.program.tasks[st.stage][st.pc]}"
                    for st in self.ranks if st.pc < len(self.program.tasks[st.stage])))
        losses = [l for st in self.ranks for l in st.losses]
        return float(np.mean(losses))

    def _advance(self, st: RankState) -> bool:
        tasks, moved = self.program.tasks[st.stage], False
        while st.pc < len(tasks):
            try:
                self.HANDLERS[tasks[st.pc].kind](self, st, tasks[st.pc])
            except _Wait:
                break
            st.pc, moved = st.pc + 1, True
        return moved

    def params(self) -> dict:
        """Current master params, gathered over the DP shards, by HF name."""
        out = {}
        for stage, layers in enumerate(self.program.stages):
            members = [st for st in self.ranks if st.stage == stage]
            for l in layers:
                flat = np.concatenate([st.layers[l].master for st in members]) \
                    if self.options.zero else members[0].layers[l].master
                first = members[0].layers[l]
                out.update(zip(first.names, _unflatten(flat, first.shapes)))
        return out

    # --- compute ------------------------------------------------------------------------

    def _rows(self, st: RankState, micro_batch: int):
        b = self.options.micro_batch_size
        first = (st.replica * self.options.micro_batches + micro_batch) * b
        rows = self.tokens[first:first + b]
        return rows[:, :-1], rows[:, 1:]

    def _kind(self, layer: int):
        return self.graph.kinds[self.graph.layers[layer].kind]

    def _forward(self, st: RankState, task) -> None:
        m = task.micro_batch
        ids, targets = self._rows(st, m)
        x = st.buffers.pop(f"in.mb{m}") if st.stage > 0 else None
        for l in self.program.stages[st.stage]:
            kind, env = self._kind(l), {}
            inputs = {"embed": [ids], "decoder": [x], "head": [x, targets]}[kind.kind]
            x, = run_graph(kind.fwd, st.layers[l].view, inputs, env=env)
            mask = kept_mask(kind, self.program.recompute.get((l, m), "none"))
            st.buffers[f"act.L{l}.mb{m}"] = [env[r.id] if keep else None
                                              for r, keep in zip(kind.residuals, mask)]
        if st.stage == len(self.program.stages) - 1:
            st.losses.append(float(x))
        else:
            st.buffers[f"out.mb{m}"] = x

    def _recompute(self, st: RankState, task) -> None:
        kind, saved = self._kind(task.layer), st.buffers[f"act.L{task.layer}.mb{task.micro_batch}"]
        position = {r.id: i for i, r in enumerate(kind.residuals)}
        inputs = [saved[position[v.id]] for v in kind.fwd.inputs]
        env: dict = {}
        run_graph(kind.fwd, st.layers[task.layer].view, inputs, env=env)
        saved[:] = [env[r.id] if value is None else value for r, value in zip(kind.residuals, saved)]

    def _backward(self, st: RankState, task) -> None:
        m, last = task.micro_batch, len(self.program.stages) - 1
        ct = st.buffers.pop(f"gin.mb{m}") if st.stage < last else \
            np.asarray(1.0 / self.options.micro_batches, np.float32)
        for l in reversed(self.program.stages[st.stage]):
            kind, residuals = self._kind(l), st.buffers.pop(f"act.L{l}.mb{m}")
            if any(r is None for r in residuals):
                raise RuntimeError(f"{task}: layer {l} activations were dropped and not recomputed")
            cts = [ct] if kind.bwd.input_names[-1].startswith("ct:") else []
            outs = dict(zip(kind.bwd.output_names,
                            run_graph(kind.bwd, st.layers[l].view, residuals + cts)))
            grad = _flat(outs["grad:" + n] for n in kind.fwd.param_names)
            state = st.layers[l]
            state.grad = grad if state.grad is None else state.grad + grad
            ct = outs.get("ct:h")
        if st.stage > 0:
            st.buffers[f"gout.mb{m}"] = ct

    # --- pipeline messages ----------------------------------------------------------------

    def _send(self, st: RankState, task) -> None:
        forward = task.kind == Kind.SEND_F
        name = f"{'out' if forward else 'gout'}.mb{task.micro_batch}"
        peer = self.program.rank(st.stage + (1 if forward else -1), st.replica)
        self.mailbox[(peer, message_tag(task))] = st.buffers.pop(name)

    def _recv(self, st: RankState, task) -> None:
        key = (st.rank, message_tag(task))
        if key not in self.mailbox:
            raise _Wait
        name = "in" if task.kind == Kind.RECV_F else "gin"
        st.buffers[f"{name}.mb{task.micro_batch}"] = self.mailbox.pop(key)

    # --- collectives ------------------------------------------------------------------------

    def _collective(self, key, group: list[int], rank: int, value, combine):
        """Every member contributes once; when all have, each takes its part of combine()."""
        slot = self.pending.setdefault(key, {})
        slot.setdefault(rank, value)
        if len(slot) < len(group):
            raise _Wait
        if key not in self.results:
            self.results[key] = combine([slot[r] for r in group])
        return self.results[key][group.index(rank)]

    def _dp_group(self, st: RankState) -> list[int]:
        return [self.program.rank(st.stage, d) for d in range(self.options.dp)]

    def _grad_sync(self, st: RankState, task) -> None:
        state, dp = st.layers[task.layer], self.options.dp

        def mean(grads):
            total = np.sum(grads, axis=0) / dp
            if self.options.zero < 2:
                return [total] * dp
            return [total[slice(*_shard_bounds(total.size, dp, d))] for d in range(dp)]
        state.grad = self._collective(("sync", self.step, st.stage, task.layer),
                                      self._dp_group(st), st.rank, state.grad, mean)

    def _global_norm(self, st: RankState, task) -> None:
        squares = 0.0
        for state in st.layers.values():
            grad = state.grad if self.options.zero == 2 else \
                state.grad[slice(*_shard_bounds(state.grad.size, self.options.dp, st.replica))]
            squares += float(np.sum(np.square(grad, dtype=np.float64)))
        world = list(range(self.options.world_size))
        total = self._collective(("norm", self.step), world, st.rank, squares,
                                 lambda parts: [float(np.sqrt(sum(parts)))] * len(parts))
        clip = self.options.clip
        st.buffers["clip_coef"] = 1.0 if clip is None else min(1.0, clip / (total + 1e-6))

    def _update(self, st: RankState, task) -> None:
        state = st.layers[task.layer]
        grad = state.grad
        if self.options.zero == 1:
            grad = grad[slice(*_shard_bounds(grad.size, self.options.dp, st.replica))]
        grad = grad * np.float32(st.buffers.get("clip_coef", 1.0))
        adamw_step(self.optimizer, self.step, state.master, grad.astype(np.float32),
                   state.m, state.v, state.decay)
        state.grad = None

    def _prefetch(self, st: RankState, task) -> None:
        state = st.layers[task.layer]
        flat = state.master
        if self.options.zero:
            flat = self._collective(("gather", self.step, st.stage, task.layer),
                                    self._dp_group(st), st.rank, state.master,
                                    lambda shards: [np.concatenate(shards)] * len(shards))
        state.view = [a.astype(self.graph.dtype) for a in _unflatten(flat, state.shapes)]

    HANDLERS = {
        Kind.F: _forward, Kind.B: _backward, Kind.REC: _recompute,
        Kind.SEND_F: _send, Kind.SEND_B: _send, Kind.RECV_F: _recv, Kind.RECV_B: _recv,
        Kind.POST_F: lambda self, st, t: None, Kind.POST_B: lambda self, st, t: None,
        Kind.FREE: lambda self, st, t: None,
        Kind.SYNC: _grad_sync, Kind.NORM: _global_norm, Kind.UPD: _update, Kind.PREF: _prefetch,
    }
