"""The inputs of `ratrain train`, checked before anything is written: the numbers, the
model, the run directory, and the default layout (pp, dp, micro-batches) for the machine's
core count. Every problem is a UserError naming the flags the user passed.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ratrain.errors import UserError
from ratrain.inputs import load_model
from ratrain.program_format.options import default_micro_batches
from ratrain.rt.threads import thread_environment
from ratrain.rt.train_options import RUN_RECORD

DEFAULT_GLOBAL_BATCH = 8


def check_layout_numbers(args) -> None:
    """The evaluation flags agree (the size flags are positive: their parser says so)."""
    from ratrain.rt.evaluate import check_eval_options
    try:
        check_eval_options(args)
    except ValueError as e:
        raise UserError(str(e)) from None


def model_source(args) -> tuple[str, str]:
    """(what, flag) the run's model is read from: --init-from's checkpoint, else --model."""
    return (args.init_from, "--init-from") if args.init_from else (args.model, "--model")


def load_checked_model(model: str, flag: str = "--model") -> tuple[dict, str]:
    """(config, name) of a model whose parameter shapes can be computed: a config.json
    that is wrong is reported as one line here, not as a traceback while tracing; a
    --init-from that is no checkpoint directory is named with its flag."""
    from ratrain import models
    if flag == "--init-from" and not (Path(model) / "config.json").is_file():
        reason = "is a file, not a checkpoint directory" if Path(model).is_file() else \
            "does not exist" if not Path(model).exists() else "has no config.json"
        raise UserError(f"--init-from {model} {reason}: pass a checkpoint directory holding "
                        "config.json and the weights (model.safetensors)")
    try:
        config, name = load_model(model)
        models.param_shapes(config)
    except KeyError as e:
        raise UserError(f"cannot read model {model}: its config has no {e}") from None
    except (ValueError, TypeError) as e:
        raise UserError(f"cannot read model {model}: {e}") from None
    return config, name


def check_context(config: dict, seq_len: int, allowed: bool) -> None:
    """A --seq-len longer than the model's context (max_position_embeddings) trains
    positions it never saw (and a RoPE scaled for that context): refused unless
    --allow-beyond-context says the user means it."""
    context = int(config["max_position_embeddings"])
    if seq_len > context and not allowed:
        raise UserError(f"--seq-len {seq_len} is longer than the model's context "
                        f"(max_position_embeddings {context}): pass --seq-len {context} or "
                        "less, or --allow-beyond-context to train past it")


def model_tokenizer(model: str) -> str | None:
    """The folder of a --model config (a directory, or a config.json's) when it holds a
    tokenizer.json: the model's own tokenizer, used as --init-from's is."""
    from ratrain.data.tokenizer import TOKENIZER_FILE
    path = Path(model)
    folder = path if path.is_dir() else path.parent if path.is_file() else None
    return str(folder) if folder is not None and (folder / TOKENIZER_FILE).is_file() else None


# NOTE [a tokenizer needs --data]: the built-in corpus is UTF-8 bytes. A new run whose
# model directory holds a tokenizer.json (`--model DIR`), or that names one with
# --tokenizer, but gives no --data, would train on byte ids and then save that tokenizer
# beside weights that never saw its ids: a checkpoint that decodes to garbage in
# transformers. Such a start is refused in one line that says to pass --data. (--init-from
# DIR alone still trains on bytes, its tokenizer carried as before: its weights are the
# point there, and its tests train byte-vocabulary checkpoints that way.)

def check_tokenizer_has_data(args, model_tokenizer: str | None) -> None:
    """NOTE [a tokenizer needs --data]; `model_tokenizer` is --model DIR's folder when
    it holds a tokenizer.json."""
    if args.data is not None or args.resume:
        return
    if args.tokenizer is not None and args.tokenizer == model_tokenizer:
        raise UserError(f"--model {args.model} has its own tokenizer "
                        f"({Path(model_tokenizer) / 'tokenizer.json'}), but without --data "
                        "the run would train on the built-in corpus as UTF-8 bytes: pass "
                        "--data FILE with the text to train on")
    if args.tokenizer is not None:
        raise UserError(f"--tokenizer {args.tokenizer} tokenizes --data text, and no --data "
                        "was given: pass --data FILE, or leave out --tokenizer to train on "
                        "the built-in corpus as bytes")


# NOTE [a model directory's weights]: `ratrain train --model DIR` where DIR holds weights
# (model.safetensors, or model.safetensors.index.json and its shards: a directory saved
# by transformers, or a ratrain checkpoint) starts from them, as --init-from DIR does. A
# run that read DIR's config.json and tokenizer but silently started from a seeded
# initialisation beside its weights trained another model than the user named (its
# first loss ln(vocab) where the weights gave 2.2). The run says where it starts in one
# line; --from-scratch takes the seeded initialisation instead. A preset, a
# config.json path and a directory without weights name a config only; --init-from and
# --resume name their own weights, and win.

def check_from_scratch(args) -> None:
    """--from-scratch is a start of its own: not with --init-from or --resume."""
    if args.from_scratch and (args.init_from or args.resume):
        flag = "--init-from" if args.init_from else "--resume"
        raise UserError(f"--from-scratch and {flag} name different starts: leave one out")


def take_model_weights(args, config: dict) -> bool:
    """Start from --model DIR's weights when it holds them (NOTE [a model directory's
    weights]), checked first (NOTE [checking a weights file]): args.init_from becomes
    DIR. Whether it did."""
    from ratrain.models.checkpoint import has_weights
    from ratrain.rt.checkpoint import checkpoint_problem
    if args.resume or args.from_scratch or args.init_from or not has_weights(args.model):
        return False
    if (problem := checkpoint_problem(args.model, config, "--model")) is not None:
        raise UserError(problem)
    args.init_from = args.model
    return True


def weights_line(checkpoint: str, config: dict) -> str:
    """`initialized from DIR (model.safetensors, 1.2M parameters)`, of a checkpoint
    checkpoint_problem has checked."""
    from ratrain import models
    from ratrain.models.checkpoint import weights_files
    from ratrain.units import format_count
    files = weights_files(checkpoint)
    count = sum(math.prod(shape) for shape in models.param_shapes(config).values())
    where = files[0] if len(files) == 1 else f"{len(files)} shards"
    return f"initialized from {checkpoint} ({where}, {format_count(count)} parameters)"


# ---- the run directory ------------------------------------------------------------------------

def new_run_dir(out: str | None) -> Path:
    """--out, else runs/<timestamp> (made unique)."""
    if out is not None:
        return Path(out)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir, n = Path("runs") / stamp, 1
    while run_dir.exists():
        run_dir, n = Path("runs") / f"{stamp}-{n}", n + 1
    return run_dir


def check_run_dir(out: str | None) -> Path:
    """The run directory, once it is known that it can be created there: a probe directory
    is made and removed in its nearest existing ancestor, so nothing is left behind."""
    run_dir = new_run_dir(out)
    where = f"--out {out}" if out is not None else f"run directory {run_dir}"
    if (run_dir / "program").exists():
        resume = f"continue it with `ratrain train --resume {run_dir}`, or " \
            if (run_dir / RUN_RECORD).is_file() else ""
        raise UserError(f"{run_dir} already holds a run; {resume}choose another --out")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{where} is a file, not a directory; choose another --out")
    ancestor = next(p for p in (run_dir.absolute(), *run_dir.absolute().parents)
                    if p.exists())
    if not ancestor.is_dir():
        raise UserError(f"{where}: {ancestor} is a file, not a directory; choose another "
                          "--out")
    try:
        Path(tempfile.mkdtemp(prefix=".ratrain-probe-", dir=ancestor)).rmdir()
    except OSError as e:
        raise UserError(f"cannot create {where}: {e.strerror or e} in {ancestor}; choose "
                          "another --out") from None
    return run_dir


# ---- the layout -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    pp: int                     # pipeline stages
    dp: int                     # data-parallel replicas
    micro_batches: int          # per step and replica
    micro_batch_size: int       # sequences per micro-batch

    @property
    def ranks(self) -> int:
        return self.pp * self.dp

    def rank_threads(self, cores: int, environ) -> int:
        """Threads each rank will run on: its share of `cores` (NOTE [threads per rank]),
        or the OMP_NUM_THREADS `environ` exports."""
        shares = thread_environment({**environ, "MPI_LOCALNRANKS": str(self.ranks)}, cores)
        return int(shares["OMP_NUM_THREADS"])

    def cores_note(self, cores: int, threads: int) -> str:
        """How the ranks use the cores, for the printed line."""
        text = (f"; {self.ranks} rank{'s' * (self.ranks > 1)} x {threads} "
                f"thread{'s' * (threads > 1)}")
        used = self.ranks * threads
        if used == cores:
            return f"{text} = all {cores} cores"
        if used < cores:
            return f"{text} = {used} of {cores} cores (NOTE [threads per rank])"
        return f"{text} on {cores} cores: oversubscribed, slower than fewer --pp x --dp"


def resolve_layout(pp: int | None, dp: int | None, micro_batches: int | None,
                   global_batch: int | None, cores: int, max_pp: int) -> Layout:
    """The layout of a train run (NOTE [default layout]); None = not given. `max_pp` is
    the model's layer count (embedding + decoders + head), partition_stages' limit."""
    if pp is not None and pp > max_pp:
        raise UserError(f"--pp {pp} is more stages than the model has layers ({max_pp}, "
                          f"with the embedding and the head): use --pp <= {max_pp}")
    batch = global_batch or DEFAULT_GLOBAL_BATCH
    if pp is None:
        pp = 2 if max_pp >= 2 and cores >= 2 * (dp or 1) else 1
    if dp is None:
        dp = _default_dp(pp, micro_batches, batch, cores)
    return Layout(pp, dp, *resolve_batch(batch, dp, micro_batches, global_batch is not None))


# NOTE [default layout]: `ratrain train` without --pp/--dp runs two pipeline stages (the
# pipeline is what ratrain is about; one on a single core) and as many data-parallel
# replicas as fit the cores while dividing the global batch and leaving every replica at
# least 2 micro-batches (1F1B needs them to overlap its stages). With the default global
# batch of 8 that is at most 4 replicas, so big machines run fewer ranks than cores, and
# each rank runs on its share of them (see NOTE [threads per rank]: pp 2 x dp 4 on 16 cores is
# 8 ranks x 2 threads, on 64 cores 8 ranks x 8 threads); the printed line says how many
# ranks and threads. Flags the user gives are kept, and a conflict names only them.

def _default_dp(pp: int, micro_batches: int | None, batch: int, cores: int) -> int:
    """The most replicas that divide the batch, fit pp x dp on the cores and leave each
    replica --micro-batches (else 2 or more) micro-batches; 1 if none does."""
    def fits(dp: int) -> bool:
        per_replica = batch // dp
        return (batch % dp == 0 and pp * dp <= cores and
                (per_replica % micro_batches == 0 if micro_batches else per_replica >= 2))
    return max([dp for dp in range(1, batch + 1) if fits(dp)], default=1)


def resolve_batch(batch: int, dp: int, micro_batches: int | None,
                  batch_given: bool = True) -> tuple[int, int]:
    """(micro-batches, micro-batch size) splitting the global batch over dp replicas."""
    batch_text = f"--global-batch {batch}" if batch_given else \
        f"the default global batch of {batch} sequences"
    per_replica, rest = divmod(batch, dp)
    if rest or per_replica == 0:  # only a given --dp can: the default divides the batch
        raise UserError(f"--dp {dp} does not divide {batch_text}: choose a --dp that "
                          f"divides it{'' if batch_given else ' or pass --global-batch'}")
    m = micro_batches or default_micro_batches(per_replica)
    if per_replica % m:  # only a given --micro-batches can
        share = f"{batch_text}" if dp == 1 else \
            f"the {per_replica} sequences of each replica ({batch_text} / --dp {dp})"
        raise UserError(f"--micro-batches {m} does not divide {share}: choose a divisor "
                          f"of {per_replica}")
    return m, per_replica // m
