"""Open a program directory for running: the manifest, the world-size, format and version
checks, the files' hashes, and the RuntimeProgram (rt/program.py) the compiler wrote.
"""
from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

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


def check_versions(directory: Path, manifest: dict) -> None:
    """The program's format and compiler version are this runtime's (its pickled tables
    name classes of this ratrain)."""
    from ratrain.rt.program import FORMAT, ratrain_version
    found = (manifest.get("format"), manifest.get("ratrain_version"))
    if found != (FORMAT, ratrain_version()):
        raise SetupError(f"{directory} was compiled by ratrain {found[1]} ({found[0]}), this "
                         f"is ratrain {ratrain_version()} ({FORMAT}): recompile it")


def read_program(directory: Path):
    """The RuntimeProgram of a checked program directory."""
    try:
        program = pickle.loads((directory / "runtime.pkl").read_bytes())
    except (OSError, pickle.UnpicklingError, AttributeError, EOFError) as e:
        raise SetupError(f"{directory}/runtime.pkl cannot be read ({e}); recompile it") from None
    program.directory = directory
    return program


def open_program(directory: str, world_size: int):
    """(manifest, Program) of a checked program directory, or a SetupError."""
    path = Path(directory)
    manifest = read_manifest(path)
    check_world_size(path, manifest, world_size)
    check_versions(path, manifest)
    check_hashes(path, manifest)
    return manifest, read_program(path)
