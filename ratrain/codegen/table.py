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

from ratrain.codegen.emit import C_TYPES, ITEMSIZE, emit_call
from ratrain.codegen.legend import slot_legend, slot_role
from ratrain.codegen.module import function_code
from ratrain.ir.tasks import BACKWARDS, Kind
from ratrain.program_format.lowered import StagePeriod
from ratrain.program_format.table import (CallLabel, NativeCall, NativeFunction, NativeStep,
                                          Pointer, PythonStep)



@dataclass(frozen=True)
class FunctionUse:
    """One use of a generated function by a task's run of calls (legend.py)."""
    task: str                           # the task's text ("0B1")
    layer: int | None                   # the layer of the calls, None if step-wide
    kind: str                           # that layer's kind ("decoder"), "" if step-wide
    roles: tuple[str, ...]              # slot_role of each pointer (same for all users)
    slots: tuple[str, ...]              # slot_legend of each pointer (this user's)


@dataclass
class StageTable:
    """What the runtime walks: one row per task, (task, steps, buffers it touches)."""
    stage: int
    functions: list[str] = field(default_factory=list)   # body of each generated function
    comments: list = field(default_factory=list)         # which tasks and layer kinds use it
    rows: list[tuple] = field(default_factory=list)      # (Task, steps, buffer names)
    scratch_floats: int = 0             # largest fp32 scratch a function needs
    tables: dict = field(default_factory=dict)           # constant arrays by name
    legends: list = field(default_factory=list)          # per function: role of each o[i]
    first_users: list = field(default_factory=list)      # per function: "0F0 (L1)"
    first_slots: list = field(default_factory=list)      # per function: its slots there
    layers: list = field(default_factory=list)           # per function: layers using it
    calls: list = field(default_factory=list)            # per function: its NativeCalls
    period: StagePeriod | None = None   # rows of a periodic program (NOTE [periodic
                                        # programs]); None: the rows are the whole step

    def function_of(self, body: str, calls: tuple, task, use: FunctionUse) -> int:
        if body not in self._index:
            self._index[body] = len(self.functions)
            self.functions.append(body)
            self.calls.append(calls)
            self.comments.append(set())
            self.legends.append([set() for _ in use.roles])
            self.first_users.append(use.task if use.layer is None
                                    else f"{use.task} (L{use.layer})")
            self.first_slots.append(use.slots)
            self.layers.append(set())
        index = self._index[body]
        # a per-layer piece runs its B's code (NOTE [sync issue point])
        kind = Kind.B if task.kind in BACKWARDS else task.kind
        self.comments[index].add((str(kind), use.kind))
        for roles, role in zip(self.legends[index], use.roles):
            roles.add(role)
        self.layers[index].add(use.layer)
        return index

    def canonical(self) -> StageTable:
        """Functions sorted by text, commented with the task kinds and layer kinds using
        them and a role legend of their pointers, so two programs running the same code
        (another schedule, DP degree, ZeRO stage or number of layers) give the same module
        and share its build."""
        order = sorted(range(len(self.functions)), key=self.functions.__getitem__)
        new_index = {old: new for new, old in enumerate(order)}
        rows = [(task, tuple(replace(s, function=new_index[s.function])
                             if isinstance(s, NativeStep) else s for s in steps), touched)
                for task, steps, touched in self.rows]
        return StageTable(self.stage, [self.functions[i] for i in order],
                          [_used_by(self.comments[i]) for i in order],
                          rows, self.scratch_floats, dict(sorted(self.tables.items())),
                          [tuple(" | ".join(sorted(r)) for r in self.legends[i]) for i in order],
                          [self.first_users[i] for i in order],
                          [self.first_slots[i] for i in order],
                          [tuple(sorted(self.layers[i], key=lambda l: -1 if l is None else l))
                           for i in order], [self.calls[i] for i in order], self.period)

    def native_functions(self) -> tuple[NativeFunction, ...]:
        """What codegen/module.py renders the stage's module from (a canonical table's)."""
        return tuple(NativeFunction(comment, legend, calls) for comment, legend, calls
                     in zip(self.comments, self.legends, self.calls))

    def __post_init__(self):
        self._index: dict[str, int] = {}


