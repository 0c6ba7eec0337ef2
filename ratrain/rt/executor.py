"""One rank's step loop under MPI: walk the stage's static task table (ratrain/codegen)
and run each step: a generated native function (kernels, GIL released) or one call with
the shared semantics of rt/calls.py, messages and collectives going through rt/comm.py.
Non-blocking operations (receives posted early, gradient reductions, view all-gathers) are
completed right before a step touches their arena bytes: the hazard rule, which lets them
overlap every step in between. Live buffers are counted as they are touched and freed, so
the arena peak is measured, not copied from the plan.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np

from ratrain.program_format.call_ops import CallOp
from ratrain.program_format.lowered import shifted_call, shifted_task
from ratrain.program_format.table import FORWARD_KINDS, FORWARD_ROW, NativeStep, walk
from ratrain.rt import comm
from ratrain.rt.calls import RankState, init_layer, run_call, shard_bounds, skips
from ratrain.rt.program import stage_code
from ratrain.rt.threads import kernel_threads
from ratrain.rt.trace import StepClock

KERNEL_STATUS = {-1: "bad arguments", -2: "scratch too small", -3: "ISA unavailable"}

# NOTE [held-out loss]: the held-out loss runs the step's forward tasks only, in table
# order: F (which records the last stage's loss), POST_F/RECV_F/SEND_F for the
# activations; B, REC, SYNC, NORM, UPD, PREF and the FREEs are skipped (a vocabulary-
# parallel head's S rows run, and of its T rows only the vocab_loss that records the
# loss, codegen/program_dir.forward_rows). Under ZeRO-3 the
# F rows run the view gathers issued inside them, and a gather serving an F that training
# runs inside a skipped B or REC (or whose first use is a B the F shares it with) runs at
# its GATH row (forward_gathers): every F still reads a view gathered after the slot's
# previous tenant was last used. This is safe:
# - memory plan: every buffer F or a forward message touches is created by one of these
#   tasks and lives, in the plan, from its creator to its last reader, which is also a
#   forward task or comes later; running a subsequence of the rows in the same order, no
#   two buffers in use at once overlap, because in the full step they were live at once.
#   Only master.L, opt.L and view.L persist across steps (buffers.persistent_buffers) and
#   the forward tasks only read view.L; every other buffer is written by its creator in
#   each step before anything reads it, so the next step cannot see what eval left.
# - training state: no gradient is made, the loss scale is read only by B's fill and by
#   NORM, AdamW's step count and the step number are not advanced (self.step stays), the
#   training batch (self.tokens) and the loss list are restored, and the training Batches
#   are not consulted, so the data order is untouched; the live-buffer count and the trace
#   are left alone. In-flight view all-gathers of the last step's PREF (ZeRO) complete
#   by the hazard rule when F first reads a view, as they would in the next step.
# So the step after an evaluation is bit-identical to the same step without it (tested),
# and a forward costs about a third of a training step where F+B with the updates
# skipped would cost the whole step and write the gradient buffers for nothing.


class ProtocolError(RuntimeError):
    """The task table asks for something the runtime's protocol forbids."""


class KernelError(RuntimeError):
    """A native kernel returned a non-zero status."""


@dataclass(frozen=True)
class _Native:
    """A NativeStep ready to run: its offsets as an int64 array, passed by address."""
    function: int
    offsets: np.ndarray
    address: int                        # offsets.ctypes.data
    calls: tuple                        # CallLabels, for error messages
    ranges: tuple                       # arena [lo, hi) of every pointer it takes


@dataclass(frozen=True)
class _Row:
    task: object                        # the Task
    steps: tuple                        # _Native or Call
    buffers: frozenset                  # (offset, nbytes) of the arena buffers it touches
    frees: tuple | None                 # (offset, nbytes) of the buffer a FREE releases


def _native(step: NativeStep) -> _Native:
    offsets = np.asarray(step.offsets or (0,), np.int64)
    return _Native(step.function, offsets, offsets.ctypes.data, step.calls,
                   tuple((lo, lo + n) for lo, n in zip(step.offsets, step.nbytes)))


