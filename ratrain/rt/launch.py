"""Launching the MPI runtime: find mpiexec (the mpich wheel's, next to Python), start
`python -P -m ratrain.rt DIR` on N ranks, relay their output, stop them on an interrupt,
and when one dies name it (by its PMI rank, read from /proc) and the signal.
`ratrain run`, `ratrain train`, calibration and the test clusters launch through here.
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

from ratrain.errors import UserError
from ratrain.rt.train_options import RUN_RECORD, forward_argv


def find_mpiexec() -> str:
    """mpiexec next to this Python (the mpich wheel), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.is_file() else shutil.which("mpiexec")
    if found is None:
        raise UserError("no mpiexec found: `pip install mpich` provides one, or put your "
                          "MPI's mpiexec on PATH")
    return found


def rank_python(module: str) -> list[str]:
    """The command a rank runs: this Python with -P, so the rank imports the installed
    ratrain whatever its working directory is (NOTE [ranks import the installed package])."""
    return [sys.executable, "-P", "-m", module]


# NOTE [ranks import the installed package]: `python -m` puts the working directory first
# on sys.path. Started from a clone's root after `pip install .`, a rank would import the
# source tree, which has no compiled kernels, instead of the installed package. -P
# (Python >= 3.11) leaves the working directory off; PYTHONPATH is still honoured.


def launch(program_dir: Path, ranks: int, args, extra: list[str] = (), cluster=None) -> int:
    """mpiexec -n ranks python -m ratrain.rt DIR <training options>; its exit code. If a
    rank dies, the last line printed names it (NOTE [naming the lost rank]). With a
    `cluster` (ratrain.cluster), each rank runs in its namespace and talks over its link."""
    rank_command = [*rank_python("ratrain.rt"), str(program_dir), *forward_argv(args), *extra]
    options, rank_command = cluster.placement(rank_command) if cluster else ([], rank_command)
    command = [find_mpiexec(), *options, "-n", str(ranks), *rank_command]
    job = subprocess.Popen(command, stdout=subprocess.PIPE)
    relay = StdoutRelay(job.stdout)
    watch = RankWatch(job.pid, ranks)
    try:
        code = watch.until_exit(job)
    except KeyboardInterrupt:
        stop_after_interrupt(job, watch)
        print(f"ratrain: interrupted; {stopped(program_dir, args)}", file=sys.stderr)
        return 130
    relay.join()
    lost = relay.lost_process()
    if code != 0 and lost is not None:
        watch.stop_leftovers()
        pid, how, local = lost
        who = f"rank {watch.ranks[pid][0]}" if local and pid in watch.ranks else "a rank"
        print(f"ratrain: error: {who} (pid {pid}) {how}; {stopped(program_dir, args)}",
              file=sys.stderr, flush=True)
    return code


# NOTE [naming the lost rank]: when a rank dies by a signal (killed, segfault, out of
# memory), hydra (mpich's mpiexec) stops the others and prints a banner with the dead
# process's PID and signal on stdout, but no MPI rank. So while mpiexec runs, `launch`
# polls its descendants in /proc and records each rank's PID from PMI_RANK in its
# environment, relays mpiexec's stdout keeping the banner, and ends with one line that
# maps the PID to the rank. A rank that fails inside Python aborts the job with its own
# `ratrain:` line and hydra prints no banner, so nothing is added then.

POLL_SECONDS, START_POLL_SECONDS = 0.5, 0.05
INTERRUPT_GRACE_SECONDS = 5.0
BANNER_PID = re.compile(r"PID (\d+) RUNNING AT (\S+)")
BANNER_SIGNAL = re.compile(r"EXIT STRING: .*\(signal (\d+)\)")


class StdoutRelay:
    """Copies mpiexec's stdout to ours line by line on a thread, keeping the last lines
    to find hydra's banner in."""

    def __init__(self, stream):
        self.tail = deque(maxlen=64)
        self.thread = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self.thread.start()

    def _copy(self, stream) -> None:
        out = sys.stdout
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            self.tail.append(line)
            try:
                out.write(line)
                out.flush()
            except (OSError, ValueError):  # our stdout is closed: keep draining mpiexec's
                out = open(os.devnull, "w")

    def join(self) -> None:
        self.thread.join(timeout=5)

    def lost_process(self) -> tuple[int, str, bool] | None:
        """(pid, how it ended, whether on this host) of the process hydra's banner reports
        dead, if any."""
        text = "".join(self.tail)
        pid, number = BANNER_PID.search(text), BANNER_SIGNAL.search(text)
        if pid is None:
            return None
        how = "died" if number is None else f"was killed by {signal_text(int(number.group(1)))}"
        local = pid.group(2).split(".")[0] == socket.gethostname().split(".")[0]
        return int(pid.group(1)), how, local


