"""The training options a run takes (steps, data, optimizer, learning-rate schedule, loss
scale, metrics), defined once: `python -m ratrain.rt`, `ratrain run` and `ratrain train`
add them from this table, and `forward_argv` turns parsed values back into flags for mpiexec.
Imports neither mpi4py nor jax, so the command line stays fast.
"""
from __future__ import annotations

import argparse
import math

from ratrain.optim import INITIAL_LOSS_SCALE, LOSS_SCALE_WINDOW, AdamW
from ratrain.rt.loggers import logger_list
from ratrain.rt.stop import CHECKPOINT

LR_SCHEDULES = ("cosine", "constant")


def lr_schedule_name(text: str) -> str:
    """The --lr-schedule argument type: one of LR_SCHEDULES."""
    if text not in LR_SCHEDULES:
        raise argparse.ArgumentTypeError(f"choose one of {', '.join(LR_SCHEDULES)}, "
                                         f"not {text!r}")
    return text


FLOAT32_MAX = 3.4028234663852886e38     # the loss scale is a float32 (GradScaler)

# flag, type (None = switch), default, help
TRAINING_OPTIONS = (
    ("--steps", int, 50, "training steps to run (default: 50)"),
    ("--data", str, None, "training text: a .txt file, a directory of .txt files (sorted, "
     "recursive), a .jsonl file (a \"text\" field per line), a .parquet file or a saved "
     "Hugging Face datasets directory (a \"text\" column; these two need pip install "
     "'ratrain[data]'), tokenized once into a cache next to it, with progress; or a .npy "
     "of integer token rows [N, seq-len + 1] (default: the installed Python standard "
     "library's sources as bytes, vocab 256)"),
    ("--text-field", str, None, "the field of a .jsonl line, or the column of a parquet or "
     "datasets table, that holds the text (default: text)"),
    ("--tokenizer", str, None, "directory holding the model's tokenizer.json for text data "
     "(default: the --resume checkpoint's, else the --init-from checkpoint's or `ratrain "
     "train --model DIR`'s, else UTF-8 bytes when the vocabulary has 256 or more ids)"),
    ("--eval-data", str, None, "held-out text or .npy rows (the --data formats): report the "
     "mean next-token loss over --eval-batches global batches of it, without training on "
     "it (default: none)"),
    ("--eval-every", int, 0, "with --eval-data, evaluate after every N steps as well as "
     "after the last one (default: 0 = after the last step only)"),
    ("--eval-batches", int, 4, "global batches of --eval-data per evaluation, its first "
     "rows in file order (default: 4, fewer if it has fewer rows)"),
    ("--no-shuffle", None, False, "take the rows in file order: step k uses rows "
     "[k*G, (k+1)*G), wrapping (default: a permutation seeded by --seed)"),
    ("--seed", int, 0, "seed of the initial weights and of the row order (default: 0)"),
    ("--init-from", str, None, "start from the weights of this Hugging Face checkpoint "
     "directory instead of a seeded initialisation"),
    ("--lr", float, 1e-3, "peak learning rate of AdamW (default: 1e-3)"),
    ("--lr-schedule", lr_schedule_name, "cosine", "cosine: linear warm-up over --warmup "
     "steps, then a cosine decay from --lr to --min-lr at the last step, as nanoGPT and "
     "LLaMA train; constant: linear warm-up, then --lr (earlier versions' only schedule) "
     "(default: cosine)"),
    ("--warmup", int, None, "linear warm-up steps from 0 to --lr (default: cosine: "
     "min(100, 10%% of --steps); constant: 0)"),
    ("--min-lr", float, None, "with --lr-schedule cosine, the learning rate of the last "
     "step (default: --lr / 10)"),
    ("--weight-decay", float, 0.1, "AdamW decoupled weight decay, applied only to parameters "
     "with 2 or more dimensions (default: 0.1)"),
    ("--beta1", float, 0.9, "AdamW first-moment decay (default: 0.9)"),
    ("--beta2", float, 0.95, "AdamW second-moment decay (default: 0.95)"),
    ("--eps", float, 1e-8, "AdamW epsilon added to sqrt(v) (default: 1e-8)"),
    ("--initial-loss-scale", float, INITIAL_LOSS_SCALE, "fp16 programs: the dynamic loss "
     "scale to start from; halved (and the step skipped) when a gradient overflows, doubled "
     "after --loss-scale-window finite steps in a row (default: 65536)"),
    ("--loss-scale-window", int, LOSS_SCALE_WINDOW, "fp16 programs: finite steps in a row "
     "before the loss scale doubles (default: 2000)"),
    ("--save-dir", str, None, "write checkpoints (HF safetensors + AdamW state) under this "
     "directory as step-NNNNNN/ (default: none; `ratrain train` uses RUN/checkpoints)"),
    ("--save-every", int, 0, "checkpoint every N steps as well as after the last one "
     "(default: 0 = after the last step only; needs --save-dir)"),
    ("--keep-last", int, 3, "keep only the K newest step-NNNNNN/ checkpoints under "
     "--save-dir, removing older ones after each save (default: 3; 0 = keep all)"),
    ("--resume", str, None, "continue from a checkpoint: its directory, a --save-dir or a "
     "`ratrain train` run directory (their newest step-NNNNNN/); weights, AdamW moments, "
     "step, loss scale, data order and tokenizer; --steps is the total to reach. `ratrain "
     "train --resume RUN` continues RUN in place with its recorded options"),
    ("--allow-data-change", None, False, "with --resume: continue even though the token "
     "stream or its order differs from the checkpoint's (other --data, another tokenizer, "
     "--seed or --no-shuffle); the run is then no longer the one it continues (default: "
     "refuse, naming the change)"),
    ("--progress-us", int, 1000, "while a kernel runs with messages or collectives in flight, "
     "a helper thread lets MPI move them every N microseconds (transports such as TCP move "
     "bytes only inside MPI calls); 0 = only between kernels (default: 1000)"),
    ("--trace", str, None, "write every rank's measured task timeline to "
     "DIR/trace-rank<R>.json (Chrome trace format; open in Perfetto) (default: none)"),
    ("--trust-program-code", None, False, "build and run the program directory's own "
     "code/*.pyx as shipped, even where it differs from the code its tables make, or the "
     "program predates format 10; only for a directory whose author you trust (default: "
     "refuse such a program: NOTE [a program directory is data])"),
    ("--metrics", str, None, "append one JSON line per step (step, loss, tokens/s, grad "
     "norm, loss scale, skipped, arena bytes and RSS per rank) to this file (default: none)"),
    ("--log-every", int, 1, "print the progress line every N steps (and at the job's "
     "first step, the last, and each evaluation); --metrics still gets every step "
     "(default: 1)"),
    ("--log-to", logger_list, None, "also log each step's loss, eval loss, lr, tokens/s, "
     "grad norm and MFU to: tensorboard (event files in a tensorboard/ folder beside "
     "--metrics; needs tensorboardX or torch), wandb (a W&B run in wandb/ beside it, "
     "offline unless WANDB_MODE says otherwise; needs wandb), or both, comma-separated "
     "(default: none)"),
)

