"""The program format's JSON (NOTE [program format], runtime.py): runtime.json holds the
RuntimeProgram, code/stage<N>.tasks.json a stage's rows, one row per line:

    {"task": "0F3", "buffers": ["act.L1.mb3", ...], "steps": [STEP, ...]}

where a STEP is a native one, {"function": 4, "offsets": [...], "nbytes": [...],
"calls": [["rms_norm", "L1 rms_norm"], ...]} (the generated function's index in the
.pyx, the arena offset and size of each pointer, the lowered calls it runs with their IR
notes), or a Python one, {"call": {"op", "outputs", "inputs", "params", "note"}} with
slots as {"buffer", "offset", "dtype", "shape"} and constants as {"literal", "dtype"}; a
call's "layer" (and a native call label's third field) is the layer it works on, null if
step-wide. Tasks are written in the task IR's text (ir/tasks.py), which parses back.
Since format 10 the head also holds the generated module's "header" line and its
"functions", one per line: {"used_by", "legend": [role of o[i], ...], "calls": [{"op",
"params", "outputs": [[i, dtype, shape], ...], "inputs": [...]}]}, from which
codegen/module.py renders code/stage<N>.pyx (NOTE [a program directory is data]).
Decoding builds the format's own types only, and checks every field it reads
(checks.py): a bad one is one FormatError line naming the file and the field.

Older formats this runtime reads (runtime.READABLE) are converted as they are read:
formats 6 and 7 wrote no placement in the options (their ranks are pipeline-major, the
option's default: NOTE [placement], hw/topology.py); format 6 wrote no layers; its per-layer calls' notes began with "L<layer>" (_v6_layer).
Formats 6-8 also wrote a table of the SYNC rows the runtime started inside the step's
last B; it is not read: their SYNCs start at their own rows, right after that B, with
the same numbers and less overlap (format 9 writes the B's per-layer pieces and each
SYNC after its own: NOTE [sync issue point]).
"""
from __future__ import annotations

import json
from dataclasses import asdict

from ratrain.ir.buffers import parse_buffer
from ratrain.ir.graph import DTYPE_SHORT, Literal
from ratrain.ir.tasks import parse_task
from ratrain.program_format import checks as c
from ratrain.program_format.checks import FieldError, FormatError, at, field, refused
from ratrain.program_format.lowered import Call, Slot, StagePeriod
from ratrain.program_format.options import CompileOptions, legacy_vocab_parallel
from ratrain.program_format.runtime import (FORMAT, LayerState, Memory, RuntimeGraph,
                                            RuntimeProgram, StagePlan)
from ratrain.program_format.table import (FORWARD_ROW, CallLabel, NativeCall,
                                          NativeFunction, NativeStep, Pointer, PythonStep,
                                          StageRows)

__all__ = ["FormatError", "read_runtime", "read_stage_rows", "write_runtime",
           "write_stage_rows"]
HEADER = "ratrain generated program: "    # how a generated module's first comment starts
NATIVE_DTYPES = ("float32", "float16", "bfloat16", "int32")   # codegen/emit.py's C_TYPES


# ---- values -----------------------------------------------------------------------------

def _tuples(value):
    """JSON lists back to the tuples the compiler wrote (params, shapes, offsets)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _slot(x) -> dict:
    if isinstance(x, Slot):
        return {"buffer": x.buffer, "offset": x.offset, "dtype": x.dtype, "shape": list(x.shape)}
    return {"literal": x.value, "dtype": x.dtype}


def _buffer(value, path: str) -> str:
    """A buffer's name, checked against the grammar (ir/buffers.py NAME_FORMS)."""
    try:
        parse_buffer(c.text(value, path, 100))
    except ValueError as e:
        raise FieldError(path, f"is not a buffer name ({e})") from None
    return value


def _read_slot(d, path: str):
    dtype = c.one_of(field(d, "dtype", path), at(path, "dtype"), DTYPE_SHORT)
    if isinstance(d, dict) and "literal" in d:
        return Literal(c.number(d["literal"], at(path, "literal")), dtype)
    return Slot(_buffer(field(d, "buffer", path), at(path, "buffer")), c.integer(field(d, "offset", path), at(path, "offset")), dtype,
                c.shape(field(d, "shape", path), at(path, "shape")))