def stop_after_interrupt(job: subprocess.Popen, watch: RankWatch) -> None:
    """mpiexec got the same Ctrl-C and forwards it to the ranks, but a rank interrupted
    before it can abort the job leaves the others waiting for it: after a grace period a
    second SIGINT makes hydra abort the job, then mpiexec and the ranks are killed."""
    for escalation in (signal.SIGINT, signal.SIGKILL, None):
        try:
            job.wait(timeout=INTERRUPT_GRACE_SECONDS)
            break
        except subprocess.TimeoutExpired:
            if escalation is not None:
                job.send_signal(escalation)
    watch.stop_leftovers()


def signal_text(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


class RankWatch:
    """pid -> (MPI rank, start time) of the job's rank processes, from /proc."""

    def __init__(self, root_pid: int, world_size: int):
        self.root_pid, self.world_size, self.ranks = root_pid, world_size, {}

    def until_exit(self, job: subprocess.Popen) -> int:
        """Poll the ranks until mpiexec exits (quickly until every rank is known, so that
        one dying at start-up is named too); its exit code."""
        while True:
            self.ranks |= rank_processes(self.root_pid, known=self.ranks)
            try:
                return job.wait(timeout=POLL_SECONDS if len(self.ranks) >= self.world_size
                                else START_POLL_SECONDS)
            except subprocess.TimeoutExpired:
                continue

    def stop_leftovers(self) -> None:
        """SIGKILL any rank still running after mpiexec ended (hydra stops them first)."""
        for pid, (_, started) in self.ranks.items():
            if process_start(pid) == started:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def rank_processes(root_pid: int, known=()) -> dict[int, tuple[int, int]]:
    """pid -> (PMI_RANK, start time) of root_pid's descendants not in `known` (empty
    without /proc)."""
    found = {}
    for pid in descendants(root_pid):
        if pid in known:
            continue
        rank, started = pmi_rank(pid), process_start(pid)
        if rank is not None and started is not None:
            found[pid] = (rank, started)
    return found


def descendants(root_pid: int) -> list[int]:
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int(stat.read_bytes().rsplit(b")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    found, frontier = [], [root_pid]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, ())]
        found += frontier
    return found


def pmi_rank(pid: int) -> int | None:
    """PMI_RANK from the process's environment (hydra sets it for every rank)."""
    with contextlib.suppress(OSError, ValueError):
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if entry.startswith(b"PMI_RANK="):
                return int(entry[len(b"PMI_RANK="):])
    return None


def process_start(pid: int) -> int | None:
    """Start time (clock ticks after boot) of a live process: with the pid, its identity;
    None once it is gone or a zombie."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        return None if fields[0] == b"Z" else int(fields[19])
    return None


def stopped(program_dir: Path, args) -> str:
    """What a user whose job ended early can do next."""
    from ratrain.rt.checkpoint import latest_checkpoint
    checkpoint = latest_checkpoint(args.save_dir)
    if checkpoint is not None:
        return (f"every rank stopped; the last checkpoint is {checkpoint}: continue with "
                f"`{resume_command(program_dir, args, checkpoint)}`")
    if args.save_dir:
        return f"every rank stopped; no checkpoint was written to {args.save_dir} yet"
    return "every rank stopped; no checkpoints (--save-dir and --save-every make runs resumable)"


def resume_command(program_dir: Path, args, checkpoint: Path) -> str:
    """The one command that continues a stopped job from `checkpoint`: `ratrain train
    --resume RUN` for a run directory of `ratrain train` (it recorded its options), else
    the whole `ratrain run` command with this job's training options."""
    run = Path(program_dir).parent
    if (run / RUN_RECORD).is_file():
        return shlex.join(["ratrain", "train", "--resume", str(run)])
    options = forward_argv(args)
    if "--resume" in options:
        at = options.index("--resume")
        del options[at:at + 2]
    ranks = ["-n", str(args.ranks)] if getattr(args, "ranks", None) else []
    return shlex.join(["ratrain", "run", str(program_dir), *ranks, "--resume",
                       str(checkpoint), *options])
