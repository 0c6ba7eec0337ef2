"""Static task table of one stage: every lowered task becomes a row of steps. Runs of
consecutive calls of one layer that have a native template form one generated function;
a row names the function and the arena offsets of its pointers, so tasks that differ only
in layer or micro-batch share the function (the code grows with layer kinds, not layers x
micro-batches). Calls without a template (data rows, messages, collectives, the optimizer)
stay Python steps run by rt/calls.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ratrain.codegen.emit import C_TYPES, emit_call
from ratrain.passes.lower import note_layer

ITEMSIZE = {"float32": 4, "float16": 2, "int32": 4}


@dataclass(frozen=True)
class CallLabel:
    op: str                             # IR op of a call a native step runs
    note: str                           # where it came from ("L3 rms_norm")


@dataclass(frozen=True)
class NativeStep:
    function: int                       # index of the generated function
    offsets: tuple[int, ...]            # arena byte offset of each pointer it takes
    nbytes: tuple[int, ...]             # bytes each pointer covers (the hazard ranges)
    calls: tuple[CallLabel, ...]        # the lowered calls it runs, in order


@dataclass(frozen=True)
class PythonStep:
    call: object                        # a lowered Call run by rt/calls.py


@dataclass
class StageTable:
    """What the runtime walks: one row per task, (task, steps, buffers it touches)."""
    stage: int
    functions: list[str] = field(default_factory=list)   # body of each generated function
    comments: list[str] = field(default_factory=list)    # which tasks use it
    rows: list[tuple] = field(default_factory=list)      # (Task, steps, buffer names)
    scratch_floats: int = 0             # largest fp32 scratch a function needs
    tables: dict = field(default_factory=dict)           # constant arrays by name

    def function_of(self, body: str, task) -> int:
        if body not in self._index:
            self._index[body] = len(self.functions)
            self.functions.append(body)
            self.comments.append(set())
        self.comments[self._index[body]].add(str(task.kind))
        return self._index[body]

    def canonical(self) -> StageTable:
        """Functions sorted by text and commented with the task kinds using them, so two
        programs running the same code (another schedule, DP degree or ZeRO stage) give
        the same module and share its build."""
        order = sorted(range(len(self.functions)), key=self.functions.__getitem__)
        new_index = {old: new for new, old in enumerate(order)}
        rows = [(task, tuple(replace(s, function=new_index[s.function])
                             if isinstance(s, NativeStep) else s for s in steps), touched)
                for task, steps, touched in self.rows]
        return StageTable(self.stage, [self.functions[i] for i in order],
                          [", ".join(sorted(self.comments[i])) + " tasks" for i in order],
                          rows, self.scratch_floats, dict(sorted(self.tables.items())))

    def __post_init__(self):
        self._index: dict[str, int] = {}


class _Pointers:
    """Slot -> `<T *>(A + o[i])`, numbering the distinct slots of one function."""

    def __init__(self, offsets: dict):
        self.arena_offsets, self.index, self.order, self.nbytes = offsets, {}, [], []

    def rewind(self, size: int) -> None:
        """Forget the pointers numbered after the first `size` (a call that fell back)."""
        for key in [k for k, i in self.index.items() if i >= size]:
            del self.index[key]
        del self.order[size:], self.nbytes[size:]

    def __call__(self, slot) -> str:
        key = (slot.buffer, slot.offset)
        if key not in self.index:
            self.index[key] = len(self.order)
            self.order.append(self.arena_offsets[slot.buffer][0] + slot.offset)
            self.nbytes.append(math.prod(slot.shape) * ITEMSIZE[slot.dtype])
        return f"<{C_TYPES[slot.dtype]} *>(A + o[{self.index[key]}])"


def _comment(call) -> str:
    """The IR line of a call without its buffers (the same for every layer)."""
    params = " ".join(f"{k}={v}" for k, v in call.params)
    shapes = " ".join(f"{x.dtype}{list(x.shape)}" for x in (*call.outputs, *call.inputs)
                      if hasattr(x, "shape"))
    return f"{call.op}[{params}] {shapes}".replace("[] ", " ")


def _flush(table: StageTable, task, run: list, pointers: _Pointers, steps: list) -> None:
    if not run:
        return
    lines: list[str] = []
    for position, (call, emitted) in enumerate(run):
        lines.append(f"# {_comment(call)}")
        lines += emitted.lines
        lines.append(f"if st != 0: status[0] = st; return {position}")
        table.scratch_floats = max(table.scratch_floats, emitted.scratch_floats)
        table.tables.update(emitted.tables)
    function = table.function_of("\n".join(lines), task)
    steps.append(NativeStep(function, tuple(pointers.order), tuple(pointers.nbytes),
                            tuple(CallLabel(c.op, c.note) for c, _ in run)))


def _layer(call) -> str:
    """The layer a call belongs to ("L3" of note "L3 rms_norm"), "" if none."""
    layer = note_layer(call.note)
    return "" if layer is None else f"L{layer}"


def build_stage_table(program, stage: int) -> StageTable:
    """The table of `stage` from the lowered program and its memory plan."""
    offsets = program.memory.stages[stage].offsets
    table = StageTable(stage)
    for lowered in program.lowered[stage]:
        steps: list = []
        run, pointers = [], _Pointers(offsets)
        for call in lowered.calls:
            if run and _layer(call) != _layer(run[-1][0]):  # one function per layer
                _flush(table, lowered.task, run, pointers, steps)
                run, pointers = [], _Pointers(offsets)
            before = len(pointers.order)
            emitted = emit_call(call, pointers)
            if emitted is None:
                pointers.rewind(before)
                _flush(table, lowered.task, run, pointers, steps)
                run, pointers = [], _Pointers(offsets)
                steps.append(PythonStep(call))
            else:
                run.append((call, emitted))
        _flush(table, lowered.task, run, pointers, steps)
        touched = frozenset(x.buffer for c in lowered.calls for x in (*c.inputs, *c.outputs)
                            if hasattr(x, "buffer"))
        table.rows.append((lowered.task, tuple(steps), touched))
    return table.canonical()
