"""The commit rule under MPI (NOTE [commit rule], passes/insert_update.py): programs
compiled with --update-rule commit and after-norm train to bit-identical losses, norms,
loss scales and weights, on steps that clip (a tiny --clip) and on fp16 steps that
overflow (a huge initial loss scale); the commit run's trace shows updates running before
the step's NORM, which under after-norm comes before every update."""
import json

import numpy as np
import pytest

from ratrain import models
from ratrain.cli import main as ratrain_main
from rt_reference import CONFIG, mpirun, read_metrics, write_workdir

pytestmark = pytest.mark.mpi

T, M, B, STEPS = 16, 2, 2, 6
HYPER = ["--lr", "0.01", "--lr-schedule", "constant", "--eps", "1e-6", "--weight-decay", "0.1",
         "--seed", "3", "--no-shuffle"]
# large enough that the first steps overflow fp16 gradients, small enough that later ones do not
HUGE_SCALE = str(2.0 ** 20)
RECORDED = ("loss", "grad_norm", "loss_scale", "skipped", "skipped_steps")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return write_workdir(tmp_path_factory.mktemp("commit"), CONFIG, 64, T)


def compile_rule(workdir, name: str, rule: str, pp: int, dp: int, *extra):
    out = workdir / f"{name}-{rule}"
    if not out.exists():
        assert ratrain_main(["compile", str(workdir / "config.json"), "--seq-len", str(T),
                             "--pp", str(pp), "--dp", str(dp), "--micro-batches", str(M),
                             "--micro-batch-size", str(B), "--recompute", "none",
                             "--update-rule", rule, *extra, "-o", str(out)]) == 0
    return out


def train(workdir, program, ranks: int, *args):
    """(metrics records, final weights by name) of a run of `program`."""
    metrics, saved = (workdir / f"{program.name}.{kind}" for kind in ("jsonl", "saved"))
    run = mpirun(ranks, program, "--steps", STEPS, "--data", workdir / "tokens.npy",
                 "--metrics", metrics, "--save-dir", saved, *HYPER, *args, timeout=300)
    assert run.returncode == 0, run.stderr
    _, weights = models.load_pretrained(saved / f"step-{STEPS:06d}")
    return read_metrics(metrics), weights


CASES = {  # name -> (pp, dp, compile flags, run flags)
    "clip-pp2": (2, 1, ("--clip", "1e-3"), ()),
    "fp16-zero2": (1, 2, ("--precision", "fp16", "--zero", "2"),
                   ("--initial-loss-scale", HUGE_SCALE, "--loss-scale-window", "2")),
    "fp16-clip-pp2-dp2": (2, 2, ("--precision", "fp16", "--zero", "1", "--clip", "0.05"),
                          ("--initial-loss-scale", HUGE_SCALE, "--loss-scale-window", "2")),
}


@pytest.mark.parametrize("name", [
    "clip-pp2", pytest.param("fp16-zero2", marks=pytest.mark.slow),
    pytest.param("fp16-clip-pp2-dp2", marks=pytest.mark.slow)])
def test_commit_and_after_norm_train_bit_identically(workdir, name):
    pp, dp, flags, run_flags = CASES[name]
    runs = {rule: train(workdir, compile_rule(workdir, name, rule, pp, dp, *flags), pp * dp,
                        *run_flags) for rule in ("commit", "after-norm")}
    assert_trained_identically(runs["commit"], runs["after-norm"], flags)


def assert_trained_identically(run, reference_run, flags) -> None:
    """Two runs' (records, weights) are bit-identical; a --clip run clipped some step and
    an fp16 run skipped its first steps (overflow) and not all of them."""
    (records, weights), (reference, reference_weights) = run, reference_run
    project = lambda rs: [{k: r[k] for k in RECORDED if k in r} for r in rs]
    assert project(records) == project(reference)
    assert weights.keys() == reference_weights.keys()
    assert all(np.array_equal(weights[k], reference_weights[k]) for k in weights)
    if "--clip" in flags:
        clip = float(flags[flags.index("--clip") + 1])
        assert any(r["grad_norm"] is not None and r["grad_norm"] > clip for r in records)
    if "fp16" in flags:
        assert records[0]["skipped"] and not all(r["skipped"] for r in records)


def _spans(trace_dir, rank: int) -> dict:
    """Task text -> (start, end) microseconds of step 2 on `rank`."""
    events = json.loads((trace_dir / f"trace-rank{rank}.json").read_text())["traceEvents"]
    return {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in events
            if e.get("ph") == "X" and e["args"]["step"] == 2}


def test_trace_shows_updates_before_the_norm(workdir):
    """dp 2, fp16: under commit the first update (the last layer's) starts right after its
    own SYNC, before the first layer's UPD waits for the stage's last SYNC, and before the
    NORM; under after-norm the NORM (which waits for every SYNC) ends before any UPD."""
    flags = ("--precision", "fp16", "--zero", "1")
    last = len(models.layer_specs(CONFIG)) - 1
    losses = {}
    for rule in ("commit", "after-norm"):
        program = compile_rule(workdir, "trace", rule, 1, 2, *flags)
        trace_dir = workdir / f"trace-{rule}"
        metrics = workdir / f"trace-{rule}.jsonl"
        run = mpirun(2, program, "--steps", 3, "--data", workdir / "tokens.npy", "--metrics",
                     metrics, "--trace", trace_dir, *HYPER, timeout=300)
        assert run.returncode == 0, run.stderr
        losses[rule] = [r["loss"] for r in read_metrics(metrics)]
        for rank in (0, 1):
            spans = _spans(trace_dir, rank)
            norm = spans["0NORM"]
            updates = {t: s for t, s in spans.items() if "UPD[" in t}
            assert len(updates) == last + 1
            if rule == "commit":
                first = spans[f"0UPD[L{last}]"]
                assert first[0] < spans["0UPD[L0]"][0] and first[1] <= norm[0]
                assert all(end <= norm[0] for _, end in updates.values())
            else:
                assert all(start >= norm[1] for start, _ in updates.values())
    assert losses["commit"] == losses["after-norm"]
