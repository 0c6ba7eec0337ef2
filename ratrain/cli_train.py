"""`ratrain run DIR -n N` and `ratrain train`: launch the MPI runtime with mpiexec.

run starts `python -m ratrain.rt DIR` on N ranks with the training options. train first
compiles a model (the tiny preset by default) into a run directory, then runs it and
prints a summary. mpiexec is the one of the installed mpich wheel (next to Python). When
a rank dies, the last line printed names it and the checkpoint to resume from.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

from ratrain.errors import UserError
from ratrain.program_format.options import PRECISIONS, RECOMPUTE_POLICIES, SCHEDULES
from ratrain.rt.train_options import add_training_options, forward_argv


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
                f"`ratrain run {program_dir} --resume {checkpoint}` and the same options")
    if args.save_dir:
        return f"every rank stopped; no checkpoint was written to {args.save_dir} yet"
    return "every rank stopped; no checkpoints (--save-dir and --save-every make runs resumable)"


# ---- ratrain run ---------------------------------------------------------------------------

def cmd_run(args) -> int:
    """Check the program directory and the rank count here (no MPI job for a certain
    failure), then launch."""
    from ratrain.rt.load import SetupError, check_world_size, read_manifest
    program = Path(args.program)
    check_checkpoint_options(args)
    try:
        manifest = read_manifest(program)
        ranks = args.ranks if args.ranks is not None else manifest["world_size"]
        check_world_size(program, manifest, ranks)
    except SetupError as e:
        raise UserError(str(e)) from None
    tokenize_data(args, manifest["model"]["config"], manifest["options"]["seq_len"])
    if args.cluster is None:
        return launch(program, ranks, args)
    from ratrain.cluster import ClusterError, cluster_for_run
    try:
        with cluster_for_run(args.cluster, ranks) as cluster:
            return launch(program, ranks, args, cluster=cluster)
    except ClusterError as e:
        raise UserError(str(e)) from None


def add_run_parser(sub) -> None:
    p = sub.add_parser("run", help="run a compiled program directory on MPI ranks",
                       description="Start `mpiexec -n N python -m ratrain.rt DIR` with the "
                       "training options below and return its exit code.")
    p.add_argument("program", metavar="DIR", help="program directory from `ratrain compile`")
    p.add_argument("-n", "--ranks", type=int, default=None, metavar="N", help="MPI ranks to "
                   "start; must equal the program's pp x dp (default: the program's)")
    p.add_argument("--cluster", default=None, metavar="NAME", help="run each rank in its "
                   "own network namespace of the test cluster NAME, over its shaped link "
                   "(`ratrain cluster up`; made for this run and removed after it if not up; "
                   "needs root)")
    add_training_options(p)
    p.set_defaults(func=cmd_run)


def check_checkpoint_options(args, save_dir_given: bool = True) -> None:
    """--steps, --save-every, --keep-last, --resume and --save-dir, checked before anything
    is compiled or started (the runtime checks them again for `python -m ratrain.rt`);
    --resume becomes the checkpoint directory it names."""
    from ratrain.rt.checkpoint import check_save_dir, find_resume_checkpoint
    from ratrain.rt.train_options import check_run_length
    problem = check_run_length(args, save_dir_given)
    if problem is None and args.resume:
        try:
            args.resume = str(find_resume_checkpoint(args.resume))
        except ValueError as e:
            problem = str(e)
    if problem is None and args.save_dir:
        problem = check_save_dir(args.save_dir)
    if problem is not None:
        raise UserError(problem)


# ---- ratrain train -----------------------------------------------------------------------------
# The checks of its inputs, the layout rules and the run directory: cli_train_inputs.py.

def compile_options(args, config: dict, layout):
    """CompileOptions of a train run (the compile command's rules for unset flags)."""
    import argparse
    from ratrain.cli_compile import load_hw, resolve_options
    flags = argparse.Namespace(pp=layout.pp, dp=layout.dp, micro_batches=layout.micro_batches,
                               micro_batch_size=layout.micro_batch_size,
                               seq_len=args.seq_len, schedule=args.schedule,
                               recompute=args.recompute, zero=args.zero, budget=args.budget,
                               precision=args.precision, clip=args.clip, grad_accum="auto",
                               zero3_prefetch=args.zero3_prefetch,
                               update_rule=args.update_rule)
    return resolve_options(flags, config, load_hw("cpu"))


def compile_run(args, run_dir: Path, config: dict, name: str, options) -> None:
    """Compile the model in memory, then write run_dir/program: a program that does not
    fit is reported before the run directory exists."""
    from ratrain.cli_compile import (build_manifest, compile_graph, load_hw, program_files,
                                     read_hf_config, trace_for, write_program_dir)
    program, records = compile_graph(trace_for(config, name, options), options)
    hf_config = read_hf_config(name)
    try:
        write_program_dir(run_dir / "program", program_files(program, records),
                          lambda h: build_manifest(program, records, load_hw("cpu"), h,
                                                   hf_config))
    except OSError as e:
        raise UserError(f"cannot write the run directory {run_dir}: {e.strerror or e}") \
            from None


def cmd_train(args) -> int:
    """Check every input, compile into a new run directory, run it, print a summary."""
    from ratrain.cli_train_inputs import (check_layout_numbers, check_run_dir,
                                          load_checked_model, resolve_layout)
    check_layout_numbers(args)
    config, name = load_checked_model(args.init_from or args.model)
    cores = os.cpu_count() or 1
    layout = resolve_layout(args.pp, args.dp, args.micro_batches, args.global_batch, cores,
                            config["num_hidden_layers"] + 2)
    options = compile_options(args, config, layout)
    tokenize_data(args, config, options.seq_len)
    check_checkpoint_options(args, save_dir_given=False)  # last: it creates --save-dir
    run_dir = check_run_dir(args.out)
    compile_run(args, run_dir, config, name, options)
    args.metrics = args.metrics or str(run_dir / "metrics.jsonl")
    args.save_dir = args.save_dir or str(run_dir / "checkpoints")
    print(f"compiled {name} for {options.world_size} ranks (pp {options.pp} x dp "
          f"{options.dp}, {options.micro_batches} micro-batches of {options.micro_batch_size} "
          f"x {options.seq_len} tokens) into {run_dir}/program{layout.cores_note(cores)}",
          flush=True)
    code = launch(run_dir / "program", options.world_size, args)
    if code == 0:
        print(summary(Path(args.metrics), run_dir))
    return code


def tokenize_data(args, config: dict, seq_len: int) -> None:
    """Tokenize text --data/--eval-data into their caches here, once, before the ranks
    start (NOTE [tokenize once] in rt/data.py)."""
    from ratrain.rt.data import DataError, prepare_text_data
    try:
        prepare_text_data(args, config, seq_len)
    except DataError as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"cannot read {e.filename}: {e.strerror}") from None


