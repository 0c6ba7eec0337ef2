"""The code/ files and runtime.json of a program directory (NOTE [program format],
program_format/runtime.py), from a lowered Program: each stage's generated module, its
rows with what the compiler knows of them (StageRows), and the legend of its functions.
"""
from __future__ import annotations

from ratrain.codegen.legend import format_legend
from ratrain.codegen.module import render_stage
from ratrain.codegen.table import build_stage_table
from ratrain.ir.tasks import Kind
from ratrain.ir.vocab import state_layers
from ratrain.passes.insert_gathers import gather_plan, issuing_task
from ratrain.passes.insert_tied_sum import tie_stages
from ratrain.program_format.call_ops import CallOp
from ratrain.program_format.codec import write_runtime, write_stage_rows
from ratrain.program_format.runtime import (LayerState, Memory, RuntimeGraph,
                                            RuntimeProgram, StagePlan)
from ratrain.program_format.table import FORWARD_KINDS, FORWARD_ROW, PythonStep, StageRows



def runtime_program(program) -> RuntimeProgram:
    """The RuntimeProgram of a compiled (lowered) Program."""
    graph = program.graph
    layers = {index: LayerState(program.layer_params(index), program.state_slots(index),
                                program.view_slots(index)) for index in range(len(graph.layers))}
    memory = Memory({s: StagePlan(m.arena_bytes, m.peak_bytes, dict(m.offsets), m.persistent)
                     for s, m in program.memory.stages.items()})
    # a rank holds the state of its stage's layers and of its shard of a vocabulary-
    # parallel head (NOTE [vocabulary-parallel head])
    stages = tuple(state_layers(program, s) for s in range(len(program.stages)))
    return RuntimeProgram(RuntimeGraph(graph.name, graph.config), program.options,
                          stages, memory, layers, tie_stages(program))


def forward_rows(program, stage: int, rows) -> tuple:
    """NOTE [held-out loss] under ZeRO-3: (row, what the forward-only pass runs there) for
    each gather that serves an F but that training runs in a task that pass skips: the
    GATH row itself, or its call issued inside a B or REC (passes/lower._with_gathers_
    issued), found in that row."""
    tasks = [task for task, _, _ in rows]
    row_of = {task: r for r, task in enumerate(tasks)}
    out = []
    for g in gather_plan(program, stage, tasks):
        issuer = None if g.after is None else issuing_task(program, g.after[0])
        if not any(use.kind == Kind.F for use, _ in g.uses) or \
                (issuer is not None and issuer.kind in FORWARD_KINDS):
            continue
        if issuer is None:
            out.append((row_of[g.task], FORWARD_ROW))
            continue
        use = str(g.uses[0][0])
        call, = [s.call for s in rows[row_of[issuer]][1] if isinstance(s, PythonStep)
                 and is_gather_of(s.call, g.task.layer, use)]
        out.append((row_of[g.task], call))
    out += _shard_forward_rows(rows)
    return tuple(sorted(out, key=lambda x: x[0]))


def is_gather_of(call, layer: int, use: str) -> bool:
    """Is `call` the ZeRO-3 gather of `layer`'s view for the task whose text is `use`?"""
    return call.op == CallOp.GATHER_VIEW and call.layer == layer and \
        dict(call.params)["use"] == use


def _shard_forward_rows(rows) -> list:
    """NOTE [held-out loss] under a vocabulary-parallel head: the held-out pass runs every
    S row and, of each T, its vocab_loss call (not the gradients: NOTE
    [vocabulary-parallel head]); and every E row of a split embedding, which makes stage
    0's input (NOTE [vocabulary-parallel embedding])."""
    out = []
    for r, (task, steps, _) in enumerate(rows):
        if task.kind in (Kind.S, Kind.E):
            out.append((r, FORWARD_ROW))
        elif task.kind == Kind.T:
            out += [(r, s.call) for s in steps
                    if isinstance(s, PythonStep) and s.call.op == CallOp.VOCAB_LOSS]
    return out


def stage_rows(program, table, header: str) -> StageRows:
    """What the runtime reads of a stage's table, its generated functions as data."""
    return StageRows(table.stage, tuple(table.rows), table.period,
                     forward_rows(program, table.stage, table.rows), header,
                     table.native_functions())


def code_files(program, header: str) -> dict[str, str]:
    """code/stage<N>.pyx, .tasks.json and .legend.txt (which slots each generated
    function's offsets are, for its first user) of every stage, and runtime.json. The
    .pyx is rendered from the rows as the runtime renders it (NOTE [a program directory
    is data], rt/program.py)."""
    files = {"runtime.json": write_runtime(runtime_program(program))}
    for stage in range(program.options.pp):
        table = build_stage_table(program, stage)
        rows = stage_rows(program, table, header)
        files[f"code/stage{stage}.pyx"] = render_stage(rows.functions, rows.header)
        files[f"code/stage{stage}.tasks.json"] = write_stage_rows(rows)
        files[f"code/stage{stage}.legend.txt"] = format_legend(table)
    return files
