"""Values a user can get wrong, each refused by `ratrain train` in one `ratrain: error:`
line naming the input and the fix, exit 2, before anything is written (issue 41, items 8
and 9): optimizer numbers out of range, a --seq-len past the model's context, a Hugging
Face hub id, a directory without config.json, a --init-from that does not exist. Run in
process: each refusal comes before any compile or MPI job."""
import argparse
import json
import os

import pytest

from ratrain.cli import main as ratrain_main
from ratrain.models import get_config
from ratrain.rt.train_options import add_training_options, check_run_length

REFUSED = {  # case: (flags, what the line must say)
    "lr negative": (["--lr", "-1"], "--lr must be a positive learning rate"),
    "lr nan": (["--lr", "nan"], "--lr must be a positive learning rate"),
    "min-lr negative": (["--min-lr", "-0.1"], "--min-lr must be 0 or a positive"),
    "min-lr above lr": (["--lr", "1e-3", "--min-lr", "1e-2"],
                        "--min-lr 0.01 is above --lr 0.001"),
    "warmup past steps": (["--warmup", "20", "--steps", "10"],
                          "--warmup 20 is longer than --steps 10"),
    "beta1 1": (["--beta1", "1"], "--beta1 must be in [0, 1)"),
    "beta2 negative": (["--beta2", "-0.5"], "--beta2 must be in [0, 1)"),
    "eps 0": (["--eps", "0"], "--eps must be a positive number"),
    "weight-decay negative": (["--weight-decay", "-1"], "--weight-decay must be 0 or"),
    "clip negative": (["--clip", "-1"], "--clip must be a positive gradient norm"),
    "clip inf": (["--clip", "inf"], "--clip must be a positive gradient norm"),
    "seq-len past context": (["--model", "SHORT", "--seq-len", "64"],
                             "--seq-len 64 is longer than the model's context "
                             "(max_position_embeddings 32): pass --seq-len 32 or less, or "
                             "--allow-beyond-context"),
    "hub id": (["--model", "Qwen/Qwen2.5-0.5B"],
               "model 'Qwen/Qwen2.5-0.5B' is not a local path, and ratrain does not "
               "download models"),
    "directory without config.json": (["--model", "EMPTY"], "is a directory without "
                                      "config.json: point at the directory holding"),
    "init-from nonexistent": (["--init-from", "/nonexistent"],
                              "--init-from /nonexistent does not exist: pass a checkpoint "
                              "directory"),
    "init-from without config.json": (["--init-from", "EMPTY"],
                                      "has no config.json: pass a checkpoint directory"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_refused_in_one_line_naming_the_input_and_the_fix(case, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "short.json").write_text(json.dumps(
        get_config("tiny") | {"max_position_embeddings": 32}))
    flags, expected = REFUSED[case]
    named = {"EMPTY": str(tmp_path / "empty"), "SHORT": str(tmp_path / "short.json")}
    before = sorted(os.listdir(tmp_path))
    code = ratrain_main(["train", *(named.get(f, f) for f in flags),
                         "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", err
    assert len(err.splitlines()) == 1 and err.startswith("ratrain: error: "), err
    assert expected in err, err
    assert sorted(os.listdir(tmp_path)) == before   # nothing written


def test_beyond_context_is_taken_when_the_flag_says_so():
    from ratrain.cli.train_inputs import check_context
    config = get_config("tiny") | {"max_position_embeddings": 32}
    check_context(config, 64, allowed=True)
    check_context(config, 32, allowed=False)


def test_ranks_check_the_optimizer_numbers_too():
    """check_run_length is what the ranks run at set-up (`python -m ratrain.rt` directly)."""
    parser = argparse.ArgumentParser()
    add_training_options(parser)
    assert check_run_length(parser.parse_args(["--beta2", "1.0"])).startswith("--beta2")
    assert check_run_length(parser.parse_args(["--lr", "3e-4", "--min-lr", "0"])) is None
