"""Program directories (NOTE [program format]): the files of a compiled program and its
manifest, written atomically (a temporary sibling renamed into place; with --build the
generated modules are built into the user cache first), and read back: the manifest, a
pass's output, a rank's lines.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from ratrain.compiler import compile_graph
from ratrain.errors import UserError
from ratrain.program_format.build import CacheError, check_owned, private_dir, user_cache
from ratrain.program_format.codec import HEADER
from ratrain.rt.load import MANIFEST, SetupError
from ratrain.rt.load import read_manifest as _read_manifest
from ratrain.rt.program import first_difference


def program_files(program, records) -> dict[str, str | bytes]:
    """Relative path -> contents of every file except the manifest."""
    from ratrain.codegen.program_dir import code_files
    from ratrain.passes.periodic_program import describe_periods
    periodic = "".join(f"{line}\n" for line in describe_periods(program))
    files = {f"passes/{i:02d}_{r.name}.txt": f"# after: {r.name}\n{periodic}{r.text}\n"
             for i, r in enumerate(records, 1)}
    stage_text = {s: "".join(f"{t}\n" for t in tasks) for s, tasks in program.tasks.items()}
    for rank in range(program.options.world_size):
        files[f"rank{rank}.txt"] = stage_text[program.coords(rank)[0]]
    files["memory.txt"] = program.memory.report() + "\n"
    header = (f"{HEADER}{program.graph.name}, pp {program.options.pp} x "
              f"dp {program.options.dp}, after pass lower. Do not edit; recompile.")
    return files | code_files(program, header)


def _stage_summary(program) -> list[dict]:
    plan = program.memory.stages
    return [{"stage": s, "layers": list(layers), "peak_bytes": plan[s].peak_bytes,
             "arena_bytes": plan[s].arena_bytes,
             "peak_breakdown": plan[s].timeline[plan[s].peak_task] if plan[s].timeline else {}}
            for s, layers in enumerate(program.stages)]


def build_manifest(program, records, profile: dict, hashes: dict[str, str],
                   hf_config: dict | None = None, machine: dict | None = None) -> dict:
    """program.json; `hf_config` is the model's config as read (read_hf_config), kept
    next to the filled-in one for the runtime's checkpoints; `machine` the machine it was
    compiled for (NOTE [recorded machine], hw/machine.py), `profile` that machine's."""
    from ratrain.program_format.runtime import FORMAT
    o = program.options
    model = {"name": program.graph.name, "config": program.graph.config}
    return {
        "format": FORMAT, "ratrain_version": ratrain_version(),
        "model": model | ({"hf_config": hf_config} if hf_config is not None else {}),
        "options": asdict(o), "hw": dict(profile), "machine": machine or {},
        "world_size": o.world_size,
        "ranks": {str(r): dict(zip(("stage", "replica"), program.coords(r)))
                  for r in range(o.world_size)},
        "stages": _stage_summary(program), "flops": step_flops(program, profile, (machine or {}).get("profile")),
        "periods": {str(s): asdict(p) for s, p in sorted((program.periods or {}).items())},
        "passes": [{"name": r.name} for r in records],
        "files": hashes}


def step_flops(program, profile: dict, identity: str | None = None) -> dict:
    """MFU's two terms (NOTE [model FLOPs and MFU] in rt/metrics.py): the model FLOPs of one
    step (every micro-batch of every replica) and the peak FLOP/s of all ranks for the
    program's precision (a rank's, as the simulator takes it, times the world size), and
    which profile that peak is of (`identity`: the --hw name or path it was read by)."""
    from ratrain.hw.identity import profile_label
    from ratrain.sim.kernels import peak_flops
    from ratrain.sim.simulate import rank_profile
    o = program.options
    rank_peak = peak_flops(rank_profile(profile, o.world_size), o.precision)
    return {"model_per_step": program.graph.micro_batch_flops() * o.micro_batches * o.dp,
            "peak": rank_peak * o.world_size, "peak_of": profile_label(profile, identity)}


def ratrain_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("ratrain")
    except PackageNotFoundError:
        return "unknown"


def compile_program_dir(out: Path, graph, options, profile: dict, hf_config: dict | None,
                        machine: dict, build: bool = False, expand: bool = False):
    """Compile `graph` with `options` for `profile` and write the program directory `out`
    (write_program_dir: atomically); (program, records). `machine` is the record of the
    machine compiled for (NOTE [recorded machine]). `ratrain compile` and `ratrain plan
    --measure` compile through here, so a measured row is the program `compile` writes."""
    program, records = compile_graph(graph, options, expand=expand, profile=profile)
    write_program_dir(out, program_files(program, records),
                      lambda hashes: build_manifest(program, records, profile, hashes,
                                                    hf_config, machine), build=build)
    return program, records


