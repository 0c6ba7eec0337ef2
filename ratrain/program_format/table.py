"""What a rank walks: one stage's task rows. A row is a task and its steps, each a native
step (a generated function with the arena offsets of its pointers) or a Python step (one
lowered call that rt/calls.py runs). codegen/table.py builds the rows; the compiler adds
what the runtime would otherwise re-derive (StageRows: the forward-only pass's gathers,
and each generated function as data, NativeFunction, from which codegen/module.py renders
the stage's Cython) and codec.py stores them as JSON.
"""
from __future__ import annotations

from dataclasses import dataclass

from ratrain.ir.tasks import Kind
from ratrain.program_format.lowered import StagePeriod, shifted_call, shifted_task


@dataclass(frozen=True)
class CallLabel:
    op: str                             # IR op of a call a native step runs
    note: str                           # where it came from ("L3 rms_norm")
    layer: int | None = None            # the layer it works on, None if step-wide


@dataclass(frozen=True)
class NativeStep:
    function: int                       # index of the generated function
    offsets: tuple[int, ...]            # arena byte offset of each pointer it takes
    nbytes: tuple[int, ...]             # bytes each pointer covers (the hazard ranges)
    calls: tuple[CallLabel, ...]        # the lowered calls it runs, in order


@dataclass(frozen=True)
class Pointer:
    """An operand of a generated function's call: the tensor at `o[index]`."""
    index: int                          # which of the function's pointers
    dtype: str                          # numpy dtype name (codegen/emit.py C_TYPES)
    shape: tuple[int, ...]              # tensor shape


@dataclass(frozen=True)
class NativeCall:
    """A lowered call as a generated function runs it: its slots as the function's
    pointers, so every task and layer using the function shares it."""
    op: str                             # IR op with a template in codegen/emit.py
    outputs: tuple[Pointer, ...]
    inputs: tuple[Pointer, ...]
    params: tuple = ()                  # sorted (name, value) pairs, the lowered call's


@dataclass(frozen=True)
class NativeFunction:
    """What codegen/module.py renders one generated function from."""
    used_by: str                        # "B, REC tasks of decoder layers" (a comment)
    legend: tuple[str, ...]             # role of each pointer o[i] (codegen/legend.py)
    calls: tuple[NativeCall, ...]       # in order


@dataclass(frozen=True)
class PythonStep:
    call: object                        # a lowered Call run by rt/calls.py


# NOTE [held-out loss] (rt/executor.py): the tasks the forward-only pass runs, and what
# it runs at a row whose task it would skip: the row itself (a ZeRO-3 gather standing
# alone), or one gather call that training issues inside another row.
FORWARD_KINDS = frozenset({Kind.F, Kind.POST_F, Kind.RECV_F, Kind.SEND_F})
FORWARD_ROW = "row"


@dataclass(frozen=True)
class StageRows:
    """A stage's rows as the runtime reads them (code/stage<N>.tasks.json)."""
    stage: int
    rows: tuple                         # (Task, steps, names of the buffers it touches)
    period: StagePeriod | None = None   # NOTE [periodic programs]; None: the whole step
    forward: tuple = ()                 # (row, FORWARD_ROW or a Call) of NOTE [held-out loss]
    header: str = ""                    # first comment line of the generated module
    functions: tuple | None = None      # NativeFunction of each native step's function;
                                        # None: a format before 10, whose .pyx is all there is


def walk(rows: int, period: StagePeriod | None):
    """(row, micro-batch shift) of every row the step runs, in order: the rows as they
    are, or a periodic program's period repeated (NOTE [periodic programs])."""
    if period is None:
        yield from ((i, 0) for i in range(rows))
        return
    for first, end, d in period.segments():
        yield from ((i, d) for i in range(first, rows if end is None else end))


def shifted_steps(steps: tuple, d: int) -> tuple:
    """A row's steps `d` micro-batches later: Python steps' calls shift; native steps
    take arena offsets only, which a repetition shares with the period it repeats."""
    if not d:
        return steps
    return tuple(PythonStep(shifted_call(s.call, d)) if isinstance(s, PythonStep) else s
                 for s in steps)


def expanded_rows(table):
    """The rows the step runs, in order, of a table with `rows` and `period`: each
    repetition's tasks and Python steps shifted to their micro-batches."""
    for i, d in walk(len(table.rows), table.period):
        task, steps, touched = table.rows[i]
        yield shifted_task(task, d), shifted_steps(steps, d), touched
