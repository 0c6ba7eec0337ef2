"""Stopping a run: SIGTERM (what Slurm and Kubernetes send) or a terminal's Ctrl-C stops
every rank after the step in flight, writes that step's checkpoint and ends with one
`ratrain:` line naming it and the command that resumes, with none of the MPI launcher's
own output; resuming from that checkpoint is bit-identical to an uninterrupted run
(fp32): after SIGTERM, `ratrain train --resume RUN` with no other option continues RUN in
place, in one metrics.jsonl. A second signal ends the job at once; ranks under mpiexec directly stop the same
way on SIGTERM."""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from ratrain.rt.launch import RankWatch, process_start, rank_processes
from ratrain.rt.stop import (CHECKPOINT, Stopped, command_text, resume_text,
                             signals_interrupt, stopped_by)
from rt_reference import assert_same_checkpoint, read_metrics

STEPS = 20  # the signal lands after step 2
# 2 ranks, fp32 (a resumed run repeats every bit); a step takes a few tenths of a second,
# long beside the time a signal takes to reach the ranks, short for the test
SHAPE = ["--seq-len", 64, "--global-batch", 8, "--pp", 2, "--micro-batches", 4,
         "--precision", "fp32"]
LAUNCHER_NOISE = ("assert", "BAD TERMINATION", "terminated badly", "YOUR APPLICATION",
                  "[mpiexec@", "[proxy:", "Abort(", "Traceback")


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "ratrain.cli", *map(str, args)]


_started: list[subprocess.Popen] = []


def start(command: list[str], out_dir) -> subprocess.Popen:
    """`command` in a session of its own (as a shell starts a foreground job: its process
    group gets the terminal's Ctrl-C), output to out_dir/out.txt and err.txt."""
    with open(out_dir / "out.txt", "w") as out, open(out_dir / "err.txt", "w") as err:
        _started.append(subprocess.Popen(command, stdout=out, stderr=err,
                                         start_new_session=True))
    return _started[-1]


@pytest.fixture(autouse=True)
def no_job_outlives_its_test():
    """A job a failed test leaves running (mpiexec in a session of its own, its ranks) is
    killed, so that it does not train on through the rest of the suite."""
    yield
    while _started:
        job = _started.pop()
        if job.poll() is None:
            RankWatch(job.pid, 0).kill_job(job)    # the job, its mpiexec, proxies and ranks
            job.wait()


def signal_after(job: subprocess.Popen, metrics, steps: int, send) -> tuple[int, dict]:
    """Once `metrics` has `steps` lines: the rank processes, then send(job); (the steps
    logged just before the signal, the ranks)."""
    deadline = time.monotonic() + 300
    while not (metrics.exists() and len(read_metrics(metrics)) >= steps):
        assert job.poll() is None and time.monotonic() < deadline, "no steps logged"
        time.sleep(0.1)
    ranks = rank_processes(job.pid)
    logged = len(read_metrics(metrics))
    send(job)
    return logged, ranks


def assert_ranks_gone(ranks: dict) -> None:
    deadline = time.monotonic() + 30
    while any(process_start(pid) == started for pid, (_, started) in ranks.items()):
        assert time.monotonic() < deadline, "a rank outlived the job"
        time.sleep(0.1)


def last_line(out_dir) -> str:
    """The last line of stderr, the one `ratrain:` line there; stdout and stderr hold none
    of mpiexec's internals."""
    text = (out_dir / "out.txt").read_text() + (out_dir / "err.txt").read_text()
    assert not [n for n in LAUNCHER_NOISE if n in text], text
    lines = (out_dir / "err.txt").read_text().splitlines()
    assert [l for l in lines if l.startswith("ratrain:")] == lines[-1:], lines
    return lines[-1]


def assert_checkpoint(checkpoint, step: int) -> None:
    """`checkpoint` holds step `step`, with the shard of each of the two stages."""
    assert json.loads((checkpoint / "trainer_state.json").read_text())["step"] == step
    assert {f"model-0000{s}-of-00002.safetensors" for s in (1, 2)} <= \
        {f.name for f in checkpoint.iterdir()}


