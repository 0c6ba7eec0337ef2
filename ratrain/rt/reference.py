"""Reference execution of lowered programs: every rank's calls run in one process, with
numpy, on a byte arena of exactly the planned size. Messages and DP collectives are
simulated; a rank that must wait yields to the next. The semantic oracle for the whole
compiler (and, later, for the MPI runtime): wrong offsets corrupt values, wrong order
deadlocks or reads garbage, so agreement with the whole-model reference checks both.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ratrain.ir.vocab import merge_shards, state_layers
from ratrain.optim import AdamW, LossScaler, starting_scaler
from ratrain.passes.lower_state import state_slots
from ratrain.rt.calls import (RankState, init_layer, run_call, shard_bounds,  # noqa: F401
                              unflatten_layer)


class _Wait(Exception):
    """The call cannot run yet (message or collective peers missing)."""


class Executor:
    """Runs a lowered Program's steps for all ranks in this process."""

    def __init__(self, program, params: dict, optimizer: AdamW,
                 scaler: LossScaler | None = None):
        """`scaler`: the loss scale every rank starts from (fp16 programs; default
        GradScaler's 2**16, growth after 2000 finite steps)."""
        if program.lowered is None or program.memory is None:
            raise ValueError("the program is not lowered: run the whole pipeline first")
        self.program, self.optimizer = program, optimizer
        self.options, self.graph = program.options, program.graph
        self.mailbox, self.pending, self.results = {}, {}, {}
        self.deferred, self.awaited = {}, {}  # non-blocking pipeline collectives
        self.step = 0
        scaler = scaler or starting_scaler(self.options.precision)
        self.ranks = [self._rank_state(r, params, scaler) for r in range(self.options.world_size)]

    # --- set-up: master params, optimizer state and views into the arena ----------------

    def _rank_state(self, rank: int, params: dict, scaler: LossScaler) -> RankState:
        stage, replica = self.program.coords(rank)
        memory = self.program.memory.stages[stage]
        st = RankState(rank, stage, replica, np.zeros(memory.arena_bytes, np.uint8),
                       memory.offsets, scaler=dataclasses.replace(scaler))
        for layer in state_layers(self.program, stage):
            init_layer(self.program, st, layer, params)
        return st

    # --- driving ------------------------------------------------------------------------

    def run_step(self, tokens) -> float:
        """One training step on tokens [G, T+1], G = dp * M * micro-batch size; returns
        the step's loss (mean over all its micro-batches)."""
        o = self.options
        expected = (o.dp * o.micro_batches * o.micro_batch_size, o.seq_len + 1)
        if tuple(np.shape(tokens)) != expected:
            raise ValueError(f"a step takes tokens of shape {expected}, got {np.shape(tokens)}")
        self.step, self.tokens = self.step + 1, np.asarray(tokens, np.int32)
        self.pc = {st.rank: [0, 0] for st in self.ranks}  # next (task, call) of each rank
        for st in self.ranks:
            st.losses, st.clip_coef = [], 1.0
        while not all(self._done(st) for st in self.ranks):
            if not any([self._advance(st) for st in self.ranks]):
                raise RuntimeError("reference execution is stuck: " + ", ".join(
                    f"rank {st.rank} at {self.program.lowered[st.stage][self.pc[st.rank][0]].task}"
                    for st in self.ranks if not self._done(st)))
        return float(np.mean([loss for st in self.ranks for loss in st.losses]))

    def _done(self, st: RankState) -> bool:
        return self.pc[st.rank][0] == len(self.program.lowered[st.stage])

    def _advance(self, st: RankState) -> bool:
        lowered, moved, pc = self.program.lowered[st.stage], False, self.pc[st.rank]
        while pc[0] < len(lowered):
            calls = lowered[pc[0]].calls
            while pc[1] < len(calls):
                if self._touches_awaited(st, calls[pc[1]]):
                    return moved
                try:
                    run_call(self, st, calls[pc[1]])
                except _Wait:
                    return moved
                pc[1], moved = pc[1] + 1, True
            pc[0], pc[1], moved = pc[0] + 1, 0, True
        return moved

    def params(self) -> dict:
        """Current master params, gathered over the DP shards, by HF name."""
        out = {}
        for stage, layers in enumerate(self.program.stages):
            members = [st for st in self.ranks if st.stage == stage]
            for layer in state_layers(self.program, stage):
                n = state_slots(self.program, layer)[3]
                shards = [st.view(state_slots(self.program, layer)[0]) for st in members]
                flat = (np.concatenate(shards) if self.options.zero else shards[0])[:n]
                out |= unflatten_layer(self.program, layer, flat)
        return merge_shards(out)

    # --- the Transport of rt/calls.py: data rows, simulated messages and collectives ------

    def rows(self, st: RankState, micro_batch: int):
        b = self.options.micro_batch_size
        first = (st.replica * self.options.micro_batches + micro_batch) * b
        return self.tokens[first:first + b]

    def _peer(self, st: RankState, call) -> int:
        return self.program.rank(st.stage + dict(call.params)["peer"], st.replica)

    def send(self, st: RankState, call, message) -> None:
        self.mailbox[(self._peer(st, call), dict(call.params)["tag"])] = message.copy()

    def post_receive(self, st: RankState, call, target) -> None:
        pass

    def receive(self, st: RankState, call, target) -> None:
        key = (st.rank, dict(call.params)["tag"])
        if key not in self.mailbox:
            raise _Wait
        target[...] = self.mailbox.pop(key)

    def _collective(self, key, group: list[int], rank: int, value, combine):
        """Every member contributes once; when all have, each takes its part of combine()."""
        slot = self.pending.setdefault(key, {})
        slot.setdefault(rank, value)
        if len(slot) < len(group):
            raise _Wait
        if key not in self.results:
            self.results[key] = [combine([slot[r] for r in group]), set()]
        parts, taken = self.results[key]
        taken.add(rank)
        if len(taken) == len(group):  # everyone has its part: forget the collective
            del self.pending[key], self.results[key]
        return parts[group.index(rank)]

    def _key(self, call) -> tuple:
        target, params = (call.outputs or call.inputs)[0].buffer, dict(call.params)
        # a ZeRO-3 view slot takes many gathers a step: the use and layer tell them apart;
        # a rolled-back step gathers a view twice (NOTE [commit rule]): two collectives
        return call.op, self.step, target, params.get("micro_batch"), params.get("use"), \
            call.note, params.get("redo")

    def _dp_group(self, st: RankState) -> list[int]:
        return [self.program.rank(st.stage, d) for d in range(self.options.dp)]

    def dp_sum(self, st: RankState, call, value, scatter: bool, finish) -> None:
        dp = self.options.dp

        def total(parts):
            whole = np.sum(parts, axis=0)
            return [whole[slice(*shard_bounds(whole.size, dp, d))] if scatter else whole
                    for d in range(dp)]
        finish(self._collective(self._key(call), self._dp_group(st), st.rank,
                                np.array(value), total))

    def dp_gather(self, st: RankState, call, shard, finish, into=None) -> None:
        finish(self._collective(self._key(call), self._dp_group(st), st.rank, shard.copy(),
                                lambda shards: [np.concatenate(shards)] * len(shards)))

    def tie_sum(self, st: RankState, call, value) -> None:
        params = dict(call.params)
        group = [self.program.rank(s, st.replica) for s in params["stages"]]
        key = ("tie", self.step, params["weight"], st.replica)
        value[...] = self._collective(key, group, st.rank, value.copy(),
                                      lambda parts: [np.sum(parts, axis=0)] * len(parts))

    def world_sum(self, st: RankState, call, value: float) -> float:
        world = list(range(self.options.world_size))
        return self._collective(("norm", self.step), world, st.rank, value,
                                lambda parts: [sum(parts)] * len(parts))

    # --- non-blocking collectives over the pipeline group (NOTE [vocabulary-parallel
    # head]): a rank contributes and goes on; its target is written once every part is
    # in, and until then a call touching the target's buffer waits (the hazard rule)

    def _touches_awaited(self, st: RankState, call) -> bool:
        return any((st.rank, s.buffer) in self.awaited
                   for s in call.inputs + call.outputs if hasattr(s, "buffer"))

    def _deferred(self, key, needed: int, st: RankState, value, target, combine) -> None:
        """Stage st.stage contributes `value` (None: nothing) to collective `key` of its
        replica's `needed` stages; this rank's part, combine(parts by stage, its stage),
        goes into `target` ((arena view, buffer name), or None) once all are in."""
        entry = self.deferred.setdefault(key, {"values": {}, "targets": {}})
        if value is not None:
            entry["values"][st.stage] = np.array(value, copy=True)
        if target is not None:
            entry["targets"][st.stage] = (*target, st.rank)
            self.awaited[(st.rank, target[1])] = key
        if len(entry["values"]) < needed:
            return
        for stage, (array, buffer, rank) in entry["targets"].items():
            array[...] = combine(entry["values"], stage)
            del self.awaited[(rank, buffer)]
        entry["targets"] = {}

    def _pipe_key(self, st: RankState, call) -> tuple:
        return call.op, self.step, dict(call.params)["micro_batch"], st.replica

    def pipe_broadcast(self, st: RankState, call, value, root: int) -> None:
        mine = st.stage == root
        self._deferred(self._pipe_key(st, call), 1, st, value if mine else None,
                       None if mine else (value, call.outputs[0].buffer),
                       lambda values, r: values[root])

    def pipe_allgather(self, st: RankState, call, part, out) -> None:
        self._deferred(self._pipe_key(st, call), self.options.pp, st, part,
                       (out, call.outputs[0].buffer),
                       lambda values, r: np.stack([values[s] for s in sorted(values)]))

    def pipe_reduce(self, st: RankState, call, value, root: int, into) -> None:
        target = None if into is None else (into, call.outputs[-1].buffer)
        self._deferred(self._pipe_key(st, call), self.options.pp, st, value, target,
                       lambda values, r: sum(values[s] for s in sorted(values)))
