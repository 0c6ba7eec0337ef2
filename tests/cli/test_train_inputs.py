"""`ratrain train` checks every input before it writes anything: each bad input is one
`ratrain: error:` line, exit 2, no traceback and no run directory; and the default layout
fits any core count (dp divides the batch, 2+ micro-batches, ranks <= cores)."""
import json
import subprocess
import sys

from pathlib import Path

import pytest

from ratrain.cli import UserError
from ratrain.cli.train_inputs import resolve_layout
from ratrain.hw import load_profile
from ratrain.rt.threads import thread_environment
from ratrain.sim.simulate import rank_profile
from ratrain.models import get_config

TINY_LAYERS = get_config("tiny")["num_hidden_layers"] + 2   # embedding + decoders + head


def ratrain_train(*args):
    return subprocess.run([sys.executable, "-m", "ratrain.cli", "train", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def bad_configs(root):
    """config.json files a user might get wrong, by name."""
    tiny = get_config("tiny")
    cases = {"no-heads": {k: v for k, v in tiny.items() if k != "num_attention_heads"},
             "hidden-as-text": tiny | {"hidden_size": "256"},
             "heads-not-dividing": tiny | {"num_attention_heads": 3},
             "window-too-short": tiny | {"model_type": "mistral", "sliding_window": 64},
             "not-json": None}
    paths = {}
    for name, config in cases.items():
        paths[name] = root / f"{name}.json"
        paths[name].write_text("{hidden" if config is None else json.dumps(config))
    return paths


BAD_FLAGS = {
    "pp 0": ["--pp", 0], "dp 0": ["--dp", 0], "steps 0": ["--steps", 0],
    "steps -3": ["--steps", -3], "global-batch 0": ["--global-batch", 0],
    "seq-len 0": ["--seq-len", 0], "micro-batches 0": ["--micro-batches", 0],
    "keep-last -1": ["--keep-last", -1], "save-every -1": ["--save-every", -1],
    "pp over layers": ["--pp", TINY_LAYERS + 1], "dp not dividing": ["--dp", 3],
    "micro-batches not dividing": ["--micro-batches", 3],
    "unknown model": ["--model", "no-such-model"],
    "unwritable save-dir": ["--save-dir", "/proc/ratrain-x"],
    "resume nothing": ["--resume", "."],
    "data missing": ["--data", "/nonexistent/corpus.txt"],
    "data empty": ["--data", "EMPTY"],
    "data unknown kind": ["--data", "FILE"],
    "eval-every without eval-data": ["--eval-every", 5],
    "progress-us -1": ["--progress-us", -1],
    "initial-loss-scale 0": ["--initial-loss-scale", 0],
}


@pytest.mark.parametrize("case", [*BAD_FLAGS, "out in /proc", "out is a file",
                                  "out under a file", "no-heads", "hidden-as-text",
                                  "heads-not-dividing", "window-too-short", "not-json"])
def test_bad_input_is_one_error_line_and_no_run_dir(case, tmp_path):
    run_dir = tmp_path / "run"
    configs = bad_configs(tmp_path)
    (tmp_path / "file").write_text("a file")
    (tmp_path / "empty.txt").write_text("")
    if case in BAD_FLAGS:
        named = {"EMPTY": tmp_path / "empty.txt", "FILE": tmp_path / "file"}
        args = [*(named.get(a, a) for a in BAD_FLAGS[case]), "--out", run_dir]
    elif case.startswith("out"):
        run_dir = {"out in /proc": "/proc/ratrain-run", "out is a file": tmp_path / "file",
                   "out under a file": tmp_path / "file" / "run"}[case]
        args = ["--out", run_dir]
    else:
        args = ["--model", configs[case], "--out", run_dir]
    result = ratrain_train(*args, "--steps" if "steps" not in case else "--seed", 1)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("ratrain: error: "), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    if case != "out is a file":
        assert not Path(run_dir).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["file", "empty.txt", *(f"{name}.json" for name in configs)])


def test_errors_name_the_flags_given():
    with pytest.raises(UserError, match=r"^--dp 3 does not divide the default global batch "
                                        r"of 8 sequences"):
        resolve_layout(None, 3, None, None, cores=32, max_pp=TINY_LAYERS)
    with pytest.raises(UserError, match=r"^--dp 3 does not divide --global-batch 8"):
        resolve_layout(None, 3, None, 8, cores=32, max_pp=TINY_LAYERS)
    with pytest.raises(UserError) as error:
        resolve_layout(None, None, 3, None, cores=32, max_pp=TINY_LAYERS)
    assert "--micro-batches 3" in str(error.value) and "--dp" not in str(error.value)
    with pytest.raises(UserError, match=r"^--pp 7 is more stages than the model has layers"):
        resolve_layout(7, None, None, None, cores=32, max_pp=TINY_LAYERS)


@pytest.mark.parametrize("cores", range(1, 129))
def test_default_layout_fits_every_core_count(cores):
    layout = resolve_layout(None, None, None, None, cores, max_pp=TINY_LAYERS)
    assert 8 % layout.dp == 0
    assert layout.dp * layout.micro_batches * layout.micro_batch_size == 8
    assert layout.micro_batches >= 2
    assert 1 <= layout.ranks <= cores and layout.pp <= TINY_LAYERS
    assert layout.pp == (2 if cores >= 2 else 1)
    # the most replicas (of 1, 2, 4) whose ranks fit; 8 would leave 1 micro-batch each
    assert layout.dp == max(dp for dp in (1, 2, 4) if dp * layout.pp <= max(cores, 1))


@pytest.mark.parametrize("flags, cores, expected", [
    # (pp, dp, micro-batches, global batch), cores -> (pp, dp, micro-batches, size)
    ((None, None, None, None), 2, (2, 1, 4, 2)),
    ((None, None, None, None), 32, (2, 4, 2, 1)),
    ((None, None, None, 64), 32, (2, 16, 4, 1)),
    ((3, None, None, None), 2, (3, 1, 4, 2)),      # the user's --pp may oversubscribe
    ((None, 2, None, None), 2, (1, 2, 4, 1)),
    ((None, None, 2, None), 16, (2, 4, 2, 1)),
    ((4, None, 8, 16), 128, (4, 2, 8, 1)),
    ((None, None, None, None), 1, (1, 1, 4, 2)),
])
def test_given_flags_are_kept(flags, cores, expected):
    layout = resolve_layout(*flags, cores=cores, max_pp=TINY_LAYERS)
    assert (layout.pp, layout.dp, layout.micro_batches, layout.micro_batch_size) == expected


def test_one_stage_model_gets_one_stage():
    layout = resolve_layout(None, None, None, None, cores=8, max_pp=1)
    assert (layout.pp, layout.dp) == (1, 4)


@pytest.mark.parametrize("cores, threads", [(16, 2), (64, 8)])
def test_default_layout_uses_every_core(cores, threads):
    """The default global batch of 8 splits into at most 4 replicas of 2 stages: the 8
    ranks get cores // 8 threads each (NOTE [threads per rank]), so no core idles."""
    layout = resolve_layout(None, None, None, None, cores, max_pp=TINY_LAYERS)
    assert (layout.pp, layout.dp, layout.ranks) == (2, 4, 8)
    assert layout.rank_threads(cores, {}) == threads
    assert layout.cores_note(cores, threads) == f"; 8 ranks x {threads} threads = all {cores} cores"
    # what each rank sets before numpy loads: mpiexec starts 8 on the node
    assert thread_environment({"MPI_LOCALNRANKS": "8"}, cores) == dict.fromkeys(
        ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), str(threads))


