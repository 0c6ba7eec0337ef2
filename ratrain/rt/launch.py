"""Launching the MPI runtime: find mpiexec (the mpich wheel's, next to Python), start
`python -P -m ratrain.rt DIR` on N ranks, relay their output, forward a stop signal to
every rank (a second one ends the job at once), and when one dies name it (by its PMI
rank, read from /proc) and the signal.
`ratrain run`, `ratrain train`, calibration and the test clusters launch through here.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from ratrain.errors import UserError
from ratrain.rt.hosts import job_command
from ratrain.rt.stop import STOP_SIGNALS, exit_code, resume_text, signal_name
from ratrain.rt.train_options import forward_argv


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


def launch(program_dir: Path, ranks: int, args, resume_command: str, cluster=None,
           hosts: tuple[str, ...] | None = None) -> int:
    """mpiexec -n ranks python -m ratrain.rt DIR <training options>; its exit code.
    `resume_command` (rt/stop.command_text) is what a stopped run prints to continue
    (NOTE [forwarding stop signals]). If a rank dies, the last line printed names it (NOTE
    [naming the lost rank]). With `hosts` (rt/hosts.py), the ranks run on those hosts;
    with a `cluster` (ratrain.cluster), in its node namespaces, talking over their links."""
    rank_command = [*rank_python("ratrain.rt"), str(program_dir), *forward_argv(args),
                    "--resume-command", resume_command]
    command = job_command(find_mpiexec(), ranks, rank_command, hosts, cluster)
    with StopSignals() as stop:
        job = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
        relays = OutputRelay(job.stdout, sys.stdout), OutputRelay(job.stderr, sys.stderr)
        watch = RankWatch(job.pid, ranks)
        stop.act = lambda: stop.forward(job, watch, relays)
        code = watch.until_exit(job, stop.act)
    if code < 0 and not stop.ended_job:  # NOTE [a killed mpiexec]
        end_orphans(job, watch)
    for relay in relays:
        relay.join()
    if code < 0 and not stop.ended_job:
        print(f"ratrain: error: mpiexec (pid {job.pid}) was killed by {signal_text(-code)}; "
              f"{stopped(args, resume_command)}", file=sys.stderr, flush=True)
        return 128 - code
    if stop.ended_job:
        print(f"ratrain: stopped at once by a second signal ({signal_name(stop.received[1])}):"
              f" the step in flight is lost; {stopped(args, resume_command)}", file=sys.stderr,
              flush=True)
        return exit_code(stop.received[0])
    lost = relays[0].lost_process()
    if code != 0 and lost is not None:
        watch.stop_leftovers()
        pid, how, local = lost
        who = f"rank {watch.ranks[pid][0]}" if local and pid in watch.ranks else "a rank"
        print(f"ratrain: error: {who} (pid {pid}) {how}; {stopped(args, resume_command)}",
              file=sys.stderr, flush=True)
    elif relays[0].banner:  # a banner that names no process: shown as hydra wrote it
        sys.stdout.write("".join(relays[0].banner))
        sys.stdout.flush()
    return code


# NOTE [a killed mpiexec]: when mpiexec itself is killed (SIGKILL, or a signal it does not
# forward), its proxies and ranks lose their launcher and the job cannot go on; `ratrain`
# used to return the negative status, which the shell saw as 247, with no line. Now it
# kills what is left of the job (mpiexec's session is its own process group, so its
# proxies and ranks go with one killpg, and the ranks it knows by pid besides), then
# prints one `ratrain:` line naming mpiexec, the signal and the last checkpoint, and exits
# 128 + the signal, as a job a signal ended does (NOTE [stop exit code]).


def end_orphans(job: subprocess.Popen, watch: RankWatch) -> None:
    """SIGKILL the proxies and ranks of a job whose mpiexec was killed."""
    with contextlib.suppress(OSError):
        os.killpg(job.pid, signal.SIGKILL)
    watch.stop_leftovers()


# NOTE [forwarding stop signals]: mpiexec runs in a session of its own, so a terminal's
# Ctrl-C (SIGINT to the foreground process group) reaches `ratrain` alone, and hydra
# (mpich's mpiexec) never sees a signal it would answer with its own messages ("Sending
# Ctrl-C to processes as requested") or a dying rank it would report in a banner. While
# the job runs, `ratrain` catches SIGINT, SIGTERM and SIGHUP and sends the signal it got to
# every rank process itself (the pids RankWatch found), each as soon as the rank catches
# it (SigCgt in /proc/PID/status: a rank still starting Python would be killed by
# SIGTERM); the ranks stop after the step they agree on (NOTE [stopping at one step],
# rt/stop.py), rank 0 prints the one `ratrain:` line with `resume_command` filled in, and
# every rank exits 128 + the signal, which mpiexec returns without a banner. A second
# signal ends the job at once: the relays go quiet, then mpiexec, its proxies and the
# ranks are killed (SIGKILL: none of them prints anything) and `ratrain` says which
# checkpoint is the last. When the scheduler signals mpiexec directly too (Slurm signals
# every process of the job), hydra forwards it to the ranks, which count it once; its
# two Ctrl-C lines are not relayed (HYDRA_CTRL_C).


# NOTE [naming the lost rank]: when a rank dies by a signal (killed, segfault, out of
# memory), hydra (mpich's mpiexec) stops the others and prints a banner with the dead
# process's PID and signal on stdout, but no MPI rank. So while mpiexec runs, `launch`
# polls its descendants in /proc and records each rank's PID from PMI_RANK in its
# environment, relays mpiexec's stdout holding the banner back (OutputRelay: its ten
# lines came before `ratrain`'s own and said less), and ends with one line that maps the
# PID to the rank; a banner that names no PID is printed after all. A rank that fails
# inside Python aborts the job with its own `ratrain:` line and hydra prints no banner,
# so nothing is added then.

# NOTE [looking for ranks]: `launch` finds the rank processes by walking /proc (about 3 ms
# with 70 processes), every START_POLL_SECONDS for the job's first START_SECONDS so that a
# rank dying at start-up is named too, then every POLL_SECONDS while some rank is still
# unseen (ranks that `--hosts` puts on other hosts never show up here), and not at all once
# every rank is known. It used to walk /proc every 0.5 s for the whole run, and every 50 ms
# when some ranks ran on other hosts. Once every rank is known the loop still waits for
# mpiexec in slices of SIGNAL_SECONDS (Popen.wait polls waitpid every 50 ms or less
# within one), never in one blocking waitpid: Python runs a signal's handler only on the
# main thread, and the kernel may deliver a signal sent to this process to another of its
# threads (the output relays', BLAS's), which leaves a blocked waitpid uninterrupted. The
# handler then never ran: Ctrl-C and SIGTERM sent together to a `ratrain run` of 2 ranks
# on 2 cores (the second one, arriving while the first is pending on the main thread, goes
# to another thread) were ignored by 7 of 70 jobs, which trained on; by none of 70 since.
# The relays also block the stop signals, leaving the kernel fewer threads to hand them
# to (NOTE [forwarding stop signals]).
POLL_SECONDS, START_POLL_SECONDS, START_SECONDS = 0.5, 0.05, 10.0
SIGNAL_SECONDS = 0.5
BANNER_PID = re.compile(r"PID (\d+) RUNNING AT (\S+)")
BANNER_SIGNAL = re.compile(r"EXIT STRING: .*\(signal (\d+)\)")
HYDRA_CTRL_C = re.compile(r"\[mpiexec@[^]]*\] (Sending Ctrl-C to processes as requested|"
                          r"Press Ctrl-C again to force abort)$")
# hydra's banner about a dead process: a blank line, a rule of '=', the report between
# rules, then three lines of its own ending with BANNER_END (NOTE [naming the lost rank])
BANNER_RULE = re.compile(r"={20,}$")
BANNER_END = "Please see the FAQ page for debugging suggestions"


class OutputRelay:
    """Copies one of mpiexec's output streams to `out` line by line on a thread, keeping
    the last lines to find hydra's banner in; hydra's Ctrl-C lines are dropped, its banner
    about a dead process is held back in `banner` (the line `launch` prints names the
    rank instead, so the banner never comes before it), and nothing is copied once muted."""

    def __init__(self, stream, out):
        self.tail, self.muted = deque(maxlen=64), False
        self.banner, self.blank, self.in_banner = [], [], False
        self.thread = threading.Thread(target=self._copy, args=(stream, out), daemon=True)
        self.thread.start()

    def _copy(self, stream, out) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # NOTE [looking for ranks]
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            self.tail.append(line)
            if self.muted or HYDRA_CTRL_C.match(line.rstrip("\n")):
                continue
            out = _write(out, "".join(self._shown(line)))
        _write(out, "".join(self.blank))

    def _shown(self, line: str) -> list[str]:
        """The lines to copy now that `line` came: blank lines wait for the next one, to
        learn whether they open hydra's banner, which is held back whole."""
        text = line.rstrip("\n")
        if self.in_banner or BANNER_RULE.match(text):
            self.banner += [*self.blank, line]
            self.blank, self.in_banner = [], text != BANNER_END
            return []
        if not text:
            self.blank.append(line)
            return []
        shown, self.blank = [*self.blank, line], []
        return shown

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


