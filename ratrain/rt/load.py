"""Open a program directory for running: the manifest, the world-size and format checks,
the files' hashes, and the RuntimeProgram the compiler wrote (runtime.json, NOTE [program
format] in program_format/runtime.py).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

from ratrain.program_format.codec import FormatError, read_runtime
from ratrain.program_format.runtime import format_problem

MANIFEST = "program.json"


class SetupError(ValueError):
    """The job cannot start; the message is one line telling the user what to do."""


def read_manifest(directory: Path) -> dict:
    try:
        return json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        raise SetupError(f"{directory} is not a program directory (no {MANIFEST}); "
                         "write one with `ratrain compile MODEL -o DIR`") from None
    except (OSError, json.JSONDecodeError) as e:
        raise SetupError(f"{directory / MANIFEST} is corrupted ({e}); recompile it") from None


def check_world_size(directory: Path, manifest: dict, world_size: int) -> None:
    o, needed = manifest["options"], manifest["world_size"]
    if world_size != needed:
        raise SetupError(f"{directory} was compiled for {needed} ranks (pp {o['pp']} x dp "
                         f"{o['dp']}) but this job has {world_size}: run `mpiexec -n {needed} "
                         f"python -m ratrain.rt {directory}` (or `ratrain run {directory} "
                         f"-n {needed}`), or recompile for {world_size} ranks")


def check_hashes(directory: Path, manifest: dict) -> None:
    """Every file listed in the manifest exists and has its recorded sha256."""
    for relative, digest in manifest["files"].items():
        try:
            actual = hashlib.sha256((directory / relative).read_bytes()).hexdigest()
        except OSError:
            actual = None
        if actual != digest:
            state = "is missing" if actual is None else "does not match its hash"
            raise SetupError(f"{directory} is corrupted: {relative} {state} in {MANIFEST}; "
                             "recompile it")


def check_format(directory: Path, manifest: dict) -> None:
    """The program's format is one this runtime reads (NOTE [program format])."""
    problem = format_problem(manifest.get("format"))
    if problem:
        raise SetupError(f"{directory} {problem}")


def read_program(directory: Path):
    """The RuntimeProgram of a checked program directory."""
    path = directory / "runtime.json"
    try:
        program = read_runtime(path.read_text(), str(path))
    except OSError as e:
        raise SetupError(f"{path} cannot be read ({e.strerror or e}); recompile it") from None
    except FormatError as e:
        raise SetupError(f"{e}; recompile it") from None
    return replace(program, directory=str(directory))


def open_program(directory: str, world_size: int):
    """(manifest, Program) of a checked program directory, or a SetupError."""
    path = Path(directory)
    manifest = read_manifest(path)
    check_format(path, manifest)
    check_world_size(path, manifest, world_size)
    check_hashes(path, manifest)
    return manifest, read_program(path)