def losses(metrics) -> list[float]:
    return [r["loss"] for r in read_metrics(metrics)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """(the losses of an uninterrupted `ratrain train` of STEPS steps, its program)."""
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    run = subprocess.run(cli("train", "--steps", STEPS, *SHAPE, "--out", run_dir),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return losses(run_dir / "metrics.jsonl"), run_dir / "program"


def send_sigterm(job):
    os.kill(job.pid, signal.SIGTERM)        # to the ratrain process, as Kubernetes does


def send_ctrl_c(job):
    os.killpg(job.pid, signal.SIGINT)       # to the process group, as a terminal does


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("send, name", [(send_sigterm, "SIGTERM"), (send_ctrl_c, "SIGINT")])
def test_signal_stops_train_at_one_step_and_resume_is_exact(tmp_path, uninterrupted,
                                                            send, name):
    run_dir = tmp_path / "run"
    job = start(cli("train", "--steps", STEPS, *SHAPE, "--out", run_dir), tmp_path)
    logged, ranks = signal_after(job, run_dir / "metrics.jsonl", 2, send)

    assert job.wait(timeout=120) == 128 + signal.Signals[name]
    assert_ranks_gone(ranks)
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")]
    last = steps[-1]
    # the step in flight, and at most the next one if it began before the signal landed
    assert steps == list(range(1, last + 1)) and logged <= last <= logged + 2 < STEPS
    checkpoint = run_dir / "checkpoints" / f"step-{last:06d}"
    assert_checkpoint(checkpoint, last)
    assert last_line(tmp_path) == (f"ratrain: stopped by {name} after step {last} of {STEPS}; "
                         f"checkpoint {checkpoint}; resume with: ratrain train --resume "
                         f"{run_dir}")

    if name == "SIGTERM":  # the printed command, no other option: the run continues in place
        resumed = subprocess.run(cli("train", "--resume", run_dir), capture_output=True,
                                 text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr
        assert losses(run_dir / "metrics.jsonl") == uninterrupted[0]   # one metrics file
        return
    resumed = subprocess.run(cli("run", run_dir / "program", "--resume", checkpoint,
                                 "--steps", STEPS, "--metrics", tmp_path / "resumed.jsonl"),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert losses(run_dir / "metrics.jsonl") + losses(tmp_path / "resumed.jsonl") == \
        uninterrupted[0]


@pytest.mark.mpi
@pytest.mark.slow
def test_ranks_under_mpiexec_stop_on_sigterm_and_print_their_resume(tmp_path, uninterrupted):
    """hydra forwards SIGTERM to every rank; the printed mpiexec command resumes exactly."""
    program = uninterrupted[1]
    metrics = tmp_path / "metrics.jsonl"
    job = start(["mpiexec", "-n", "2", sys.executable, "-m", "ratrain.rt", str(program),
                 "--steps", str(STEPS), "--save-dir", str(tmp_path / "ckpt"),
                 "--metrics", str(metrics)], tmp_path)
    logged, ranks = signal_after(job, metrics, 2, lambda j: j.send_signal(signal.SIGTERM))

    assert job.wait(timeout=120) == 143
    assert_ranks_gone(ranks)
    last = read_metrics(metrics)[-1]["step"]
    assert logged <= last <= logged + 2 < STEPS
    checkpoint = tmp_path / "ckpt" / f"step-{last:06d}"
    assert_checkpoint(checkpoint, last)
    line = last_line(tmp_path)
    said = re.fullmatch(rf"ratrain: stopped by SIGTERM after step {last} of {STEPS}; "
                        rf"checkpoint {re.escape(str(checkpoint))}; resume with: (.*)", line)
    assert said, line
    command = shlex.split(said.group(1))
    assert command[:8] == ["mpiexec", "-n", "2", sys.executable, "-m", "ratrain.rt",
                           str(program), "--resume"]
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert losses(metrics) == uninterrupted[0]  # the resumed run appended to the file


@pytest.mark.mpi
@pytest.mark.slow
def test_signal_to_one_rank_stops_every_rank_after_the_same_step(tmp_path, uninterrupted):
    """SIGTERM reaches rank 1 only (as when a scheduler signals ranks at different times):
    rank 0 learns of it from the agreement before the next step, so both stop there."""
    program, metrics, save_dir = uninterrupted[1], tmp_path / "metrics.jsonl", tmp_path / "ckpt"
    job = start(cli("run", program, "--steps", STEPS, "--save-dir", save_dir, "--metrics",
                    metrics), tmp_path)

    def rank_1_only(j):
        os.kill(next(p for p, (r, _) in rank_processes(j.pid).items() if r == 1), signal.SIGTERM)
    logged, ranks = signal_after(job, metrics, 2, rank_1_only)

    assert job.wait(timeout=120) == 143
    assert_ranks_gone(ranks)
    last = read_metrics(metrics)[-1]["step"]
    assert logged <= last <= logged + 2 < STEPS
    checkpoint = save_dir / f"step-{last:06d}"
    assert_checkpoint(checkpoint, last)
    assert last_line(tmp_path) == (f"ratrain: stopped by SIGTERM after step {last} of {STEPS}; "
                         f"checkpoint {checkpoint}; resume with: ratrain run {program} "
                         f"--resume {checkpoint} --steps {STEPS} --save-dir {save_dir} "
                         f"--metrics {metrics}")


@pytest.mark.mpi
@pytest.mark.slow
def test_second_signal_ends_the_job_at_once(tmp_path, uninterrupted):
    program = uninterrupted[1]
    metrics, save_dir = tmp_path / "metrics.jsonl", tmp_path / "ckpt"
    job = start(cli("run", program, "--steps", 100_000, "--save-every", 1, "--save-dir",
                    save_dir, "--metrics", metrics), tmp_path)

    def twice(j):  # two signals of one kind sent at once may merge into one pending
        send_ctrl_c(j)
        send_sigterm(j)
    _, ranks = signal_after(job, metrics, 2, twice)

    # sent at once, the two may be handled in either order: the first names the exit
    # code (NOTE [stop exit code]), the line the second
    code = job.wait(timeout=60)
    assert code in (130, 143)
    second = "SIGTERM" if code == 130 else "SIGINT"
    assert_ranks_gone(ranks)
    checkpoint = sorted(save_dir.glob("step-*"))[-1]
    assert last_line(tmp_path) == (
        f"ratrain: stopped at once by a second signal ({second}): the step in flight is "
        f"lost; every rank stopped; the last checkpoint is {checkpoint}: continue with "
        f"`ratrain run {program} --resume {checkpoint} --steps 100000 --save-dir {save_dir} "
        f"--save-every 1 --metrics {metrics}`")


def test_resume_command_fills_in_the_checkpoint_quoted():
    command = command_text(["ratrain", "run", "my runs/p", "--resume", CHECKPOINT,
                            "--steps", 9])
    assert command == "ratrain run 'my runs/p' --resume {checkpoint} --steps 9"
    assert shlex.split(resume_text(command, "my runs/ckpt/step-000003")) == \
        ["ratrain", "run", "my runs/p", "--resume", "my runs/ckpt/step-000003", "--steps", "9"]


def test_sigterm_outside_a_job_interrupts_as_ctrl_c_does():
    """Before the ranks start (compiling, tokenizing) the command ends with its own line."""
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as stopped:
        with signals_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert stopped_by(stopped.value) == signal.SIGTERM
    assert stopped_by(KeyboardInterrupt()) == signal.SIGINT
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.mpi
@pytest.mark.slow
def test_sigterm_then_train_resume_of_a_tied_bpe_model_on_text_is_exact(tmp_path):
    """Issue 25's case: a tied LLaMA with its own BPE tokenizer.json, trained on text,
    SIGTERM mid-run, then `ratrain train --resume RUN` with no other option: the run
    continues in place, one metrics.jsonl, losses equal to an uninterrupted run's (fp32),
    and its checkpoints carry the model's tokenizer (not byte tokens). Started with
    --init-from (whose resumed run takes its tokenizer from the checkpoint it resumed
    from, not from a --model directory) and --save-every 5 --keep-last 3: the resumed
    run's saves rotate out the checkpoint it resumed from and go on landing (issue 41,
    item 0: the next save failed copying that one's tokenizer, on 613e35c), and the last
    of them equals the uninterrupted run's last, byte for byte."""
    from run_dir_fixtures import text, write_model_dir
    model = write_model_dir(tmp_path / "model", weights=True)
    (tmp_path / "train.txt").write_text(text(400, 1))
    steps = 150  # a step takes milliseconds: enough of them that the signal lands mid-run
    train = ["--init-from", model, "--data", tmp_path / "train.txt", "--steps", steps,
             "--seq-len", 32, "--global-batch", 4, "--precision", "fp32",
             "--save-every", 5, "--keep-last", 3]
    whole_dir = tmp_path / "whole"
    whole = subprocess.run(cli("train", *train, "--out", whole_dir),
                           capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr

    run_dir = tmp_path / "run"
    job = start(cli("train", *train, "--out", run_dir), tmp_path)
    _, ranks = signal_after(job, run_dir / "metrics.jsonl", 2, send_sigterm)
    assert job.wait(timeout=120) == 128 + signal.SIGTERM
    assert_ranks_gone(ranks)
    last = read_metrics(run_dir / "metrics.jsonl")[-1]["step"]
    assert last < steps, "the run ended before the signal: make its steps longer"
    checkpoint = run_dir / "checkpoints" / f"step-{last:06d}"
    assert (checkpoint / "tokenizer.json").read_bytes() == \
        (model / "tokenizer.json").read_bytes()
    assert last_line(tmp_path).endswith(f"resume with: ratrain train --resume {run_dir}")

    resumed = subprocess.run(cli("train", "--resume", run_dir), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert losses(run_dir / "metrics.jsonl") == losses(tmp_path / "whole" / "metrics.jsonl")
    assert last + 15 < steps, "too few saves after the resume to rotate its checkpoint out"
    kept = [sorted(p.name for p in (d / "checkpoints").iterdir()) for d in (run_dir, whole_dir)]
    assert kept[0] == kept[1] == [f"step-{s:06d}" for s in (steps - 10, steps - 5, steps)]
    finals = [d / "checkpoints" / f"step-{steps:06d}" for d in (run_dir, whole_dir)]
    assert (finals[0] / "tokenizer.json").is_file()
    assert_same_checkpoint(*finals)
