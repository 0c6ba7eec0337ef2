"""`ratrain compile` and `ratrain inspect DIR`: a model to a program directory and back.

compile traces the model, runs the pass PIPELINE (passes/pipeline.py) and writes DIR
atomically: program.json (manifest with sha256 of every file), passes/NN_<pass>.txt,
rank<R>.txt, memory.txt, and what the runtime runs: runtime.pkl and code/stage<N>.pyx
(generated Cython, built into build/ before DIR appears) with its task table
code/stage<N>.pkl and code/stage<N>.legend.txt (what each generated function's offsets
are). inspect reads those files; for pictures it recompiles from the
manifest's config and options (compiling is deterministic and fast).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

from ratrain.cli_plan import add_search_options, apply_plan
from ratrain.passes.buffers import CATEGORIES
from ratrain.passes.options import (GRAD_ACCUMULATION, PRECISIONS, RECOMPUTE_POLICIES, SCHEDULES,
                                    UPDATE_RULES)
from ratrain.passes.plan_memory import format_bytes

MANIFEST = "program.json"
SIZE_UNITS = {"": 1, "b": 1} | {f"{p}{s}": 1000 ** (i + 1) for i, p in enumerate("kmgt")
                                 for s in ("", "b")} \
    | {f"{p}i{s}": 1024 ** (i + 1) for i, p in enumerate("kmgt") for s in ("", "b")}
SIZE_HELP = ("decimal units are powers of 10 (KB/MB/GB/TB, or K/M/G/T: 20GB = 20 * 10^9 "
             "bytes, as in the MT-3000's '20 GB'); binary units need an i (KiB/MiB/GiB/TiB: "
             "20GiB = 20 * 2^30); a plain number is bytes")


def format_budget(nbytes: int) -> str:
    """Both readings of a budget: `20 GB (18.63 GiB)`."""
    scale, unit = next((s, u) for s, u in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"),
                                           (1, "B")) if nbytes >= s or u == "B")
    return f"{nbytes / scale:.4g} {unit} ({format_bytes(nbytes)})"


def _user_error(message: str) -> Exception:
    from ratrain.cli import UserError
    return UserError(message)


def parse_size(text: str) -> int:
    """Bytes of a size like `20GB` (10^9), `20GiB` (2^30), `1.5G`, `512MB`, `4096`."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*([a-z]*)\s*",
                         str(text), re.I)
    unit = match and match[3].lower()
    if not match or unit not in SIZE_UNITS:
        raise ValueError(f"cannot read size {text!r}: {SIZE_HELP}")
    nbytes = round(float(match[1] + (f"e{match[2]}" if match[2] else "")) * SIZE_UNITS[unit])
    if nbytes < 1:
        raise ValueError(f"size {text!r} must be at least one byte")
    return nbytes


def _size_arg(text: str) -> int:
    import argparse
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# ---- compiling ---------------------------------------------------------------------------

def resolve_options(args, config: dict, profile: dict):
    """CompileOptions from the flags, filling unset ones from the model and the profile."""
    from ratrain.passes.program import CompileOptions
    context = int(config.get("max_position_embeddings", 128))
    precision = args.precision or profile.get("default_precision", "fp32")
    zero = args.zero if args.zero is not None else (
        profile.get("default_zero", 0) if args.dp > 1 else 0)
    if args.clip is not None and not args.clip > 0:
        raise _user_error(f"--clip must be a positive gradient norm (got {args.clip})")
    from ratrain.models import check_sequence_length
    try:
        options = CompileOptions(
            pp=args.pp, dp=args.dp, micro_batches=args.micro_batches,
            micro_batch_size=args.micro_batch_size, seq_len=args.seq_len or min(128, context),
            schedule=args.schedule, recompute=args.recompute, zero=zero,
            budget=args.budget or int(profile["usable_memory"]), hw=profile["name"],
            precision=precision, clip=args.clip, grad_accum=args.grad_accum,
            zero3_prefetch=getattr(args, "zero3_prefetch", 1),
            update_rule=getattr(args, "update_rule", "commit"))
        check_sequence_length(config, options.seq_len)  # a sliding window is refused here
    except ValueError as e:
        raise _user_error(str(e)) from None
    return options