def is_program_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def check_output(out: Path, force: bool) -> None:
    """Refuse to replace anything but an empty directory or (with --force) a program."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return
    if out.is_dir() and is_program_dir(out):
        if not force:
            raise UserError(f"{out} already holds a compiled program; pass --force to "
                              "overwrite it")
        return
    raise UserError(f"{out} exists and is not a program directory (no {MANIFEST}); "
                      "refusing to overwrite it: choose another -o")


def write_program_dir(out: Path, files: dict[str, str], manifest_of, build=False) -> dict:
    """Write `files` and the manifest (`manifest_of(hashes)`) into a temporary sibling of
    `out`, then rename it into place: readers see the old DIR or the whole new one. With
    `build`, the generated modules are built into the user cache before."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        hashes = _write_files(staging, files)
        if build:
            _build_code({k: v for k, v in files.items() if k.endswith(".pyx")})
        manifest = manifest_of(hashes)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
        _swap_into_place(staging, out)
        record_verified(out)  # NOTE [tables are derived]
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _write_files(root: Path, files: dict[str, str | bytes]) -> dict[str, str]:
    hashes, by_text = {}, {}
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        path.write_bytes(data)
        key = id(content)  # replicas of a stage share one string: hash it once
        hashes[relative] = by_text.get(key) or by_text.setdefault(
            key, hashlib.sha256(data).hexdigest())
    return hashes


def _build_code(sources: dict[str, str]) -> None:
    """Build every distinct generated module into the user cache, two at a time: the
    program directory holds no built code (NOTE [a program directory is data])."""
    from ratrain.program_format.build import BuildError, CacheError, build_all
    try:
        build_all(sources.values())
    except CacheError as e:
        raise UserError(str(e)) from None
    except BuildError as e:
        raise UserError(f"the generated code did not build (a C compiler and the Python "
                          f"headers are needed): {str(e).splitlines()[-1]}") from None


def _swap_into_place(staging: Path, out: Path) -> None:
    from ratrain.atomic import replace_dir
    os.chmod(staging, 0o755)
    replace_dir(staging, out)


def read_manifest(directory: Path) -> dict:
    """The manifest of a program directory (rt/load.py's reader), or a UserError."""
    try:
        return _read_manifest(directory)
    except SetupError as e:
        raise UserError(str(e)) from None


def pass_file(directory: Path, manifest: dict, after: str | None) -> Path:
    """passes/NN_<name>.txt by pass name or number (1-based); the last pass by default."""
    names = [p["name"] for p in manifest["passes"]]
    if after is None:
        index = len(names)
    elif after.isdigit() and 1 <= int(after) <= len(names):
        index = int(after)
    elif after in names:
        index = names.index(after) + 1
    else:
        raise UserError(f"--after {after!r} names no pass of this program; passes: "
                          + ", ".join(f"{i} {n}" for i, n in enumerate(names, 1)))
    return directory / "passes" / f"{index:02d}_{names[index - 1]}.txt"


def rank_line(text: str, manifest: dict, rank: int) -> str:
    """The task-list line of `rank`'s stage in a pass's text, labelled with the rank."""
    if str(rank) not in manifest["ranks"]:
        raise UserError(f"--rank {rank} is out of range: the program has ranks "
                          f"0..{manifest['world_size'] - 1}")
    stage = manifest["ranks"][str(rank)]["stage"]
    for line in text.splitlines():
        if line.startswith(f"rank {stage}:"):
            return f"rank {rank}:" + line[len(f"rank {stage}:"):]
    raise UserError(f"this pass's output has no task lists yet (stage {stage} of rank "
                      f"{rank}); try a later --after")


def rank_lowered(text: str, manifest: dict, rank: int) -> str:
    """The lowered calls of `rank`'s stage in a pass's text (the block format_lowered
    writes, header relabelled with the rank), "" before the lower pass."""
    stage = manifest["ranks"][str(rank)]["stage"]
    blocks = re.split(r"^(?=# lowered program of stage \d+$)", text, flags=re.M)
    header = f"# lowered program of stage {stage}\n"
    block = next((b for b in blocks if b.startswith(header)), "")
    if not block:
        return ""
    calls = block[len(header):].rstrip("\n")
    return f"# lowered program of stage {stage} (rank {rank})\n{calls}\n"


# ---- a program directory is what its manifest compiles to ------------------------------

# NOTE [tables are derived]: the checks of NOTE [a program directory is data] (3) make a
# table safe to read; they cannot tell a table the compiler wrote from one edited to hold
# another value in range (a tag, an offset, a slot, a param its schema allows), which
# would train as another program. But every file of a program directory is a function of
# program.json's model config, options, recorded split (NOTE [a recorded split is kept])
# and profile (NOTE [identical recompiles]), so `ratrain run` and `ratrain evaluate`
# rebuild the directory from those in memory and refuse it, in one line naming the first
# file and line (or manifest field) that differs, unless it is byte for byte what they
# make (the manifest's ratrain_version aside): then no table holds a value the compiler
# would not write. The ranks cannot do this (they import no pass, NOTE [program format]);
# what they check is the tables' form and their agreement with each other.
# A rebuild costs one compile, so a directory this user's ratrain wrote, or rebuilt and
# a job ran to the end (not at the check: a start that fails writes nothing, see NOTE
# [a failed start is undone]), is recorded in the private build cache
# (build/verified/<sha256 of program.json>): program.json holds every file's sha256,
# which open_program checks, so its hash names the whole directory.
# --trust-program-code runs a directory as shipped, tables too.

