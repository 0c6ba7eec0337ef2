"""NOTE [looking for ranks] (rt/launch.py): `ratrain run` walks /proc for the job's ranks
often at start-up, less while some rank is unseen, and not at all once it knows them all;
its main thread never blocks for good, and the relays leave stop signals to it."""
import os
import signal
import subprocess

import pytest

from ratrain.rt import launch
from ratrain.rt.launch import (POLL_SECONDS, SIGNAL_SECONDS, START_POLL_SECONDS, START_SECONDS,
                               RankWatch)


class FakeJob:
    """mpiexec that exits after `looks` waits, recording each wait's timeout."""

    def __init__(self, looks: int):
        self.looks, self.timeouts = looks, []

    def wait(self, timeout=None):
        self.timeouts.append(timeout)
        if len(self.timeouts) < self.looks:
            raise subprocess.TimeoutExpired("mpiexec", timeout)
        return 0


@pytest.fixture
def clock(monkeypatch):
    """time.monotonic() that each wait of the fake job moves on by its timeout."""
    now = [100.0]
    monkeypatch.setattr(launch.time, "monotonic", lambda: now[0])
    return now


def watch_job(monkeypatch, clock, world: int, seen: list[dict], looks: int):
    """until_exit over a FakeJob; rank_processes answers `seen[k]` at its k-th walk (then
    nothing new). The number of walks and the job's wait timeouts."""
    walks = []

    def rank_processes(root, known=()):
        walks.append(len(known))
        return seen[len(walks) - 1] if len(walks) <= len(seen) else {}
    monkeypatch.setattr(launch, "rank_processes", rank_processes)
    job, between = FakeJob(looks), []
    original = job.wait

    def wait(timeout=None):
        clock[0] += timeout or 0.0
        return original(timeout)
    job.wait = wait
    assert RankWatch(1, world).until_exit(job, lambda: between.append(1)) == 0
    assert len(between) == len(job.timeouts)  # between() after every look
    return len(walks), job.timeouts


def test_no_walk_once_every_rank_is_known(monkeypatch, clock):
    """Rank 0 shows up at the first walk, rank 1 at the third: three walks 50 ms apart,
    then mpiexec is waited for in slices of SIGNAL_SECONDS, never blocking for good (a
    signal another thread takes would not wake a blocked waitpid), with no more walks."""
    walks, timeouts = watch_job(monkeypatch, clock, 2, [{10: (0, 1)}, {}, {11: (1, 2)}],
                                looks=6)
    assert walks == 3
    assert timeouts == [START_POLL_SECONDS, START_POLL_SECONDS] + [SIGNAL_SECONDS] * 4


def test_relays_leave_stop_signals_to_the_main_thread():
    """An output relay's thread blocks SIGINT, SIGTERM and SIGHUP."""
    read, write = os.pipe()
    masks = []

    class Out:
        def write(self, line):
            masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))

        def flush(self):
            pass
    with os.fdopen(read, "rb") as stream:
        relay = launch.OutputRelay(stream, Out())
        with os.fdopen(write, "wb") as w:
            w.write(b"a line\n")
        relay.join()
    assert masks and set(launch.STOP_SIGNALS) <= masks[0]
    assert not set(launch.STOP_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_ranks_on_other_hosts_slow_the_walks_after_start_up(monkeypatch, clock):
    """With one of two ranks on another host, the walks go on, every 50 ms for the first
    START_SECONDS, then every POLL_SECONDS."""
    looks = int(START_SECONDS / START_POLL_SECONDS) + 5
    walks, timeouts = watch_job(monkeypatch, clock, 2, [{10: (0, 1)}], looks=looks)
    assert walks == looks
    fast = [t for t in timeouts if t == START_POLL_SECONDS]
    assert len(fast) in (int(START_SECONDS / START_POLL_SECONDS),
                         int(START_SECONDS / START_POLL_SECONDS) + 1)
    assert timeouts[len(fast):] == [POLL_SECONDS] * (looks - len(fast))
