"""Every tiny family preset trains under mpiexec in fp32 and bf16 (pp 2): the calls
without a native template (Baichuan's W_pack slice, ...) run through rt/calls' numpy rules,
which a rank must have without importing the compiler."""
import json
import subprocess
import sys

import numpy as np
import pytest

from ratrain.cli import main as ratrain_main

pytestmark = pytest.mark.mpi

PRESETS = ("tiny", "tiny-gqa", "tiny-qwen", "tiny-baichuan", "tiny-tied")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("preset", PRESETS)
def test_each_family_trains_under_mpi(tmp_path, preset, precision):
    out, metrics = tmp_path / "prog", tmp_path / "m.jsonl"
    assert ratrain_main(["compile", preset, "--seq-len", "32", "--pp", "2", "--micro-batches",
                         "2", "--precision", precision, "-o", str(out)]) == 0
    run = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "ratrain.rt", str(out),
                          "--steps", "3", "--metrics", str(metrics), "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
    assert len(losses) == 3 and np.isfinite(losses).all() and losses[-1] < losses[0]
