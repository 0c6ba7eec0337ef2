"""Stopping a run between steps: SIGINT, SIGTERM and SIGHUP only record which signal came,
and the step loop (rt/run.py) stops where every rank agrees (NOTE [stopping at one step]);
also the text of the command that resumes a stopped run. Standard library only: ranks
install the handlers before they import numpy or MPI, and the launcher imports it too.
"""
from __future__ import annotations

import contextlib
import shlex
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
CHECKPOINT = "{checkpoint}"     # in a resume command: the checkpoint the stop wrote

_received = 0                   # the first stop signal this rank got, 0 for none


# NOTE [stopping at one step]: Slurm and Kubernetes send SIGTERM before they kill a job,
# a terminal sends SIGINT, and either may reach some ranks earlier than others (or some
# several times: under Slurm the ranks, mpiexec and `ratrain` all get one, and the
# latter two forward theirs). A rank's handler therefore only records the signal. Before
# each step every rank contributes what it recorded to one all-reduce (max over the
# world, comm.agree_on_stop): all of them see the same value at the same step boundary,
# so a signal that lands on rank 0 during step k and on rank 1 just after its check
# still stops both after step k+1, never one after k and the other after k+1. The step
# in flight finishes, its checkpoint is written (unless its periodic save just did) and
# rank 0 prints one `ratrain:` line naming it and the command that resumes; every rank
# exits with 128 + the signal's number (NOTE [stop exit code]). Repeated signals change
# nothing on a rank; "stop at once" is the launcher's (rt/launch.py): on a second signal
# it kills mpiexec and the ranks itself, quietly.

# NOTE [stop exit code]: a stopped run exits 128 + the signal (130 SIGINT, 143 SIGTERM,
# 129 SIGHUP), as a process killed by it would, though it saved a checkpoint: it has not
# reached --steps, and everything that reads exit codes takes non-zero as "not done".
# A Slurm `--dependency=afterok:JOB` must not start an evaluation of a half-trained
# model, a Kubernetes Job's podFailurePolicy can match 143 to retry a preempted pod, and
# `ratrain train ... && next` stops. A signal that arrives during the last step changes
# nothing: the run completes, saves as usual and exits 0.


def listen() -> None:
    """Record SIGINT, SIGTERM and SIGHUP instead of dying or raising KeyboardInterrupt.
    Requires the main thread."""
    for number in STOP_SIGNALS:
        signal.signal(number, _record)


def _record(number: int, frame) -> None:
    global _received
    _received = _received or number


def received() -> int:
    """The first stop signal this process got since listen(), 0 for none."""
    return _received


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where SIGINT raises KeyboardInterrupt; args: (number,)."""


def _raise_stopped(number: int, frame) -> None:
    raise Stopped(number)


@contextlib.contextmanager
def signals_interrupt():
    """Within the block (on the main thread), SIGTERM and SIGHUP interrupt the command as
    Ctrl-C does, raising Stopped: a command stopped before its ranks start ends with its
    own line (the launcher handles them while a job runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {n: signal.signal(n, _raise_stopped) for n in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def stopped_by(interrupt: KeyboardInterrupt) -> int:
    """The signal that raised `interrupt` (Stopped or Ctrl-C's KeyboardInterrupt)."""
    return interrupt.args[0] if isinstance(interrupt, Stopped) else signal.SIGINT


def signal_name(number: int) -> str:
    return signal.Signals(number).name


def exit_code(number: int) -> int:
    """NOTE [stop exit code]."""
    return 128 + number


def command_text(words) -> str:
    """`words` as one shell command line (each quoted where needed), CHECKPOINT kept as
    is for resume_text to fill."""
    return " ".join(w if w == CHECKPOINT else shlex.quote(str(w)) for w in words)


def resume_text(command: str, checkpoint) -> str:
    """`command` (a command_text) with CHECKPOINT replaced by `checkpoint`, quoted."""
    return command.replace(CHECKPOINT, shlex.quote(str(checkpoint)))
