"""zb1 under MPI (NOTE [zb1 schedule], passes/schedule_zb1.py): programs compiled with
--pipeline-schedule zb1 and 1f1b train to bit-identical losses, norms, loss scales and
weights (fp32; with clipping; fp16 steps that overflow and roll back; bf16), for
pipelines of 2 and 4 stages, DP with ZeRO 2 (also reduce-scattered per micro-batch) and
3, tied embeddings and the baseline lifecycle; the zb1 run's measured arena peak is its
plan's."""
import pytest

from ratrain import models
from ratrain.cli import main as ratrain_main
from rt_reference import CONFIG, write_workdir
from test_commit_rule_mpi import B, HUGE_SCALE, T, assert_trained_identically, train

pytestmark = pytest.mark.mpi

M = 4  # micro-batches: zb1 has W's to defer
TIED = models.fill_defaults(dict(CONFIG, tie_word_embeddings=True))

CASES = {  # name -> (pp, dp, compile flags, run flags, tied)
    "pp2": (2, 1, (), (), False),
    "pp4": (4, 1, (), (), False),
    "pp2-dp2-zero2": (2, 2, ("--zero", "2"), (), False),
    "pp2-dp2-zero3": (2, 2, ("--zero", "3"), (), False),
    "pp2-dp2-zero2-scatter": (2, 2, ("--zero", "2", "--grad-accum", "scatter"), (), False),
    "tied-pp2": (2, 1, (), (), True),
    "baseline-pp2": (2, 1, ("--schedule", "baseline"), (), False),
    "clip-pp2": (2, 1, ("--clip", "1e-3"), (), False),
    "fp16-clip-pp2-dp2": (2, 2, ("--precision", "fp16", "--zero", "1", "--clip", "0.05"),
                          ("--initial-loss-scale", HUGE_SCALE, "--loss-scale-window", "2"),
                          False),
    "bf16-pp2": (2, 1, ("--precision", "bf16"), (), False),   # the head's G kept in bf16
}
QUICK = {"pp2", "pp4"}


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    return {tied: write_workdir(tmp_path_factory.mktemp("zb1-tied" if tied else "zb1"),
                                TIED if tied else CONFIG, 64, T) for tied in (False, True)}


def compile_schedule(workdir, name: str, schedule: str, pp: int, dp: int, *extra):
    out = workdir / f"{name}-{schedule}"
    flags = ("--precision", "fp32") if "--precision" not in extra else ()
    assert ratrain_main(["compile", str(workdir / "config.json"), "--seq-len", str(T),
                         "--pp", str(pp), "--dp", str(dp), "--micro-batches", str(M),
                         "--micro-batch-size", str(B), "--recompute", "none",
                         "--pipeline-schedule", schedule, *flags, *extra,
                         "-o", str(out)]) == 0
    return out


@pytest.mark.parametrize("name", [name if name in QUICK else
                                  pytest.param(name, marks=pytest.mark.slow) for name in CASES])
def test_zb1_trains_bit_identically_to_1f1b(workdirs, name):
    pp, dp, flags, run_flags, tied = CASES[name]
    workdir = workdirs[tied]
    runs = {s: train(workdir, compile_schedule(workdir, name, s, pp, dp, *flags), pp * dp,
                     *run_flags) for s in ("zb1", "1f1b")}
    assert_trained_identically(runs["zb1"], runs["1f1b"], flags)
    records = runs["zb1"][0]
    assert records[-1]["arena_peak_bytes"] == records[-1]["planned_peak_bytes"]