# The options `ratrain train` was given, recorded in its run directory when the run starts:
# `ratrain train --resume RUN` continues with them (NOTE [a run directory is the unit of
# work] in cli/resume.py), and a stopped run's hint names that command.
RUN_RECORD = "train_options.json"

METAVARS = {"--steps": "N", "--data": "FILE", "--text-field": "NAME", "--tokenizer": "DIR", "--eval-data": "FILE",
            "--eval-every": "N", "--eval-batches": "K", "--seed": "S", "--init-from": "DIR",
            "--lr": "LR", "--lr-schedule": "NAME", "--warmup": "N", "--min-lr": "LR",
            "--weight-decay": "W", "--beta1": "B1", "--beta2": "B2", "--eps": "EPS",
            "--metrics": "FILE", "--initial-loss-scale": "S", "--loss-scale-window": "N",
            "--save-dir": "DIR", "--save-every": "N", "--keep-last": "K", "--resume": "DIR",
            "--progress-us": "N", "--trace": "DIR", "--log-every": "N",
            "--log-to": "LOGGERS"}


def add_training_options(parser, skip: tuple = (), only: tuple | None = None,
                         helps: dict | None = None) -> None:
    """The TRAINING_OPTIONS but `skip`, or only those in `only`: `ratrain eval` and
    `ratrain generate` take a few, with `helps` (flag -> help) saying what they mean there."""
    for flag, kind, default, text in TRAINING_OPTIONS:
        if flag in skip or only is not None and flag not in only:
            continue
        text = (helps or {}).get(flag, text)
        if kind is None:
            parser.add_argument(flag, action="store_true", help=text)
        else:
            parser.add_argument(flag, type=kind, default=default, help=text,
                                metavar=METAVARS[flag])


