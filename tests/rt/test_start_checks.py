"""A failed start leaves nothing behind: `ratrain train` and `ratrain run` check the
checkpoint they start from (its files, config and shapes, read from the safetensors
headers, and every weights file's length: a file cut short under --model, --init-from or
--resume) and the data before they compile, tokenize or write; each failure is one
`ratrain: error:` line, and afterwards neither the run directory nor a token cache exists.
No MPI job starts; a job that ends before its first step is undone."""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ratrain import models
from ratrain.models.safetensors_writer import SafetensorsWriter
from run_dir_fixtures import CONFIG, text, write_model_dir


def ratrain(cwd, *args, cache=None):
    env = {**__import__("os").environ, "RATRAIN_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "ratrain.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("start")
    write_model_dir(root / "model", weights=False)       # config.json + tokenizer only
    (root / "train.txt").write_text(text(200, 1))
    (root / "short.txt").write_text("the fox.\n")
    tiny = models.get_config("tiny")                     # another model's checkpoint
    models.save_pretrained(root / "tiny-ckpt", tiny, models.init_params(tiny, 0))
    (root / "tiny-ckpt" / "trainer_state.json").write_text(json.dumps({"step": 2}))
    write_cut_checkpoints(root)
    compiled = ratrain(root, "compile", "model/config.json", "--seq-len", 16, "--pp", 2,
                       "-o", "program", cache=root / "cache")
    assert compiled.returncode == 0, compiled.stderr
    return root


def write_cut_checkpoints(root):
    """cut-weights: the model's directory with its model.safetensors cut in half (a copy
    interrupted); cut-ckpt: a checkpoint of the model to --resume (moments, trainer state),
    its model.safetensors cut in half too."""
    shutil.copytree(root / "model", root / "cut-weights")
    filled = models.fill_defaults(CONFIG)
    params = models.init_params(filled, 3)
    models.save_pretrained(root / "cut-ckpt", filled, params)
    models.save_pretrained(root / "cut-weights", filled, params)
    (root / "cut-weights" / "config.json").write_text(json.dumps(CONFIG))
    moments = SafetensorsWriter(root / "cut-ckpt" / "optimizer.safetensors", [
        (f"{name}.{key}", "float32", value.shape) for name, value in params.items()
        for key in ("exp_avg", "exp_avg_sq")], {"format": "pt"})
    for name, value in params.items():
        for key in ("exp_avg", "exp_avg_sq"):
            moments.write(f"{name}.{key}", np.zeros_like(value))
    moments.close()
    (root / "cut-ckpt" / "trainer_state.json").write_text(json.dumps({"step": 2}))
    for folder in ("cut-weights", "cut-ckpt"):
        file = root / folder / "model.safetensors"
        os.truncate(file, file.stat().st_size // 2)


def cut_short(workdir, folder: str) -> str:
    """What is wrong with FOLDER/model.safetensors, as the error line says it: the float32
    weights of every parameter, and what the half file holds after its header."""
    file = workdir / folder / "model.safetensors"
    header = int.from_bytes(file.read_bytes()[:8], "little")
    shapes = models.param_shapes(models.fill_defaults(CONFIG)).values()
    needed, held = 4 * sum(map(math.prod, shapes)), file.stat().st_size - 8 - header
    return (f"{folder}/model.safetensors is cut short: its tensors need {needed:,} bytes "
            f"after the header, the file holds {held:,}; copy or save it again, or pass "
            "another checkpoint")


TINY_SHAPES = ("model.embed_tokens.weight is [256, 256] in the checkpoint, the model needs "
               "[320, 32]")
CASES = {
    "init-from without safetensors": (
        ["train", "--init-from", "model", "--data", "train.txt"],
        "--init-from model is not a checkpoint directory (model: neither model.safetensors "
        "nor model.safetensors.index.json found); pass a directory holding config.json and "
        "model.safetensors"),
    "resume another model's checkpoint": (
        ["train", "--model", "model", "--resume", "tiny-ckpt", "--data", "train.txt"],
        f"--resume tiny-ckpt does not fit the model: {TINY_SHAPES}"),
    "run resume another model's checkpoint": (
        ["run", "program", "--resume", "tiny-ckpt", "--data", "train.txt"],
        f"--resume tiny-ckpt does not fit the model: {TINY_SHAPES}"),
    "run init-from without safetensors": (
        ["run", "program", "--init-from", "model", "--data", "train.txt"],
        "--init-from model is not a checkpoint directory"),
    "too little data": (
        ["train", "--model", "model", "--data", "short.txt", "--seq-len", 16],
        "--data short.txt has 6 tokens, fewer than one row of seq-len + 1 = 17"),
    "missing data": (
        ["train", "--model", "model", "--data", "none.txt"],
        "--data none.txt does not exist"),
    # See NOTE [a tokenizer needs --data]: not byte ids under a BPE tokenizer's name
    "model tokenizer without data": (
        ["train", "--model", "model"],
        "--model model has its own tokenizer (model/tokenizer.json), but without --data "
        "the run would train on the built-in corpus as UTF-8 bytes: pass --data FILE"),
    "tokenizer without data": (
        ["train", "--tokenizer", "model"],
        "--tokenizer model tokenizes --data text, and no --data was given: pass --data"),
}


@pytest.mark.parametrize("case", CASES)
def test_failed_start_writes_nothing(workdir, tmp_path, case):
    args, message = CASES[case]
    assert_refused_writing_nothing(workdir, tmp_path, args, message)


# a weights file cut in half, under each flag that names one (--steps 1: a start that
# let it through would train for a step, or fail in the ranks, not run for long)
CUT_CASES = {
    "train --model": (["train", "--model", "cut-weights"], "--model", "cut-weights"),
    "train --init-from": (["train", "--init-from", "cut-weights"], "--init-from",
                          "cut-weights"),
    "train --resume": (["train", "--model", "model", "--resume", "cut-ckpt"], "--resume",
                       "cut-ckpt"),
    "run --init-from": (["run", "program", "--init-from", "cut-weights"], "--init-from",
                        "cut-weights"),
    "run --resume": (["run", "program", "--resume", "cut-ckpt"], "--resume", "cut-ckpt"),
}


@pytest.mark.parametrize("case", CUT_CASES)
def test_weights_cut_short_are_refused_before_anything_is_written(workdir, tmp_path, case):
    args, flag, folder = CUT_CASES[case]
    assert_refused_writing_nothing(
        workdir, tmp_path, [*args, "--data", "train.txt", "--steps", 3],
        f"{flag} {folder}: {cut_short(workdir, folder)}", whole=True)


def assert_refused_writing_nothing(workdir, tmp_path, args, message, whole=False):
    """One `ratrain: error:` line starting with `message` (being it, if `whole`), exit 2,
    no MPI job, and neither the run directory nor a token cache nor a record of the
    program as checked; the cache may hold the modules built from the program's checked
    code (NOTE [build beside the check]), keyed by their source as any later run's."""
    before = sorted(p.name for p in workdir.iterdir())
    out = ["--out", tmp_path / "run"] if args[0] == "train" else \
        ["--save-dir", tmp_path / "run", "--metrics", tmp_path / "run" / "m.jsonl"]
    result = ratrain(workdir, *args, *out, cache=tmp_path / "cache")
    errors = [l for l in result.stderr.splitlines() if l.startswith("ratrain:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert errors[0].startswith(f"ratrain: error: {message}"), errors[0]
    if whole:
        assert result.stderr.splitlines() == [f"ratrain: error: {message}"]
    assert "Traceback" not in result.stderr and "mpiexec" not in result.stdout
    assert not (tmp_path / "run").exists()
    cache = tmp_path / "cache"
    written = [p.relative_to(cache) for p in cache.rglob("*") if p.is_file()] \
        if cache.exists() else []
    assert all(p.parts[0] == "build" and p.parts[1] != "verified" and p.suffix in
               (".so", ".lock") for p in written), written
    assert sorted(p.name for p in workdir.iterdir()) == before   # no token cache by the data


def test_a_start_whose_job_ends_before_a_step_is_undone(workdir, tmp_path, monkeypatch):
    """See NOTE [a failed start is undone]: a job that ends before it trains a step, here as a
    rank failing at set-up ends it (MPI_Abort: exit 1), leaves no run directory and no
    token cache behind, so the same command runs again (the job stands in for mpiexec)."""
    import ratrain.cli.train as train_command
    from ratrain.cli import main
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    exits = iter([1, 0])
    monkeypatch.setattr(train_command, "launch", lambda *args, **kwargs: next(exits))
    argv = ["train", "--model", "model", "--data", "short-run.txt", "--seq-len", "16",
            "--steps", "1", "--out", str(tmp_path / "run")]
    (workdir / "short-run.txt").write_text(text(50, 4))
    before = sorted(p.name for p in workdir.iterdir())
    assert main(argv) == 1
    assert not (tmp_path / "run").exists()
    assert sorted(p.name for p in workdir.iterdir()) == before   # its token cache removed
    assert main(argv) == 0
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == \
        ["program", "train.log", "train_options.json"]   # train.log: NOTE [the run's log]


@pytest.mark.mpi
def test_ranks_started_directly_check_the_checkpoint_too(workdir):
    from rt_reference import mpirun
    run = mpirun(2, workdir / "program", "--steps", 1, "--resume", workdir / "tiny-ckpt")
    assert run.returncode == 2 and "step 1/1" not in run.stdout
    assert run.stderr.strip().splitlines() == [
        f"ratrain: error: --resume {workdir / 'tiny-ckpt'} does not fit the model: "
        f"{TINY_SHAPES}"]


def no_token_cache(cache) -> bool:
    """Nothing of the run's under RATRAIN_CACHE: the ranks' built modules (build/, keyed by
    their source and shared by every program with it) may stay, token caches may not."""
    return not cache.exists() or {p.name for p in cache.iterdir()} <= {"build"}


@pytest.mark.mpi
def test_a_start_the_ranks_refuse_is_undone(workdir, tmp_path):
    """--metrics is checked by the ranks (they write it): their refusal removes the run
    directory and the token cache the start wrote, so the same command can run again."""
    before = sorted(p.name for p in workdir.iterdir())
    result = ratrain(workdir, "train", "--model", "model", "--data", "train.txt", "--seq-len",
                     16, "--steps", 1, "--metrics", "/proc/ratrain-m/m.jsonl", "--out",
                     tmp_path / "run", cache=tmp_path / "cache")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == \
        "ratrain: error: cannot write --metrics /proc/ratrain-m/m.jsonl: No such file or directory"
    assert not (tmp_path / "run").exists() and no_token_cache(tmp_path / "cache")
    assert sorted(p.name for p in workdir.iterdir()) == before