def summary(metrics: Path, run_dir: Path) -> str:
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    if not steps:
        return f"no steps run; run directory {run_dir}"
    timed = steps[1:] or steps
    rate = sum(s["tokens_per_s"] for s in timed) / len(timed)
    evaluated = [s["eval_loss"] for s in steps if s.get("eval_loss") is not None]
    held_out = f", eval loss {evaluated[-1]:.4f}" if evaluated else ""
    return (f"trained {len(steps)} steps: final loss {steps[-1]['loss']:.4f}{held_out}, "
            f"{rate:,.0f} tokens/s; run directory {run_dir} (program/, checkpoints/, {metrics.name})")


def _size(text: str) -> int:
    import argparse
    from ratrain.cli_compile import parse_size
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_train_parser(sub, model_help: str) -> None:
    p = sub.add_parser("train", help="compile a model and train it on MPI ranks in one "
                       "command", description="Compile MODEL (tiny by default) into a run "
                       "directory, start one MPI rank per core with mpiexec, print a progress "
                       "line per step and a summary.")
    p.add_argument("--model", default="tiny", help=f"the model: {model_help} (default: tiny)")
    p.add_argument("--out", default=None, metavar="DIR", help="run directory for the program "
                   "and the metrics (default: runs/<timestamp>)")
    _add_layout_options(p)
    add_training_options(p)
    p.set_defaults(func=cmd_train)


def _add_layout_options(p) -> None:
    p.add_argument("--seq-len", type=int, default=128, metavar="T",
                   help="tokens per sequence (default: 128)")
    p.add_argument("--global-batch", type=int, default=None, metavar="G",
                   help="sequences per step over all replicas (default: 8)")
    p.add_argument("--micro-batches", type=int, default=None, metavar="M", help="micro-batches "
                   "per step and replica (default: the largest divisor of G / dp up to 4, "
                   "at least 2 where G / dp allows)")
    p.add_argument("--pp", type=int, default=None, metavar="P", help="pipeline stages, at "
                   "most the model's layers + 2 (default: 2 when there are cores for it, else 1)")
    p.add_argument("--dp", type=int, default=None, metavar="D", help="data-parallel replicas "
                   "(default: the most that divide G, leave 2 micro-batches per replica and "
                   "fit pp x dp ranks on the cores)")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None,
                   help="ZeRO stage over the DP group (default: 0)")
    p.add_argument("--zero3-prefetch", type=int, default=1, metavar="K",
                   help="--zero 3: gather each layer view K uses ahead (default: 1)")
    p.add_argument("--schedule", choices=SCHEDULES, default="ratrain", help="ratrain "
                   "(lifecycle scheduling) or baseline (everything at the step end) "
                   "(default: ratrain)")
    p.add_argument("--recompute", choices=RECOMPUTE_POLICIES, default="auto",
                   help="activation recovery; auto = the least recompute that fits --budget "
                   "(default: auto)")
    p.add_argument("--budget", type=_size, default=None, metavar="SIZE",
                   help="usable memory per rank, e.g. 2GB (default: the cpu profile's)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="fp32 exact "
                   "mode, or fp16 mixed precision: fp16 activations and views, fp32 master "
                   "weights, dynamic loss scaling (default: fp32)")
    p.add_argument("--clip", type=float, default=None, metavar="X",
                   help="clip gradients to global norm X (default: no clipping)")
    from ratrain.cli_compile import add_update_rule_option
    add_update_rule_option(p)
