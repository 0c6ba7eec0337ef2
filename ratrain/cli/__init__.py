"""The `ratrain` command: one subcommand per user task (DESIGN section 1).

Each subcommand is a small function over parsed arguments; errors a user can fix are
raised as `UserError` and printed as one line, never as a traceback.
"""
from __future__ import annotations

import argparse
import os
import sys

from ratrain.cli.calibrate import add_calibrate_parser
from ratrain.cli.cluster import add_cluster_parser
from ratrain.cli.compile import add_compile_parser, add_program_inspect_options
from ratrain.cli.evaluate import add_eval_parsers
from ratrain.cli.options import OneLineErrors, add_options
from ratrain.cli.plan import add_plan_parser
from ratrain.cli.sim import add_simulate_parser
from ratrain.cli.train import add_run_parser, add_train_parser
from ratrain.errors import UserError
from ratrain.models.config import preset_names
from ratrain.rt.stop import exit_code, signal_name, signals_interrupt, stopped_by
from ratrain.units import format_bytes

MODEL_HELP = (f"a preset name ({', '.join(preset_names())}), a Hugging Face config.json, "
              "or a directory holding one")


def _trace(args):
    from ratrain import models
    from ratrain.models.trace import trace_model
    try:
        config = models.get_config(args.model)
    except (ValueError, FileNotFoundError, OSError) as e:
        raise UserError(str(e)) from None
    return trace_model(config, micro_batch_size=args.micro_batch_size, seq_len=args.seq_len,
                       name=args.model)


def cmd_info(args) -> None:
    from ratrain.ir.costs import layer_cost
    tg = _trace(args)
    c = tg.config
    print(f"model: {tg.name} ({c.get('model_type')})  hidden {c['hidden_size']}, "
          f"layers {c['num_hidden_layers']}, heads {c['num_attention_heads']} "
          f"(kv {c.get('num_key_value_heads', c['num_attention_heads'])}), "
          f"ffn {c['intermediate_size']}, vocab {c['vocab_size']}")
    print(f"micro-batch: {tg.micro_batch_size} x {tg.seq_len} tokens, dtype {tg.dtype}")
    print(f"parameters: {tg.num_params()}")
    print(f"{'layer':>5} {'kind':<8} {'params':>12} {'fwd GFLOP':>10} {'bwd GFLOP':>10} "
          f"{'param bytes':>12} {'act bytes/mb':>13}")
    costs = {k: layer_cost(kind) for k, kind in tg.kinds.items()}
    types = tg.param_types()
    for layer in tg.layers:
        cost = costs[layer.kind]
        n = sum(types[p].size for p in layer.param_names)
        print(f"{layer.index:>5} {layer.kind:<8} {n:>12} {cost.fwd_flops / 1e9:>10.3f} "
              f"{cost.bwd_flops / 1e9:>10.3f} {format_bytes(cost.param_bytes):>12} "
              f"{format_bytes(cost.residual_bytes):>13}")
    for name, layers in tg.tied.items():
        print(f"note: {name} ({types[name].size} parameters) is tied: counted in layers "
              f"{' and '.join(map(str, layers))}, so the rows sum to "
              f"{sum(types[p].size for layer in tg.layers for p in layer.param_names)}, "
              f"above the {tg.num_params()} parameters")
    if args.graph:
        print(tg.kinds["decoder"].fwd)


def cmd_inspect(args) -> None:
    from pathlib import Path
    from ratrain.cli.compile import cmd_inspect_program, reject_program_options
    from ratrain.programs import is_program_dir
    if is_program_dir(Path(args.model)):
        return cmd_inspect_program(args)
    reject_program_options(args)
    tg = _trace(args)
    if not 0 <= args.layer < len(tg.layers):
        raise UserError(f"--layer {args.layer} is out of range: the model has layers "
                        f"0..{len(tg.layers) - 1} (0 = embedding, {len(tg.layers) - 1} = head)")
    layer = tg.layers[args.layer]
    kind = tg.kinds[layer.kind]
    print(f"# layer {layer.index} ({layer.kind}); parameters: " + ", ".join(layer.param_names))
    print(kind.fwd if args.graph == "fwd" else kind.bwd)


def _add_shape_options(p) -> None:
    p.add_argument("model", nargs="?", default="tiny", help=f"the model: {MODEL_HELP} "
                   "(default: tiny)")
    add_options(p, "--micro-batch-size", "--seq-len")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(
        prog="ratrain", description="Compile, run, inspect and plan resource-aware 1F1B + DP "
        "training of dense LLMs (RATrain).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                help="what to do; `ratrain COMMAND --help` explains each")
    p = sub.add_parser("info", help="trace a model: config, exact parameter count, "
                       "per-layer FLOPs and bytes",
                       description="Trace MODEL into the IR on abstract shapes (no parameter "
                       "memory) and print its config, `parameters: N` counted from the traced "
                       "graph, and per-layer FLOPs and bytes for one micro-batch.")
    _add_shape_options(p)
    p.add_argument("--graph", action="store_true", help="also print the decoder layer's "
                   "forward IR")
    p.set_defaults(func=cmd_info)
    add_compile_parser(sub, MODEL_HELP)
    p = sub.add_parser("inspect", help="print one layer's IR, or a compiled program after "
                       "a pass", description="Print the IR text of one layer of MODEL, or, "
                       "given a program DIR written by `ratrain compile`, its text after a "
                       "pass (one rank's task list with --rank) and its pictures.")
    _add_shape_options(p)
    p.add_argument("--layer", type=int, default=1, metavar="I",
                   help="layer index: 0 = embedding, 1..L = decoder layers, L+1 = head "
                   "(default: 1)")
    p.add_argument("--graph", choices=("fwd", "bwd"), default="fwd",
                   help="which graph to print (default: fwd)")
    add_program_inspect_options(p)
    p.set_defaults(func=cmd_inspect)
    add_run_parser(sub)
    add_train_parser(sub, MODEL_HELP)
    add_eval_parsers(sub)
    add_simulate_parser(sub)
    add_calibrate_parser(sub)
    add_plan_parser(sub, MODEL_HELP)
    add_cluster_parser(sub)
    return parser


def given_options(parser: argparse.ArgumentParser, argv) -> frozenset[str]:
    """The dests of the options `argv` names, whatever their values: parsed again with
    every default suppressed, so `--seed 0` counts as given and abbreviations are read
    as argparse reads them (a resumed run takes only these from the command line)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                for option in command._actions:
                    option.default = argparse.SUPPRESS
    return frozenset(vars(parser.parse_args(argv))) - {"command", "func"}


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.given = given_options(parser, argv)
    try:
        with signals_interrupt():
            code = args.func(args)  # launchers return mpiexec's exit code
    except UserError as e:  # one error line; what explains it (a breakdown) indented below
        first, *details = str(e).splitlines() or [""]
        print("\n".join([f"ratrain: error: {first}", *(f"  {d}" for d in details)]),
              file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # before or after a job (rt/launch.py handles it during)
        print(f"ratrain: stopped by {signal_name(stopped_by(e))}", file=sys.stderr)
        return exit_code(stopped_by(e))
    except BrokenPipeError:  # the reader went away (`ratrain plan ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code or 0
