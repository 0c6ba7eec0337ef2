"""The experiment loggers people already use, fed by rank 0 beside metrics.jsonl
(`--log-to tensorboard,wandb`): each step's scalars go to TensorBoard event files
(tensorboardX, else torch.utils.tensorboard) and to a Weights & Biases run. Optional
extras: a logger's library is imported only when asked for, and checked before the job
starts, so a rank that logs nowhere imports nothing more.
"""
from __future__ import annotations

import argparse
import importlib.util
import os

LOGGERS = ("tensorboard", "wandb")

# where each logger writes, beside --metrics (the run directory for `ratrain train`)
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"


def logger_list(text: str) -> str:
    """The --log-to argument type: a comma-separated list of LOGGERS (kept as text, so
    it forwards to the ranks and records as given)."""
    names = logger_names(text)
    if any(n not in LOGGERS for n in names) or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(LOGGERS)} (comma-"
                                         f"separated), not {text!r}")
    return ",".join(names)


def logger_names(text: str | None) -> tuple[str, ...]:
    """The loggers a --log-to value names (none for None)."""
    return tuple(n for n in (text or "").split(",") if n)


# NOTE [optional loggers]: TensorBoard and W&B are extras (`pip install
# "ratrain[tensorboard]"`, `"ratrain[wandb]"`), so a run that asks for one without its
# library is refused before anything is compiled or written, naming the pip command.
# TensorBoard takes tensorboardX where installed, else torch.utils.tensorboard (the same
# event files). W&B logs offline unless WANDB_MODE says otherwise: a run needs no
# network or login, and `wandb sync RUN/wandb/offline-run-*` uploads it later.
# Every logged scalar is a metrics.jsonl field of the step (LOGGED_FIELDS).

LOGGED_FIELDS = ("loss", "eval_loss", "lr", "tokens_per_s", "grad_norm", "loss_scale",
                 "mfu", "step_seconds")
# logger: (the module sets that can serve it, each set wholly installed; its extra)
EXTRAS = {"tensorboard": ((("tensorboardX",), ("torch", "tensorboard")), "tensorboard"),
          "wandb": ((("wandb",),), "wandb")}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing
        return False


def loggers_problem(log_to: str | None, metrics: str | None) -> str | None:
    """Why --log-to cannot run (a library missing, no --metrics to write beside), as one
    line; None if it can (NOTE [optional loggers])."""
    names = logger_names(log_to)
    for name in names:
        choices, extra = EXTRAS[name]
        if not any(all(_installed(m) for m in modules) for modules in choices):
            needs = " or ".join(" with ".join(modules) for modules in choices)
            return (f"--log-to {name} needs {needs}: pip install \"ratrain[{extra}]\" (or "
                    f"leave --log-to {name} out)")
    if names and not metrics:
        return f"--log-to {','.join(names)} writes beside --metrics: pass --metrics FILE"
    return None


class TensorBoardLog:
    """Scalars of every step into event files under DIR (tensorboardX's SummaryWriter,
    else torch's: the same format)."""

    def __init__(self, folder: str):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            from torch.utils.tensorboard import SummaryWriter
        self.folder, self.writer = folder, SummaryWriter(folder)

    def write(self, step: int, scalars: dict) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(f"train/{name}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLog:
    """A W&B run in DIR, offline unless WANDB_MODE says otherwise (NOTE [optional
    loggers]), named after the run directory."""

    def __init__(self, folder: str, name: str, config: dict):
        import wandb
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.run = wandb.init(dir=folder, name=name, config=config, project="ratrain",
                              mode=os.environ.get("WANDB_MODE", "offline"))

    def write(self, step: int, scalars: dict) -> None:
        self.run.log({f"train/{k}": v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


def open_loggers(log_to: str | None, metrics: str, options: dict) -> list:
    """The loggers --log-to names, writing beside the --metrics file (none without
    --log-to: a run with neither has nothing to place them beside)."""
    names = logger_names(log_to)
    if not names:
        return []
    beside = os.path.dirname(os.path.abspath(metrics))
    made = []
    for name in names:
        if name == "tensorboard":
            made.append(TensorBoardLog(os.path.join(beside, TENSORBOARD_DIR)))
        else:
            made.append(WandbLog(os.path.join(beside, WANDB_DIR),
                                 os.path.basename(beside), options))
    return made


def logged_scalars(record: dict) -> dict:
    """The step's LOGGED_FIELDS that it has (numbers only)."""
    return {k: float(record[k]) for k in LOGGED_FIELDS
            if isinstance(record.get(k), (int, float)) and not isinstance(record[k], bool)}
