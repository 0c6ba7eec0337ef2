"""The save directory: --keep-last pruning, what --resume finds, the probe before a run,
an interrupted save leaving nothing --resume would pick, and the exported config.json."""
import json
import os

import pytest

from ratrain.rt import checkpoint as ck


def fake_checkpoint(root, step: int):
    path = root / ck.checkpoint_name(step)
    path.mkdir(parents=True)
    (path / ck.STATE_FILE).write_text(json.dumps({"step": step}))
    return path


def test_keep_last_removes_only_older_checkpoints_of_ours(tmp_path):
    steps = [fake_checkpoint(tmp_path, s) for s in (5, 10, 15, 20)]
    strangers = [tmp_path / "step-notes", tmp_path / "best", tmp_path / ".step-000025.x1"]
    for path in strangers:
        path.mkdir()
    (tmp_path / "step-000001").write_text("a file named like a checkpoint")
    removed = ck.prune_checkpoints(tmp_path, keep=2, written=steps[-1])
    assert removed == steps[:2]
    assert sorted(ck.checkpoint_steps(tmp_path)) == [15, 20]
    assert all(p.exists() for p in strangers) and (tmp_path / "step-000001").is_file()


def test_keep_last_never_removes_the_checkpoint_just_written(tmp_path):
    older_step_written_last = fake_checkpoint(tmp_path, 3)  # e.g. a resumed run's first save
    newer = [fake_checkpoint(tmp_path, s) for s in (8, 9)]
    assert ck.prune_checkpoints(tmp_path, keep=1, written=older_step_written_last) == newer[:1]
    assert older_step_written_last.exists() and newer[1].exists()
    assert ck.prune_checkpoints(tmp_path, keep=0, written=newer[1]) == []


def test_resume_finds_a_checkpoint_a_save_dir_or_a_run_dir(tmp_path):
    run = tmp_path / "run"
    for step in (2, 4, 12):
        fake_checkpoint(run / "checkpoints", step)
    assert ck.find_resume_checkpoint(str(run)) == run / "checkpoints" / "step-000012"
    assert ck.find_resume_checkpoint(str(run / "checkpoints")) == \
        run / "checkpoints" / "step-000012"
    one = run / "checkpoints" / "step-000004"
    assert ck.find_resume_checkpoint(str(one)) == one
    with pytest.raises(ValueError, match=r"^--resume .*empty: no checkpoint there \(looked "
                                         r"for trainer_state.json in it, and for step-N"):
        (tmp_path / "empty").mkdir()
        ck.find_resume_checkpoint(str(tmp_path / "empty"))


