"""What a run starts from, checked before it starts: the --resume or --init-from checkpoint
against the model (files, config, shapes: headers only), and whether a resumed run would
train on the tokens, in the order, its checkpoint was trained on. `ratrain train`/`run`
check it before compiling or writing anything; the runtime again at set-up.
"""
from __future__ import annotations

from ratrain.rt.checkpoint import checkpoint_problem
from ratrain.rt.data import stream_change


def checkpoints_problem(args, config: dict) -> str | None:
    """What is wrong with the checkpoint the run starts from (--resume, else --init-from,
    which a resumed run does not read) for the model `config`, as one line; None if
    nothing is."""
    flag, source = ("--resume", args.resume) if args.resume else ("--init-from", args.init_from)
    return checkpoint_problem(source, config, flag) if source else None


def data_order(args, state: dict) -> tuple[bool, int]:
    """(shuffle, seed) of the rows: a resumed run's, unless --allow-data-change."""
    if args.allow_data_change or not state:
        return not args.no_shuffle, args.seed
    return state.get("shuffle", not args.no_shuffle), state.get("seed", args.seed)


def resume_problem(args, state: dict, stream: dict) -> str | None:
    """Why resuming the checkpoint whose trainer state is `state` with this run's token
    `stream` would train on other tokens than it did (NOTE [token stream identity] in
    rt/data.py), as one line; None when it would not, or --allow-data-change is given.
    Checkpoints written before the stream was recorded name only their --data."""
    if not args.resume or args.allow_data_change:
        return None
    saved = state.get("token_stream") or \
        ({"data": state["data"]} if "data" in state else None)
    current = stream if "token_stream" in state else {"data": args.data}
    change = saved is not None and stream_change(saved, current)
    if not change:
        return None
    return (f"--resume {args.resume} was trained on other tokens: {change}; pass the run's "
            "--data (and --tokenizer) to continue it, or --allow-data-change to train on "
            "these tokens from its weights")
