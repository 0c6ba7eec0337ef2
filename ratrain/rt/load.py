"""Open a program directory for running: the manifest, the world-size check, the files'
hashes, and the lowered Program rebuilt from the manifest's config and options.

Compiling is deterministic, so every rank rebuilds the program (about a second for small
models) and checks that its task list and memory plan equal the files that were hashed.
"""
from __future__ import annotations

import hashlib
import json
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


def rebuild_program(directory: Path, manifest: dict):
    """The lowered Program of the manifest, checked against its rank and memory files."""
    from ratrain.cli_compile import program_files, recompile
    program = recompile(manifest)
    rebuilt = program_files(program, [])
    for relative in [f for f in manifest["files"] if not f.startswith("passes/")]:
        if hashlib.sha256(rebuilt[relative].encode()).hexdigest() != manifest["files"][relative]:
            raise SetupError(f"{directory}/{relative} differs from what this ratrain compiles "
                             "from the manifest (another compiler version?); recompile it")
    return program


def open_program(directory: str, world_size: int):
    """(manifest, Program) of a checked program directory, or a SetupError."""
    path = Path(directory)
    manifest = read_manifest(path)
    check_world_size(path, manifest, world_size)
    check_hashes(path, manifest)
    return manifest, rebuild_program(path, manifest)