def test_interrupted_save_leaves_no_step_dir(tmp_path, monkeypatch):
    """A save interrupted before its rename leaves only the hidden staging directory."""
    from types import SimpleNamespace
    fake_checkpoint(tmp_path, 1)
    path = tmp_path / ck.checkpoint_name(2)
    staging = ck.staging_dir(path)

    def crash(source, target):
        raise KeyboardInterrupt
    monkeypatch.setattr(ck, "replace_dir", crash)
    with pytest.raises(KeyboardInterrupt):
        ck.finish_checkpoint(SimpleNamespace(stages=((0,),)), staging, path, {}, {"step": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == [staging.name, "step-000001"]
    assert staging.name.startswith(".step-000002.")
    assert ck.find_resume_checkpoint(str(tmp_path)) == tmp_path / "step-000001"


def test_killed_save_leaves_only_a_hidden_staging_dir(tmp_path):
    """A SIGKILL mid-save skips the clean-up: what is left is named .step-N.*, which
    neither --resume nor --keep-last treats as a checkpoint."""
    fake_checkpoint(tmp_path, 1)
    staging = tmp_path / ".step-000002.abc123"
    staging.mkdir()
    (staging / ck.STATE_FILE).write_text("{}")
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step-000001"
    assert ck.prune_checkpoints(tmp_path, 1, tmp_path / "step-000001") == []


def test_save_dir_probe(tmp_path):
    assert ck.check_save_dir(str(tmp_path / "new" / "ckpt")) is None
    assert list((tmp_path / "new" / "ckpt").iterdir()) == []   # the probe is gone
    (tmp_path / "file").write_text("x")
    problem = ck.check_save_dir(str(tmp_path / "file" / "ckpt"))
    assert problem.startswith(f"cannot write checkpoints to --save-dir {tmp_path}/file/ckpt")
    assert ck.check_save_dir("/proc/ratrain-ckpt").startswith("cannot write checkpoints")


def test_exported_config_keeps_the_users_keys_and_says_float32():
    v5 = {"model_type": "llama", "dtype": "bfloat16", "layer_types": ["full_attention"]}
    assert ck.export_config(v5) == v5 | {"dtype": "float32"}
    v4 = {"model_type": "llama", "torch_dtype": "float16"}
    assert ck.export_config(v4) == {"model_type": "llama", "torch_dtype": "float32"}
    assert ck.export_config({"model_type": "qwen2"})["torch_dtype"] == "float32"


def test_tokenizer_files_come_from_the_first_source_that_has_them(tmp_path):
    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir(), full.mkdir()
    for name in ("tokenizer.json", "merges.txt", "generation_config.json", "notes.txt"):
        (full / name).write_text(name)
    found = ck.tokenizer_files(None, str(empty), str(full))
    assert sorted(p.name for p in found) == ["generation_config.json", "merges.txt",
                                             "tokenizer.json"]
    assert ck.tokenizer_files(str(full / "tokenizer.json")) == [full / "tokenizer.json"]
    (full / "my-bpe.json").write_text("{}")   # --tokenizer FILE: copied as tokenizer.json
    assert ck.tokenizer_files(str(full / "my-bpe.json"), str(full)) == [full / "my-bpe.json"]
    assert ck.tokenizer_files(None, str(empty)) == []


def run_checkpoint(root, config: dict, step: int = 3):
    """A checkpoint as a run writes it: weights, AdamW moments, trainer state."""
    from ratrain import models
    from safetensors.numpy import save_file
    params = models.init_params(config, 0)
    models.save_pretrained(root, config, params)
    save_file({f"{n}.{key}": v for n, v in params.items() for key in ck.MOMENTS},
              str(root / "optimizer.safetensors"))
    (root / ck.STATE_FILE).write_text(json.dumps({"step": step}))
    return root


def test_checkpoint_problem_reads_headers_and_names_what_differs(tmp_path):
    from ratrain import models
    tiny = models.get_config("tiny")
    path = run_checkpoint(tmp_path / "ckpt", tiny)
    assert ck.checkpoint_problem(path, tiny, "--resume") is None
    wider = dict(tiny, vocab_size=512)
    assert ck.checkpoint_problem(path, wider, "--init-from") == (
        f"--init-from {path} does not fit the model: model.embed_tokens.weight is [256, 256] "
        "in the checkpoint, the model needs [512, 256]")
    deeper = dict(tiny, num_hidden_layers=5)
    assert ck.checkpoint_problem(path, deeper, "--resume").endswith(
        "model.layers.4.input_layernorm.weight is not in the checkpoint; the model needs it "
        "as [256]")
    regrouped = dict(tiny, num_attention_heads=8, num_key_value_heads=8)  # same shapes
    assert ck.checkpoint_problem(path, regrouped, "--resume").endswith(
        "its config.json has num_attention_heads 4, the model 8")
    (path / "optimizer.safetensors").unlink()
    assert ck.checkpoint_problem(path, tiny, "--init-from") is None   # weights are enough
    assert ck.checkpoint_problem(path, tiny, "--resume").endswith(
        "model.embed_tokens.weight.exp_avg is not in its optimizer files; the model needs "
        "it as [256, 256]")
    (path / "model.safetensors").write_bytes(b"not safetensors")
    assert ck.checkpoint_problem(path, tiny, "--resume") == (
        f"--resume {path}: {path}/model.safetensors is not a safetensors file (its first 8 "
        "bytes are no header length); copy or save it again, or pass another checkpoint")


def test_weights_files_are_checked_against_their_length(tmp_path):
    """See NOTE [checking a weights file]: each tensor's byte range holds its dtype x shape and
    lies inside the file; an index names only tensors its shards hold. Headers only."""
    from ratrain import models
    tiny = models.get_config("tiny")
    path = run_checkpoint(tmp_path / "ckpt", tiny)
    fix = "; copy or save it again, or pass another checkpoint"
    moments = path / "optimizer.safetensors"
    needed = 2 * 4 * sum(v.size for v in models.init_params(tiny, 0).values())
    held = moments.stat().st_size - 8 - int.from_bytes(moments.read_bytes()[:8], "little")
    assert held == needed
    os.truncate(moments, moments.stat().st_size - 1)
    assert ck.checkpoint_problem(path, tiny, "--init-from") is None   # moments not read
    assert ck.checkpoint_problem(path, tiny, "--resume") == (
        f"--resume {path}: {moments} is cut short: its tensors need {needed:,} bytes after "
        f"the header, the file holds {needed - 1:,}{fix}")
    weights = path / "model.safetensors"
    raw = weights.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])

    def compact(header: dict) -> bytes:   # the same header length, as the writer pads it
        return json.dumps(header, separators=(",", ":")).encode().ljust(size)

    header["model.norm.weight"]["shape"] = [255]
    weights.write_bytes(raw[:8] + compact(header) + raw[8 + size:])
    assert ck.checkpoint_problem(path, tiny, "--init-from") == (
        f"--init-from {path}: {weights} is damaged: its header gives model.norm.weight 1,024 "
        f"bytes for F32 [255] (1,020){fix}")
    header["model.norm.weight"]["shape"] = [256]
    weights.write_bytes(raw[:8] + compact(header) + raw[8 + size:])
    weight_map = dict.fromkeys([*header, "lm_head.bias"], "model.safetensors")
    weight_map.pop("__metadata__", None)
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert ck.checkpoint_problem(path, tiny, "--init-from") == (
        f"--init-from {path}: {path}/model.safetensors.index.json puts lm_head.bias in "
        f"model.safetensors, which does not hold it{fix}")


