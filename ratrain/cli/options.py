"""The options several commands share, each defined once: one type, default and help in
the OPTIONS table, added to a command's parser by `add_options`. Defaults are
CompileOptions' (program_format/options.py); None means "decided by the command" (the
profile, the model, or `ratrain train`'s layout rules), which the help says.
Imports neither jax nor the passes, so building the parser stays fast.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any, Callable

from ratrain.models.config import SEQ_LEN_HELP
from ratrain.planner.margin import SIMULATION_MARGIN
from ratrain.program_format.options import (GRAD_ACCUMULATION, MAX_DEFAULT_MICRO_BATCHES,
                                            PRECISION_HELP, PRECISIONS,
                                            PIPELINE_SCHEDULES, RECOMPUTE_POLICIES,
                                            SCHEDULES, UPDATE_RULES, VOCAB_PARALLEL,
                                            CompileOptions)
from ratrain.units import bandwidth_arg, latency_arg, size_arg

DEFAULTS = CompileOptions()
DEFAULT_SIMULATE = 3            # candidates the planner compiles and simulates at most


def _int_at_least(low: int, words: str) -> Callable[[str], int]:
    """An argparse type: an integer >= low, else a usage error naming what was given."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}")
        return value
    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "0 or a positive integer")


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0, else a usage error naming what was given."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


class OneLineErrors(argparse.ArgumentParser):
    """A parser (and its subcommands' parsers) whose usage errors are one `ratrain: error:`
    line naming the input and where the options are listed, like every other error."""

    def error(self, message: str):
        self.exit(2, f"ratrain: error: {message} (`{self.prog} --help` lists the "
                  "options)\n")


@dataclass(frozen=True)
class Option:
    flag: str                           # "--seq-len"
    help: str                           # what it means, ending with its default
    type: Callable | None = None        # argparse type; None with choices = str
    default: Any = None                 # None = the command decides (the help says how)
    choices: tuple | None = None        # the values it takes, if a fixed set
    metavar: str | None = None          # the value's name in --help
    required: bool = False              # the command cannot run without it
    switch: bool = False                # a flag without a value (store_true; default False)
    bare: Any = None                    # the value of the flag given alone, if it may be
                                        # (argparse nargs="?", const=bare)


HW_HELP = "hardware profile: mt3000, cpu (the shipped one, measured on another machine) or a " \
    "path to a profile .json"
# where no --hw is given: calibrate/this_machine.default_hw (NOTE [this machine's profile])
DEFAULT_HW = "this machine's profile ($RATRAIN_DEFAULT_HW, else its cached calibration, made " \
    "by a quick pass of seconds on first use)"

