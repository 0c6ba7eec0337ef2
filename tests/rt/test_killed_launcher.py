"""How a job that ends badly ends (issue 41, item 9), with a shell script standing in for
mpiexec so no MPI job runs: a killed mpiexec ends with one `ratrain:` line and 128 + its
signal (NOTE [a killed mpiexec]); hydra's banner about a dead rank is held back, so the
`ratrain:` line naming the rank is the last thing shown (NOTE [naming the lost rank])."""
import argparse
import io
import socket
import sys

import pytest

from ratrain.rt import launch
from ratrain.rt.launch import OutputRelay
from ratrain.rt.train_options import add_training_options

BANNER = f"""
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 4242 RUNNING AT {socket.gethostname()}
=   EXIT CODE: 9
=   CLEANING UP REMAINING PROCESSES
=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES
===================================================================================
YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)
This typically refers to a problem with your application.
Please see the FAQ page for debugging suggestions
"""


def run_fake_mpiexec(tmp_path, monkeypatch, capsys, script: str) -> tuple[int, str, str]:
    """launch() with `script` as mpiexec; (exit code, stdout, stderr)."""
    mpiexec = tmp_path / "mpiexec"
    mpiexec.write_text("#!/bin/sh\n" + script)
    mpiexec.chmod(0o755)
    monkeypatch.setattr(launch, "find_mpiexec", lambda: str(mpiexec))
    parser = argparse.ArgumentParser()
    add_training_options(parser)
    args = parser.parse_args(["--save-dir", str(tmp_path / "ckpt")])
    code = launch.launch(tmp_path / "program", 2, args, "ratrain train --resume RUN")
    out, err = capsys.readouterr()
    return code, out, err


def test_killed_mpiexec_ends_with_one_line_and_its_signal_code(tmp_path, monkeypatch, capsys):
    code, out, err = run_fake_mpiexec(tmp_path, monkeypatch, capsys,
                                      "echo 'step 1/5  loss 5.5'\nkill -9 $$\n")
    assert code == 128 + 9
    assert out == "step 1/5  loss 5.5\n"
    assert len(err.splitlines()) == 1, err
    assert err.startswith("ratrain: error: mpiexec (pid ") and \
        "was killed by signal 9 (SIGKILL); every rank stopped; no checkpoint was written" in err


def test_hydra_banner_is_held_back_behind_the_line_naming_the_rank(tmp_path, monkeypatch,
                                                                     capsys):
    code, out, err = run_fake_mpiexec(tmp_path, monkeypatch, capsys,
                                      f"echo 'step 1/5'\ncat <<'EOF'{BANNER}EOF\nexit 9\n")
    assert code == 9
    assert out == "step 1/5\n", out   # no banner, nor the blank line opening it
    assert err.splitlines() == [
        "ratrain: error: a rank (pid 4242) was killed by signal 9 (SIGKILL); every rank "
        f"stopped; no checkpoint was written to {tmp_path / 'ckpt'} yet"]


@pytest.mark.parametrize("text", ["a\n\nb\n", "a\n\n", "\n\n=== short\n"])
def test_relay_keeps_every_other_line_and_blank_line(text):
    out = io.StringIO()
    relay = OutputRelay(io.BytesIO(text.encode()), out)
    relay.join()
    assert out.getvalue() == text and relay.banner == []
