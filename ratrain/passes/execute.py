"""Reference execution of lowered programs: every rank's calls run in one process, with
numpy, on a byte arena of exactly the planned size. Messages and DP collectives are
simulated; a rank that must wait yields to the next. The semantic oracle for the whole
compiler (and, later, for the MPI runtime): wrong offsets corrupt values, wrong order
deadlocks or reads garbage, so agreement with the whole-model reference checks both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ratrain.ir.rules import lookup_rule
from ratrain.optim import AdamW, adamw_step
from ratrain.passes.lower import state_slots, view_slots


class _Wait(Exception):
    """The call cannot run yet (message or collective peers missing)."""


def shard_bounds(n: int, dp: int, replica: int) -> tuple[int, int]:
    size = -(-n // dp)
    return min(n, replica * size), min(n, (replica + 1) * size)


@dataclass
class RankState:
    rank: int
    stage: int
    replica: int
    arena: np.ndarray                   # uint8, exactly the planned arena
    offsets: dict                       # buffer name -> (arena offset, nbytes)
    decay: dict = field(default_factory=dict)   # layer -> weight-decay mask of its shard
    losses: list = field(default_factory=list)  # per micro-batch loss of this step
    clip_coef: float = 1.0              # from the step's global norm
    pc: int = 0                         # next task
    call: int = 0                       # next call inside that task

    def view(self, slot) -> np.ndarray:
        base, nbytes = self.offsets[slot.buffer]
        size = math.prod(slot.shape) * np.dtype(slot.dtype).itemsize
        if slot.offset + size > nbytes:
            raise IndexError(f"rank {self.rank}: {slot} runs past its buffer ({nbytes} bytes)")
        return np.ndarray(slot.shape, slot.dtype, buffer=self.arena, offset=base + slot.offset)


class Executor:
    """Runs a lowered Program's steps for all ranks in this process."""

    def __init__(self, program, params: dict, optimizer: AdamW):
        if program.lowered is None or program.memory is None:
            raise ValueError("the program is not lowered: run the whole pipeline first")
        self.program, self.optimizer = program, optimizer
        self.options, self.graph = program.options, program.graph
        self.mailbox, self.pending, self.results = {}, {}, {}
        self.step = 0
        self.ranks = [self._rank_state(r, params) for r in range(self.options.world_size)]

    # --- set-up: master params, optimizer state and views into the arena ----------------

    def _rank_state(self, rank: int, params: dict) -> RankState:
        stage, replica = self.program.coords(rank)
        memory = self.program.memory.stages[stage]
        st = RankState(rank, stage, replica, np.zeros(memory.arena_bytes, np.uint8),
                       memory.offsets)
        for layer in self.program.stages[stage]:
            self._init_layer(st, layer, params)
        return st

    def _layer_arrays(self, layer: int, params: dict):
        names = self.graph.layers[layer].param_names
        flat = np.concatenate([np.asarray(params[n], np.float32).ravel() for n in names])
        decay = np.concatenate([np.full(np.size(params[n]), float(np.ndim(params[n]) >= 2),
                                        np.float32) for n in names])
        return flat, decay

    def _shard(self, n: int, replica: int) -> tuple[int, int]:
        return (0, n) if self.options.zero == 0 else shard_bounds(n, self.options.dp, replica)

    def _init_layer(self, st: RankState, layer: int, params: dict) -> None:
        flat, decay = self._layer_arrays(layer, params)
        master, m, v, _, shard = state_slots(self.program, layer)
        lo, hi = self._shard(flat.size, st.replica)
        for slot in (master, m, v):
            st.view(slot)[:] = 0
        st.view(master)[:hi - lo] = flat[lo:hi]
        st.decay[layer] = np.zeros(shard, np.float32)
        st.decay[layer][:hi - lo] = decay[lo:hi]
        self._write_view(st, view_slots(self.program, layer), flat)

    def _write_view(self, st: RankState, slots, flat) -> None:
        at = 0
        for slot in slots:
            n = math.prod(slot.shape)
            st.view(slot)[...] = flat[at:at + n].reshape(slot.shape)
            at += n



    # --- driving ------------------------------------------------------------------------

    def run_step(self, tokens) -> float:
        """One training step on tokens [G, T+1], G = dp * M * micro-batch size; returns
        the step's loss (mean over all its micro-batches)."""
        o = self.options
        expected = (o.dp * o.micro_batches * o.micro_batch_size, o.seq_len + 1)
        if tuple(np.shape(tokens)) != expected:
            raise ValueError(f"a step takes tokens of shape {expected}, got {np.shape(tokens)}")
        self.step, self.tokens = self.step + 1, np.asarray(tokens, np.int32)
        for st in self.ranks:
            st.pc, st.call, st.losses, st.clip_coef = 0, 0, [], 1.0
        while not all(self._done(st) for st in self.ranks):
            if not any([self._advance(st) for st in self.ranks]):
                raise RuntimeError("reference execution is stuck: " + ", ".join(
                    f"rank {st.rank} at {self.program.lowered[st.stage][st.pc].task}"
                    for st in self.ranks if not self._done(st)))
        return float(np.mean([loss for st in self.ranks for loss in st.losses]))

    def _done(self, st: RankState) -> bool:
        return st.pc == len(self.program.lowered[st.stage])

    def _advance(self, st: RankState) -> bool:
        lowered, moved = self.program.lowered[st.stage], False
        while st.pc < len(lowered):
            calls = lowered[st.pc].calls
            while st.call < len(calls):
                try:
                    self._run_call(st, calls[st.call])
                except _Wait:
                    return moved
                st.call, moved = st.call + 1, True
            st.pc, st.call, moved = st.pc + 1, 0, True
        return moved

    def _run_call(self, st: RankState, call) -> None:
        handler = self.ACTIONS.get(call.op)
        if handler is not None:
            handler(self, st, call)
            return
        rule = lookup_rule(call.op)
        args = [st.view(x) if hasattr(x, "buffer") else np.asarray(x.value, x.dtype)
                for x in call.inputs]
        out = rule.fwd(np, *args, **dict(call.params))
        out = [np.array(o) for o in (out if isinstance(out, (tuple, list)) else (out,))]
        for slot, value in zip(call.outputs, out):
            st.view(slot)[...] = value

    def params(self) -> dict:
        """Current master params, gathered over the DP shards, by HF name."""
        out = {}
        for stage, layers in enumerate(self.program.stages):
            members = [st for st in self.ranks if st.stage == stage]
            for layer in layers:
                n = state_slots(self.program, layer)[3]
                shards = [st.view(state_slots(self.program, layer)[0]) for st in members]
                flat = (np.concatenate(shards) if self.options.zero else shards[0])[:n]
                self._unflatten_into(out, layer, flat)
        return out

    def _unflatten_into(self, out: dict, layer: int, flat) -> None:
        at = 0
        for name, var in zip(self.graph.layers[layer].param_names,
                             self.graph.kinds[self.graph.layers[layer].kind].fwd.params):
            out[name] = flat[at:at + var.size].reshape(var.shape).copy()
            at += var.size

    # --- data, loss, gradient accumulation ---------------------------------------------------

    def _rows(self, st: RankState, micro_batch: int):
        b = self.options.micro_batch_size
        first = (st.replica * self.options.micro_batches + micro_batch) * b
        return self.tokens[first:first + b]

    def _load_ids(self, st: RankState, call) -> None:
        st.view(call.outputs[0])[...] = self._rows(st, dict(call.params)["micro_batch"])[:, :-1]

    def _load_targets(self, st: RankState, call) -> None:
        st.view(call.outputs[0])[...] = self._rows(st, dict(call.params)["micro_batch"])[:, 1:]

    def _record_loss(self, st: RankState, call) -> None:
        st.losses.append(float(st.view(call.inputs[0])))

    def _fill(self, st: RankState, call) -> None:
        st.view(call.outputs[0])[...] = dict(call.params)["value"]

    def _copy(self, st: RankState, call) -> None:
        st.view(call.outputs[0])[...] = st.view(call.inputs[0])

    def _accumulate_grad(self, st: RankState, call) -> None:
        target, value = st.view(call.outputs[0]), st.view(call.inputs[0])
        if dict(call.params)["first"]:
            target[...] = value
        else:
            target += value

    # --- pipeline messages ---------------------------------------------------------------------

    def _peer(self, st: RankState, call) -> int:
        return self.program.rank(st.stage + dict(call.params)["peer"], st.replica)

    def _send(self, st: RankState, call) -> None:
        key = (self._peer(st, call), dict(call.params)["tag"])
        self.mailbox[key] = st.view(call.inputs[0]).copy()

    def _wait_recv(self, st: RankState, call) -> None:
        key = (st.rank, dict(call.params)["tag"])
        if key not in self.mailbox:
            raise _Wait
        st.view(call.outputs[0])[...] = self.mailbox.pop(key)

    # --- collectives -----------------------------------------------------------------------------

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

    def _grad_scatter(self, st: RankState, call) -> None:
        """Reduce-scatter one micro-batch's gradient and add this rank's shard."""
        dp, params = self.options.dp, dict(call.params)
        flat = np.concatenate([st.view(s).astype(np.float32).ravel() for s in call.inputs])

        def mean(grads):
            total = np.sum(grads, axis=0) / np.float32(dp)
            return [total[slice(*shard_bounds(total.size, dp, d))] for d in range(dp)]
        key = ("scatter", self.step, call.outputs[0].buffer, params["micro_batch"])
        part = self._collective(key, self._dp_group(st), st.rank, flat, mean)
        shard = st.view(call.outputs[0])
        if params["first"]:
            shard[...] = 0
        shard[:part.size] += part

    def _grad_sync(self, st: RankState, call) -> None:
        dp, grad = self.options.dp, st.view(call.inputs[0])
        if dict(call.params)["op"] == "wait":
            return
        scatter = dict(call.params)["op"] == "reduce_scatter"

        def mean(grads):
            total = np.sum(grads, axis=0) / np.float32(dp)
            return [total[slice(*shard_bounds(total.size, dp, d))] if scatter else total
                    for d in range(dp)]
        key = ("sync", self.step, call.inputs[0].buffer)
        result = self._collective(key, self._dp_group(st), st.rank, grad.copy(), mean)
        out = st.view(call.outputs[0])
        out[...] = 0
        out[:result.size] = result

    def _owned(self, st: RankState, slot) -> np.ndarray:
        """The part of a gradient this rank counts in the global norm (no DP double count)."""
        grad = st.view(slot)
        if slot.buffer.startswith("gshard"):
            return grad
        return grad[slice(*shard_bounds(grad.size, self.options.dp, st.replica))]

    def _global_norm(self, st: RankState, call) -> None:
        squares = sum(float(np.sum(np.square(self._owned(st, s), dtype=np.float64)))
                      for s in call.inputs)
        world = list(range(self.options.world_size))
        total = self._collective(("norm", self.step), world, st.rank, squares,
                                 lambda parts: [float(np.sqrt(sum(parts)))] * len(parts))
        clip = dict(call.params)["clip"]
        st.clip_coef = 1.0 if clip is None else min(1.0, clip / (total + 1e-6))

    def _adamw(self, st: RankState, call) -> None:
        master, m, v = (st.view(s) for s in call.outputs)
        grad = st.view(call.inputs[0])
        if dict(call.params)["zero"] == 1:
            lo, hi = shard_bounds(grad.size, self.options.dp, st.replica)
            grad = np.concatenate([grad[lo:hi], np.zeros(master.size - (hi - lo), np.float32)])
        layer = int(call.outputs[0].buffer.split(".L")[1])
        adamw_step(self.optimizer, self.step, master, grad * np.float32(st.clip_coef), m, v,
                   st.decay[layer])

    def _prefetch_view(self, st: RankState, call) -> None:
        flat = st.view(call.inputs[0])
        if dict(call.params)["gather"]:
            key = ("gather", self.step, call.inputs[0].buffer)
            flat = self._collective(key, self._dp_group(st), st.rank, flat.copy(),
                                    lambda shards: [np.concatenate(shards)] * len(shards))
        self._write_view(st, call.outputs, flat)

    ACTIONS = {
        "load_ids": _load_ids, "load_targets": _load_targets, "record_loss": _record_loss,
        "fill": _fill, "copy": _copy, "accumulate_grad": _accumulate_grad,
        "send": _send, "post_recv": lambda self, st, call: None, "wait_recv": _wait_recv,
        "grad_sync": _grad_sync, "grad_scatter": _grad_scatter, "global_norm": _global_norm, "adamw": _adamw,
        "prefetch_view": _prefetch_view,
    }
