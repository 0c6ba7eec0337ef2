"""What a run starts from, checked by `ratrain train` and `ratrain run` before anything is
compiled, tokenized or written; and `ratrain train --resume RUN`, which continues a run
directory in place with the options recorded when it started (RUN/train_options.json).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ratrain.errors import UserError
from ratrain.rt.train_options import RUN_RECORD, TRAINING_OPTIONS, option_dest

# NOTE [a run directory is the unit of work]: `ratrain train` records the training options
# it was given in RUN/train_options.json next to RUN/program (NOTE [a run directory is
# self-contained] for its paths). `ratrain train --resume RUN` reads them back, takes
# from the command line only the options given again, reuses RUN/program (the layout and
# model flags cannot change: they are compiled in), continues from the newest checkpoint
# under the recorded --save-dir, drops the metrics records of steps after that checkpoint
# (they are trained again) and appends to the same metrics file. Without a checkpoint
# yet, the run starts again from its start. The checkpoint's trainer state names its
# token stream and row order; a resume that would change them is refused (NOTE [token
# stream identity] in rt/data.py) unless --allow-data-change is given. The record is
# rewritten with the merged options, so a later resume without flags continues the same
# way (a larger --steps stays larger).

# NOTE [a run directory is self-contained]: a path the record holds that lies inside RUN
# (RUN/checkpoints, RUN/metrics.jsonl, a --trace under RUN) is written relative to RUN and
# read back against wherever RUN is now; any other path (the user's --data, --init-from,
# --tokenizer) is written absolute, so a resume from another working directory finds it.
# So `cp -r RUN COPY; ratrain train --resume COPY` continues COPY from its own newest
# checkpoint and writes only into COPY, and a moved RUN resumes from its own checkpoint.
# Records written before this rule hold every path absolute. Where such a record's
# --save-dir and --metrics are OLD/checkpoints and OLD/metrics.jsonl (what `ratrain train`
# gives every run), OLD is where the run was written, and its paths under OLD are read
# under RUN (_written_in); other absolute paths are read as they are.

PATH_OPTIONS = ("data", "eval_data", "tokenizer", "init_from", "resume", "save_dir",
                "metrics", "trace")
# the flags of `ratrain train` that are compiled into RUN/program
PROGRAM_OPTIONS = ("model", "seq_len", "global_batch", "micro_batches", "pp", "dp", "zero",
                   "zero3_prefetch", "schedule", "recompute", "budget", "precision", "clip",
                   "update_rule", "pipeline_schedule")
ONCE_OPTIONS = ("allow_data_change",)   # apply to the command that names them, not recorded


# ---- checks before anything is written -------------------------------------------------------

def check_start(args, config: dict) -> None:
    """The checkpoint the run starts from (files, config and shapes, read from headers)
    and, when resuming, that the token stream and row order are the checkpoint's; a
    UserError otherwise. Requires args.resume resolved to a checkpoint directory. Fills in
    the checkpoint's --seed and --no-shuffle where the command line does not give them,
    so the flags forwarded to the ranks say what the run does."""
    from ratrain.rt.data import DataError, text_settings, token_stream_identity
    from ratrain.rt.start import checkpoints_problem, resume_problem
    problem = checkpoints_problem(args, config)
    state = _trainer_state(args.resume) if args.resume and problem is None else {}
    problem = problem or _order_problem(args, state)
    if problem is None:
        try:
            stream = token_stream_identity(args.data, text_settings(args, config, build=False))
        except DataError as e:
            raise UserError(str(e)) from None
        problem = resume_problem(args, state, stream)
    if problem is not None:
        raise UserError(problem)
    given = getattr(args, "given", frozenset())
    if state and "seed" not in given:
        args.seed = state.get("seed", args.seed)
    if state and "no_shuffle" not in given:
        args.no_shuffle = not state.get("shuffle", not args.no_shuffle)


def _trainer_state(checkpoint: str) -> dict:
    from ratrain.rt.checkpoint import STATE_FILE
    return json.loads((Path(checkpoint) / STATE_FILE).read_text())


def _order_problem(args, state: dict) -> str | None:
    """A --seed or --no-shuffle given again that would reorder a resumed run's rows."""
    if not state or args.allow_data_change or not state.get("shuffle", False):
        return None
    given = getattr(args, "given", frozenset())
    change = "--no-shuffle" if "no_shuffle" in given and args.no_shuffle else \
        f"--seed {args.seed}" if "seed" in given and args.seed != state.get("seed") else None
    if change is None:
        return None
    return (f"--resume {args.resume} shuffled its rows with --seed {state.get('seed')}; "
            f"{change} would take other rows from here: leave it out, or pass "
            "--allow-data-change")


# ---- the run record -------------------------------------------------------------------------

def write_run_record(run_dir: Path, args, start: dict | None = None) -> None:
    """RUN/train_options.json: every training option of `args` (paths inside RUN relative
    to it, others absolute: NOTE [a run directory is self-contained]), the model, and the
    --resume/--init-from the run started from (`start`, else args')."""
    options = {option_dest(flag): getattr(args, option_dest(flag))
               for flag, _, _, _ in TRAINING_OPTIONS}
    options = {k: v for k, v in options.items() if k not in ONCE_OPTIONS} | (start or {})
    options = {k: _recorded_path(v, run_dir) if k in PATH_OPTIONS and v else v
               for k, v in options.items()}
    model = getattr(args, "model", None)
    if model is not None and Path(model).exists():  # a preset's name stays its name
        model = _recorded_path(model, run_dir)
    record = {"model": model, "options": options}
    temp = run_dir / f".{RUN_RECORD}.{os.getpid()}.tmp"
    temp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(temp, run_dir / RUN_RECORD)


