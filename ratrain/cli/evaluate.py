"""`ratrain eval RUN_OR_CHECKPOINT --data FILE` and `ratrain generate RUN_OR_CHECKPOINT
--prompt TEXT`: score a checkpoint on held-out text, or see what it writes, without
training. A run directory means its newest checkpoint. eval runs the held-out pass of a
run (NOTE [eval is the run's held-out pass]); generate samples in this process
(models/sample.py).
"""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from ratrain.errors import UserError

CHECKPOINT_HELP = ("a checkpoint directory (config.json and model.safetensors: ratrain's "
                   "RUN/checkpoints/step-N or a transformers save_pretrained directory), or a "
                   "run directory or --save-dir, meaning its newest checkpoint")

# NOTE [eval is the run's held-out pass]: `ratrain eval` reports what a training run's
# --eval-data reports after the step the checkpoint saved, to the last digit: the same
# function on the same rows. The rows are evaluate.held_out_rows' (the first --eval-batches
# global batches of FILE in file order, the last one wrapping), the number is
# evaluate.evaluate's (the mean of the micro-batch losses of the program's forward tasks,
# NOTE [held-out loss] in rt/executor.py), run by rt/eval_job.py under mpiexec. A
# checkpoint of a `ratrain train` run is evaluated by RUN/program itself, on its own
# ranks, with the run's --eval-batches and tokenizer: the kernels, micro-batches and
# threads of the run's evaluation. Any other checkpoint gets a program compiled for one
# rank here (--seq-len, --global-batch), in a temporary directory.


def find_checkpoint(path: str) -> Path:
    """The checkpoint RUN_OR_CHECKPOINT names: a directory with config.json and weights,
    else the newest step-N under PATH/checkpoints or PATH; a UserError otherwise."""
    from ratrain.models.checkpoint import has_weights
    from ratrain.rt.checkpoint import latest_checkpoint
    root = Path(path)
    if not root.is_dir():
        raise UserError(f"{path} does not exist or is not a directory; pass a checkpoint "
                        "directory or a run directory (`ratrain train --out RUN`)")
    if (root / "config.json").is_file() and has_weights(root):
        return root
    found = latest_checkpoint(root / "checkpoints") or latest_checkpoint(root)
    if found is None:
        raise UserError(f"{path} holds no checkpoint (no config.json with model.safetensors "
                        "in it, and no step-N directory in it or in its checkpoints/); pass "
                        "a checkpoint directory or a run that has saved one")
    return found


def checked_config(checkpoint: Path) -> tuple[dict, str]:
    """(config, name) of a checkpoint whose weights fit its config.json (headers and file
    lengths only: rt/checkpoint.checkpoint_problem), or a UserError."""
    from ratrain.cli.train_inputs import load_checked_model
    from ratrain.rt.checkpoint import checkpoint_problem
    config, name = load_checked_model(str(checkpoint))
    if (problem := checkpoint_problem(checkpoint, config, "checkpoint")) is not None:
        raise UserError(problem)
    return config, name


# ---- ratrain eval ----------------------------------------------------------------------------

def cmd_eval(args) -> int:
    """Tokenize FILE here (NOTE [tokenize once]), then run the held-out pass of the run's
    program, or of one compiled for the checkpoint (NOTE [eval is the run's held-out
    pass]); the job's exit code."""
    from ratrain.cli.resume import run_of
    if args.data is None:
        raise UserError("eval needs --data FILE, the held-out text to score the checkpoint on")
    checkpoint = find_checkpoint(args.checkpoint)
    config, name = checked_config(checkpoint)
    _check_data_exists(args.data)
    run = run_of(str(checkpoint.parent.parent)) if checkpoint.parent.name == "checkpoints" \
        else None
    if run is not None:
        _take_run_options(args, run)
        return _evaluate(args, run / "program", checkpoint)
    with tempfile.TemporaryDirectory(prefix="ratrain-eval-") as folder:
        program = Path(folder) / "program"
        _compile_for_one_rank(args, config, name, program)
        return _evaluate(args, program, checkpoint)


