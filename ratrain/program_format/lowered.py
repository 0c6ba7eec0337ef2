"""The lowered program's types: Slot (a tensor at a byte offset of an arena buffer), Call
(one kernel or runtime call over slots) and LoweredTask, with the helpers that read them.

`lower` (passes/lower.py, lower_state.py) makes them; codegen, the simulator, the
reference executor and the runtime read them. Part of the program format, so that readers
import only these definitions and never the passes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ratrain.ir.buffers import arena_name
from ratrain.ir.graph import DTYPE_SHORT, format_param
from ratrain.ir.tasks import Kind, Task, parse_task
from ratrain.program_format.call_ops import CallOp


@dataclass(frozen=True)
class Slot:
    buffer: str                         # arena buffer name ("act.L5.mb3")
    offset: int                         # bytes from the buffer's start
    dtype: str                          # numpy dtype name
    shape: tuple[int, ...]              # tensor shape

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        dims = ",".join(map(str, self.shape))
        return f"{self.buffer}+{self.offset}:{DTYPE_SHORT.get(self.dtype, self.dtype)}[{dims}]"


@dataclass(frozen=True)
class Call:
    op: str                             # IR op, or a runtime action (send_activation, ...)
    outputs: tuple[Slot, ...]           # where results are written
    inputs: tuple = ()                  # Slots or Literals read
    params: tuple = ()                  # sorted (name, value) pairs
    note: str = ""                      # where it came from: "L3 rms_norm" etc.
    layer: int | None = None            # the layer it works on, None for a step-wide call

    def __str__(self) -> str:
        params = " ".join(f"{k}={format_param(v)}" for k, v in self.params)
        op = f"{self.op}[{params}]" if params else self.op
        args = " ".join(str(x) if isinstance(x, Slot) else f"{x.value!r}" for x in self.inputs)
        outs = " ".join(map(str, self.outputs))
        text = f"{outs} = {op} {args}".strip(" =") if outs else f"{op} {args}".strip()
        return f"{text}    # {self.note}" if self.note else text


@dataclass(frozen=True)
class LoweredTask:
    task: Task                          # the task these calls implement
    calls: tuple[Call, ...]             # in order


# Note suffix of the forward calls a B runs to rebuild a layer (NOTE [backward-time
# recovery]): the simulator costs them as forward graph nodes.
RECOMPUTE_TAG = " (recompute)"


def var_slot(buffer: str, offset: int, var) -> Slot:
    """The slot of IR value `var` at `offset` bytes of `buffer`."""
    return Slot(arena_name(buffer), offset, var.dtype, tuple(var.shape))


def flat_slot(buffer: str, elements: int, offset: int = 0) -> Slot:
    """A flat fp32 range of a buffer (master, moments, gradients)."""
    return Slot(arena_name(buffer), offset, "float32", (elements,))


def rollback_only(call: Call) -> bool:
    """Does the call run only when the step rolls back (NOTE [commit rule])?"""
    return call.op == CallOp.REDO_UPDATE or bool(dict(call.params).get("redo"))


# ---- micro-batch shifts (NOTE [periodic programs], passes/periodic_program.py) ----------

# Messages of one micro-batch: forward activation and backward gradient.
TAGS_PER_MICRO_BATCH = 2


def message_tag(task: Task) -> int:
    """MPI tag of a pipeline message: unique per (micro-batch, direction) within a step,
    the same on the sending and the receiving side."""
    backward = task.kind in (Kind.SEND_B, Kind.RECV_B, Kind.POST_B)
    return TAGS_PER_MICRO_BATCH * task.micro_batch + int(backward)


@dataclass(frozen=True)
class StagePeriod:
    """A stage's rows as an instance of the step that repeats one period: rows
    [start, start + length) run `count` times, micro-batches `shift` later each time, and
    the rows after them run (count - 1) x shift micro-batches later; count 1 is the
    instance itself (NOTE [periodic programs])."""
    instance: int                       # micro-batches the instance's rows hold
    start: int                          # first row of the period
    length: int                         # rows in one period
    shift: int                          # micro-batches one period advances
    count: int                          # times the period runs in the step

    @property
    def micro_batches(self) -> int:
        return self.instance + (self.count - 1) * self.shift

    def segments(self):
        """(first row, end row, micro-batch shift) of the step's row runs, in order."""
        a, b = self.start, self.start + self.length
        yield 0, a, 0
        for i in range(self.count):
            yield a, b, i * self.shift
        yield b, None, (self.count - 1) * self.shift


def shifted_task(task: Task, d: int) -> Task:
    """The same task `d` micro-batches later (step-wide tasks are unchanged)."""
    return task if not d or task.micro_batch is None else \
        replace(task, micro_batch=task.micro_batch + d)


def _shifted_text(text: str, d: int) -> str:
    """A task's text (a message's note, a gather's use) `d` micro-batches later; any
    other text as it is."""
    try:
        return str(shifted_task(parse_task(text), d))
    except ValueError:
        return text


def _shifted_param(name: str, value, d: int):
    if name == "micro_batch":
        return value + d
    if name == "tag":
        return value + TAGS_PER_MICRO_BATCH * d
    if name == "use":
        return _shifted_text(value, d)
    return value


def shifted_call(call: Call, d: int) -> Call:
    """The call a shifted task runs: its micro-batch, message tag, gather use and note
    `d` micro-batches later. Slots keep their buffer names: a periodic program's buffers
    of a later period are those of the period it repeats, at the same offsets."""
    if not d:
        return call
    params = tuple((k, _shifted_param(k, v, d)) for k, v in call.params)
    note = _shifted_text(call.note, d) if call.note[:1].isdigit() else call.note
    return replace(call, params=params, note=note) if (params, note) != (call.params, call.note) \
        else call
