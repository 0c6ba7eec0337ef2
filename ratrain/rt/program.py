"""A stage's code for a rank: its rows (code/stage<N>.tasks.json, read by the program
format's codec) and its generated module, built from code/stage<N>.pyx into the build cache
or found there. Cached per process, as a rank runs one stage.
"""
from __future__ import annotations

from pathlib import Path

from ratrain.program_format.build import build_module, load_module
from ratrain.program_format.codec import read_stage_rows

_CODE: dict = {}


def stage_code(program, stage: int) -> tuple:
    """(StageRows, loaded generated module) of `stage` of an opened RuntimeProgram."""
    key = (program.directory, stage)
    if key not in _CODE:
        code = Path(program.directory) / "code"
        rows_file = code / f"stage{stage}.tasks.json"
        rows = read_stage_rows(rows_file.read_text(), str(rows_file))
        module = load_module(build_module((code / f"stage{stage}.pyx").read_text(),
                                          Path(program.directory)))
        _CODE[key] = (rows, module)
    return _CODE[key]