def expand(stage_rows, offsets: dict) -> tuple[tuple, dict]:
    """(the rows the step runs, NOTE [held-out loss]'s row -> what the forward-only pass
    runs there) of a stage's rows, a periodic program's expanded (NOTE [periodic
    programs]): each stored row is made ready once, and a repetition shifts only its task
    and Python calls (native steps take arena offsets, which it shares)."""
    ready = [RankExecutor.row(offsets, *row) for row in stage_rows.rows]
    rows, forward_rows = [], {}
    forward = dict(stage_rows.forward)
    for i, d in walk(len(ready), stage_rows.period):
        rows.append(_shifted(ready[i], d))
        if i in forward:
            what = forward[i]
            forward_rows[len(rows) - 1] = rows[-1] if what == FORWARD_ROW else \
                _Row(rows[-1].task, (shifted_call(what, d),), frozenset(), None)
    return tuple(rows), forward_rows


def _shifted(row: _Row, d: int) -> _Row:
    """The row `d` micro-batches later."""
    if not d:
        return row
    return _Row(shifted_task(row.task, d),
                tuple(s if isinstance(s, _Native) else shifted_call(s, d) for s in row.steps),
                row.buffers, row.frees)


class RankExecutor:
    """This rank's arena, its in-flight operations and the Transport of rt/calls.py."""

    def __init__(self, program, comms: comm.Communicators, params: dict, moments=None,
                 step: int = 0, progress_interval: float = 0.0):
        """`program`: a RuntimeProgram (rt/load.py) of the job; `progress_interval`: seconds
        between MPI progress probes while a kernel runs with transfers pending (NOTE
        [progress while kernels run], rt/comm.py), 0 for none."""
        self.program, self.options, self.comms = program, program.options, comms
        stage, replica = program.coords(comms.rank)
        plan = program.memory.stages[stage]
        self.state = RankState(comms.rank, stage, replica,
                               np.empty(plan.arena_bytes, np.uint8), plan.offsets)
        stage_rows, self.module = stage_code(program, stage)
        self.threads, self.address = kernel_threads(), self.state.arena.ctypes.data
        self.task_rows, self.forward_gathers = expand(stage_rows, plan.offsets)
        self.planned_peak_bytes = plan.peak_bytes
        # buffers live now, by their (offset, nbytes); their bytes, the peak so far
        self.live = {plan.offsets[b] for b in plan.persistent}
        self.peak_bytes = self.live_bytes = sum(n for _, n in self.live)
        for layer in program.stages[stage]:
            init_layer(program, self.state, layer, params, moments)
        comms.split_dp_group(stage, replica)
        comms.split_tie_group(stage, replica, program.tie_stages)
        comms.split_pipe_group(stage, replica)
        self.in_flight: list[comm.InFlight] = []
        self.receives: dict = {}        # (source, tag) -> posted receive
        self.sends: list[comm.InFlight] = []
        self.step, self.optimizer, self.tokens = step, None, None  # steps done so far
        self.position = ("set-up", None)  # (task, call) being run, for error messages
        self.trace = None               # a TaskTrace to record task times into, if any
        # the generated functions' per-call clock while tracing (NOTE [calls in the
        # trace]); a program run from its own older code (--trust-program-code) has none
        rows = [*self.task_rows, *self.forward_gathers.values()]
        self.call_clock = np.zeros(1 + max((len(s.calls) for r in rows for s in r.steps
                                            if isinstance(s, _Native)), default=0)) \
            if getattr(self.module, "PER_CALL_CLOCK", False) else None
        self.pending = False            # a transfer was still moving after the last step
        self.progress = comm.ProgressAgent(comms, progress_interval) \
            if comm.ProgressAgent.usable(progress_interval) else None

    @property
    def arena_bytes(self) -> int:
        return self.state.arena.nbytes

    @staticmethod
    def row(offsets: dict, task, steps, buffers) -> _Row:
        """A row ready to run: native steps with their offsets as arrays, buffers by
        their arena bytes."""
        ready = tuple(_native(s) if isinstance(s, NativeStep) else s.call for s in steps)
        return _Row(task, ready, frozenset(offsets[b] for b in buffers),
                    offsets[task.buffer] if task.kind == "FREE" else None)

    def _count_live(self, row: _Row) -> None:
        """A buffer is live from the first task touching it to its FREE (plan_memory's
        convention), so the measured peak can be checked against the planned one. Buffers
        are told apart by their arena bytes, not their names: no two live at once share
        them, and a periodic program's later periods name the buffers of the period they
        repeat (NOTE [periodic programs])."""
        if row.frees is not None:
            if row.frees in self.live:
                self.live.discard(row.frees)
                self.live_bytes -= row.frees[1]
            return
        for key in row.buffers - self.live:
            self.live.add(key)
            self.live_bytes += key[1]
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    # --- driving --------------------------------------------------------------------------

    def run_step(self, tokens: np.ndarray, optimizer) -> list[float]:
        """One step on the global batch `tokens` [G, T+1]; this rank's micro-batch losses."""
        st = self.state
        self.step, self.tokens, self.optimizer = self.step + 1, tokens, optimizer
        st.losses, st.clip_coef = [], 1.0
        for row in self.task_rows:
            self._run_row(row)
        self._complete(self.sends)
        self.sends = []
        return list(st.losses)

    def run_forward(self, tokens: np.ndarray) -> list[float]:
        """The forward of the global batch `tokens` [G, T+1] with the current weights:
        this rank's micro-batch losses; weights, optimizer and loss scale untouched
        (NOTE [held-out loss])."""
        st = self.state
        saved = self.tokens, st.losses
        self.tokens, st.losses = tokens, []
        try:
            for r, row in enumerate(self.task_rows):
                if row.task.kind in FORWARD_KINDS or r in self.forward_gathers:
                    self._run_steps(self.forward_gathers.get(r, row))
            self._complete(self.sends)
            self.sends = []
            return list(st.losses)
        finally:
            self.tokens, st.losses = saved

    def _run_row(self, row: _Row) -> None:
        start = time.perf_counter()
        self._count_live(row)
        if self.trace is None:
            self._run_steps(row)
            return
        clock = StepClock()
        self._run_steps(row, clock)
        self.trace.record(row.task, self.step, start, time.perf_counter(), clock)

    def _run_steps(self, row: _Row, clock=None) -> None:
        """The row's calls, letting MPI progress after each; `clock` (a trace's StepClock)
        times each step's wait for its operands and its run (NOTE [calls in the trace])."""
        for i, step in enumerate(row.steps):
            if isinstance(step, _Native):
                self._run_native(row.task, step, clock and clock.at(i, len(step.calls)))
            elif skips(self.state, step):  # see NOTE [commit rule]: no wait for its buffers
                pass
            else:
                if clock:
                    clock.at(i, 1)
                self.position = (row.task, step)
                self._clear_hazards(step, self._ranges(step.inputs + step.outputs))
                if clock:
                    clock.waited()
                run_call(self, self.state, step)
                if clock:
                    clock.ran()
            self.pending = comm.drive_progress(self.in_flight + self.sends)

    def settle(self) -> None:
        """Complete every operation in flight now (before a checkpoint gathers shards);
        between steps that is the last PREFs' view all-gathers and nothing else."""
        self._complete(self.in_flight + self.sends)
        self.in_flight, self.sends = [], []

    def finish(self) -> None:
        """Complete everything still in flight (the last step's view all-gathers)."""
        self.settle()
        if self.progress is not None:
            self.progress.stop()

    def _run_native(self, task, step: _Native, clock=None) -> None:
        self.position = (task, step.calls[0])
        self._clear_hazards(step.calls[0], step.ranges)
        if clock:
            clock.waited()
        timed = clock and self.call_clock is not None
        failed, status = self._call_native(step, self.call_clock if timed else None)
        if clock:
            clock.ran(self.call_clock[:len(step.calls) + 1] if timed else None)
        if failed >= 0:
            self.position = (task, step.calls[failed])
            raise KernelError(f"kernel status {status} "
                              f"({KERNEL_STATUS.get(status, 'unknown')}): {step.calls[failed]}")

    def _call_native(self, step: _Native, clock: np.ndarray | None) -> tuple[int, int]:
        """Run one generated function; MPI progresses meanwhile if a transfer is pending
        (NOTE [progress while kernels run]); `clock`, if given, gets its calls' times."""
        poking = self.progress.poking() if self.progress is not None and self.pending \
            else contextlib.nullcontext()
        clocked = () if clock is None else (clock.ctypes.data,)  # older code takes none
        with poking:
            return self.module.run_function(step.function, self.address, step.address,
                                            self.threads, *clocked)

    def _clear_hazards(self, call, ranges) -> None:
        """Complete every in-flight operation whose arena bytes `ranges` cover."""
        if not self.in_flight:
            return
        for lo, hi in ranges:
            for op in self.in_flight:
                if op.overlaps(lo, hi):
                    self._check_not_early(call, op)
                    op.complete()
        self.in_flight = [op for op in self.in_flight if not op.done]

    def _check_not_early(self, call, op: comm.InFlight) -> None:
        """Only its wait_recv may touch a posted receive's bytes (plan_memory keeps the
        message buffer apart from POST to RECV; anything else is a program bug)."""
        if call.op != CallOp.WAIT_RECV and any(op is r for r in self.receives.values()):
            (source, tag), = [k for k, r in self.receives.items() if r is op]
            raise ProtocolError(f"{call.op} ({call.note}) on stage {self.state.stage} touches "
                                f"the message from rank {source} tag {tag} before its wait_recv")

    def _ranges(self, slots) -> tuple:
        return tuple(self.state.byte_range(s) for s in slots if hasattr(s, "buffer"))

    @staticmethod
    def _complete(ops) -> None:
        for op in ops:
            op.complete()

    # --- the Transport of rt/calls.py -----------------------------------------------------

    def rows(self, st: RankState, micro_batch: int) -> np.ndarray:
        b = self.options.micro_batch_size
        first = (st.replica * self.options.micro_batches + micro_batch) * b
        return self.tokens[first:first + b]

    def _peer(self, st: RankState, call) -> tuple[int, int]:
        params = dict(call.params)
        return self.program.rank(st.stage + params["peer"], st.replica), params["tag"]

    def send(self, st: RankState, call, message: np.ndarray) -> None:
        self.sends.append(comm.send_activation(self.comms, *self._peer(st, call), message))

    def post_receive(self, st: RankState, call, target: np.ndarray) -> None:
        key = self._peer(st, call)
        if key in self.receives:
            raise ProtocolError(f"{call.note}: a second receive posted on stage {st.stage} "
                                f"from rank {key[0]} tag {key[1]} before the first was waited")
        op = comm.post_activation_receive(self.comms, *key, target, self._ranges(call.outputs))
        self.receives[key] = op
        self.in_flight.append(op)

    def receive(self, st: RankState, call, target: np.ndarray) -> None:
        op = self.receives.pop(self._peer(st, call), None)
        if op is None:
            raise ProtocolError(f"{call.note}: wait_recv on stage {st.stage} before its "
                                "post_recv")
        op.complete()

    def _touched(self, call, value: np.ndarray) -> tuple:
        """Arena ranges a collective on `value` keeps busy: its targets, and its inputs
        too when it reads them in place."""
        in_place = np.may_share_memory(value, self.state.arena)
        return self._ranges(call.outputs + (call.inputs if in_place else ()))

    def dp_sum(self, st: RankState, call, value, scatter: bool, finish) -> None:
        ranges = self._touched(call, value)
        if scatter:
            counts = [hi - lo for lo, hi in (shard_bounds(value.size, self.options.dp, d)
                                             for d in range(self.options.dp))]
            op = comm.start_grad_reduce_scatter(self.comms, value, counts, ranges, finish)
        else:
            op = comm.start_grad_allreduce(self.comms, value, ranges, finish)
        self.in_flight.append(op)

    def dp_gather(self, st: RankState, call, shard, finish, into=None) -> None:
        op = comm.start_param_allgather(self.comms, shard, self._touched(call, shard), finish,
                                        into)
        self.in_flight.append(op)

    def world_sum(self, st: RankState, call, value: float) -> float:
        return comm.sum_over_world(self.comms, value)

    def tie_sum(self, st: RankState, call, value: np.ndarray) -> None:
        comm.sum_tied_gradient(self.comms, value)

    # See NOTE [vocabulary-parallel head]: non-blocking over the replica's pipeline group,
    # completed by the hazard rule (a stage's reduce part, which touches no arena byte,
    # at the step's end with the sends); the embedding's the same way (NOTE
    # [vocabulary-parallel embedding])

    def pipe_broadcast(self, st: RankState, call, value, root: int) -> None:
        self.in_flight.append(comm.start_hidden_broadcast(self.comms, value, root,
                                                          self._ranges(call.outputs)))

    def pipe_allgather(self, st: RankState, call, part, out) -> None:
        self.in_flight.append(comm.start_stats_allgather(self.comms, part, out,
                                                         self._ranges(call.outputs)))

    def pipe_reduce(self, st: RankState, call, value, root: int, into) -> None:
        ranges = self._ranges(call.outputs[-1:]) if into is not None else ()
        op = comm.start_hidden_grad_reduce(self.comms, value, root, into, ranges)
        (self.in_flight if into is not None else self.sends).append(op)