def trace_for(config: dict, name: str, options):
    """The TrainGraph the options ask for: fp16 programs trace in float16."""
    from ratrain.ir.train_graph import trace_model
    dtype = "float16" if options.precision == "fp16" else "float32"
    return trace_model(config, micro_batch_size=options.micro_batch_size,
                       seq_len=options.seq_len, dtype=dtype, name=name)


def compile_graph(graph, options, expand: bool = False):
    """Run the pass pipeline; (program, records). A long step compiles as a periodic
    program (NOTE [periodic programs]) unless `expand`; over-budget programs are user
    errors."""
    from ratrain.passes.partition_stages import PartitionError
    from ratrain.passes.plan_memory import MemoryBudgetError
    try:
        if not expand:
            found = _compile_periodic(graph, options)
            if found is not None:
                return found
        return _compile_instance(graph, options, None)
    except (PartitionError, MemoryBudgetError) as e:
        over_budget = isinstance(e, MemoryBudgetError) or e.peak > 0
        raise _user_error(f"the {options.schedule} program does not fit --budget "
                          f"{format_budget(options.budget)} per rank:\n{e}" if over_budget
                          else str(e)) from None


def _compile_instance(graph, options, micro_batches: int | None):
    from ratrain.passes.pipeline import run_pipeline
    from ratrain.passes.program import Program
    return run_pipeline(Program(graph, options, built_micro_batches=micro_batches))


def _compile_periodic(graph, options):
    """(periodic program, stage 0's instance's records), or None when the step is short
    or shows no period (the caller then compiles it whole)."""
    from ratrain.passes.periodic_program import find_periods, periodic_program, worth_it
    if not worth_it(options.micro_batches, options.pp):
        return None
    compiled = {}

    def instance(n: int):
        compiled[n] = _compile_instance(graph, options, n)
        return compiled[n][0]

    periods = find_periods(instance, options.micro_batches, options.pp,
                           lambda text: print(f"ratrain: {text}", file=sys.stderr, flush=True))
    if periods is None:
        print(f"ratrain: no repeating period found; compiling all {options.micro_batches} "
              "micro-batches", file=sys.stderr, flush=True)
        return None
    return periodic_program(periods), compiled[periods[0][1].instance][1]


def load_model(model: str) -> tuple[dict, str]:
    from ratrain import models
    try:
        return models.get_config(model), model
    except (ValueError, FileNotFoundError, OSError) as e:
        raise _user_error(str(e)) from None


def read_hf_config(model: str) -> dict | None:
    """The model's config dict as its file or preset holds it, before defaults are filled
    in: what checkpoints write back as config.json (NOTE [checkpoints transformers loads]
    in rt/run.py). None if it cannot be read (load_model reports why)."""
    from ratrain.models.config import _config_file
    try:
        with open(_config_file(model)) as f:
            raw = json.load(f)
    except (ValueError, OSError):
        return None
    return raw if isinstance(raw, dict) else None


def load_hw(name_or_path: str) -> dict:
    from ratrain.hw import ProfileError, load_profile
    try:
        return load_profile(name_or_path)
    except ProfileError as e:
        raise _user_error(str(e)) from None


# ---- the program directory ----------------------------------------------------------------

def program_files(program, records) -> dict[str, str | bytes]:
    """Relative path -> contents of every file except the manifest."""
    from ratrain.rt.program import code_files
    from ratrain.passes.periodic_program import describe_periods
    periodic = "".join(f"{line}\n" for line in describe_periods(program))
    files = {f"passes/{i:02d}_{r.name}.txt": f"# after: {r.name} ({r.seconds * 1e3:.1f} ms)\n"
             f"{periodic}{r.text}\n" for i, r in enumerate(records, 1)}
    stage_text = {s: "".join(f"{t}\n" for t in tasks) for s, tasks in program.tasks.items()}
    for rank in range(program.options.world_size):
        files[f"rank{rank}.txt"] = stage_text[program.coords(rank)[0]]
    files["memory.txt"] = program.memory.report() + "\n"
    header = (f"ratrain generated program: {program.graph.name}, pp {program.options.pp} x "
              f"dp {program.options.dp}, after pass lower. Do not edit; recompile.")
    return files | code_files(program, header)


def _stage_summary(program) -> list[dict]:
    plan = program.memory.stages
    return [{"stage": s, "layers": list(layers), "peak_bytes": plan[s].peak_bytes,
             "arena_bytes": plan[s].arena_bytes,
             "peak_breakdown": plan[s].timeline[plan[s].peak_task] if plan[s].timeline else {}}
            for s, layers in enumerate(program.stages)]