def verified_dir() -> Path:
    """Where the checked directories are recorded: beside the modules built from them,
    in the user's private build cache (program_format/build.py)."""
    return user_cache() / "verified"


def _manifest_key(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


def record_verified(directory: Path) -> None:
    """Remember that this user's ratrain wrote or rebuilt `directory` as it is now; a
    cache that is not private (CacheError) or not writable only costs a later rebuild."""
    try:
        key = _manifest_key((directory / MANIFEST).read_bytes())
        private_dir(user_cache())
        (private_dir(verified_dir()) / key).touch()
    except (OSError, CacheError):
        pass


def _is_verified(directory: Path) -> bool:
    """Is `directory` as it is now recorded (record_verified)? Creates nothing; a record
    in a cache others may write counts for nothing."""
    try:
        key = _manifest_key((directory / MANIFEST).read_bytes())
        if not (verified_dir() / key).exists():
            return False
        check_owned(user_cache())
        check_owned(verified_dir())
        return True
    except (OSError, CacheError):
        return False


def rebuild_program_dir(manifest: dict) -> tuple[dict, dict]:
    """(relative path -> contents, manifest) of the directory `manifest` compiles to: its
    model, options and recorded split on its profile, whole or periodic as recorded.
    A process rebuilds one set of those inputs once (`ratrain plan --measure` checks
    several programs, a test many edits of one)."""
    inputs = {key: manifest.get(key) for key in ("model", "options", "stages", "hw",
                                                 "machine")}
    # key order kept: a config's order is part of what runtime.json writes
    return _rebuilt(json.dumps(inputs | {"periodic": bool(manifest.get("periods"))}))


@functools.lru_cache(maxsize=4)
def _rebuilt(inputs: str) -> tuple[dict, dict]:
    from contextlib import redirect_stderr
    from io import StringIO

    from ratrain.compiler import trace_for
    from ratrain.program_format.options import CompileOptions
    manifest = json.loads(inputs)
    options = CompileOptions.from_dict(manifest["options"])
    model = manifest["model"]
    graph = trace_for(model["config"], model["name"], options)
    stages = tuple(tuple(s["layers"]) for s in manifest["stages"])
    with redirect_stderr(StringIO()):  # a periodic compile's progress lines
        program, records = compile_graph(graph, options, expand=not manifest["periodic"],
                                         profile=manifest["hw"], stages=stages)
    files = program_files(program, records)
    hashes = {relative: hashlib.sha256(content.encode() if isinstance(content, str)
                                       else content).hexdigest()
              for relative, content in files.items()}
    rebuilt = build_manifest(program, records, manifest["hw"], hashes,
                             model.get("hf_config"), manifest.get("machine"))
    return files, json.loads(json.dumps(rebuilt))


def check_derived(directory: Path, manifest: dict) -> None:
    """See NOTE [tables are derived]: a UserError (one line) unless `directory`, opened and
    checked (rt/load.open_program), is what its manifest compiles to."""
    if _is_verified(directory):
        return
    how = ("recompile the program, or run it as shipped with --trust-program-code if you "
           "trust whoever wrote it")
    try:
        files, rebuilt = rebuild_program_dir(manifest)
    except Exception as e:  # an edited manifest can fail anywhere in the compiler
        first = (str(e).splitlines() or [""])[0][:200]
        raise UserError(f"{directory / MANIFEST} does not compile ({type(e).__name__}: "
                        f"{first}); {how}") from None
    for relative in sorted(files):
        if manifest["files"].get(relative) != rebuilt["files"][relative]:
            path = directory / relative
            raise UserError(f"{path} {_differs(path, files[relative])} what {MANIFEST}'s "
                            f"model, options and split compile to; {how}")
    for key in sorted(set(rebuilt) | set(manifest)):
        if key != "ratrain_version" and rebuilt.get(key) != manifest.get(key):
            raise UserError(f"{directory / MANIFEST}: {key} is not what its model, options "
                            f"and split compile to; {how}")
    if not _filled_from(manifest["model"]):
        raise UserError(f"{directory / MANIFEST}: model.hf_config is not the config "
                        f"model.config was filled in from; {how}")


def _filled_from(model: dict) -> bool:
    """Is the user's config as read (hf_config, which checkpoints write back as their
    config.json) the one the compiled config was filled in from (models/config.py)?"""
    from ratrain.models.config import fill_defaults
    if model.get("hf_config") is None:
        return True
    try:
        return fill_defaults(model["hf_config"]) == model["config"]
    except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError):
        return False


def _differs(path: Path, made) -> str:
    """How a shipped file differs from the rebuild's `made`: from which line."""
    try:
        shipped = path.read_text()
    except (OSError, UnicodeDecodeError):
        return "is missing or unreadable, unlike"
    made = made if isinstance(made, str) else made.decode(errors="replace")
    return f"differs at line {first_difference(shipped, made) or 1} from"
