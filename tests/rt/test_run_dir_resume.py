"""A run directory is the unit of work (NOTE [a run directory is the unit of work] in
cli/resume.py): a tied LLaMA with its weights and its own BPE tokenizer.json, trained on
text by `ratrain train --model DIR` (from DIR's weights, as --init-from DIR starts; DIR's
tokenizer, not bytes), stopped after its step-3 checkpoint, continues with `ratrain train
--resume RUN` and no other option, bit-exactly against an uninterrupted run and in one
metrics.jsonl, also after it was copied or moved (see NOTE [a run directory is
self-contained]: a copy resumes from its own checkpoint and writes only into itself);
`ratrain run RUN/program --resume CKPT --data train.txt` without the tokenizer gives the
same losses, and other tokens are refused in one line."""
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

from rt_reference import read_metrics
from run_dir_fixtures import text, write_model_dir

pytestmark = pytest.mark.mpi

TRAIN = ["--model", "model", "--data", "train.txt", "--steps", 6, "--save-every", 3,
         "--keep-last", 0, "--seq-len", 16, "--global-batch", 4, "--precision", "fp32"]


def ratrain(cwd, *args):
    return subprocess.run([sys.executable, "-m", "ratrain.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("rundir")
    write_model_dir(root / "model", weights=True)    # config, weights and tokenizer
    (root / "train.txt").write_text(text(400, 1))
    return root


@pytest.fixture(scope="module")
def reference_run(workdir):
    """The uninterrupted run."""
    result = ratrain(workdir, "train", *TRAIN, "--out", "ref")
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def reference(reference_run, workdir):
    return workdir / "ref"


def test_model_dir_weights_start_the_run_as_init_from_does(workdir, reference_run):
    """See NOTE [a model directory's weights]: --model DIR starts from DIR's model.safetensors
    and says so; its first loss is --init-from DIR's, and not a seeded start's."""
    from ratrain import models
    from run_dir_fixtures import CONFIG
    count = sum(math.prod(s) for s in models.param_shapes(models.fill_defaults(CONFIG)).values())
    assert reference_run.stdout.splitlines()[0] == (
        f"initialized from model (model.safetensors, {count / 1e3:.1f}K parameters); "
        "--from-scratch would start from a seeded initialisation")
    one_step = ["--data", "train.txt", "--steps", 1, *TRAIN[TRAIN.index("--seq-len"):]]
    init = ratrain(workdir, "train", "--init-from", "model", *one_step, "--out", "init")
    assert init.returncode == 0, init.stderr
    assert init.stdout.splitlines()[0] == \
        f"initialized from model (model.safetensors, {count / 1e3:.1f}K parameters)"
    first = read_metrics(workdir / "ref" / "metrics.jsonl")[0]["loss"]
    assert read_metrics(workdir / "init" / "metrics.jsonl")[0]["loss"] == first


def test_model_dir_tokenizer_is_used_and_carried(workdir, reference):
    tokenizer_file = workdir / "model" / "tokenizer.json"
    ids = Tokenizer.from_file(str(tokenizer_file)).encode(
        (workdir / "train.txt").read_text(), add_special_tokens=False).ids
    sidecar, = workdir.glob("train.txt.*.tokens.json")
    assert json.loads(sidecar.read_text())["tokens"] == len(ids) + 1   # + EOS
    assert len(ids) < (workdir / "train.txt").stat().st_size / 2       # not byte tokens
    for step in (3, 6):
        checkpoint = reference / "checkpoints" / f"step-{step:06d}"
        assert (checkpoint / "tokenizer.json").read_bytes() == tokenizer_file.read_bytes()
        stream = json.loads((checkpoint / "trainer_state.json").read_text())["token_stream"]
        assert stream == {
            "data": str(workdir / "train.txt"), "data_bytes": (workdir / "train.txt").stat().st_size,
            "tokenizer": hashlib.sha256(tokenizer_file.read_bytes()).hexdigest(), "eos_id": 1,
            "cache_key": sidecar.name.split(".")[2]}


def test_copied_and_moved_runs_resume_into_themselves_bit_exactly(workdir, reference):
    """See NOTE [a run directory is self-contained]: a stopped run, copied, continues the copy
    from the copy's checkpoint and leaves the original untouched; moved, it continues from
    its own checkpoint, without recreating its old path. Both end bit-exactly as the
    uninterrupted run, each in one metrics.jsonl."""
    run = workdir / "run"
    first = ratrain(workdir, "train", *TRAIN, "--out", "run")
    assert first.returncode == 0, first.stderr
    # what a run stopped during step 6 leaves: no step-6 checkpoint, steps 1-5 logged
    shutil.rmtree(run / "checkpoints" / "step-000006")
    metrics = run / "metrics.jsonl"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:5]))
    record = json.loads((run / "train_options.json").read_text())["options"]
    assert (record["save_dir"], record["metrics"]) == ("checkpoints", "metrics.jsonl")
    assert record["data"] == str(workdir / "train.txt")   # outside the run: absolute

    shutil.copytree(run, workdir / "copy")
    original = files_of(run)
    assert_resumes_bit_exactly(workdir, "copy", reference)
    assert files_of(run) == original
    run.rename(workdir / "moved")
    assert_resumes_bit_exactly(workdir, "moved", reference)
    assert not run.exists()


