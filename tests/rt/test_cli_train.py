"""`ratrain train` and `ratrain run`: compile + mpiexec in one command, a line per phase,
progress with MFU, one summary and a loss plot at the end; run forwards the training
options and returns the runtime's exit code."""
import importlib.util
import json
import subprocess
import sys

import pytest

from test_progress import png_size

from ratrain import models
from ratrain.hw.profiles import load_profile
from ratrain.ir.costs import node_flops
from ratrain.ir.tasks import parse_task
from ratrain.models.trace import trace_model
from ratrain.rt.loggers import loggers_problem

pytestmark = pytest.mark.mpi


def ratrain(*args, timeout=150):
    return subprocess.run([sys.executable, "-m", "ratrain.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


# --log-to tensorboard where the extra is installed (and tensorboard, which reads it back)
TENSORBOARD = loggers_problem("tensorboard", "metrics.jsonl") or \
    (None if importlib.util.find_spec("tensorboard") else "no tensorboard package to read "
     "the event files: pip install tensorboard")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("train") / "run"
    return run_dir, ratrain("train", "--steps", 3, "--seq-len", 32, "--global-batch", 4,
                            "--out", run_dir, "--trace", run_dir / "trace",
                            "--save-every", 1, "--keep-last", 2, "--log-every", 5,
                            *([] if TENSORBOARD else ["--log-to", "tensorboard"]))


def test_train_on_defaults_prints_progress_and_summary(trained):
    run_dir, result = trained
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("compiling tiny for 2 ranks (pp 2 x dp 1")
    # See NOTE [this machine's profile]: the tests pin the shipped one (tests/conftest.py)
    peak = load_profile("cpu")["threads"]["1"]["fp32_flops"] / 1e9
    assert lines[1] == ("MFU against the shipped cpu profile (measured on another machine): "
                        f"2 ranks x {peak:.1f} GFLOP/s fp32 peak")
    assert lines[2].startswith(f"compiled into {run_dir}/program in ")
    assert lines[2].endswith("; starting 2 ranks with mpiexec")
    assert lines[3].startswith("2 ranks up: building the stage code")
    assert lines[4] == "first step: 1/3 (it also warms up)"
    # --log-every 5: the first step and the last (metrics.jsonl has every step)
    assert [l.split()[1] for l in lines if l.startswith("step ")] == ["1/3", "3/3"]
    assert [l for l in lines if l.startswith("removed ")] == ["removed step-000001 (keep-last 2)"]
    assert lines[-2] == f"plotted the loss in {run_dir}/loss.png"
    assert lines[-1].startswith("done: 3 steps in ") and "final loss" in lines[-1]
    assert lines[-1].endswith(f"; metrics {run_dir}/metrics.jsonl")
    assert "(MFU " in lines[-1] and " against the shipped cpu profile (measured on another " \
        "machine)); per rank" in lines[-1]
    assert sum(l.startswith("done: ") for l in lines) == 1  # one summary
    steps = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert steps[-1]["loss"] < steps[0]["loss"]  # bytes of Python source are learnable
    _, params = models.load_pretrained(run_dir / "checkpoints" / "step-000003")  # 2 shards
    assert set(params) == set(models.param_shapes(models.get_config("tiny")))


def test_train_log_holds_what_the_terminal_showed(trained):
    """See NOTE [the run's log]: RUN/train.log is the command's output, first line included."""
    run_dir, result = trained
    assert result.stderr == ""
    assert (run_dir / "train.log").read_text() == result.stdout


@pytest.mark.skipif(TENSORBOARD is not None, reason=f"--log-to tensorboard: {TENSORBOARD}")
def test_tensorboard_events_hold_the_loss_of_every_step(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run_dir, _ = trained
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    steps = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == \
        [(s["step"], pytest.approx(s["loss"], rel=1e-6)) for s in steps]
    assert [e.step for e in events.Scalars("train/lr")] == [1, 2, 3]


def test_mfu_is_model_flops_over_step_seconds_over_peak(trained):
    """MFU = model FLOPs of a step (3 x the traced forward, by the rule tables, for the 4
    micro-batches of 1 x 32 tokens) / step seconds / peak of 2 ranks (each 1 of the cpu
    profile's 2 node cores: its 1-thread fp32 rate)."""
    run_dir, _ = trained
    graph = trace_model(models.get_config("tiny"), micro_batch_size=1, seq_len=32)
    forward = sum(node_flops(node) for layer in graph.layers
                  for node in graph.kinds[layer.kind].fwd.nodes)
    model_flops = 3 * forward * 4
    peak = 2 * load_profile("cpu")["threads"]["1"]["fp32_flops"]
    steps = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for s in steps:
        assert s["model_flops"] == model_flops
        assert s["mfu"] == pytest.approx(model_flops / s["step_seconds"] / peak, rel=0.01)
        assert 0 < s["mfu"] < 1 and s["eta_s"] >= 0
    assert 0 < steps[0]["elapsed_s"] < steps[1]["elapsed_s"] < steps[2]["elapsed_s"]
    assert steps[-1]["eta_s"] == 0
    line = next(l for l in trained[1].stdout.splitlines() if l.startswith("step 3/3"))
    assert f"MFU {steps[-1]['mfu']:.1%}" in line and "  mem " in line and "  ETA 0.0s" in line


def test_run_directory_holds_the_loss_plot(trained):
    run_dir, _ = trained
    assert png_size(run_dir / "loss.png") == (800, 500)


def test_trace_has_every_task_of_every_step(trained):
    run_dir, _ = trained
    for rank in (0, 1):
        events = json.loads((run_dir / "trace" / f"trace-rank{rank}.json").read_text())
        tasks = [e for e in events["traceEvents"] if e["ph"] == "X"]
        assert {e["args"]["step"] for e in tasks} == {1, 2, 3}
        assert any(e["name"].startswith(f"{rank}F0") for e in tasks)
        assert all(e["dur"] >= 0 for e in tasks)
        # a native step's calls, each clocked (NOTE [calls in the trace])
        native = [s for e in tasks for s in e["args"]["calls"] if len(s) == 5]
        assert any(count > 1 for _, count, *_ in native)
        for _, count, _, run, each in native:
            assert len(each) == count and min(each) >= 0 and sum(each) <= run + 0.1 * count


def test_simulate_against_the_trace_of_the_run(trained):
    """`ratrain simulate --against` reads what `--trace` wrote of the same program: a row per
    stage and kind, each measured figure the median over steps 2-3 of what the trace holds."""
    run_dir, _ = trained
    done = ratrain("simulate", run_dir / "program", "--against", run_dir / "trace",
                   "--skip-steps", 1)
    assert done.returncode == 0, done.stderr
    table = done.stdout.split("median of steps 2-3")[1].splitlines()
    rows = {tuple(line.split()[:2]): line.split()[2] for line in table[2:-1]}
    step = float(table[-1].split("step: measured ")[1].split(" ms")[0])
    assert step >= max(float(rows[str(s), "all"]) for s in (0, 1)) > 0
    for stage in (0, 1):
        events = json.loads((run_dir / "trace" / f"trace-rank{stage}.json").read_text())
        forward = sorted(sum(e["dur"] for e in events["traceEvents"] if e["ph"] == "X" and
                             e["args"]["step"] == step and parse_task(e["name"]).kind == "F")
                         for step in (2, 3))
        assert float(rows[str(stage), "F"]) == pytest.approx(sum(forward) / 2e3, abs=0.006)
        assert float(rows[str(stage), "all"]) > float(rows[str(stage), "F"]) > 0


def test_run_forwards_options_and_exit_code(trained):
    run_dir, _ = trained
    bad = ratrain("run", run_dir / "program", "--steps", 1, "--data", run_dir / "none.npy")
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("ratrain: error: cannot read --data")
    wrong = ratrain("run", run_dir / "program", "-n", 1, "--steps", 1)
    assert wrong.returncode == 2 and "compiled for 2 ranks" in wrong.stderr
