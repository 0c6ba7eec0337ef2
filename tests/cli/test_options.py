"""Options shared by several commands are defined once (cli/options.py): one type, default
and help, the defaults CompileOptions'; every command that takes one parses it the same."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ratrain.cli
from ratrain.cli import build_parser
from ratrain.cli.options import MACHINE_FLAGS, OPTIONS
from ratrain.planner.margin import SIMULATION_MARGIN
from ratrain.program_format.options import CompileOptions

CLI = Path(ratrain.cli.__file__).parent
SHARED = ("--budget", "--precision", "--recompute", "--schedule", "--seq-len", "--hw",
          "--zero", "--clip", "--pp", "--dp", "--micro-batches", "--micro-batch-size",
          "--global-batch", "--update-rule", "--zero3-prefetch", "--grad-accum",
          "--schedule-png", "--pipeline-schedule", *MACHINE_FLAGS)
COMMANDS = ("info", "inspect", "compile", "train", "plan", "simulate")


def definitions(flag: str) -> list[str]:
    """Every place under ratrain/cli that defines `flag` (an Option or an add_argument)."""
    return [f"{path.name}: {m.group(0)}" for path in sorted(CLI.glob("*.py"))
            for m in re.finditer(rf'(?:Option|add_argument)\(\s*"{flag}"', path.read_text())]


@pytest.mark.parametrize("flag", SHARED)
def test_each_shared_option_is_defined_once(flag):
    assert definitions(flag) == [f'options.py: Option("{flag}"']


def actions():
    """(command, flag, argparse action) of every option of every command."""
    sub = next(a for a in build_parser()._actions if a.choices and "compile" in a.choices)
    return [(name, flag, action) for name in COMMANDS
            for action in sub.choices[name]._actions for flag in action.option_strings]


def test_every_command_takes_the_one_definition():
    seen = {}
    for command, flag, action in actions():
        if flag in OPTIONS:
            option = OPTIONS[flag]
            seen.setdefault(flag, []).append(command)
            assert action.type is option.type, (command, flag)
            # plan's --schedule also takes a strategy; --hw defaults to the program's
            # profile (simulate) or, with --plan, to the --machine file's (compile, plan)
            widened = (command, flag) in {("plan", "--schedule"), ("simulate", "--hw"),
                                          ("compile", "--hw"), ("plan", "--hw")}
            if not widened:
                assert (action.default, action.help, action.choices) == \
                    (option.default, option.help, option.choices), (command, flag)
    assert seen["--budget"] == seen["--precision"] == ["compile", "train", "plan"]
    assert seen["--seq-len"] == ["info", "inspect", "compile", "train", "plan"]
    assert seen["--hw"] == ["compile", "plan", "simulate"]
    assert seen["--schedule-png"] == ["inspect", "simulate"]
    # the machine: planned for (plan, compile --plan), replayed on (simulate)
    assert all(seen[flag] == ["compile", "plan", "simulate"] for flag in MACHINE_FLAGS)


def test_defaults_come_from_compile_options():
    defaults = CompileOptions()
    assert defaults.recompute == "auto"   # the CLI's default is CompileOptions' (one truth)
    for field in ("schedule", "pipeline_schedule", "recompute", "grad_accum",
                  "update_rule",
                  "zero3_prefetch", "micro_batch_size", "clip"):
        assert OPTIONS[f"--{field.replace('_', '-')}"].default == getattr(defaults, field)
    assert f"{SIMULATION_MARGIN:.0%}%" in OPTIONS["--simulate"].help   # argparse's %%
    # no --hw: this machine's profile, chosen when a command runs (NOTE [this machine's
    # profile]), not a fixed name
    assert OPTIONS["--hw"].default is None and "this machine's" in OPTIONS["--hw"].help


ARGV = {"compile": ["compile", "tiny", "-o", "out", "--hw", "mt3000"],
        "train": ["train"], "plan": ["plan", "tiny", "--clusters", "2", "--global-batch", "8",
                                     "--hw", "mt3000"]}


@pytest.mark.parametrize("command", ARGV)
def test_same_flags_same_values_in_every_command(command):
    args = build_parser().parse_args(
        ARGV[command] + ["--budget", "1.5GiB", "--precision", "bf16", "--schedule",
                         "baseline", "--seq-len", "64"]
        + ([] if command == "plan" else ["--recompute", "selective", "--zero", "2",
                                         "--clip", "1.5", "--pp", "2", "--dp", "2"]))
    assert (args.budget, args.precision, args.schedule, args.seq_len) == \
        (3 * 2**29, "bf16", "baseline", 64)
    if command != "plan":
        assert (args.recompute, args.zero, args.clip, args.pp, args.dp) == \
            ("selective", 2, 1.5, 2, 2)
    if command != "train":
        assert args.hw == "mt3000"


@pytest.mark.parametrize("command", ["info", "inspect", "compile -o out", "train",
                                     "plan --clusters 2 --global-batch 8"])
@pytest.mark.parametrize("value", ["0", "-3", "eight"])
def test_seq_len_must_be_positive_everywhere(command, value, tmp_path):
    name, *rest = command.split()
    argv = [name] + (["tiny"] if name in ("info", "inspect", "compile", "plan") else []) + rest
    result = subprocess.run([sys.executable, "-m", "ratrain.cli", *argv, "--seq-len", value],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"ratrain: error: argument --seq-len: expected a positive "
                             f"integer, got '{value}' (`ratrain {name} --help` lists the "
                             "options)\n")
    assert list(tmp_path.iterdir()) == []
