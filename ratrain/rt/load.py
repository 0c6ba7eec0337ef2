"""Open a program directory for running: the manifest, the world-size and format checks,
the files' hashes, the RuntimeProgram the compiler wrote (runtime.json, NOTE [program
format] in program_format/runtime.py) and every stage's rows and rendered code, all read
as untrusted input (NOTE [a program directory is data], rt/program.py). `ratrain run`
calls open_program before it starts ranks, and every rank again.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

from ratrain.program_format import checks as c
from ratrain.program_format.checks import FieldError, field, refused
from ratrain.program_format.codec import FormatError, read_runtime
from ratrain.program_format.options import CompileOptions
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


def check_manifest(directory: Path, manifest) -> None:
    """The manifest's fields the runtime reads have their kinds: a SetupError naming the
    first that does not (NOTE [a program directory is data], rt/program.py)."""
    try:
        _manifest_fields(manifest)
    except FieldError as e:
        raise SetupError(str(refused(str(directory / MANIFEST), e))) from None


def _manifest_fields(m) -> None:
    c.integer(field(m, "world_size", ""), "world_size", 1, 1 << 16)
    options = field(m, "options", "")
    for key in ("pp", "dp", "seq_len"):
        c.integer(field(options, key, "options"), f"options.{key}", 1, 1 << 20)
    model = field(m, "model", "")
    for key in ("config", "hf_config"):
        if key in model and not isinstance(model[key], dict):
            raise FieldError(f"model.{key}", "must be a JSON object (the model's config)")
    field(model, "config", "model")
    files = field(m, "files", "")
    if not isinstance(files, dict):
        raise FieldError("files", "must be a JSON object of file -> sha256")
    for relative, digest in files.items():
        parts = Path(relative).parts
        if not parts or Path(relative).is_absolute() or ".." in parts:
            raise FieldError("files", f"must name files inside the directory, got {relative!r}")
        if not isinstance(digest, str) or len(digest) != 64:
            raise FieldError(f"files.{relative}", "must be a sha256 in hex")
    flops = m.get("flops")
    if flops is not None:
        for key in ("model_per_step", "peak"):
            if c.number(field(flops, key, "flops"), f"flops.{key}") <= 0:
                raise FieldError(f"flops.{key}", "must be positive")


def check_agrees(directory: Path, manifest: dict, program) -> None:
    """The manifest and runtime.json describe one program: its options, its model and
    the parameters of its layers (which the ranks initialise from the model's config)."""
    from ratrain.ir.vocab import whole_shapes
    from ratrain.models.params import param_shapes
    try:  # formats before 8 wrote fewer options: compare what they mean
        same = CompileOptions.from_dict(manifest["options"]) == program.options
    except (TypeError, ValueError):
        same = False
    if not same or manifest["model"]["config"] != program.graph.config:
        raise SetupError(f"{directory / MANIFEST} and runtime.json describe different "
                         "programs (options or model config); recompile it")
    try:
        shapes = param_shapes(program.graph.config)
    except (KeyError, TypeError, ValueError, ArithmeticError) as e:
        raise SetupError(f"{directory / 'runtime.json'}: graph.config is not a model config "
                         f"ratrain reads ({type(e).__name__}: {e}); recompile it") from None
    held = whole_shapes((name, shape) for layer in program.layers.values()
                        for name, shape in layer.params)  # a head's row shards whole
    if held != shapes:
        raise SetupError(f"{directory / 'runtime.json'}: layers.*.params are not the "
                         "parameters of graph.config's model; recompile it")


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


def check_format(directory: Path, manifest) -> None:
    """The program's format is one this runtime reads (NOTE [program format])."""
    if not isinstance(manifest, dict):
        raise SetupError(f"{directory / MANIFEST} is not a JSON object; recompile it")
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
        raise SetupError(str(e)) from None
    return replace(program, directory=str(directory))


def open_program(directory: str, world_size: int, trust: bool = False):
    """(manifest, Program) of a checked program directory whose every stage's rows and
    code were checked (rt/program.py's stage_source), or a SetupError."""
    from ratrain.rt.program import CodeError, stage_source
    path = Path(directory)
    manifest = read_manifest(path)
    check_format(path, manifest)
    check_manifest(path, manifest)
    check_world_size(path, manifest, world_size)
    check_hashes(path, manifest)
    program = read_program(path)
    check_agrees(path, manifest, program)
    try:
        for stage in range(program.options.pp):
            stage_source(program, stage, trust)
    except (CodeError, FormatError) as e:
        raise SetupError(str(e)) from None
    return manifest, program