def _v6_layer(note: str) -> int | None:
    """Format 6's layer of a call: its note's "L<layer>" head ("L3 rms_norm" -> 3)."""
    head = note.split(" ", 1)[0]
    return int(head[1:]) if head[:1] == "L" and head[1:].isdigit() else None


def _call(call: Call) -> dict:
    return {"op": call.op, "outputs": [_slot(s) for s in call.outputs],
            "inputs": [_slot(s) for s in call.inputs],
            "params": [[k, v] for k, v in call.params], "note": call.note, "layer": call.layer}


def _read_call(d, path: str) -> Call:
    def operands(key):
        return tuple(_read_slot(x, at(at(path, key), i))
                     for i, x in enumerate(c.listed(field(d, key, path), at(path, key))))
    note = c.text(field(d, "note", path), at(path, "note"))
    layer = d["layer"] if "layer" in d else _v6_layer(note)
    return Call(c.name(field(d, "op", path), at(path, "op")), operands("outputs"),
                operands("inputs"), c.params(field(d, "params", path), at(path, "params")),
                note, c.optional_integer(layer, at(path, "layer"), 0, 1 << 20))


def _step(step) -> dict:
    if isinstance(step, PythonStep):
        return {"call": _call(step.call)}
    return {"function": step.function, "offsets": list(step.offsets),
            "nbytes": list(step.nbytes), "calls": [[x.op, x.note, x.layer] for x in step.calls]}


def _read_label(value, path: str) -> CallLabel:
    fields = c.listed(value, path)
    if len(fields) not in (2, 3):
        raise FieldError(path, "must be [op, note, layer]")
    note = c.text(fields[1], at(path, 1))
    layer = fields[2] if len(fields) == 3 else _v6_layer(note)
    return CallLabel(c.name(fields[0], at(path, 0)), note,
                     c.optional_integer(layer, at(path, 2), 0, 1 << 20))


def _integers(d, key: str, path: str) -> tuple[int, ...]:
    return c.integers(field(d, key, path), at(path, key))


def _read_step(d, path: str):
    if isinstance(d, dict) and "call" in d:
        return PythonStep(_read_call(d["call"], at(path, "call")))
    labels = c.listed(field(d, "calls", path), at(path, "calls"))
    return NativeStep(c.integer(field(d, "function", path), at(path, "function")),
                      _integers(d, "offsets", path), _integers(d, "nbytes", path),
                      tuple(_read_label(x, at(at(path, "calls"), i))
                            for i, x in enumerate(labels)))


# ---- generated functions (format 10: NOTE [a program directory is data]) ---------------

def _function(f: NativeFunction) -> dict:
    def operands(xs):
        return [[x.index, x.dtype, list(x.shape)] for x in xs]
    return {"used_by": f.used_by, "legend": list(f.legend),
            "calls": [{"op": x.op, "params": [[k, v] for k, v in x.params],
                       "outputs": operands(x.outputs), "inputs": operands(x.inputs)}
                      for x in f.calls]}


def _read_pointer(value, path: str, pointers: int) -> Pointer:
    index, dtype, dims = c.listed(value, path, 3)
    return Pointer(c.integer(index, at(path, 0), 0, pointers - 1),
                   c.one_of(dtype, at(path, 1), NATIVE_DTYPES), c.shape(dims, at(path, 2)))


def _read_native_call(d, path: str, pointers: int, ops) -> NativeCall:
    def operands(key):
        return tuple(_read_pointer(x, at(at(path, key), i), pointers)
                     for i, x in enumerate(c.listed(field(d, key, path), at(path, key))))
    op = field(d, "op", path)
    return NativeCall(c.text(op, at(path, "op")) if ops is None else
                      c.one_of(op, at(path, "op"), ops),
                      operands("outputs"), operands("inputs"),
                      c.params(field(d, "params", path), at(path, "params")))