def _recorded_path(path: str, run_dir: Path) -> str:
    """`path` as the record holds it: relative to run_dir inside it, else absolute."""
    full, run = os.path.abspath(path), os.path.abspath(run_dir)
    return os.path.relpath(full, run) if os.path.commonpath([full, run]) == run else full


def _read_path(value, run_dir: Path, written_in: str | None = None):
    """A recorded path as this run uses it (NOTE [a run directory is self-contained]): a
    relative one is inside run_dir, where run_dir is now; an absolute one under the old
    record's `written_in` is moved under run_dir; any other as it is."""
    run = os.path.abspath(run_dir)
    if not value or not os.path.isabs(value):
        return os.path.join(run, value) if value else value
    if written_in is not None and os.path.commonpath([value, written_in]) == written_in:
        return os.path.join(run, os.path.relpath(value, written_in))
    return value


def _written_in(options: dict) -> str | None:
    """Where a record of absolute paths was written: OLD when its --save-dir and --metrics
    are OLD/checkpoints and OLD/metrics.jsonl, `ratrain train`'s own for OLD; else None."""
    save_dir, metrics = options.get("save_dir"), options.get("metrics")
    if not (isinstance(save_dir, str) and isinstance(metrics, str) and
            os.path.isabs(save_dir)):
        return None
    old = os.path.dirname(save_dir)
    same = os.path.basename(save_dir) == "checkpoints" and \
        metrics == os.path.join(old, "metrics.jsonl")
    return old if same else None


def run_of(path: str) -> Path | None:
    """The `ratrain train` run directory --resume PATH names: PATH, or the run holding the
    checkpoint PATH (RUN/checkpoints/step-N); None for anything else."""
    root = Path(path)
    for run in (root, root.parent.parent):
        if (run / RUN_RECORD).is_file() and (run / "program").is_dir():
            return run
    return None


def refuse_old_run_dir(path: str) -> None:
    """A run directory made before runs recorded their options cannot be resumed in place."""
    root = Path(path)
    if (root / "program").is_dir() and not (root / RUN_RECORD).is_file():
        raise UserError(f"--resume {path}: this run directory has no {RUN_RECORD} (it was "
                        f"made by an older ratrain); continue it with `ratrain run "
                        f"{root / 'program'} --resume {path}` and its --data, --tokenizer "
                        "and --steps")


# ---- ratrain train --resume RUN -------------------------------------------------------------

def resumed_args(args, run: Path) -> dict:
    """Fill `args` from RUN's record (NOTE [a run directory is the unit of work]): the
    options given again win; --resume becomes the checkpoint to continue from (the run's
    own start when it has none yet). Returns the record's start (--resume, --init-from)."""
    from ratrain.rt.checkpoint import find_resume_checkpoint, latest_checkpoint
    given = getattr(args, "given", frozenset())
    fixed = [d for d in PROGRAM_OPTIONS if d in given]
    if fixed:
        flag = "--" + fixed[0].replace("_", "-")
        raise UserError(f"{flag} cannot change when resuming {run}: its program is compiled "
                        f"with the model and layout it started with; leave {flag} out, or "
                        "start a new run with --out")
    try:
        record = json.loads((run / RUN_RECORD).read_text())["options"]
        written_in = _written_in(record)
        record = {k: _read_path(v, run, written_in) if k in PATH_OPTIONS else v
                  for k, v in record.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"cannot read {run / RUN_RECORD} ({e}); start a new run") from None
    named = Path(args.resume)
    for flag, _, default, _ in TRAINING_OPTIONS:
        dest = option_dest(flag)
        if dest not in given and dest not in ONCE_OPTIONS:
            setattr(args, dest, record.get(dest, default))
    saved_in = record.get("save_dir") or run / "checkpoints"  # where the run saved so far
    checkpoint = latest_checkpoint(saved_in) if named.resolve() == run.resolve() else \
        _checkpoint_named(find_resume_checkpoint, named)
    args.resume = str(checkpoint) if checkpoint is not None else record.get("resume")
    args.out = str(run)
    return {"resume": record.get("resume"), "init_from": record.get("init_from")}


def recorded_steps(run: Path) -> int | None:
    """The --steps RUN's record holds (the end its schedule ran to); None if unreadable
    (resumed_args says why)."""
    try:
        return int(json.loads((run / RUN_RECORD).read_text())["options"]["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _checkpoint_named(find, path: Path) -> Path:
    try:
        return find(str(path))
    except ValueError as e:
        raise UserError(str(e)) from None


def keep_metrics_until(metrics: Path, step: int) -> int:
    """Drop the records of steps after `step` from the metrics file (they are trained
    again), and a last line cut short; how many were dropped."""
    if not metrics.is_file():
        return 0
    lines = metrics.read_text().splitlines(keepends=True)
    kept = [line for line in lines if _record_step(line) <= step]
    if len(kept) != len(lines):
        temp = metrics.with_name(f".{metrics.name}.{os.getpid()}.tmp")
        temp.write_text("".join(kept))
        os.replace(temp, metrics)
    return len(lines) - len(kept)


def _record_step(line: str) -> float:
    """The step of a metrics line; infinite for a line cut short by a kill (dropped)."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")