def build_manifest(program, records, profile: dict, hashes: dict[str, str],
                   hf_config: dict | None = None) -> dict:
    """program.json; `hf_config` is the model's config as read (read_hf_config), kept
    next to the filled-in one for the runtime's checkpoints."""
    from ratrain.rt.program import FORMAT, ratrain_version
    o = program.options
    model = {"name": program.graph.name, "config": program.graph.config}
    return {
        "format": FORMAT, "ratrain_version": ratrain_version(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": model | ({"hf_config": hf_config} if hf_config is not None else {}),
        "options": asdict(o), "hw": profile, "world_size": o.world_size,
        "ranks": {str(r): dict(zip(("stage", "replica"), program.coords(r)))
                  for r in range(o.world_size)},
        "stages": _stage_summary(program),
        "periods": {str(s): asdict(p) for s, p in sorted((program.periods or {}).items())},
        "passes": [{"name": r.name, "seconds": r.seconds} for r in records],
        "files": hashes}


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
            raise _user_error(f"{out} already holds a compiled program; pass --force to "
                              "overwrite it")
        return
    raise _user_error(f"{out} exists and is not a program directory (no {MANIFEST}); "
                      "refusing to overwrite it: choose another -o")


def write_program_dir(out: Path, files: dict[str, str], manifest_of, build=False) -> dict:
    """Write `files` and the manifest (`manifest_of(hashes)`) into a temporary sibling of
    `out`, then rename it into place: readers see the old DIR or the whole new one. With
    `build`, the generated modules are built in before."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        hashes = _write_files(staging, files)
        if build:
            _build_code(staging, {k: v for k, v in files.items() if k.endswith(".pyx")})
        manifest = manifest_of(hashes)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
        _swap_into_place(staging, out)
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


def _build_code(root: Path, sources: dict[str, str]) -> None:
    """Build every distinct generated module into root/build, two at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from ratrain.codegen.build import BuildError, build_module
    distinct = sorted(set(sources.values()))
    try:
        with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
            list(pool.map(lambda source: build_module(source, root), distinct))
    except BuildError as e:
        raise _user_error(f"the generated code did not build (a C compiler and the Python "
                          f"headers are needed): {str(e).splitlines()[-1]}") from None


def _swap_into_place(staging: Path, out: Path) -> None:
    from ratrain.atomic import replace_dir
    os.chmod(staging, 0o755)
    replace_dir(staging, out)


# ---- --report --------------------------------------------------------------------------------

def format_pass_times(records) -> list[str]:
    lines = ["pass times:"]
    lines += [f"  {i:02d} {r.name:<20} {r.seconds * 1e3:9.1f} ms" for i, r in enumerate(records, 1)]
    lines.append(f"  {'total':<23} {sum(r.seconds for r in records) * 1e3:9.1f} ms")
    return lines


def format_stage_memory(program) -> list[str]:
    """Per stage: peak, arena and the peak's bytes by category (as in memory.txt)."""
    header = f"  {'stage':>5} {'peak':>10} {'arena':>10} " + " ".join(f"{c:>11}" for c in CATEGORIES)
    lines = [f"peak memory per stage (budget {format_budget(program.options.budget)}):", header]
    for stage, m in sorted(program.memory.stages.items()):
        row = m.timeline[m.peak_task] if m.timeline else dict.fromkeys(CATEGORIES, 0)
        lines.append(f"  {stage:>5} {format_bytes(m.peak_bytes):>10} {format_bytes(m.arena_bytes):>10} "
                     + " ".join(f"{format_bytes(row[c]):>11}" for c in CATEGORIES))
    return lines


def simulate(program, profile: dict):
    """dry_run of the stage task lists with the profile's cost model (seconds); a
    periodic program's whole step, each repeated task costed as the one it repeats."""
    from ratrain.sim.costs import task_cost_model
    from ratrain.passes.dryrun import dry_run
    from ratrain.passes.periodic_program import expanded_schedule
    schedule, base = expanded_schedule(program)
    cost = task_cost_model(program, profile)
    return dry_run(schedule, lambda task: cost(base[task]))


def format_dry_run(program, profile: dict, result) -> list[str]:
    lines = [f"dry run on {profile['name']} ({'calibrated' if profile.get('calibrated') else 'uncalibrated'} "
             f"profile): step {result.makespan:.4g} s, bubble {result.bubble_fraction:.1%}",
             f"  {'stage':>5} {'busy s':>10} {'exposed tail s':>15}"]
    lines += [f"  {s:>5} {result.busy[s]:>10.4g} {result.exposed_tail.get(s, 0.0):>15.4g}"
              for s in sorted(result.timeline)]
    lines.append("  (dry run: each rank runs its tasks one after another, so a non-blocking "
                 "SYNC does not overlap compute here; the simulator models that)")
    return lines


def format_schedule_comparison(program, other, profile: dict, result) -> list[str]:
    """This program's peak and step time next to the other schedule's (or why it failed)."""
    mine = program.options.schedule
    lines = ["ratrain vs baseline (same configuration):"]
    runs = {mine: (program, result)}
    if isinstance(other, str):
        lines.append(f"  {_other_schedule(mine)}: does not fit: {other}")
    else:
        runs[other.options.schedule] = (other, simulate(other, profile))
    for schedule in ("ratrain", "baseline"):
        if schedule in runs:
            p, r = runs[schedule]
            lines.append(f"  {schedule:<9} peak {format_bytes(p.memory.peak_bytes)} (stage "
                         f"{p.memory.worst_stage}), arena {format_bytes(p.memory.arena_bytes)}, "
                         f"step {r.makespan:.4g} s, bubble {r.bubble_fraction:.1%}")
    return lines


def _other_schedule(schedule: str) -> str:
    return "baseline" if schedule == "ratrain" else "ratrain"


def compile_other_schedule(graph, options):
    """The same configuration under the other schedule, in memory, through plan_memory
    only (its peak is all the report needs); the error's first line if it does not fit."""
    from ratrain.passes.partition_stages import PartitionError
    from ratrain.passes.pipeline import PIPELINE, run_pipeline
    from ratrain.passes.plan_memory import MemoryBudgetError, plan_memory
    from ratrain.passes.program import Program
    other = Program(graph, replace(options, schedule=_other_schedule(options.schedule)))
    try:
        return run_pipeline(other, PIPELINE + [plan_memory], verify=False)[0]
    except (PartitionError, MemoryBudgetError) as e:
        return str(e).splitlines()[0]


def format_report(program, records, profile: dict, graph) -> str:
    result = simulate(program, profile)
    other = compile_other_schedule(graph, program.options)
    return "\n".join(format_pass_times(records) + format_stage_memory(program)
                     + format_dry_run(program, profile, result)
                     + format_schedule_comparison(program, other, profile, result))


# ---- the commands ----------------------------------------------------------------------------

def cmd_compile(args) -> None:
    config, name = load_model(args.model)
    profile = load_hw(args.hw)
    out = Path(args.output)
    check_output(out, args.force)
    apply_plan(args)
    options = resolve_options(args, config, profile)
    graph = trace_for(config, name, options)
    program, records = compile_graph(graph, options, expand=args.expand)
    files = program_files(program, records)
    hf_config = read_hf_config(args.model)
    write_program_dir(out, files, lambda hashes: build_manifest(program, records, profile,
                                                                hashes, hf_config),
                      build=args.build)
    o = options
    print(f"compiled {name} for {o.world_size} ranks (pp {o.pp} x dp {o.dp}), schedule "
          f"{o.schedule}, recompute {o.recompute}, zero {o.zero}, {o.precision} on {o.hw}: "
          f"peak {format_bytes(program.memory.peak_bytes)} per rank -> {out}")
    if args.report:
        print(format_report(program, records, profile, graph))


def read_manifest(directory: Path) -> dict:
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise _user_error(f"cannot read {directory / MANIFEST}: {e}") from None


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
        raise _user_error(f"--after {after!r} names no pass of this program; passes: "
                          + ", ".join(f"{i} {n}" for i, n in enumerate(names, 1)))
    return directory / "passes" / f"{index:02d}_{names[index - 1]}.txt"


def rank_line(text: str, manifest: dict, rank: int) -> str:
    """The task-list line of `rank`'s stage in a pass's text, labelled with the rank."""
    if str(rank) not in manifest["ranks"]:
        raise _user_error(f"--rank {rank} is out of range: the program has ranks "
                          f"0..{manifest['world_size'] - 1}")
    stage = manifest["ranks"][str(rank)]["stage"]
    for line in text.splitlines():
        if line.startswith(f"rank {stage}:"):
            return f"rank {rank}:" + line[len(f"rank {stage}:"):]
    raise _user_error(f"this pass's output has no task lists yet (stage {stage} of rank "
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


def recompile(manifest: dict, instance: int | None = None):
    """The Program a manifest describes, rebuilt from its model config and options: the
    whole step, or its instance of `instance` micro-batches."""
    from ratrain.passes.program import CompileOptions
    options = dict(manifest["options"])
    if options.get("stage_speeds") is not None:
        options["stage_speeds"] = tuple(options["stage_speeds"])
    options = CompileOptions(**options)
    graph = trace_for(manifest["model"]["config"], manifest["model"]["name"], options)
    if instance is not None:
        return _compile_instance(graph, options, instance)[0]
    return compile_graph(graph, options, expand=True)[0]


def cmd_inspect_program(args) -> None:
    directory = Path(args.model)
    manifest = read_manifest(directory)
    text = pass_file(directory, manifest, args.after).read_text()
    if args.rank is not None:
        text = (rank_line(text, manifest, args.rank) + "\n"
                + rank_lowered(text, manifest, args.rank))
    print(text, end="")
    if args.schedule_png or args.memory_png:
        instance = None
        if manifest.get("periods"):  # a step of M micro-batches would be a wall of bars
            instance = manifest["periods"]["0"]["instance"]
            print(f"(pictures of an instance of {instance} micro-batches: the step repeats "
                  "its period, NOTE [periodic programs])")
        write_pictures(recompile(manifest, instance), manifest["hw"], args)


def reject_program_options(args) -> None:
    """inspect MODEL: the program-only options would be silently ignored; refuse them."""
    given = [flag for flag, value in (("--after", args.after), ("--rank", args.rank),
             ("--schedule-png", args.schedule_png), ("--memory-png", args.memory_png))
             if value is not None]
    if given:
        raise _user_error(f"{', '.join(given)} need a program DIR written by `ratrain "
                          f"compile`; {args.model!r} has no {MANIFEST}")


def write_pictures(program, profile: dict, args) -> None:
    from ratrain.sim.costs import task_cost_model
    from ratrain.passes.plots import memory_png, schedule_png
    if args.schedule_png:
        bars = schedule_png(program, args.schedule_png, cost=task_cost_model(program, profile))
        print(f"wrote {args.schedule_png} ({bars} task bars, times from the {profile['name']} "
              "profile in seconds)")
    if args.memory_png:
        stages = memory_png(program, args.memory_png)
        print(f"wrote {args.memory_png} ({stages} stages)")


# ---- argument parsers --------------------------------------------------------------------------

def add_compile_parser(sub, model_help: str) -> None:
    p = sub.add_parser("compile", help="compile a model into a static per-rank training "
                       "program directory",
                       description="Trace MODEL, run the pass pipeline (partition, 1F1B, "
                       "recovery, gradient sync, update, prefetch, memory plan) and write a "
                       "program directory: program.json, passes/NN_<pass>.txt, rank<R>.txt, "
                       "memory.txt, and what the runtime runs: runtime.pkl and the generated "
                       f"code/stage<N>.pyx with its task table. Sizes: {SIZE_HELP}.")
    p.add_argument("model", help=f"the model: {model_help}")
    _add_parallel_options(p)
    _add_policy_options(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="program directory to write (atomically; see --force)")
    p.add_argument("--force", action="store_true",
                   help="replace DIR if it already holds a compiled program")
    p.add_argument("--build", action="store_true", help="also build the generated Cython "
                   "modules now (default: the first run builds what is missing; builds are "
                   "cached by content hash, so identical stages build once)")
    p.add_argument("--expand", action="store_true", help="compile every micro-batch of the "
                   "step into the program and its pass outputs; by default a long step (40 "
                   "micro-batches or more for 2 stages, 10 P + 8 from 4 stages) is written "
                   "as an instance of a few micro-batches with a period that repeats, "
                   "which runs the same calls")
    p.add_argument("--report", action="store_true", help="print pass times, per-stage peak "
                   "memory, a dry run on the --hw profile (bubble, exposed tail) and the "
                   "peaks of ratrain vs baseline scheduling")
    p.add_argument("--plan", action="store_true", help="let the planner choose --pp, --dp, "
                   "--micro-batches, --micro-batch-size, --zero and --recompute: the best row "
                   "of `ratrain plan` for --clusters and --global-batch (--seq-len then "
                   "defaults to the model's context, at most 2048, as in `ratrain plan`)")
    add_search_options(p, required=False)
    p.set_defaults(func=cmd_compile)


def _add_parallel_options(p) -> None:
    for flag, dest, meta, text in (
            ("--pp", "pp", "P", "pipeline stages (default: 1)"),
            ("--dp", "dp", "D", "data-parallel replicas of every stage (default: 1)"),
            ("--micro-batches", "micro_batches", "M", "micro-batches per step (default: 1)"),
            ("--micro-batch-size", "micro_batch_size", "B",
             "sequences per micro-batch (default: 1)")):
        p.add_argument(flag, dest=dest, type=int, default=1, metavar=meta, help=text)
    p.add_argument("--seq-len", type=int, default=None, metavar="T",
                   help="tokens per sequence (default: 128, or the model's context if smaller)")


def _add_policy_options(p) -> None:
    p.add_argument("--schedule", choices=SCHEDULES, default="ratrain", help="ratrain: "
                   "lifecycle scheduling (overlapped sync, forward-side recovery); baseline: "
                   "GPU-style 1F1B with everything at the step end (default: ratrain)")
    p.add_argument("--recompute", choices=RECOMPUTE_POLICIES, default="auto", help="activation"
                   " recovery: auto = the least recompute that fits --budget, run on the forward side "
                   "where that fits too, else in the backward (default: auto)")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None, help="ZeRO stage over "
                   "the DP group (default: the profile's default_zero when --dp > 1, else 0; "
                   "2 for mt3000, 0 for cpu); 3 also shards the views, gathered at each use")
    p.add_argument("--zero3-prefetch", type=int, default=1, metavar="K", help="--zero 3: "
                   "gather each layer view K uses ahead, in K + 1 view slots (0 = gather at "
                   "use, nothing overlapped) (default: 1)")
    p.add_argument("--budget", type=_size_arg, default=None, metavar="SIZE", help="usable "
                   "memory per rank, e.g. 20GB (= 20 * 10^9 bytes) or 18GiB (= 18 * 2^30) "
                   "(default: the profile's usable_memory)")
    p.add_argument("--hw", default="cpu", metavar="PROFILE", help="hardware profile: mt3000, "
                   "cpu or a path to a profile .json (default: cpu)")
    p.add_argument("--precision", choices=PRECISIONS, default=None, help="fp32 exact mode or "
                   "fp16 mixed precision (default: the profile's, fp16 on mt3000, fp32 on cpu)")
    p.add_argument("--grad-accum", choices=GRAD_ACCUMULATION, default="auto",
                   help="ZeRO-2 gradient accumulation: local (full gradient until the step's "
                   "sync), scatter (reduce-scatter every micro-batch, only a shard kept) or "
                   "auto (scatter only where local cannot fit the budget)")
    p.add_argument("--clip", type=float, default=None, metavar="X",
                   help="clip gradients to global norm X (default: no clipping)")
    add_update_rule_option(p)


def add_update_rule_option(p) -> None:
    """--update-rule, shared by compile and train (NOTE [commit rule])."""
    p.add_argument("--update-rule", choices=UPDATE_RULES, default="commit", help="with "
                   "--clip or fp16 loss scaling (a global norm): commit = each layer's AdamW "
                   "runs speculatively right after its gradient sync and the step's norm "
                   "commits it or rolls it back and redoes it exactly; after-norm = every "
                   "update waits for the norm. Same numbers either way; the baseline "
                   "schedule always uses after-norm (default: commit)")


def add_program_inspect_options(p) -> None:
    """Options of `ratrain inspect DIR` (a compiled program rather than a model)."""
    p.add_argument("--after", default=None, metavar="PASS", help="with a program DIR: show "
                   "the program after this pass, by name or number (default: the last)")
    p.add_argument("--rank", type=int, default=None, metavar="R",
                   help="with a program DIR: print only rank R's task list (and, after the "
                   "lower pass, its stage's lowered calls)")
    p.add_argument("--schedule-png", default=None, metavar="FILE", help="with a program DIR: "
                   "draw the schedule (dry-run times on the program's --hw profile) to FILE")
    p.add_argument("--memory-png", default=None, metavar="FILE",
                   help="with a program DIR: draw each stage's memory timeline to FILE")
