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
Decoding builds the format's own types only: nothing in a file names code to run.

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

from ratrain.ir.graph import Literal
from ratrain.ir.tasks import parse_task
from ratrain.program_format.lowered import Call, Slot, StagePeriod
from ratrain.program_format.options import CompileOptions
from ratrain.program_format.runtime import (FORMAT, LayerState, Memory, RuntimeGraph,
                                            RuntimeProgram, StagePlan)
from ratrain.program_format.table import (FORWARD_ROW, CallLabel, NativeStep, PythonStep,
                                          StageRows)


class FormatError(ValueError):
    """A program file that does not hold what the format says; one line naming it."""


# ---- values -----------------------------------------------------------------------------

def _tuples(value):
    """JSON lists back to the tuples the compiler wrote (params, shapes, offsets)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _slot(x) -> dict:
    if isinstance(x, Slot):
        return {"buffer": x.buffer, "offset": x.offset, "dtype": x.dtype, "shape": list(x.shape)}
    return {"literal": x.value, "dtype": x.dtype}


def _read_slot(d: dict):
    if "literal" in d:
        return Literal(d["literal"], d["dtype"])
    return Slot(d["buffer"], d["offset"], d["dtype"], tuple(d["shape"]))


def _v6_layer(note: str) -> int | None:
    """Format 6's layer of a call: its note's "L<layer>" head ("L3 rms_norm" -> 3)."""
    head = note.split(" ", 1)[0]
    return int(head[1:]) if head[:1] == "L" and head[1:].isdigit() else None


def _call(call: Call) -> dict:
    return {"op": call.op, "outputs": [_slot(s) for s in call.outputs],
            "inputs": [_slot(s) for s in call.inputs],
            "params": [[k, v] for k, v in call.params], "note": call.note, "layer": call.layer}


def _read_call(d: dict) -> Call:
    layer = d["layer"] if "layer" in d else _v6_layer(d["note"])
    return Call(d["op"], tuple(map(_read_slot, d["outputs"])), tuple(map(_read_slot, d["inputs"])),
                tuple((k, _tuples(v)) for k, v in d["params"]), d["note"], layer)


def _step(step) -> dict:
    if isinstance(step, PythonStep):
        return {"call": _call(step.call)}
    return {"function": step.function, "offsets": list(step.offsets),
            "nbytes": list(step.nbytes), "calls": [[c.op, c.note, c.layer] for c in step.calls]}


def _label(op: str, note: str, *layer) -> CallLabel:
    return CallLabel(op, note, layer[0] if layer else _v6_layer(note))


def _read_step(d: dict):
    if "call" in d:
        return PythonStep(_read_call(d["call"]))
    return NativeStep(d["function"], tuple(d["offsets"]), tuple(d["nbytes"]),
                      tuple(_label(*c) for c in d["calls"]))


# ---- code/stage<N>.tasks.json -----------------------------------------------------------

def write_stage_rows(rows: StageRows) -> str:
    """The stage's rows as JSON text, one row per line."""
    head = {"format": FORMAT, "stage": rows.stage,
            "period": None if rows.period is None else asdict(rows.period),
            "forward": [[r, what if what == FORWARD_ROW else _call(what)]
                        for r, what in rows.forward]}
    lines = [json.dumps({"task": str(task), "buffers": sorted(touched),
                         "steps": [_step(s) for s in steps]}, separators=(",", ":"))
             for task, steps, touched in rows.rows]
    return json.dumps(head)[:-1] + ', "rows": [\n' + ",\n".join(lines) + "\n]}\n"


def read_stage_rows(text: str, where: str) -> StageRows:
    try:
        d = json.loads(text)
        return StageRows(
            d["stage"],
            tuple((parse_task(r["task"]), tuple(map(_read_step, r["steps"])),
                   frozenset(r["buffers"])) for r in d["rows"]),
            None if d["period"] is None else StagePeriod(**d["period"]),
            tuple((r, what if what == FORWARD_ROW else _read_call(what))
                  for r, what in d["forward"]))
    except (ValueError, KeyError, TypeError) as e:
        raise FormatError(f"{where} is not a stage's rows ({type(e).__name__}: {e})") from None


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
    try:
        d = json.loads(text)
        memory = Memory({int(s): StagePlan(p["arena_bytes"], p["peak_bytes"],
                                           {b: tuple(o) for b, o in p["offsets"].items()},
                                           frozenset(p["persistent"]))
                         for s, p in d["memory"].items()})
        layers = {int(i): LayerState(tuple((n, tuple(shape)) for n, shape in s["params"]),
                                     tuple(map(_read_slot, s["state"][:3])) + tuple(s["state"][3:]),
                                     tuple(map(_read_slot, s["views"])))
                  for i, s in d["layers"].items()}
        return RuntimeProgram(RuntimeGraph(d["graph"]["name"], d["graph"]["config"]),
                              CompileOptions.from_dict(d["options"]),
                              tuple(tuple(s) for s in d["stages"]), memory, layers,
                              tuple(d["tie_stages"]))
    except (ValueError, KeyError, TypeError) as e:
        raise FormatError(f"{where} is not a runtime program ({type(e).__name__}: {e})") \
            from None