OPTIONS = {o.flag: o for o in (
    Option("--pp", "pipeline stages (default: compile 1; train 2 when there are cores for "
           "it, else 1; at most the model's layers + 2)", positive_int, None, metavar="P"),
    Option("--dp", "data-parallel replicas of every stage (default: compile 1; train the "
           "most that divide G, leave 2 micro-batches per replica and fit pp x dp ranks on "
           "the cores)", positive_int, None, metavar="D"),
    Option("--micro-batches", "micro-batches per step and replica (default: the largest "
           f"divisor of the replica's sequences up to {MAX_DEFAULT_MICRO_BATCHES}, at least "
           "2 where they allow; compile, which takes no global batch, "
           f"{MAX_DEFAULT_MICRO_BATCHES}; NOTE [default micro-batches])",
           positive_int, None, metavar="M"),
    Option("--micro-batch-size", "sequences per micro-batch (default: "
           f"{DEFAULTS.micro_batch_size})", positive_int, DEFAULTS.micro_batch_size,
           metavar="B"),
    Option("--seq-len", SEQ_LEN_HELP, positive_int, None, metavar="T"),
    Option("--global-batch", "sequences per step over all replicas: dp x micro-batches x "
           "micro-batch size = G (default: train 8; plan and compile --plan need it)",
           positive_int, None, metavar="G"),
    Option("--schedule", "ratrain: lifecycle scheduling (overlapped sync, forward-side "
           "recovery); baseline: GPU-style 1F1B with sync and update at the step end "
           f"(default: {DEFAULTS.schedule})", None, DEFAULTS.schedule, SCHEDULES),
    Option("--pipeline-schedule", "order of each stage's forwards and backwards: 1f1b, or "
           "zb1 = zero-bubble ZB-H1 (each backward split into the input gradient B and the "
           "weight gradients W, deferred into the pipeline's idle time; same numbers, same "
           f"in-flight bound) (default: {DEFAULTS.pipeline_schedule})", None,
           DEFAULTS.pipeline_schedule, PIPELINE_SCHEDULES),
    Option("--vocab-parallel", "split vocabulary-sized weights by rows over every "
           "pipeline stage: head = the LM head's (each stage computes its shard's logits, "
           "softmax statistics and gradients, so the head stage no longer bounds the "
           "step); both = the head's and the input embedding's (each stage looks up its "
           "rows and updates a P-th of the embedding, so stage 0 no longer holds it all); "
           "the flag alone means both; needs --pp 2 or more and a --pp dividing the "
           "vocabulary, and under both at most the decoder layers + 1 (default: "
           f"{DEFAULTS.vocab_parallel})", None,
           DEFAULTS.vocab_parallel, VOCAB_PARALLEL, bare="both"),
    Option("--recompute", "activation recovery: none, full, selective, or auto = the least "
           "recompute that fits --budget, run on the forward side where that fits too, else "
           f"in the backward (default: {DEFAULTS.recompute})", None, DEFAULTS.recompute,
           RECOMPUTE_POLICIES),
    Option("--zero", "ZeRO stage over the DP group (default: the profile's default_zero "
           "when --dp > 1, else 0; 2 for mt3000, 0 for cpu); 3 also shards the views, "
           "gathered at each use", int, None, (0, 1, 2, 3)),
    Option("--zero3-prefetch", "--zero 3: gather each layer view K uses ahead, in K + 1 "
           "view slots (0 = gather at use, nothing overlapped) (default: "
           f"{DEFAULTS.zero3_prefetch})", non_negative_int, DEFAULTS.zero3_prefetch,
           metavar="K"),
    Option("--budget", "usable memory per rank, e.g. 20GB (= 20 * 10^9 bytes) or 18GiB "
           "(= 18 * 2^30) (default: the profile's usable_memory)", size_arg, None,
           metavar="SIZE"),
    Option("--hw", f"{HW_HELP} (default: {DEFAULT_HW})", None, None, metavar="PROFILE"),
    Option("--precision", PRECISION_HELP, None, None, PRECISIONS),
    Option("--grad-accum", "ZeRO-2 gradient accumulation: local (full gradient until the "
           "step's sync), scatter (reduce-scatter every micro-batch, only a shard kept) or "
           f"auto (scatter only where local cannot fit the budget) (default: "
           f"{DEFAULTS.grad_accum})", None, DEFAULTS.grad_accum, GRAD_ACCUMULATION),
    Option("--clip", "clip gradients to global norm X (default: no clipping)", float,
           DEFAULTS.clip, metavar="X"),
    Option("--update-rule", "with --clip or fp16 loss scaling (a global norm): commit = each "
           "layer's AdamW runs speculatively right after its gradient sync and the step's "
           "norm commits it or rolls it back and redoes it exactly; after-norm = every "
           "update waits for the norm. Same numbers either way; the baseline schedule always "
           f"uses after-norm (default: {DEFAULTS.update_rule})", None, DEFAULTS.update_rule,
           UPDATE_RULES),
    Option("--placement", "which (stage, replica) each rank runs; nodes (hosts) hold "
           "consecutive ranks: pipeline = a pipeline's stages on consecutive ranks (rank = "
           "replica x pp + stage); dp = a stage's DP group on consecutive ranks (rank = stage "
           "x dp + replica); dp:B = blocks of B replicas of every stage (NOTE [placement]) "
           f"(default: {DEFAULTS.placement})", None, DEFAULTS.placement, metavar="ORDER"),
    Option("--schedule-png", "draw the schedule to FILE, one row per stage, times in seconds "
           "(inspect DIR: the dry run on the program's profile; simulate: the simulated "
           "step)", None, None, metavar="FILE"),
    Option("--skip-steps", "leave each trace's first N steps out, which warm caches and "
           "allocators (default: 2)", non_negative_int, 2, metavar="N"),
    Option("--from-scratch", "train: start from a seeded initialisation (--seed) even "
           "when --model DIR holds weights (model.safetensors or a sharded index), which "
           "the run otherwise starts from (default: DIR's weights where it has them)",
           default=False, switch=True),
    # eval and generate (cli/evaluate.py)
    Option("--prompt", "generate: the text to continue, tokenized with the checkpoint's "
           "tokenizer (its special tokens added, as transformers' tokenizer(TEXT) does)",
           metavar="TEXT", required=True),
    Option("--max-new-tokens", "generate: tokens to add after the prompt at most; the end "
           "of text token stops it sooner (default: 64)", positive_int, 64, metavar="N"),
    Option("--greedy", "generate: take the most likely token every time, as transformers' "
           "generate(do_sample=False) does (default: draw it at --temperature)", switch=True),
    Option("--temperature", "generate: divide the logits by T before drawing; below 1 is "
           "surer, above 1 more varied (default: 1.0)", positive_float, 1.0, metavar="T"),
    Option("--top-k", "generate: draw among the K most likely tokens only; 0 = all "
           "(default: 50, transformers' default)", non_negative_int, 50, metavar="K"),
    Option("--allow-beyond-context", "train: take a --seq-len longer than the model's "
           "context (max_position_embeddings), training positions it has not seen "
           "(default: refuse such a --seq-len)", default=False, switch=True),
    Option("--clusters", "ranks (MT-3000 clusters) to plan for: pp x dp = N", positive_int,
           None, metavar="N"),
    # the machine (hw/machine.py): plan and compile --plan plan for it, compile records
    # it in program.json, simulate replays on the recorded one with these over it
    Option("--machine", "a machine file: JSON with profile, nodes, ranks_per_node, "
           "inter_node_bandwidth, inter_node_latency, node_memory_bandwidth, link_bandwidth, "
           "link_latency, each optional (NOTE [machine file], docs/DESIGN.md 7.1); the "
           "machine flags given override its fields", None, None, metavar="FILE"),
    Option("--nodes", "nodes (hosts) of several ranks each: plan for K x ranks per node "
           "ranks, the placement (which ranks share a node) searched with the rest; "
           "simulate: DIR's ranks on K nodes", positive_int, None, metavar="K"),
    Option("--ranks-per-node", "ranks sharing a node's memory and one network port "
           "(default: the profile's ranks_per_node)", positive_int, None, metavar="R"),
    Option("--inter-node-bandwidth", "bytes/s of a node's network port, shared by its "
           "ranks, e.g. 1.25GB/s or 10Gbit (default: the profile's inter_node_bandwidth, "
           "else its link_bandwidth)", bandwidth_arg, None, metavar="B"),
    Option("--inter-node-latency", "seconds per message between nodes, e.g. 5us (default: "
           "the profile's inter_node_latency, else its link_latency)", latency_arg, None,
           metavar="S"),
    Option("--link-bandwidth", "bytes/s between two ranks of a node (and between nodes, "
           "where the profile gives no inter_node_bandwidth), replacing the profile's "
           "link_bandwidth, e.g. 61.7MB/s (as `ratrain cluster up` takes it)", bandwidth_arg,
           None, metavar="B"),
    Option("--link-latency", "seconds per message between two ranks of a node, replacing "
           "the profile's link_latency, e.g. 5us", latency_arg, None, metavar="S"),
    Option("--measure", "plan on this machine, then compile the K best rows, run each "
           "a few traced steps under mpiexec (about 3 s of steps after 2 warm-up steps), "
           "print the measured step beside the simulated one and pick the fastest measured "
           "(NOTE [choosing by measuring]); not with the machine flags, another machine's "
           "profile or more ranks than cores (default: no measuring)", positive_int, None,
           metavar="K"),
    Option("--measure-dir", "with --measure: keep each row's program, trace, metrics and "
           "run log in DIR/row<I> (a new or empty directory), for `ratrain calibrate "
           "--from` (default: a temporary directory, removed after)", None, None,
           metavar="DIR"),
    Option("--simulate", "compile and simulate at most the S best candidates by the "
           "analytic estimate, skipping those estimated over "
           f"{SIMULATION_MARGIN:.0%} slower than the best simulated (default: "
           f"{DEFAULT_SIMULATE})".replace("%", "%%"), positive_int, None, metavar="S"),
)}