class StopSignals:
    """Within the block: SIGINT, SIGTERM and SIGHUP are recorded and acted on at once
    (`act`, set once the job runs; the poll loop calls it too, for ranks found later):
    the first is forwarded to the ranks, the second ends the job (NOTE [forwarding stop
    signals]). Handlers are set only on the main thread (the only one Python delivers
    signals to, between bytecodes: `act` may run inside the poll loop's own call)."""

    def __init__(self):
        self.received, self.signalled, self.ended_job, self.previous = [], set(), False, {}
        self.act = lambda: None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {n: signal.signal(n, self._record) for n in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)

    def _record(self, number: int, frame) -> None:
        self.received.append(number)
        self.act()

    def forward(self, job: subprocess.Popen, watch: RankWatch, relays) -> None:
        """Send the first signal to every rank not yet sent it that catches it; after a
        second, mute the relays and kill the job."""
        if len(self.received) > 1 and not self.ended_job:
            for relay in relays:
                relay.muted = True
            watch.kill_job(job)
            self.ended_job = True
        elif self.received and not self.ended_job:
            self.signalled |= watch.send(self.received[0], exclude=self.signalled)


def _write(out, text: str):
    """Write and flush `text` to `out`; the stream to write to next (a closed output is
    replaced by /dev/null, so mpiexec's output keeps being drained)."""
    if not text:
        return out
    try:
        out.write(text)
        out.flush()
    except (OSError, ValueError):
        out = open(os.devnull, "w")
    return out


