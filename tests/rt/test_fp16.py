"""FP16 mixed precision under MPI: 200 steps of a small model with dynamic loss scaling,
the ratrain and baseline schedules on the same rows, give the same loss trajectory (within
0.081%) and the same loss-scale history, and the loss falls; a resumed fp16 run continues
with the checkpoint's loss scale, growth count and skipped steps, exactly; bad loss-scale
flags are one-line set-up errors."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from ratrain.cli import main as ratrain_main
from ratrain.rt.load import SetupError
from ratrain.rt.run import build_parser, loss_scaler, prepare
from ratrain.rt.train_options import check_run_numbers
from tiny_model import tiny_config

pytestmark = pytest.mark.mpi

CONFIG = tiny_config(hidden_size=64, intermediate_size=128, max_position_embeddings=64,
                     initializer_range=0.02)
T, M, B, STEPS, ROWS = 32, 4, 2, 200, 512
# 2**24 overflows the first steps (the logits' cotangent is about 2**24 / (M*B*T) = 2**16
# where a target is unlikely), and a short window lets the scale grow back during the run.
INITIAL_SCALE, WINDOW = 2.0 ** 24, 20
HYPER = ["--lr", "1e-3", "--lr-schedule", "constant", "--seed", "1", "--no-shuffle",
         "--initial-loss-scale", INITIAL_SCALE]
RECORDED = ("step", "loss", "lr", "grad_norm", "loss_scale", "skipped", "skipped_steps")


def mpirun(*args, timeout=1200):
    return subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "ratrain.rt",
                           *map(str, args)], capture_output=True, text=True, timeout=timeout)


def progression_workdir(root):
    """`root` with CONFIG's config.json and rows.npy: arithmetic progressions mod the
    vocabulary, learnable, so the loss must fall."""
    (root / "config.json").write_text(json.dumps(CONFIG))
    rng = np.random.default_rng(0)
    start, stride = rng.integers(0, 64, (ROWS, 1)), rng.integers(1, 4, (ROWS, 1))
    np.save(root / "rows.npy", (start + stride * np.arange(T + 1)) % CONFIG["vocab_size"])
    return root


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return progression_workdir(tmp_path_factory.mktemp("fp16"))


def compile_fp16(workdir, schedule: str):
    out = workdir / f"fp16-{schedule}"
    if not out.exists():
        assert ratrain_main(["compile", str(workdir / "config.json"), "--precision", "fp16",
                             "--seq-len", str(T), "--pp", "2", "--micro-batches", str(M),
                             "--micro-batch-size", str(B), "--recompute", "none",
                             "--schedule", schedule, "-o", str(out)]) == 0
    return out


def train(workdir, name: str, schedule: str, *args, window: int = WINDOW):
    metrics = workdir / f"{name}.jsonl"
    run = mpirun(compile_fp16(workdir, schedule), "--data", workdir / "rows.npy",
                 "--metrics", metrics, "--loss-scale-window", window, *HYPER, *args)
    assert run.returncode == 0, run.stderr
    return run, [json.loads(line) for line in metrics.read_text().splitlines()]


def check_scaler_history(records) -> None:
    """GradScaler's rule, step by step, from the metrics alone."""
    scale, good, skipped = INITIAL_SCALE, 0, 0
    for r in records:
        assert r["loss_scale"] == scale
        skipped += r["skipped"]
        assert r["skipped_steps"] == skipped
        assert (r["grad_norm"] is None) == r["skipped"]
        good = 0 if r["skipped"] else good + 1
        scale = scale / 2 if r["skipped"] else scale * 2 if good == WINDOW else scale
        good %= WINDOW


def test_fp16_schedules_agree_and_the_loss_falls(workdir):
    runs = {s: train(workdir, s, s, "--steps", STEPS) for s in ("ratrain", "baseline")}
    (run, ours), (_, baseline) = runs["ratrain"], runs["baseline"]
    assert [r["step"] for r in ours] == list(range(1, STEPS + 1))
    loss, reference = (np.array([r["loss"] for r in rs]) for rs in (ours, baseline))
    assert np.max(np.abs(loss - reference) / reference) < 8.1e-4
    history = [(r["loss_scale"], r["skipped"]) for r in ours]
    assert history == [(r["loss_scale"], r["skipped"]) for r in baseline]
    check_scaler_history(ours)
    assert ours[0]["skipped"] and 0 < ours[-1]["skipped_steps"] < STEPS // 4
    assert any(b["loss_scale"] > a["loss_scale"] for a, b in zip(ours, ours[1:]))
    quarters = loss.reshape(4, -1).mean(axis=1)
    assert loss[:20].mean() > 3.0 and loss[-20:].mean() < loss[:20].mean() / 10
    assert all(a > b for a, b in zip(quarters, quarters[1:])), quarters
    first_line = next(l for l in run.stdout.splitlines() if l.startswith("step "))
    assert first_line.startswith("step 1/200") and first_line.endswith(
        "loss scale 1.67772e+07  skipped (gradient overflow)")
    assert f"{ours[-1]['skipped_steps']} skipped steps" in run.stdout.splitlines()[-1]


@pytest.mark.slow
def test_fp16_resume_continues_the_loss_scale_exactly(workdir):
    """Window 2 makes the growth count matter: resume right after a finite step that
    followed an overflow (count 1), before a finite step (which then doubles the scale)."""
    saved, steps = workdir / "saved", 12
    _, whole = train(workdir, "whole", "ratrain", "--steps", steps, "--save-dir", saved,
                     "--save-every", 1, "--keep-last", 0, window=2)
    at = next(s for s in range(2, steps - 1) if whole[s - 2]["skipped"] and
              not whole[s - 1]["skipped"] and not whole[s]["skipped"])
    state = json.loads((saved / f"step-{at:06d}" / "trainer_state.json").read_text())
    assert state["loss_scale"]["growth_tracker"] == 1 and state["skipped_steps"] > 0
    _, resumed = train(workdir, "resumed", "ratrain", "--steps", steps, "--resume",
                       saved / f"step-{at:06d}", window=2)
    project = lambda records: [{k: r[k] for k in RECORDED} for r in records]
    assert project(resumed) == project(whole[at:])
    assert resumed[1]["loss_scale"] == 2 * resumed[0]["loss_scale"]


@pytest.mark.parametrize("flags,message", [
    (["--initial-loss-scale", "0"], "--initial-loss-scale must be positive"),
    (["--initial-loss-scale", "1e39"], "at most 3.4e38"),
    (["--loss-scale-window", "0"], "--loss-scale-window must be at least 1, got 0")])
def test_bad_loss_scale_options_are_one_line_errors(flags, message):
    """Checked by check_run_numbers: by the CLI before anything is written, and by prepare."""
    args = build_parser().parse_args(["prog", *flags])
    problem = check_run_numbers(args)
    assert re.search(message, problem) and "\n" not in problem
    with pytest.raises(SetupError, match=message):
        prepare(args, world_size=1)


def test_fp32_runs_start_unscaled_and_fp16_resumes_its_scale():
    args = build_parser().parse_args(["prog", "--initial-loss-scale", "1024"])
    saved = {"loss_scale": {"scale": 512.0, "growth_tracker": 7}}
    assert loss_scaler(args, "fp32", saved).scale == 1.0
    assert loss_scaler(args, "fp16", {}).scale == 1024.0
    resumed = loss_scaler(args, "fp16", saved)
    assert (resumed.scale, resumed.growth_tracker, resumed.growth_interval) == (512.0, 7, 2000)
