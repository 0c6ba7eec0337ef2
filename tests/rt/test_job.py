"""What rt/run.prepare builds (rt/job.py): --resume resolved into the Job, the parsed flags
left alone, and the initial weights handed over once."""
from types import SimpleNamespace

import pytest

from ratrain.rt import checkpoint as ck
from ratrain.rt import run
from ratrain.rt.job import Weights, with_resume
from ratrain.rt.load import SetupError
from test_checkpoint_dir import fake_checkpoint


def test_resume_is_resolved_to_the_newest_checkpoint(tmp_path):
    newest = [fake_checkpoint(tmp_path / "run" / "checkpoints", s) for s in (2, 7)][-1]
    assert run.resolved_resume(str(tmp_path / "run")) == str(newest)
    assert run.resolved_resume(None) is None
    (tmp_path / "empty").mkdir()
    with pytest.raises(SetupError, match="no checkpoint there"):
        run.resolved_resume(str(tmp_path / "empty"))


def test_prepare_leaves_the_flags_alone(tmp_path, monkeypatch):
    """A run directory given to --resume is resolved for the set-up checks (here the
    checkpoint's, which refuse the fake one), and `args` still names the directory."""
    fake_checkpoint(tmp_path / "run" / "checkpoints", 3)
    program = SimpleNamespace(options=None, graph=SimpleNamespace(config={}),
                              coords=lambda rank: (0, 0))
    monkeypatch.setattr(run, "open_program", lambda *a: ({}, program))
    monkeypatch.setattr(run, "stage_code", lambda *a: None)
    seen = []
    monkeypatch.setattr(run, "checkpoints_problem",
                        lambda args, config: seen.append(args.resume) or "refused")
    args = run.build_parser().parse_args(["prog", "--resume", str(tmp_path / "run")])
    with pytest.raises(SetupError, match="refused"):
        run.prepare(args, world_size=1)
    assert seen == [str(tmp_path / "run" / "checkpoints" / ck.checkpoint_name(3))]
    assert args.resume == str(tmp_path / "run")


def test_the_weights_are_handed_over_once():
    weights = Weights({"w": 1}, None)
    assert weights.take() == ({"w": 1}, None)
    with pytest.raises(RuntimeError, match="handed over already"):
        weights.take()


def test_with_resume_is_a_copy():
    args = run.build_parser().parse_args(["prog", "--resume", "RUN"])
    resumed = with_resume(args, "RUN/checkpoints/step-000003")
    assert (args.resume, resumed.resume) == ("RUN", "RUN/checkpoints/step-000003")
    assert vars(resumed) == vars(args) | {"resume": "RUN/checkpoints/step-000003"}