def option_dest(flag: str) -> str:
    """The attribute argparse stores a flag's value under: --eval-data -> eval_data."""
    return flag.lstrip("-").replace("-", "_")


def forward_argv(args) -> list[str]:
    """The training options of parsed `args` as flags (only those not at their default)."""
    argv = []
    for flag, kind, default, _ in TRAINING_OPTIONS:
        value = getattr(args, option_dest(flag), default)
        if value != default:
            argv += [flag] if kind is None else [flag, str(value)]
    return argv


def resume_argv(args) -> list[str]:
    """--resume CHECKPOINT (rt/stop.py's placeholder) and the other training options of
    `args` as flags: what a command that continues this run passes."""
    return ["--resume", CHECKPOINT,
            *forward_argv(argparse.Namespace(**{**vars(args), "resume": None}))]


def check_run_length(args, save_dir_given: bool = True) -> str | None:
    """What is wrong with --steps, --save-every, --keep-last or the learning-rate schedule
    (check_lr_schedule), if anything (one line).
    `save_dir_given`: False where a default --save-dir is filled in later (`ratrain train`)."""
    if args.steps < 1:
        return f"--steps must be at least 1, got {args.steps}"
    if args.save_every < 0 or args.keep_last < 0:
        flag, value = ("--save-every", args.save_every) if args.save_every < 0 else \
            ("--keep-last", args.keep_last)
        return f"{flag} must be 0 or a positive number, got {value}"
    if args.save_every and save_dir_given and not args.save_dir:
        return (f"--save-every {args.save_every} needs --save-dir DIR to write the "
                "checkpoints to")
    return check_lr_schedule(args)


# NOTE [default learning-rate schedule]: as nanoGPT and the LLaMA papers train, the
# default is a linear warm-up from 0 to --lr, then a cosine down to --min-lr = --lr / 10
# at the last step (Chinchilla's 10x decay; torchtitan also warms up linearly and decays
# after). nanoGPT warms up 2,000 of 600,000 steps and torchtitan 200: short runs warm up
# 10% of --steps, long runs 100 steps. Warm-up and decay are functions of the total
# --steps, so a resumed run (whose --steps is the total to reach) gets the same rates as
# an uninterrupted one; a run resumed with a larger --steps than it started with follows
# the new total's cosine from there on. `--lr-schedule constant` is the schedule of
# earlier versions: --lr from the first step (after --warmup steps, if given).


