"""`ratrain info` and `ratrain inspect`: real counts, IR text, one-line errors, help."""
import re
import subprocess
import sys

import pytest

from ratrain.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "ratrain.cli", *args],
                          capture_output=True, text=True, timeout=300)


def test_info_prints_exact_count_and_layers(capsys):
    assert main(["info", "tiny", "--seq-len", "32"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^parameters: 3295488$", out, re.M)
    rows = [l for l in out.splitlines() if re.match(r"\s+\d+ (embed|decoder|head) ", l)]
    assert [r.split()[1] for r in rows] == ["embed"] + ["decoder"] * 4 + ["head"]
    assert sum(int(r.split()[2]) for r in rows) == 3295488
    assert "note:" not in out                               # nothing tied, nothing to note


def test_info_of_a_tied_model_says_why_rows_sum_above_the_total(capsys):
    assert main(["info", "tiny-tied", "--seq-len", "32"]) == 0
    out = capsys.readouterr().out
    rows = [l for l in out.splitlines() if re.match(r"\s+\d+ (embed|decoder|head) ", l)]
    total = int(re.search(r"^parameters: (\d+)$", out, re.M).group(1))
    tied = 256 * 256                                   # vocab x hidden, in embed and head
    assert sum(int(r.split()[2]) for r in rows) == total + tied
    assert out.splitlines()[-1] == (
        f"note: model.embed_tokens.weight ({tied} parameters) is tied: counted in layers 0 "
        f"and 5, so the rows sum to {total + tied}, above the {total} parameters")


def test_info_graph_prints_decoder_ir(capsys):
    assert main(["info", "tiny", "--seq-len", "16", "--graph"]) == 0
    out = capsys.readouterr().out
    assert "{ decoder fwd" in out and "attention[alibi=False causal=True]" in out


def test_inspect_bwd_of_head(capsys):
    assert main(["inspect", "tiny", "--layer", "5", "--graph", "bwd", "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    assert "{ head bwd" in out and "cross_entropy_bwd" in out


def test_inspect_layer_out_of_range_is_one_line():
    result = run_cli("inspect", "tiny", "--layer", "99")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ratrain: error: --layer 99 is out of range: the model has layers 0..5 "
        "(0 = embedding, 5 = head)"]


def test_unknown_model_is_one_line():
    result = run_cli("info", "no-such-model")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-model" in lines[0] and "tiny" in lines[0]


def _parsers(parser):
    yield parser
    for action in parser._actions:
        for sub in getattr(action, "choices", None).values() \
                if isinstance(getattr(action, "choices", None), dict) else ():
            yield from _parsers(sub)


def test_every_option_has_help():
    from ratrain.cli import build_parser
    parsers = list(_parsers(build_parser()))
    assert len(parsers) >= 3
    for parser in parsers:
        for action in parser._actions:
            assert action.help and len(action.help) > 10, (parser.prog, action.dest)


@pytest.mark.parametrize("command", [[], ["info"], ["inspect"]])
def test_help_runs(command):
    result = run_cli(*command, "--help")
    assert result.returncode == 0 and "usage: ratrain" in result.stdout