def signal_text(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


class RankWatch:
    """pid -> (MPI rank, start time) of the job's rank processes, from /proc."""

    def __init__(self, root_pid: int, world_size: int):
        self.root_pid, self.world_size, self.ranks = root_pid, world_size, {}

    def until_exit(self, job: subprocess.Popen, between) -> int:
        """Look for the ranks until mpiexec exits, calling between() after each look
        (NOTE [looking for ranks]); its exit code."""
        started = time.monotonic()
        while True:
            if len(self.ranks) < self.world_size:
                self.ranks |= rank_processes(self.root_pid, known=self.ranks)
            between()
            try:
                return job.wait(timeout=self.next_look(time.monotonic() - started))
            except subprocess.TimeoutExpired:
                continue

    def next_look(self, elapsed: float) -> float:
        """Seconds until the next look, or, once every rank is known, of the next wait for
        mpiexec (NOTE [looking for ranks])."""
        if len(self.ranks) >= self.world_size:
            return SIGNAL_SECONDS
        return START_POLL_SECONDS if elapsed < START_SECONDS else POLL_SECONDS

    def send(self, number: int, exclude=()) -> set[int]:
        """Send signal `number` to the live ranks outside `exclude` that catch it; their
        pids."""
        sent = set()
        for pid, (_, started) in self.ranks.items():
            if pid not in exclude and process_start(pid) == started and catches(pid, number):
                with contextlib.suppress(OSError):
                    os.kill(pid, number)
                    sent.add(pid)
        return sent

    def kill_job(self, job: subprocess.Popen) -> None:
        """SIGKILL mpiexec, its proxies and the ranks (a dead process prints nothing)."""
        for pid in [job.pid, *descendants(job.pid)]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.stop_leftovers()

    def stop_leftovers(self) -> None:
        """SIGKILL any rank still running after mpiexec ended (hydra stops them first)."""
        for pid, (_, started) in self.ranks.items():
            if process_start(pid) == started:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def rank_processes(root_pid: int, known=()) -> dict[int, tuple[int, int]]:
    """pid -> (PMI_RANK, start time) of root_pid's rank processes not in `known` (empty
    without /proc): the first process with PMI_RANK down each branch of its descendants,
    not those a rank starts (its C compiler inherits PMI_RANK but is no rank to signal)."""
    children, found, frontier = process_children(), {}, [root_pid]
    while frontier:
        below = []
        for pid in (c for p in frontier for c in children.get(p, ())):
            rank = None if pid in known else pmi_rank(pid)
            if pid not in known and rank is None:
                below.append(pid)
            elif rank is not None and (started := process_start(pid)) is not None:
                found[pid] = (rank, started)
        frontier = below
    return found


def descendants(root_pid: int) -> list[int]:
    children, found, frontier = process_children(), [], [root_pid]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, ())]
        found += frontier
    return found


def process_children() -> dict[int, list[int]]:
    """parent pid -> its children's pids, from /proc (empty without it)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int(stat.read_bytes().rsplit(b")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    return children


def pmi_rank(pid: int) -> int | None:
    """PMI_RANK from the process's environment (hydra sets it for every rank)."""
    with contextlib.suppress(OSError, ValueError):
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if entry.startswith(b"PMI_RANK="):
                return int(entry[len(b"PMI_RANK="):])
    return None


def catches(pid: int, number: int) -> bool:
    """Whether the live process `pid` has a handler for signal `number` (SigCgt)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (number - 1) & 1)
    return False


def process_start(pid: int) -> int | None:
    """Start time (clock ticks after boot) of a live process: with the pid, its identity;
    None once it is gone or a zombie."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        return None if fields[0] == b"Z" else int(fields[19])
    return None


def stopped(args, resume_command: str) -> str:
    """What a user whose job ended early can do next."""
    from ratrain.rt.checkpoint import latest_checkpoint
    checkpoint = latest_checkpoint(args.save_dir)
    if checkpoint is not None:
        return (f"every rank stopped; the last checkpoint is {checkpoint}: continue with "
                f"`{resume_text(resume_command, checkpoint)}`")
    if args.save_dir:
        return f"every rank stopped; no checkpoint was written to {args.save_dir} yet"
    return "every rank stopped; no checkpoints (--save-dir and --save-every make runs resumable)"