def _read_function(d, path: str, ops) -> NativeFunction:
    legend = tuple(c.text(x, at(at(path, "legend"), i)) for i, x in
                   enumerate(c.listed(field(d, "legend", path), at(path, "legend"))))
    calls = c.listed(field(d, "calls", path), at(path, "calls"))
    return NativeFunction(c.text(field(d, "used_by", path), at(path, "used_by")), legend,
                          tuple(_read_native_call(x, at(at(path, "calls"), i), len(legend), ops)
                                for i, x in enumerate(calls)))


def _read_header(value, path: str) -> str:
    header = c.text(value, path)
    if not header.startswith(HEADER):
        raise FieldError(path, f"must start with {HEADER!r}")
    return header


# ---- code/stage<N>.tasks.json -----------------------------------------------------------

def write_stage_rows(rows: StageRows) -> str:
    """The stage's rows as JSON text, one row (and one generated function) per line."""
    head = {"format": FORMAT, "stage": rows.stage,
            "period": None if rows.period is None else asdict(rows.period),
            "forward": [[r, what if what == FORWARD_ROW else _call(what)]
                        for r, what in rows.forward], "header": rows.header}
    functions = [json.dumps(_function(f), separators=(",", ":")) for f in rows.functions]
    lines = [json.dumps({"task": str(task), "buffers": sorted(touched),
                         "steps": [_step(s) for s in steps]}, separators=(",", ":"))
             for task, steps, touched in rows.rows]
    return (json.dumps(head)[:-1] + ', "functions": [\n' + ",\n".join(functions)
            + '\n], "rows": [\n' + ",\n".join(lines) + "\n]}\n")


def read_stage_rows(text: str, where: str, native_ops=None) -> StageRows:
    """A stage's rows from its JSON, every field checked (FormatError names the bad one).
    `native_ops`: the ops a generated function may call (codegen/emit.py's templates;
    the runtime passes them), None where the reader runs no code (cluster/volume.py);
    a file without "functions" (format 9 and older) reads with functions None."""
    try:
        d = json.loads(text)
    except ValueError as e:
        raise FormatError(f"{where} is not JSON ({e}); recompile the program") from None
    try:
        return _stage_rows(d, native_ops)
    except FieldError as e:
        raise refused(where, e) from None


def _task(value, path: str):
    try:
        return parse_task(c.text(value, path, 100))
    except ValueError as e:
        raise FieldError(path, f"is not a task ({e})") from None


def _row(r, path: str):
    buffers = c.listed(field(r, "buffers", path), at(path, "buffers"))
    steps = c.listed(field(r, "steps", path), at(path, "steps"))
    return (_task(field(r, "task", path), at(path, "task")),
            tuple(_read_step(s, at(at(path, "steps"), i)) for i, s in enumerate(steps)),
            frozenset(_buffer(b, at(at(path, "buffers"), i)) for i, b in enumerate(buffers)))


def _period(value, path: str) -> StagePeriod | None:
    if value is None:
        return None
    keys = ("instance", "start", "length", "shift", "count")
    return StagePeriod(**{k: c.integer(field(value, k, path), at(path, k), 1 if k in
                                       ("length", "count") else 0, 1 << 20) for k in keys})


def _forward(value, path: str) -> tuple:
    out = []
    for i, pair in enumerate(c.listed(value, path)):
        row, what = c.listed(pair, at(path, i), 2)
        out.append((c.integer(row, at(at(path, i), 0)), what if what == FORWARD_ROW
                    else _read_call(what, at(at(path, i), 1))))
    return tuple(out)


def _stage_rows(d, native_ops) -> StageRows:
    rows = c.listed(field(d, "rows", ""), "rows")
    functions = None
    if isinstance(d, dict) and "functions" in d:
        functions = tuple(_read_function(f, at("functions", i), native_ops)
                          for i, f in enumerate(c.listed(d["functions"], "functions")))
    return StageRows(c.integer(field(d, "stage", ""), "stage", 0, 1 << 20),
                     tuple(_row(r, at("rows", i)) for i, r in enumerate(rows)),
                     _period(field(d, "period", ""), "period"),
                     _forward(field(d, "forward", ""), "forward"),
                     _read_header(d["header"], "header") if functions is not None else "",
                     functions)