def test_thread_counts_the_user_exports_are_kept_and_said():
    layout = resolve_layout(None, None, None, None, 16, max_pp=TINY_LAYERS)
    assert layout.rank_threads(16, {"OMP_NUM_THREADS": "1"}) == 1
    assert layout.cores_note(16, 1) == "; 8 ranks x 1 thread = 8 of 16 cores (NOTE [threads per rank])"
    assert thread_environment({"MPI_LOCALNRANKS": "8", "OMP_NUM_THREADS": "1"}, 16)[
        "OMP_NUM_THREADS"] == "1"
    odd = resolve_layout(3, 1, None, None, 16, max_pp=TINY_LAYERS)   # 16 // 3 = 5 threads
    assert odd.cores_note(16, odd.rank_threads(16, {})) == \
        "; 3 ranks x 5 threads = 15 of 16 cores (NOTE [threads per rank])"
    over = resolve_layout(3, 1, None, None, 2, max_pp=TINY_LAYERS)
    assert over.cores_note(2, over.rank_threads(2, {})) == \
        "; 3 ranks x 1 thread on 2 cores: oversubscribed, slower than fewer --pp x --dp"


def test_simulator_gives_a_rank_the_threads_the_runtime_does():
    profile = load_profile("cpu") | {"node_cores": 64, "threads": {
        "1": {"fp32_flops": 1.0}, "8": {"fp32_flops": 8.0}, "64": {"fp32_flops": 64.0}}}
    assert rank_profile(profile, 8)["rank_threads"] == 8    # 2 x 4 ranks on 64 cores
    assert rank_profile(profile, 8)["fp32_flops"] == 8.0
    assert rank_profile(profile | {"node_cores": 16}, 8)["rank_threads"] == 1  # 2 not measured


def test_given_options_tell_a_flag_passed_again_from_its_default():
    from ratrain.cli import build_parser, given_options
    argv = ["train", "--resume", "run", "--seed", "0", "--ste", "9", "--no-shuffle"]
    assert given_options(build_parser(), argv) == {"resume", "seed", "steps", "no_shuffle"}
    assert given_options(build_parser(), ["run", "prog"]) == {"program"}
