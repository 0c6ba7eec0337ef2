"""Code generation: a lowered program's stages become static task tables (table.py) and
Cython modules calling the native kernels (emit.py templates, module.py), built and cached
by content hash (build.py)."""
from ratrain.codegen.table import StageTable, build_stage_table
from ratrain.program_format.table import NativeStep, PythonStep


def generate(program, header: str) -> dict[int, tuple[StageTable, str]]:
    """stage -> (task table, Cython source) of every stage of a lowered program."""
    from ratrain.codegen.module import render_module
    out = {}
    for stage in range(program.options.pp):
        table = build_stage_table(program, stage)
        out[stage] = (table, render_module(table, header))
    return out


__all__ = ["NativeStep", "PythonStep", "StageTable", "build_stage_table", "generate"]