def dest(flag: str) -> str:
    """The attribute argparse stores `flag` under: "--seq-len" -> "seq_len"."""
    return flag.lstrip("-").replace("-", "_")


def flag_of(name: str) -> str:
    """The flag of a CompileOptions field (or another dest): "seq_len" -> "--seq-len";
    the inverse of `dest`."""
    return "--" + name.replace("_", "-")


def add_options(parser, *flags: str, **changes) -> None:
    """Add OPTIONS[flag] for each flag. `changes` (keyword: a dict of Option fields) adapt
    one option to a command where its meaning widens, e.g. plan's --schedule, which also
    takes a strategy: add_options(p, "--schedule", schedule={"choices": ...})."""
    for flag in flags:
        option = OPTIONS[flag]
        option = replace(option, **changes.get(dest(flag), {}))
        if option.switch:
            parser.add_argument(option.flag, action="store_true", help=option.help)
            continue
        extra = {"choices": option.choices} if option.choices else {"metavar": option.metavar}
        if option.bare is not None:
            extra |= {"nargs": "?", "const": option.bare}
        parser.add_argument(option.flag, type=option.type, default=option.default,
                            required=option.required, help=option.help, **extra)


# the layout flags compile takes (as --help lists them)
LAYOUT_FLAGS = ("--pp", "--dp", "--micro-batches", "--micro-batch-size", "--seq-len")