def _used_by(uses) -> str:
    """{("B", "decoder"), ("REC", "decoder")} -> `B, REC tasks of decoder layers`."""
    tasks = ", ".join(sorted({kind for kind, _ in uses}))
    kinds = sorted({layer_kind for _, layer_kind in uses if layer_kind})
    return f"{tasks} tasks" + (f" of {', '.join(kinds)} layers" if kinds else "")


class _Pointers:
    """Slot -> `<T *>(A + o[i])`, numbering the distinct slots of one function."""

    def __init__(self, offsets: dict):
        self.arena_offsets, self.index, self.order, self.nbytes = offsets, {}, [], []
        self.slots: list = []           # the Slot of each pointer, for the legend

    def rewind(self, size: int) -> None:
        """Forget the pointers numbered after the first `size` (a call that fell back)."""
        for key in [k for k, i in self.index.items() if i >= size]:
            del self.index[key]
        del self.order[size:], self.nbytes[size:], self.slots[size:]

    def __call__(self, slot) -> str:
        key = (slot.buffer, slot.offset)
        if key not in self.index:
            self.index[key] = len(self.order)
            self.order.append(self.arena_offsets[slot.buffer][0] + slot.offset)
            self.nbytes.append(math.prod(slot.shape) * ITEMSIZE[slot.dtype])
            self.slots.append(slot)
        return f"<{C_TYPES[slot.dtype]} *>(A + o[{self.index[key]}])"


def native_call(call, pointers: _Pointers) -> NativeCall:
    """A lowered call with its slots as the pointers of the function it runs in."""
    def pointer(slot):
        return Pointer(pointers.index[(slot.buffer, slot.offset)], slot.dtype, slot.shape)
    return NativeCall(call.op, tuple(map(pointer, call.outputs)),
                      tuple(map(pointer, call.inputs)), call.params)


def _use(program, task, run: list, pointers: _Pointers) -> FunctionUse:
    """How `task`'s run of calls uses its function: the layer and every pointer's slot."""
    layer = run[0][0].layer
    kind = "" if layer is None else program.graph.layers[layer].kind
    slots = pointers.slots
    return FunctionUse(str(task), layer, kind,
                       tuple(slot_role(program, s, layer, task.micro_batch) for s in slots),
                       tuple(slot_legend(program, s) for s in slots))


def _flush(program, table: StageTable, task, run: list, pointers: _Pointers,
           steps: list) -> None:
    if not run:
        return
    calls = tuple(native_call(call, pointers) for call, _ in run)
    body, scratch, tables = function_code(calls)
    table.scratch_floats = max(table.scratch_floats, scratch)
    table.tables.update(tables)
    function = table.function_of(body, calls, task, _use(program, task, run, pointers))
    steps.append(NativeStep(function, tuple(pointers.order), tuple(pointers.nbytes),
                            tuple(CallLabel(c.op, c.note, c.layer) for c, _ in run)))


def build_stage_table(program, stage: int) -> StageTable:
    """The table of `stage` from the lowered program and its memory plan."""
    offsets = program.memory.stages[stage].offsets
    table = StageTable(stage, period=(program.periods or {}).get(stage))
    for lowered in program.lowered[stage]:
        steps: list = []
        run, pointers = [], _Pointers(offsets)
        for call in lowered.calls:
            if run and call.layer != run[-1][0].layer:  # one function per layer
                _flush(program, table, lowered.task, run, pointers, steps)
                run, pointers = [], _Pointers(offsets)
            before = len(pointers.order)
            emitted = emit_call(call, pointers)
            if emitted is None:
                pointers.rewind(before)
                _flush(program, table, lowered.task, run, pointers, steps)
                run, pointers = [], _Pointers(offsets)
                steps.append(PythonStep(call))
            else:
                run.append((call, emitted))
        _flush(program, table, lowered.task, run, pointers, steps)
        touched = frozenset(x.buffer for c in lowered.calls for x in (*c.inputs, *c.outputs)
                            if hasattr(x, "buffer"))
        table.rows.append((lowered.task, tuple(steps), touched))
    return table.canonical()
