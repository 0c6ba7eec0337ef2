"""The loggers of a run, in one process (issue 41, item 7): --log-to's list and its
up-front check (NOTE [optional loggers]), which steps get a progress line under
--log-every, RUN/train.log's copy of the terminal (NOTE [the run's log]), and a W&B run
written offline where wandb is installed. The event files of a real run are read back in
tests/rt/test_cli_train.py."""
import argparse
import importlib.util
import sys

import pytest

from ratrain.cli.train_log import TerminalLog
from ratrain.rt import loggers
from ratrain.rt.loggers import logger_list, loggers_problem
from ratrain.rt.metrics import MetricsLog, StepMetrics
from ratrain.rt.run import _is_shown
from ratrain.rt.train_options import add_training_options, check_run_numbers, forward_argv


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_training_options(parser)
    return parser.parse_args(list(argv))


def test_log_to_takes_a_list_of_known_loggers_and_forwards_it():
    assert logger_list("tensorboard,wandb") == "tensorboard,wandb"
    for bad in ("mlflow", "tensorboard,mlflow", ","):
        with pytest.raises(argparse.ArgumentTypeError, match="choose from tensorboard, wandb"):
            logger_list(bad)
    args = parse("--log-to", "wandb", "--log-every", "10")
    assert forward_argv(args) == ["--log-every", "10", "--log-to", "wandb"]
    assert check_run_numbers(parse("--log-every", "0")) == \
        "--log-every must be a positive number of steps, got 0"


def test_a_logger_without_its_library_is_refused_naming_the_extra(monkeypatch):
    monkeypatch.setattr(loggers, "_installed", lambda module: False)
    assert loggers_problem("tensorboard", "m.jsonl") == (
        '--log-to tensorboard needs tensorboardX or torch with tensorboard: pip install '
        '"ratrain[tensorboard]" (or leave --log-to tensorboard out)')
    monkeypatch.setattr(loggers, "_installed", lambda module: True)
    assert loggers_problem("tensorboard,wandb", None) == \
        "--log-to tensorboard,wandb writes beside --metrics: pass --metrics FILE"
    assert loggers_problem(None, None) is None


def test_log_every_shows_the_first_the_last_every_nth_and_each_evaluation():
    args = parse("--log-every", "10", "--steps", "35")
    shown = [k for k in range(4, 36) if _is_shown(args, k, 4, evaluated=k == 17)]
    assert shown == [4, 10, 17, 20, 30, 35]


def test_terminal_log_holds_lines_until_the_run_directory_exists(tmp_path, capsys):
    with TerminalLog() as log:
        print("compiling")
        print("a warning", file=sys.stderr)
        log.open(tmp_path / "train.log")
        print("step 1/2")
    print("after the block")
    assert (tmp_path / "train.log").read_text() == "compiling\na warning\nstep 1/2\n"
    out, err = capsys.readouterr()
    assert out == "compiling\nstep 1/2\nafter the block\n" and err == "a warning\n"


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                    reason="wandb is not installed (pip install \"ratrain[wandb]\")")
def test_wandb_logs_offline_into_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    log = MetricsLog(str(tmp_path / "metrics.jsonl"), 2,
                     loggers=loggers.open_loggers("wandb", str(tmp_path / "metrics.jsonl"),
                                                  {"lr": 1e-3}))
    for k in (1, 2):
        log.write(StepMetrics(k, 4.0 - k, 100.0, 0.5, 1e-3, [1], [1]))
    log.close()
    assert list((tmp_path / "wandb").glob("wandb/offline-run-*"))