# the policy flags compile and train both take (compile adds --hw and --grad-accum; train
# runs on this machine's cpu profile)
POLICY_FLAGS = ("--schedule", "--pipeline-schedule", "--vocab-parallel", "--recompute", "--zero", "--zero3-prefetch", "--budget",
                "--precision", "--clip", "--update-rule")

# the machine planned for and simulated on, each a field of hw/machine.Machine (with --hw,
# its profile); plan, compile (with --plan) and simulate take them all
MACHINE_FLAGS = ("--machine", "--nodes", "--ranks-per-node", "--inter-node-bandwidth",
                 "--inter-node-latency", "--link-bandwidth", "--link-latency")


# the options a plan row chooses (compile --plan, plan --measure), at their defaults unless
# given (a row's None keeps the default: NOTE [update rule fallback])
PLANNED = ("--pp", "--dp", "--micro-batches", "--micro-batch-size", "--zero", "--recompute",
           "--update-rule", "--zero3-prefetch", "--grad-accum", "--placement",
           "--pipeline-schedule", "--vocab-parallel")


def planned_values(row) -> dict[str, Any]:
    """flag -> value of each PLANNED option for a plan row (planner/search.Row)."""
    return {flag: OPTIONS[flag].default if getattr(row, dest(flag)) is None
            else getattr(row, dest(flag)) for flag in PLANNED}