def _check_data_exists(data: str) -> None:
    """A missing or empty --data is refused before anything is compiled."""
    from ratrain.data import find_sources
    from ratrain.rt.data import DataError
    if data.endswith(".npy"):
        return
    try:
        find_sources(data, "--data")
    except DataError as e:
        raise UserError(str(e)) from None


def _take_run_options(args, run: Path) -> None:
    """A run's checkpoint: the run's --eval-batches where not given (its tokenizer is the
    checkpoint's copy); its program fixes the sequence length and batch."""
    from ratrain.rt.train_options import RUN_RECORD
    given = getattr(args, "given", frozenset())
    for flag in ("--seq-len", "--global-batch"):
        if flag.lstrip("-").replace("-", "_") in given:
            raise UserError(f"{flag} cannot be given for a checkpoint of the run {run}: it "
                            f"is evaluated by {run / 'program'}, compiled with the run's; "
                            f"leave {flag} out")
    try:
        record = json.loads((run / RUN_RECORD).read_text())["options"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"cannot read {run / RUN_RECORD} ({e}); pass the checkpoint of "
                        "another run") from None
    if "eval_batches" not in given:
        args.eval_batches = record.get("eval_batches", args.eval_batches)


def _compile_for_one_rank(args, config: dict, name: str, program: Path) -> None:
    """A one-rank program of the checkpoint's model (--seq-len, --global-batch) in
    `program`."""
    from ratrain.calibrate.this_machine import default_hw
    from ratrain.cli.train import compile_program
    from ratrain.cli.train_inputs import resolve_layout
    from ratrain.compiler import resolve_options
    from ratrain.inputs import load_hw
    from ratrain.programs import write_program_dir
    layout = resolve_layout(1, 1, None, args.global_batch, 1, config["num_hidden_layers"] + 2)
    hw = default_hw()  # NOTE [this machine's profile]
    profile = load_hw(hw)
    options = resolve_options(config, profile, pp=1, dp=1,
                              micro_batches=layout.micro_batches,
                              micro_batch_size=layout.micro_batch_size, seq_len=args.seq_len)
    print(f"compiling {name} for one rank ({layout.micro_batches} micro-batches of "
          f"{layout.micro_batch_size} x {options.seq_len} tokens)", flush=True)
    write_program_dir(program, *compile_program(config, name, options, hw, profile))


def _evaluate(args, program: Path, checkpoint: Path) -> int:
    """Tokenize --data for the program's model, then start rt/eval_job.py on its ranks."""
    from ratrain.cli.train import check_program
    from ratrain.rt.hosts import job_command
    from ratrain.rt.launch import find_mpiexec, rank_python
    manifest, ranks = check_program(program, None, False)
    _tokenize(args, manifest["model"]["config"], manifest["options"]["seq_len"], checkpoint)
    command = [*rank_python("ratrain.rt.eval_job"), str(program), str(checkpoint),
               "--data", args.data, "--eval-batches", str(args.eval_batches),
               *(["--tokenizer", args.tokenizer] if args.tokenizer else [])]
    return subprocess.run(job_command(find_mpiexec(), ranks, command),
                          stdin=subprocess.DEVNULL).returncode


def _tokenize(args, config: dict, seq_len: int, checkpoint: Path) -> None:
    """--data into its token cache (NOTE [tokenize once]), checked to hold a row."""
    from ratrain.rt.data import DataError, TextSettings, data_rows
    if args.eval_batches < 1:
        raise UserError(f"--eval-batches must be 1 or more, got {args.eval_batches}")
    text = TextSettings(config, args.tokenizer, init_from=str(checkpoint))
    try:
        data_rows(args.data, "--data", seq_len + 1, text)
    except DataError as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"cannot read {e.filename}: {e.strerror}") from None


# ---- ratrain generate ------------------------------------------------------------------------

def cmd_generate(args) -> int:
    """Print the prompt and what the checkpoint writes after it."""
    from ratrain import models
    from ratrain.models.sample import Sampling, generate_ids
    checkpoint = find_checkpoint(args.checkpoint)
    config, _ = checked_config(checkpoint)
    choice = _tokenizer(config, args.tokenizer, checkpoint)
    prompt = _encode(choice, args.prompt)
    _check_length(config, len(prompt), args.max_new_tokens)
    params = models.load_pretrained(checkpoint)[1]
    sampling = Sampling(args.max_new_tokens, args.greedy, args.temperature, args.top_k,
                        args.seed)
    # byte tokens have no end-of-text id (NOTE [byte documents]): run to the length
    eos = None if choice.path is None else choice.eos_id
    print(args.prompt + _decode(choice, generate_ids(config, params, prompt, sampling, eos)),
          flush=True)
    return 0