def test_stream_change_names_the_first_difference():
    from ratrain.rt.data import stream_change
    saved = {"data": "/d/train.txt", "data_bytes": 21119, "tokenizer": "ab" * 32,
             "eos_id": 1, "cache_key": "k"}
    assert stream_change(saved, dict(saved)) is None
    assert stream_change(saved, saved | {"data_bytes": 30000}) == \
        "its --data size in bytes was 21,119, this run's is 30,000"
    assert stream_change(saved, saved | {"tokenizer": "bytes", "eos_id": 0}) == \
        "its tokenizer was tokenizer.json sha256 abababababab, this run's is UTF-8 bytes"
    assert stream_change({"data": None, "tokenizer": "bytes"}, saved) == \
        "its --data was the built-in corpus, this run's is /d/train.txt"


def test_metrics_after_the_checkpoint_are_dropped(tmp_path):
    from ratrain.cli.resume import keep_metrics_until
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n"
                               for s in range(1, 6)) + '{"step": 6, "lo')  # killed
    assert keep_metrics_until(metrics, 3) == 3
    assert [json.loads(l)["step"] for l in metrics.read_text().splitlines()] == [1, 2, 3]
    assert keep_metrics_until(metrics, 3) == 0 and keep_metrics_until(tmp_path / "no", 1) == 0


def test_a_tokenizer_file_given_by_another_name_is_saved_as_tokenizer_json(tmp_path):
    from types import SimpleNamespace
    bpe = tmp_path / "my-bpe.json"
    bpe.write_text('{"model": {"type": "BPE"}}')
    path = tmp_path / "save" / ck.checkpoint_name(4)
    ck.finish_checkpoint(SimpleNamespace(stages=((0,),)), ck.staging_dir(path), path, {},
                         {"step": 4}, ck.tokenizer_contents(ck.tokenizer_files(str(bpe))))
    assert (path / "tokenizer.json").read_text() == bpe.read_text()
    assert not (path / "my-bpe.json").exists()


def test_resume_problem_of_a_checkpoint_from_before_stream_identities():
    """An older checkpoint names only its --data (None: the built-in corpus); the message
    says so in words, not as Python's None."""
    from argparse import Namespace
    from ratrain.rt.start import resume_problem
    args = Namespace(resume="ck", allow_data_change=False, data="b.txt")
    assert resume_problem(args, {"step": 3, "data": None}, {}) == (
        "--resume ck was trained on other tokens: its --data was the built-in corpus, this "
        "run's is b.txt; pass the run's --data (and --tokenizer) to continue it, or "
        "--allow-data-change to train on these tokens from its weights")
    assert resume_problem(args, {"step": 3, "data": "b.txt"}, {}) is None
    assert resume_problem(Namespace(**{**vars(args), "allow_data_change": True}),
                          {"step": 3, "data": None}, {}) is None
