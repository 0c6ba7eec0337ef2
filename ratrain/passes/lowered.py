"""The lowered program's types: Slot (a tensor at a byte offset of an arena buffer), Call
(one kernel or runtime call over slots) and LoweredTask, with the helpers that read them.

`lower` (lower.py, lower_state.py) makes them; codegen, the simulator, the reference
executor and the runtime read them. Kept apart from the lowering passes so that readers
import only these definitions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ratrain.ir.graph import DTYPE_SHORT
from ratrain.ir.printer import format_param
from ratrain.ir.tasks import Task
from ratrain.passes.plan_memory import arena_name


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


def note_layer(note: str) -> int | None:
    """The layer a call's note names ("L3 rms_norm" -> 3), None for a step-wide call."""
    head = note.split(" ", 1)[0]
    return int(head[1:]) if head[:1] == "L" and head[1:].isdigit() else None


def var_slot(buffer: str, offset: int, var) -> Slot:
    """The slot of IR value `var` at `offset` bytes of `buffer`."""
    return Slot(arena_name(buffer), offset, var.dtype, tuple(var.shape))


def flat_slot(buffer: str, elements: int, offset: int = 0) -> Slot:
    """A flat fp32 range of a buffer (master, moments, gradients)."""
    return Slot(arena_name(buffer), offset, "float32", (elements,))


def rollback_only(call: Call) -> bool:
    """Does the call run only when the step rolls back (NOTE [commit rule])?"""
    return call.op == "redo_update" or bool(dict(call.params).get("redo"))