def _tokenizer(config: dict, tokenizer: str | None, checkpoint: Path):
    """--tokenizer, else the checkpoint's tokenizer.json, else UTF-8 bytes where the
    vocabulary holds them (data/tokenizer.choose_tokenizer); a UserError otherwise."""
    from ratrain.data.tokenizer import choose_tokenizer
    from ratrain.rt.data import DataError
    try:
        return choose_tokenizer(config, tokenizer, str(checkpoint))
    except DataError as e:
        raise UserError(f"{e} (--prompt is text; {checkpoint} has no tokenizer.json)"
                        if tokenizer is None else str(e)) from None


def _encode(choice, prompt: str) -> list[int]:
    if choice.path is None:
        ids = list(prompt.encode("utf-8"))
    else:
        from tokenizers import Tokenizer
        ids = Tokenizer.from_file(str(choice.path)).encode(prompt).ids
    if not ids:
        raise UserError("--prompt gives no tokens: pass some text to continue")
    return ids


def _decode(choice, ids: list[int]) -> str:
    if choice.path is None:
        return bytes(ids).decode("utf-8", errors="replace")
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(choice.path)).decode(ids, skip_special_tokens=True)


def _check_length(config: dict, prompt: int, new: int) -> None:
    context = int(config.get("max_position_embeddings") or 0)
    if context and prompt + new > context:
        raise UserError(f"the prompt's {prompt} tokens and --max-new-tokens {new} exceed the "
                        f"model's context of {context} tokens (max_position_embeddings): pass "
                        f"--max-new-tokens {max(context - prompt, 1)} or a shorter --prompt")


# ---- the parsers ---------------------------------------------------------------------------

def add_eval_parsers(sub) -> None:
    from ratrain.cli.options import add_options
    from ratrain.rt.train_options import add_training_options
    p = sub.add_parser("eval", help="loss and perplexity of a checkpoint on held-out text",
                       description="Print the mean next-token loss and the perplexity of "
                       "RUN_OR_CHECKPOINT over FILE: what a training run's --eval-data "
                       "reports, computed the same way (NOTE [eval is the run's held-out "
                       "pass]). A run's checkpoint is evaluated by the run's own program on "
                       "its ranks; another checkpoint by a program compiled for one rank.")
    p.add_argument("checkpoint", metavar="RUN_OR_CHECKPOINT", help=CHECKPOINT_HELP)
    add_training_options(p, only=("--data", "--tokenizer", "--eval-batches"), helps={
        "--data": "held-out text (a .txt file, a directory of .txt files, a .jsonl of "
        "\"text\" fields), tokenized with the checkpoint's tokenizer, or a .npy of token "
        "rows [N, seq-len + 1]: what a run's --eval-data takes (required)"})
    add_options(p, "--seq-len", "--global-batch",
                global_batch={"help": "a checkpoint not of a `ratrain train` run: sequences "
                              "per batch (default: 8; a run's checkpoint: the run's)"})
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("generate", help="continue a prompt with a checkpoint's model",
                       description="Tokenize TEXT with the checkpoint's tokenizer, sample up "
                       "to --max-new-tokens tokens after it (greedy, or at --temperature "
                       "among the --top-k most likely, seeded) with ratrain's own model "
                       "code in this process, and print the prompt and its continuation.")
    p.add_argument("checkpoint", metavar="RUN_OR_CHECKPOINT", help=CHECKPOINT_HELP)
    add_options(p, "--prompt", "--max-new-tokens", "--greedy", "--temperature", "--top-k")
    add_training_options(p, only=("--tokenizer", "--seed"), helps={
        "--seed": "seed of the draws: the same seed, checkpoint and options give the same "
        "text (default: 0)"})
    p.set_defaults(func=cmd_generate)
