"""The save directory: --keep-last pruning, what --resume finds, the probe before a run,
an interrupted save leaving nothing --resume would pick, and the exported config.json."""
import json

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
    assert ck.tokenizer_files(None, str(empty)) == []
