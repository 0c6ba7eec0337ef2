"""Training data (built-in corpus, .npy rows, step batches) and the learning-rate schedule,
in one process."""
import argparse
import math
import re

import numpy as np
import pytest

from ratrain.rt.data import Batches, DataError, load_rows, training_rows
from ratrain.rt.train_options import (add_training_options, check_run_length, forward_argv,
                                      learning_rate, warmup_steps)


def test_builtin_corpus_is_byte_rows():
    rows = training_rows(None, 16, 256)
    assert rows.shape[1] == 17 and len(rows) > 1000
    assert rows.dtype == np.int32 and 0 <= rows.min() and rows.max() < 256


def test_batches_without_shuffle_take_consecutive_rows_and_wrap():
    rows = np.arange(5)[:, None].repeat(3, axis=1)
    batches = Batches(rows, 2, shuffle=False, seed=0)
    assert [list(batches.step(k)[:, 0]) for k in range(3)] == [[0, 1], [2, 3], [4, 0]]
    shuffled = Batches(rows, 5, shuffle=True, seed=1).step(0)[:, 0]
    assert sorted(shuffled) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("array, message", [
    (np.zeros((4, 9), np.int64), "rows [N, 17]"),
    (np.zeros((4, 17), np.float32), "integer token rows"),
    (np.full((4, 17), 64), "[0, 64)")])
def test_malformed_data_is_one_line_error(tmp_path, array, message):
    np.save(tmp_path / "rows.npy", array)
    with pytest.raises(DataError, match=re.escape(message)) as e:
        load_rows(str(tmp_path / "rows.npy"), 17, 64)
    assert "\n" not in str(e.value)


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_training_options(parser)
    return parser.parse_args(list(argv))


def test_warmup_then_cosine_to_min_lr():
    args = parse("--lr", "1.0", "--warmup", "2", "--min-lr", "0.1", "--steps", "6")
    lrs = [learning_rate(args, step) for step in range(1, 7)]
    assert lrs[:2] == [0.5, 1.0] and lrs[-1] == pytest.approx(0.1)
    assert all(a > b for a, b in zip(lrs[1:], lrs[2:]))
    assert learning_rate(parse("--lr", "0.3", "--lr-schedule", "constant"), 7) == 0.3


def test_default_schedule_warms_up_10_percent_then_decays_to_a_tenth():
    """See NOTE [default learning-rate schedule]: warm-up min(100, steps // 10), cosine to
    lr/10."""
    args = parse("--lr", "1.0", "--steps", "50")
    lrs = [learning_rate(args, step) for step in range(1, 51)]
    assert lrs[:5] == [0.2, 0.4, 0.6, 0.8, 1.0]
    assert lrs[5] == pytest.approx(0.5 * 0.9 * (1 + math.cos(math.pi / 45)) + 0.1)
    assert all(a > b for a, b in zip(lrs[4:], lrs[5:])) and lrs[-1] == pytest.approx(0.1)
    assert warmup_steps(parse("--steps", "5000")) == 100
    assert warmup_steps(parse("--steps", "9")) == 0
    assert learning_rate(parse("--lr", "1.0", "--steps", "1"), 1) == pytest.approx(0.1)


def test_constant_schedule_is_the_earlier_default():
    args = parse("--lr", "0.5", "--lr-schedule", "constant", "--steps", "50")
    assert [learning_rate(args, step) for step in (1, 25, 50)] == [0.5, 0.5, 0.5]
    warm = parse("--lr", "0.5", "--lr-schedule", "constant", "--warmup", "2", "--steps", "50")
    assert [learning_rate(warm, step) for step in (1, 2, 3, 50)] == [0.25, 0.5, 0.5, 0.5]


@pytest.mark.parametrize("argv, message", [
    (("--lr-schedule", "constant", "--min-lr", "0.1"), "--min-lr ends a cosine decay"),
    (("--warmup", "-1"), "--warmup must be 0 or a positive number of steps, got -1")])
def test_schedule_options_are_checked(argv, message):
    assert check_run_length(parse(*argv)).startswith(message)
    assert check_run_length(parse()) is None


def test_unknown_schedule_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit):
        parse("--lr-schedule", "linear")
    assert "choose one of cosine, constant, not 'linear'" in capsys.readouterr().err


def test_forward_argv_round_trips():
    args = parse("--steps", "4", "--no-shuffle", "--min-lr", "1e-05", "--data", "x.npy")
    assert parse(*forward_argv(args)) == args


def test_a_longer_schedule_says_how_the_learning_rate_moves():
    """issue 41: --resume RUN --steps 40 on a finished 30-step cosine run moved the rate
    from 1e-4 back up to 2.32e-4 without a note."""
    from ratrain.rt.train_options import schedule_change
    longer = parse("--lr", "1e-3", "--steps", "40")
    assert schedule_change(longer, 30, 30) == (
        "--steps 40 moves the learning-rate schedule, which ran to step 30: step 31 trains "
        "at lr 0.000232 (step 30 trained at 0.0001), then cosine to step 40")
    assert "; with --steps 30 it would train at 0.000325)" in schedule_change(longer, 30, 20)
    assert schedule_change(longer, 40, 20) is None
    constant = parse("--lr", "1e-3", "--steps", "40", "--lr-schedule", "constant")
    assert schedule_change(constant, 30, 30) is None
