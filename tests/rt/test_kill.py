"""A rank killed mid-run (SIGKILL): `ratrain run` ends every rank within 30 s, exits
non-zero and its last line names the lost rank (hydra names only its PID) and the last
checkpoint, from which the run then resumes to its end."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ratrain.cli import main as ratrain_main
from ratrain.rt.launch import process_start, rank_processes
from ratrain.rt.checkpoint import latest_checkpoint
from rt_reference import CONFIG, progression_rows, read_metrics

pytestmark = pytest.mark.mpi

T = 16


@pytest.fixture
def job(tmp_path):
    """A 2-rank `ratrain run` that would train for a long time, checkpointing every 5 steps."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    np.save(tmp_path / "tokens.npy", progression_rows(64, T, CONFIG["vocab_size"]))
    program = tmp_path / "pp2"
    assert ratrain_main(["compile", str(tmp_path / "config.json"), "--seq-len", str(T),
                         "--pp", "2", "--micro-batches", "2", "--precision", "fp32",
                         "-o", str(program)]) == 0
    common = ["--data", tmp_path / "tokens.npy", "--save-dir", tmp_path / "ckpt"]
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        launcher = subprocess.Popen(
            ratrain_command("run", program, "--steps", 100_000, "--save-every", 5,
                            "--metrics", tmp_path / "metrics.jsonl", *common),
            stdout=out, stderr=err)
    yield launcher, tmp_path, program, common
    if launcher.poll() is None:  # the test failed before the job ended: Ctrl-C stops it all
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=60)


def ratrain_command(*args) -> list[str]:
    return [sys.executable, "-m", "ratrain.cli", *map(str, args)]


def wait_for_steps(launcher, tmp_path, steps: int, timeout=120):
    deadline, metrics = time.monotonic() + timeout, tmp_path / "metrics.jsonl"
    while not (metrics.exists() and len(read_metrics(metrics)) >= steps):
        assert launcher.poll() is None and time.monotonic() < deadline, \
            (tmp_path / "err.txt").read_text()
        time.sleep(0.2)


def test_killed_rank_is_named_and_the_run_resumes(job):
    launcher, tmp_path, program, common = job
    wait_for_steps(launcher, tmp_path, 12)
    ranks = rank_processes(launcher.pid)
    assert sorted(rank for rank, _ in ranks.values()) == [0, 1]
    victim = next(pid for pid, (rank, _) in ranks.items() if rank == 1)
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)

    code = launcher.wait(timeout=30)
    while any(process_start(pid) == started for pid, (_, started) in ranks.items()):
        assert time.monotonic() - killed < 30, "a rank outlived the job"
        time.sleep(0.1)
    assert code != 0
    last = (tmp_path / "err.txt").read_text().splitlines()[-1]
    checkpoints = sorted((tmp_path / "ckpt").glob("step-*"))
    assert checkpoints, "no checkpoint before the kill"
    assert re.fullmatch(rf"ratrain: error: rank 1 \(pid {victim}\) was killed by signal 9 "
                        rf"\(SIGKILL\); every rank stopped; the last checkpoint is "
                        rf"{re.escape(str(checkpoints[-1]))}: continue with `ratrain run "
                        rf"{re.escape(str(program))} --resume .*", last), last
    assert "BAD TERMINATION" not in (tmp_path / "out.txt").read_text()  # held back: ours says more

    done = int(checkpoints[-1].name.split("-")[1])
    resumed = subprocess.run(ratrain_command(
        "run", program, "--resume", checkpoints[-1], "--steps", done + 3,
        "--metrics", tmp_path / "resumed.jsonl", *common), capture_output=True, text=True,
        timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert [r["step"] for r in read_metrics(tmp_path / "resumed.jsonl")] == \
        [done + 1, done + 2, done + 3]
    assert (tmp_path / "ckpt" / f"step-{done + 3:06d}" / "model.safetensors.index.json").is_file()


def test_last_checkpoint_is_the_highest_complete_step(tmp_path):
    for name in ("step-000005", "step-999999", "step-1000000", ".step-2000000.tmp"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trainer_state.json").write_text("{}")
    (tmp_path / "step-3000000").write_text("not a checkpoint directory")
    (tmp_path / "step-4000000").mkdir()  # no trainer_state.json: not one of ours
    assert latest_checkpoint(str(tmp_path)) == tmp_path / "step-1000000"
    assert latest_checkpoint(str(tmp_path / "none")) is None and latest_checkpoint(None) is None