def files_of(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def assert_resumes_bit_exactly(workdir, name: str, reference) -> None:
    """`ratrain train --resume NAME` of a run stopped during step 6 continues NAME from its
    step-3 checkpoint into NAME, ending as the uninterrupted run did."""
    run = workdir / name
    resumed = ratrain(workdir, "train", "--resume", name)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[0] == (
        f"resuming {name} from its checkpoint {run}/checkpoints/step-000003: steps 4..6; "
        "2 metrics records after step 3 dropped")
    assert [l.split()[1] for l in resumed.stdout.splitlines() if l.startswith("step ")] == \
        ["4/6", "5/6", "6/6"]
    assert resumed.stdout.splitlines()[-1].endswith(f"; metrics {run}/metrics.jsonl")
    whole, records = read_metrics(reference / "metrics.jsonl"), read_metrics(
        run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [(r["loss"], r["lr"]) for r in records] == [(r["loss"], r["lr"]) for r in whole]
    elapsed = [r["elapsed_s"] for r in records]  # NOTE [elapsed across resumes]
    assert elapsed == sorted(elapsed) and elapsed[3] > elapsed[2] > 0, elapsed
    assert sorted(p.name for p in run.iterdir()) == \
        ["checkpoints", "loss.png", "metrics.jsonl", "program", "train.log", "train_options.json"]
    finals = [d / "checkpoints" / "step-000006" for d in (reference, run)]
    names = sorted(p.name for p in finals[0].iterdir())
    assert sorted(p.name for p in finals[1].iterdir()) == names
    for name in names:
        a, b = ((d / name).read_bytes() for d in finals)
        if name == "trainer_state.json":  # "data" is the --data as typed: now absolute;
            a, b = ({k: v for k, v in json.loads(x).items()  # elapsed_s: a wall time
                     if k not in ("data", "elapsed_s")} for x in (a, b))
        assert a == b, name


def test_run_resume_without_the_tokenizer_uses_the_checkpoints(workdir, reference):
    checkpoint = reference / "checkpoints" / "step-000003"
    again = ratrain(workdir, "run", "ref/program", "--resume", checkpoint, "--data",
                    "train.txt", "--steps", 6, "--metrics", "again.jsonl")
    assert again.returncode == 0, again.stderr
    whole = read_metrics(reference / "metrics.jsonl")
    assert [r["loss"] for r in read_metrics(workdir / "again.jsonl")] == \
        [r["loss"] for r in whole[3:]]
    (workdir / "other.txt").write_text(text(400, 2))
    other = ratrain(workdir, "run", "ref/program", "--resume", checkpoint, "--data",
                    "other.txt", "--steps", 6)
    assert other.returncode == 2 and other.stdout == ""
    assert other.stderr.splitlines() == [
        f"ratrain: error: --resume {checkpoint} was trained on other tokens: its --data was "
        f"{workdir / 'train.txt'}, this run's is {workdir / 'other.txt'}; pass the run's "
        "--data (and --tokenizer) to continue it, or --allow-data-change to train on these "
        "tokens from its weights"]
    reordered = ratrain(workdir, "train", "--resume", "ref", "--seed", 1)
    assert reordered.returncode == 2 and reordered.stderr.splitlines() == [
        f"ratrain: error: --resume {checkpoint.parent}/step-000006 shuffled its rows with "
        "--seed 0; --seed 1 would take other rows from here: leave it out, or pass "
        "--allow-data-change"]
    assert not list(workdir.glob("other.txt.*"))   # refused before tokenizing
    again = ratrain(workdir, "train", *TRAIN, "--out", "ref")
    assert again.returncode == 2 and again.stderr.splitlines() == [
        "ratrain: error: ref already holds a run; continue it with `ratrain train --resume "
        "ref`, or choose another --out"]


def test_options_given_again_override_and_are_recorded(workdir, reference):
    whole = read_metrics(reference / "metrics.jsonl")
    more = ratrain(workdir, "train", "--resume", "ref", "--steps", 7)
    assert more.returncode == 0, more.stderr
    assert [l.split()[1] for l in more.stdout.splitlines() if l.startswith("step ")] == ["7/7"]
    records = read_metrics(reference / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 8)) and records[:6] == whole
    record = json.loads((reference / "train_options.json").read_text())
    assert record["options"]["steps"] == 7 and record["options"]["resume"] is None
    # records as written before NOTE [a run directory is self-contained] held: read, and
    # a copy of the run resumes from its own checkpoints (step 6, not the original's 7)
    record["options"] |= {"save_dir": str(reference / "checkpoints"),
                          "metrics": str(reference / "metrics.jsonl")}
    (reference / "train_options.json").write_text(json.dumps(record))
    shutil.copytree(reference, workdir / "old-copy")
    shutil.rmtree(workdir / "old-copy" / "checkpoints" / "step-000007")
    old_copy = ratrain(workdir, "train", "--resume", "old-copy", "--steps", 6)
    assert old_copy.returncode == 2 and old_copy.stderr.splitlines() == [
        "ratrain: error: old-copy has reached step 6 of --steps 6 already; pass a larger "
        "--steps to train it further"]
    done = ratrain(workdir, "train", "--resume", "ref")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "ratrain: error: ref has reached step 7 of --steps 7 already; pass a larger --steps "
        "to train it further"]
    relaid = ratrain(workdir, "train", "--resume", "ref", "--pp", 1, "--steps", 8)
    assert relaid.returncode == 2 and relaid.stderr.splitlines() == [
        "ratrain: error: --pp cannot change when resuming ref: its program is compiled with "
        "the model and layout it started with; leave --pp out, or start a new run with --out"]


def test_a_checkpoint_cut_short_is_refused_before_the_run_is_touched(workdir, reference):
    """A run whose newest checkpoint has a weights file cut in half (a copy interrupted):
    `ratrain train --resume RUN` refuses it in one line naming the file, and writes
    nothing (NOTE [checking a weights file])."""
    cut = workdir / "cut"
    shutil.copytree(reference, cut)
    checkpoint = max((cut / "checkpoints").iterdir())
    shard = min(checkpoint.glob("model*.safetensors"))
    os.truncate(shard, shard.stat().st_size // 2)
    before = files_of(cut)
    refused = ratrain(workdir, "train", "--resume", "cut", "--steps", 9)
    assert refused.returncode == 2 and refused.stdout == ""
    line, = refused.stderr.splitlines()
    assert line.startswith(f"ratrain: error: --resume {checkpoint}: {shard} is cut short: "
                           "its tensors need ")
    assert line.endswith("; copy or save it again, or pass another checkpoint")
    assert files_of(cut) == before
