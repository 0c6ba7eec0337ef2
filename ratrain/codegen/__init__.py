"""Code generation: a lowered program's stages become static task tables (table.py) whose
generated functions are data (NativeFunction) that module.py renders as Cython over the
emit.py templates; program_format/build.py builds and caches the modules by content hash.
The ranks import emit.py and module.py only (a pure renderer, NOTE [a program directory
is data] in rt/program.py), so this package imports nothing at import time."""
from ratrain.program_format.table import NativeStep, PythonStep


def generate(program, header: str) -> dict:
    """stage -> (task table, Cython source) of every stage of a lowered program."""
    from ratrain.codegen.module import render_stage
    from ratrain.codegen.table import build_stage_table
    out = {}
    for stage in range(program.options.pp):
        table = build_stage_table(program, stage)
        out[stage] = (table, render_stage(table.native_functions(), header))
    return out


def __getattr__(name: str):
    """StageTable and build_stage_table, imported on first use (they import the passes)."""
    if name in ("StageTable", "build_stage_table"):
        from ratrain.codegen import table
        return getattr(table, name)
    raise AttributeError(name)


__all__ = ["NativeStep", "PythonStep", "StageTable", "build_stage_table", "generate"]