# ---- runtime.json -----------------------------------------------------------------------

def write_runtime(program: RuntimeProgram) -> str:
    layers = {str(i): {"params": [[name, list(shape)] for name, shape in s.params],
                       "state": [_slot(x) for x in s.state[:3]] + list(s.state[3:]),
                       "views": [_slot(x) for x in s.views]}
              for i, s in sorted(program.layers.items())}
    memory = {str(stage): {"arena_bytes": p.arena_bytes, "peak_bytes": p.peak_bytes,
                           "offsets": {b: list(o) for b, o in sorted(p.offsets.items())},
                           "persistent": sorted(p.persistent)}
              for stage, p in sorted(program.memory.stages.items())}
    return json.dumps({"format": FORMAT,
                       "graph": {"name": program.graph.name, "config": program.graph.config},
                       "options": asdict(program.options),
                       "stages": [list(s) for s in program.stages], "memory": memory,
                       "layers": layers, "tie_stages": list(program.tie_stages)},
                      indent=1) + "\n"


def read_runtime(text: str, where: str) -> RuntimeProgram:
    """The RuntimeProgram of runtime.json, every field checked against the others: a
    stage per pipeline stage, each layer on one stage, every buffer inside its stage's
    arena and every state and view slot inside its buffer (FormatError names the bad one)."""
    try:
        d = json.loads(text)
    except ValueError as e:
        raise FormatError(f"{where} is not JSON ({e}); recompile the program") from None
    try:
        return _runtime(d)
    except FieldError as e:
        raise refused(where, e) from None


def _options(value, path: str) -> CompileOptions:
    """CompileOptions of JSON, each field of its declared kind, then checked as on
    construction (options.py)."""
    if not isinstance(value, dict):
        raise FieldError(path, f"must be a JSON object, got {type(value).__name__}")
    fields, checked = CompileOptions.__dataclass_fields__, {}
    for key, v in value.items():
        if key not in fields:
            raise FieldError(at(path, key), "is not a compile option")
        if key == "vocab_parallel":  # true/false before it took a value
            v = legacy_vocab_parallel(v)
        checked[key] = _option_value(v, at(path, key), str(fields[key].type))
    try:
        return CompileOptions.from_dict(checked)
    except (TypeError, ValueError) as e:
        raise FieldError(path, f"are not options the compiler makes ({e})") from None


def _option_value(v, path: str, kind: str):
    if v is None and "None" in kind:
        return None
    if kind == "bool":
        if not isinstance(v, bool):
            raise FieldError(path, f"must be true or false, got {v!r}")
        return v
    if kind.startswith("int"):
        return c.integer(v, path, 0, 1 << 40)
    if kind.startswith("str"):
        return c.text(v, path, 100)
    if kind.startswith("float"):
        return c.number(v, path)
    return tuple(c.number(x, at(path, i)) for i, x in enumerate(c.listed(v, path)))


def _plan(p, path: str) -> StagePlan:
    arena = c.integer(field(p, "arena_bytes", path), at(path, "arena_bytes"))
    peak = c.integer(field(p, "peak_bytes", path), at(path, "peak_bytes"), 0, arena)
    given, offsets = field(p, "offsets", path), {}
    if not isinstance(given, dict):
        raise FieldError(at(path, "offsets"), "must be a JSON object of buffers")
    for b, o in given.items():
        where = at(at(path, "offsets"), b)
        start, size = c.listed(o, where, 2)
        start = c.integer(start, at(where, 0), 0, arena)
        offsets[_buffer(b, where)] = (start, c.integer(size, at(where, 1), 0, arena - start))
    persistent = frozenset(c.one_of(b, at(at(path, "persistent"), i), offsets) for i, b in
                           enumerate(c.listed(field(p, "persistent", path),
                                              at(path, "persistent"))))
    return StagePlan(arena, peak, offsets, persistent)