def warmup_steps(args) -> int:
    """--warmup, or the schedule's default (NOTE [default learning-rate schedule])."""
    if args.warmup is not None:
        return args.warmup
    return min(100, args.steps // 10) if args.lr_schedule == "cosine" else 0


def check_lr_schedule(args) -> str | None:
    """What is wrong with --lr-schedule, --warmup, --min-lr or the AdamW numbers, if
    anything (one line)."""
    if args.warmup is not None and args.warmup < 0:
        return f"--warmup must be 0 or a positive number of steps, got {args.warmup}"
    if args.warmup is not None and args.warmup > args.steps:
        return (f"--warmup {args.warmup} is longer than --steps {args.steps}: the learning "
                f"rate would never reach --lr; pass --warmup {args.steps} or less")
    if args.min_lr is not None and args.lr_schedule == "constant":
        return "--min-lr ends a cosine decay: drop it, or --lr-schedule constant"
    return check_optimizer_numbers(args)


# flag, whether a value is in range, what the range is (the defaults are the help's)
OPTIMIZER_RANGES = (
    ("--lr", lambda v: v > 0, "a positive learning rate, e.g. 1e-3 (the default)"),
    ("--min-lr", lambda v: v >= 0, "0 or a positive learning rate below --lr"),
    ("--beta1", lambda v: 0 <= v < 1, "in [0, 1), e.g. 0.9 (the default)"),
    ("--beta2", lambda v: 0 <= v < 1, "in [0, 1), e.g. 0.95 (the default)"),
    ("--eps", lambda v: v > 0, "a positive number, e.g. 1e-8 (the default)"),
    ("--weight-decay", lambda v: v >= 0, "0 or a positive number, e.g. 0.1 (the default)"),
)


def check_optimizer_numbers(args) -> str | None:
    """The first of --lr, --min-lr, --beta1, --beta2, --eps, --weight-decay out of its
    range (OPTIMIZER_RANGES; NaN and infinity never are in it), or --min-lr above --lr."""
    for flag, in_range, what in OPTIMIZER_RANGES:
        value = getattr(args, option_dest(flag))
        if value is not None and not (math.isfinite(value) and in_range(value)):
            return f"{flag} must be {what}; got {value:g}"
    if args.min_lr is not None and args.min_lr > args.lr:
        return (f"--min-lr {args.min_lr:g} is above --lr {args.lr:g}: the cosine decays from "
                f"--lr down to --min-lr; pass a --min-lr of at most {args.lr:g}")
    return None


def check_run_numbers(args) -> str | None:
    """What is wrong with --progress-us, --initial-loss-scale or --loss-scale-window, if
    anything (one line): checked by `ratrain train`/`run` before anything is written, and
    by the ranks at set-up."""
    if args.progress_us < 0:
        return (f"--progress-us must be 0 (off) or a positive number of microseconds, got "
                f"{args.progress_us}")
    if not 0 < args.initial_loss_scale <= FLOAT32_MAX:
        return (f"--initial-loss-scale must be positive and at most 3.4e38 (a float32), got "
                f"{args.initial_loss_scale:g}")
    if args.loss_scale_window < 1:
        return f"--loss-scale-window must be at least 1, got {args.loss_scale_window}"
    if args.log_every < 1:
        return f"--log-every must be a positive number of steps, got {args.log_every}"
    return None


def learning_rate(args, step: int) -> float:
    """lr of 1-based `step`: linear warm-up, then constant or cosine down to --min-lr
    (NOTE [default learning-rate schedule])."""
    warmup = warmup_steps(args)
    if step <= warmup:
        return args.lr * step / warmup
    if args.lr_schedule == "constant" or args.steps <= warmup:
        return args.lr
    min_lr = args.lr / 10 if args.min_lr is None else args.min_lr
    progress = (step - warmup) / max(1, args.steps - warmup)
    return min_lr + 0.5 * (args.lr - min_lr) * (1 + math.cos(math.pi * progress))


def schedule_change(args, old_steps: int, step: int) -> str | None:
    """The line a run resumed after `step` prints when its --steps is no longer the
    `old_steps` its schedule ran to: how the learning rate moves (see NOTE [default
    learning-rate schedule]: warm-up and cosine are functions of --steps); None when it
    does not move."""
    old = argparse.Namespace(**{**vars(args), "steps": old_steps})
    before, now = learning_rate(old, max(step, 1)), learning_rate(args, step + 1)
    would = learning_rate(old, step + 1) if step < old_steps else None
    if old_steps == args.steps or now == (before if would is None else would):
        return None
    line = (f"--steps {args.steps} moves the learning-rate schedule, which ran to step "
            f"{old_steps}: step {step + 1} trains at lr {now:.3g}")
    line += f" (step {step} trained at {before:.3g}" + (
        f"; with --steps {old_steps} it would train at {would:.3g})" if would is not None
        else ")")
    return line + f", then {args.lr_schedule} to step {args.steps}"


def optimizer_at(args, step: int) -> AdamW:
    return AdamW(lr=learning_rate(args, step), beta1=args.beta1, beta2=args.beta2,
                 eps=args.eps, weight_decay=args.weight_decay)
