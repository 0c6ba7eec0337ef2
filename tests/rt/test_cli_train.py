"""`ratrain train` and `ratrain run`: compile + mpiexec in one command, a summary at the
end; run forwards the training options and returns the runtime's exit code."""
import json
import subprocess
import sys

import pytest

from ratrain import models

pytestmark = pytest.mark.mpi


def ratrain(*args, timeout=150):
    return subprocess.run([sys.executable, "-m", "ratrain.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("train") / "run"
    return run_dir, ratrain("train", "--steps", 3, "--seq-len", 32, "--global-batch", 4,
                            "--out", run_dir, "--trace", run_dir / "trace")


def test_train_on_defaults_prints_progress_and_summary(trained):
    run_dir, result = trained
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "pp 2 x dp 1" in lines[0]
    assert [l.split()[1] for l in lines if l.startswith("step ")] == ["1/3", "2/3", "3/3"]
    assert lines[-1].startswith("trained 3 steps: final loss") and str(run_dir) in lines[-1]
    steps = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert steps[-1]["loss"] < steps[0]["loss"]  # bytes of Python source are learnable
    _, params = models.load_pretrained(run_dir / "checkpoints" / "step-000003")  # 2 shards
    assert set(params) == set(models.param_shapes(models.get_config("tiny")))


def test_trace_has_every_task_of_every_step(trained):
    run_dir, _ = trained
    for rank in (0, 1):
        events = json.loads((run_dir / "trace" / f"trace-rank{rank}.json").read_text())
        tasks = [e for e in events["traceEvents"] if e["ph"] == "X"]
        assert {e["args"]["step"] for e in tasks} == {1, 2, 3}
        assert any(e["name"].startswith(f"{rank}F0") for e in tasks)
        assert all(e["dur"] >= 0 for e in tasks)


def test_run_forwards_options_and_exit_code(trained):
    run_dir, _ = trained
    bad = ratrain("run", run_dir / "program", "--steps", 1, "--data", run_dir / "none.npy")
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("ratrain: error: cannot read --data")
    wrong = ratrain("run", run_dir / "program", "-n", 1, "--steps", 1)
    assert wrong.returncode == 2 and "compiled for 2 ranks" in wrong.stderr