def _in_buffer(slot, plan: StagePlan, path: str):
    """`slot` lies inside its buffer of `plan`."""
    if slot.buffer not in plan.offsets:
        raise FieldError(at(path, "buffer"), f"names no buffer of the stage's memory plan, "
                         f"got {slot.buffer!r}")
    if slot.offset + slot.nbytes > plan.offsets[slot.buffer][1]:
        raise FieldError(path, f"runs past the end of buffer {slot.buffer} "
                         f"({plan.offsets[slot.buffer][1]} bytes)")
    return slot


def _layer(s, path: str, plan: StagePlan, zero: int) -> LayerState:
    """A layer's state slots, each inside its buffer of the stage's plan; its views too,
    except under ZeRO-3, which has none in the plan (each use gathers its own: NOTE
    [ZeRO-3 lifecycle]) and never reads them (rt/calls.init_layer)."""
    def slots(key, count=None, planned=True):
        read = (_read_slot(x, at(at(path, key), i))
                for i, x in enumerate(c.listed(field(s, key, path), at(path, key))[:count]))
        return tuple(_in_buffer(slot, plan, at(at(path, key), i)) if planned else slot
                     for i, slot in enumerate(read))
    params = []
    for i, pair in enumerate(c.listed(field(s, "params", path), at(path, "params"))):
        name, dims = c.listed(pair, at(at(path, "params"), i), 2)
        params.append((c.text(name, at(at(at(path, "params"), i), 0), 200),
                       c.shape(dims, at(at(at(path, "params"), i), 1))))
    state = c.listed(s["state"], at(path, "state"), 5)
    sizes = tuple(c.integer(v, at(at(path, "state"), 3 + i)) for i, v in enumerate(state[3:]))
    views = slots("views", planned=zero != 3)
    if len(views) != len(params):
        raise FieldError(at(path, "views"), f"must hold one slot per parameter ({len(params)})")
    return LayerState(tuple(params), slots("state", 3) + sizes, views)


def _pipeline_order(stages, options) -> list[int]:
    """The stages' layers in model order: in stage order, and under --vocab-parallel the
    head's shards (each stage's last layer, NOTE [vocabulary-parallel head]) after them,
    then under --vocab-parallel both the embedding's (each stage's last, the head's
    shard before it: NOTE [vocabulary-parallel embedding])."""
    shards = int(options.splits_head) + int(options.splits_embedding)
    if not shards:
        return [l for layers in stages for l in layers]
    return [l for layers in stages for l in layers[:len(layers) - shards]] + \
        [layers[len(layers) - shards + k] for k in range(shards) for layers in stages
         if len(layers) >= shards]


def _runtime(d) -> RuntimeProgram:
    graph = field(d, "graph", "")
    name = field(graph, "name", "graph")
    if not isinstance(name, str) or not isinstance(field(graph, "config", "graph"), dict):
        raise FieldError("graph", "must hold the model's name and config")
    options = _options(field(d, "options", ""), "options")
    stages = tuple(tuple(c.integer(l, at(at("stages", s), i), 0, 1 << 20)
                         for i, l in enumerate(c.listed(layers, at("stages", s))))
                   for s, layers in enumerate(c.listed(field(d, "stages", ""), "stages",
                                                       options.pp)))
    order = [l for layers in stages for l in layers]
    if _pipeline_order(stages, options) != list(range(len(order))):
        raise FieldError("stages", "must hold the layers 0..L-1, in order, each on one stage "
                         "(with --vocab-parallel, then each stage's shard of the head, and "
                         "with --vocab-parallel both of the embedding, last)")
    plans = field(d, "memory", "")
    memory = {s: _plan(field(plans, str(s), "memory"), at("memory", str(s)))
              for s in range(options.pp)}
    stage_of = {l: s for s, layers in enumerate(stages) for l in layers}
    layers = field(d, "layers", "")
    state = {l: _layer(field(layers, str(l), "layers"), at("layers", str(l)),
                       memory[stage_of[l]], options.zero) for l in range(len(order))}
    ties = tuple(c.integer(s, at("tie_stages", i), 0, options.pp - 1)
                 for i, s in enumerate(c.listed(field(d, "tie_stages", ""), "tie_stages")))
    return RuntimeProgram(RuntimeGraph(name, graph["config"]), options, stages,
                          Memory(memory), state, ties)
