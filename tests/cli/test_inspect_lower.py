"""The lower pass's record in a program directory holds the lowered calls of every stage,
and `ratrain inspect DIR --after lower --rank R` prints rank R's stage's calls."""
import re

import pytest

from ratrain.cli import main
from ratrain.passes.pipeline import PIPELINE, _late_passes

PASS_NAMES = [p.__name__ for p in PIPELINE + _late_passes()]
LOWER = f"{PASS_NAMES.index('lower') + 1:02d}_lower.txt"
BEFORE_LOWER = f"{PASS_NAMES.index('lower'):02d}_{PASS_NAMES[PASS_NAMES.index('lower') - 1]}.txt"
OPTIONS = ["tiny", "--seq-len", "32", "--pp", "2", "--dp", "2", "--micro-batches", "2",
           "--recompute", "none"]


def compile_to(out):
    assert main(["compile", *OPTIONS, "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def program_dir(tmp_path_factory):
    return compile_to(tmp_path_factory.mktemp("programs") / "pp2dp2")


def body(path) -> str:
    """A pass file without its first line (which holds the pass's time)."""
    return path.read_text().split("\n", 1)[1]


def test_lower_record_holds_the_lowered_calls(program_dir):
    passes = program_dir / "passes"
    lowered, planned = body(passes / LOWER), body(passes / BEFORE_LOWER)
    assert lowered != planned and lowered.startswith(planned)  # task lists, then the calls
    calls = lowered[len(planned):]
    assert re.findall(r"^# lowered program of stage \d+$", calls, re.M) == [
        "# lowered program of stage 0", "# lowered program of stage 1"]
    # the tiny model has 6 layers: 0-2 on stage 0, 3-5 on stage 1 (head is 5)
    assert re.search(r"^1SYNC\[L4\]:\n    grad\.L4\+0:f32\[\d+\] = grad_sync\[op=allreduce\] "
                     r"grad\.L4\+0:f32\[\d+\]    # L4$", calls, re.M)
    assert re.search(r"^1UPD\[L4\]:\n    master\.L4\+0:f32\[\d+\] opt\.L4\+0:f32\[\d+\] "
                     r"opt\.L4\+\d+:f32\[\d+\] = adamw\[zero=0\] grad\.L4\+0:f32\[\d+\]    # L4$",
                     calls, re.M)
    assert re.search(r"^0F1:\n    act\.L0\.mb1\+0:i32\[1,32\] = load_ids\[micro_batch=1\]",
                     calls, re.M)
    assert " 0x" not in calls and " at 0x" not in calls  # no addresses


def test_lower_record_is_deterministic(program_dir, tmp_path):
    again = compile_to(tmp_path / "again")
    assert body(again / "passes" / LOWER) == body(program_dir / "passes" / LOWER)


def test_inspect_after_lower_rank_prints_its_stage_calls(program_dir, capsys):
    assert main(["inspect", str(program_dir), "--after", "lower", "--rank", "1"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("rank 1: 1POST_F0") and lines[1] == \
        "# lowered program of stage 1 (rank 1)"
    assert "grad_sync[op=allreduce] grad.L4+0" in out and "adamw[zero=0] grad.L5+0" in out
    assert "1F0:" in lines and "0F0:" not in lines  # stage 1's tasks only
    assert "# L1 " not in out and "stage 0" not in out  # none of stage 0's layers
    assert main(["inspect", str(program_dir), "--after", "lower", "--rank", "2"]) == 0
    replica = capsys.readouterr().out.splitlines()  # rank 2 is stage 0's second replica
    assert replica[1] == "# lowered program of stage 0 (rank 2)" and "0F0:" in replica


def test_inspect_before_lower_rank_prints_only_the_task_list(program_dir, capsys):
    assert main(["inspect", str(program_dir), "--after", "plan_memory", "--rank", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rank 1: ") and out.count("\n") == 1
