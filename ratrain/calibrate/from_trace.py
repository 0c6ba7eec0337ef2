"""`ratrain calibrate --from TRACE`: what a traced run (`ratrain run DIR --trace TRACE`)
really took for each kernel shape and runtime call, at the run's own concurrency, written
into a profile as traced rows that the cost model prefers (NOTE [traced rows]).

Reads every rank's trace (rt/trace.py: each task's steps with their wait and run times,
NOTE [calls in the trace]), sets each step beside what the cost model charges the lowered
calls it ran (sim/calls.ProfileCosts.call_charges) and keeps, per call key, the median
over steps, tasks and ranks; the program is the one the trace names, or --program.
"""
from __future__ import annotations

import datetime
import functools
import json
import platform
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ratrain.errors import UserError
from ratrain.ir.tasks import Kind, parse_task
from ratrain.rt.trace import PROGRAM_EVENT
from ratrain.sim.costs import expected_largest_normal, paced_ranks
from ratrain.sim.kernels import key_text

SKIP_STEPS = 2                          # a run's first steps warm caches and allocators
MIN_WAIT = 50e-6                        # a UPD whose every replica waited longer than this
                                        # saw its all-reduce end at one moment for all

# NOTE [arrival drift]: the replicas of a stage reach a collective at moments the trace
# cannot set side by side (each rank's clock starts at its own first step), but they all
# see it end at one moment, once the last has posted and the bytes have moved. So where
# every replica waited at the UPD for its all-reduce, replica r arrived `wait_r` before
# that moment: the typical replica waited mean(wait) - min(wait) for the latest, which
# is what the cost model charges as drift x e(D) x the time since the replicas last met
# (NOTE [stragglers]), so that difference over e(D) is the estimate (of the arrivals'
# standard deviation, were they normal; a replica that is slow step after step, as on
# the 16-core node, is not, and the difference is still what the others waited). Each
# replica posted
# that all-reduce (its SYNC) some time after the replicas last met (its last UPD of the
# step before, on its own clock); the spread over the mean of that time is one sample of
# the replicas' relative speed spread. Only a step's first UPD is such a sample: the
# later ones wait behind it on the DP channel, after the replicas met at its end (on
# the 16-core node, pp 4 x dp 4: 0.4-1.5 s apart at the first, 5-90 ms at the later
# ones of the same step). The median over the run's stages and steps is
# the `arrival_drift` the cost model charges stragglers from (NOTE [stragglers],
# sim/costs.py). A UPD some replica reached after the end (a wait of about 0) says only
# that it was late, and a UPD without a SYNC (ZeRO 2's reduce-scatters inside B) has no
# post to time: both are left out.

# NOTE [traced rows]: `ratrain calibrate` times each kernel alone, every rank sweeping its
# cache at the same moment, a condition no run has (a 16-core node: the layers' F, B and
# BL ran at 0.76-0.85x of what such a profile charged, the embedding's F in 1.4 ms where
# 82.5 ms was charged). A traced run times the same kernels where they really run. So:
# 1. Each step of a traced task (a native function of several lowered calls, or one
#    runtime call) gives its run time, its wait for operands left out, and a native
#    step each of its calls' run times (NOTE [calls in the trace], rt/trace.py): a call's
#    r = run / s is its time over the cost model's charge s. A trace without per-call
#    times (a program run from its own older code) gives the step's ratio r = run /
#    (s_1 + ... + s_k) to each of its calls, spreading the run over them in proportion
#    to their charges: then every call of a decoder layer's forward got the same r
#    (tiny pp 2: 0.76-0.78 for all 19, GEMMs, attention and adds alike), and the op
#    speeds of 5. could not tell one op from another.
# 2. An IR call's row is its whole graph node (node_key: precision, op, FLOPs, bytes,
#    kernel shape): a zb1 half of a backward GEMM, charged share x the whole, gives the
#    whole r x s / share. A runtime call that only computes (AdamW, the copies) is keyed
#    by its op, params and slot shapes (runtime_key); transfers, collectives and waits
#    have no row: their time is the link's and the other ranks'.
# 3. A row's seconds are the median of its samples over steps (after the first
#    SKIP_STEPS), tasks and ranks. The profile keeps them under `traced` (in the `threads`
#    entry of the run's threads per rank), with where they came from; the cost model
#    (sim/kernels.node_seconds, ProfileCosts) charges a call its row where there is one,
#    before any microbenchmark case, so a shape measured in one program serves every
#    program that has it, and a program is never scored against its own trace by accident
#    of a constant fitted to it: nothing is fitted, each row is a measured time.
# 4. A task's wall time beyond its calls' (the runtime's loop between its steps, MPI
#    progress after each, a native step's entry into its generated function before its
#    first call's clock), and the runtime's loop between one task of a step and the next,
#    is spread over the lowered calls the traced steps ran: `call_overhead`, seconds per
#    lowered call, which the simulator adds to every task by its calls. Until 2026-11-29
#    the entry and the loop between tasks were left out (a native step's entry went with
#    its run to its calls before per-call clocks, 1., and nowhere after): tiny-gqa pp 2
#    bf16 on 2 vCPUs, 70-120 us a native step and 13 us between tasks, and a profile
#    calibrated from one run's trace predicted that run's own step 2-10% short.
# 5. A shape no traced program ran still runs in a run's conditions, not the
#    microbenchmark's: each traced call's ratio r (1.) is also a sample of how fast its op
#    runs in a run against what the given profile charges it, and `op_speed` keeps the
#    median per precision and op. The cost model multiplies an untraced call of that op
#    by it (sim/kernels.op_speed_factor). The 16-core node's pp 1 x dp 16 runs micro-
#    batches of 2 where the pp 4 x dp 4 traces ran 1: without it the traced profile
#    charged those programs the microbenchmark's kernel times, 13-16% short. Ratios are
#    against the profile `calibrate --from` is given, whose untraced rows they scale.
# 6. The slowdown of kernels beside a collective (NOTE [kernels beside collectives],
#    sim/engine.py) is measured where the run has it too: `ratrain calibrate` times a GEMM
#    loop with all-reduces streaming beside it on every rank at once (1.78x on the 16-core
#    node), but in the pp 4 x dp 4 1f1b traces of that node a stage's last backward, whose
#    layers (BL) run while the all-reduces of the layers before them move, ran 1.05x the
#    time per charged second of its other backwards (B, nothing in flight), and the pp 1
#    x dp 16 ZeRO 1 backward, all-reduces beside every layer but the first, no slower than
#    ZeRO 2's. So where a rank ran both, the median ratio (1.) of its BL steps that began
#    with one of its SYNCs posted and not yet waited for (UPD), over the median of its B
#    steps that began with none, is one sample; the median over ranks is the traced
#    `kernel_slowdown_beside`, which the simulator prefers to the microbenchmark's (hw/
#    topology.node_of). It is a whole task's slowdown, the collective moving for part of
#    it, so it charges the simulated slowdown no more than the run had. A program of one
#    replica posts its SYNCs too, but they move nothing: its ranks give no sample (until
#    2026-11-28 they did, and tiny pp 2's traces, 0.96-1.02, stood in for the probe's
#    1.84-2.24 in every dp 2 program predicted from them, bench/predict-runs/2026-11-28-c).
# 7. A call that moves data (a send, a posted receive, a receive's wait, a collective's
#    start: ProfileCosts.host_ops) has no row (2.), its time on the link being the link's
#    and its wait the other ranks'; but the rank runs it too, the runtime's own work to
#    post or complete it (mpi4py, the send's copy). Its run (its wait for operands left
#    out) less the compute the cost model charges it is one sample of its op's host time;
#    the median per op is the traced `call_host`, which the simulator charges as compute
#    at the call, after its wait where it has one. On 2 vCPUs: 61 us a gradient sync's
#    start, 74 a posted receive, 97 a send, 38 a receive's wait, where the link charged
#    none of it (tiny-gqa pp 2 bf16: 1.2 ms of a 113 ms step on each stage).


@dataclass(frozen=True)
class TracedRun:
    trace: Path                         # the directory of trace-rank<R>.json files
    program: Path                       # the program directory that was traced


def traced_runs(traces: list[str], program: str | None) -> list[TracedRun]:
    """The runs `--from` names, each with its program: --program, else the one the trace
    recorded (rt/trace.py PROGRAM_EVENT)."""
    runs = []
    for trace in map(Path, traces):
        files = sorted(trace.glob("trace-rank*.json"))
        if not files:
            raise UserError(f"--from {trace}: no trace-rank<R>.json there; write them with "
                            f"`ratrain run DIR --trace {trace}`")
        recorded = next((e["args"]["program"] for e in _events(files[0], "M")
                         if e.get("name") == PROGRAM_EVENT), None)
        chosen = program or recorded
        if chosen is None:
            raise UserError(f"--from {trace} does not name its program (traced before "
                            "ratrain recorded it): pass --program DIR")
        runs.append(TracedRun(trace.resolve(), Path(chosen).resolve()))
    return runs


def _events(path: Path, phase: str = "X") -> list[dict]:
    try:
        return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == phase]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a trace of `ratrain run --trace` ({e})") from None


@dataclass
class Samples:
    """What one traced run measured (NOTE [traced rows], NOTE [stragglers])."""
    calls: dict                         # row key -> seconds, a sample per call run
    drifts: list                        # _drift_samples' rows (NOTE [arrival drift])
    world: int                          # the program's ranks
    dp: int = 1                         # its replicas
    overhead: float = 0.0               # seconds inside tasks outside their steps
    lowered_calls: int = 0              # lowered calls the traced steps ran
    ratios: dict = None                 # (precision, op) -> run / charged, a sample per
                                        # call run (NOTE [traced rows] 5)
    beside: list = None                 # a slowdown sample per rank (NOTE [traced rows] 6)
    warm: dict = None                   # kernel key -> how many of its samples were
                                        # scaled to fully cached (NOTE [traced
                                        # residency], sim/calls.py)
    host: dict = None                   # op -> host seconds of a call that moves data
                                        # beyond its charge (NOTE [traced rows] 7)
    spread: list = None                 # the ranks' speed spread per replica and step
                                        # (NOTE [rank spread], sim/costs.py)


def call_samples(run: TracedRun, profile: dict, skip: int = SKIP_STEPS) -> Samples:
    """The samples of `run` after its first `skip` steps: one per call of every traced
    step (NOTE [traced rows] 1-2), and each rank's waits at its UPDs (NOTE [arrival
    drift])."""
    from ratrain.compiler import recompile
    from ratrain.programs import is_program_dir, read_manifest
    from ratrain.sim.calls import ProfileCosts
    from ratrain.sim.simulate import rank_profile
    if not is_program_dir(run.program):
        raise UserError(f"{run.program} (the program of --from {run.trace}) is not a program "
                        "directory; pass --program DIR")
    program = recompile(read_manifest(run.program))
    costs = ProfileCosts(program, rank_profile(profile, program.options.world_size))
    tasks = {stage: {str(t): t for t in stage_tasks}
             for stage, stage_tasks in program.tasks.items()}
    samples: dict[tuple, list[float]] = defaultdict(list)
    ratios: dict[tuple, list[float]] = defaultdict(list)
    warm: dict[tuple, int] = defaultdict(int)
    charges: dict = {}
    hosts: dict = {}
    host: dict[str, list[float]] = defaultdict(list)
    drifts: list = []
    beside: list = []
    ran: dict = defaultdict(list)       # (rank, step) -> its keyed calls' (key, seconds)
    overhead, lowered = 0.0, 0
    for path in sorted(run.trace.glob("trace-rank*.json")):
        events = _events(path)
        backwards, previous = _Backwards(), None
        for event in events:
            backwards.see(event)
            gap = _gap(previous, event)
            previous = event
            if event["args"].get("step", 0) <= skip or "calls" not in event["args"]:
                continue
            stage = program.coords(event["pid"])[0]
            task = tasks[stage].get(event["name"])
            if task is None:
                raise UserError(f"{path} holds task {event['name']}, which stage {stage} of "
                                f"{run.program} does not run: pass the traced program")
            if task not in charges:
                charges[task] = costs.call_charges(task)
                hosts[task] = costs.host_ops(task)
            steps = event["args"]["calls"]
            calls = list(_ran(charges[task], steps))
            _add_samples(samples, ratios, warm, charges[task], calls)
            _add_host(host, charges[task], hosts[task], calls)
            ran[event["pid"], event["args"]["step"]] += [
                (charges[task][i][1], run / charges[task][i][2])
                for i, run in calls if charges[task][i][1] is not None]
            backwards.add(task, steps, charges[task])
            overhead += (gap + event["dur"] - sum(s[2] + _clocked(s) for s in steps)) * 1e-6
            lowered += sum(s[1] for s in steps)
        drifts += _drift_samples(events, program, skip)
        beside += backwards.slowdown() if program.options.dp > 1 else []  # 6.
    return Samples(samples, drifts, program.options.world_size, program.options.dp,
                   overhead, lowered, ratios, beside, warm, host, _rank_spread(ran, program))


def _rank_spread(ran: dict, program) -> list[float]:
    """See NOTE [rank spread]: for each step, the spread of speed of the ranks that pace
    each other (each replica's stages; a one-stage program's replicas), from their calls'
    times over the run's median time per call key."""
    o = program.options
    across = paced_ranks(o.pp, o.dp)
    if across < 2:
        return []
    by_key = defaultdict(list)
    for calls in ran.values():
        for key, seconds in calls:
            by_key[key].append(seconds)
    median = {key: statistics.median(values) for key, values in by_key.items()}
    speeds = defaultdict(list)          # (replica or stage, step) -> each rank's time over
    for (rank, step), calls in ran.items():  # its calls' medians
        typical = sum(median[key] for key, _ in calls)
        if typical > 0:
            stage, replica = program.coords(rank)
            speeds[replica if o.pp > 1 else stage, step].append(
                sum(s for _, s in calls) / typical)
    e = expected_largest_normal(across)
    return [(max(r) - statistics.mean(r)) / statistics.mean(r) / e
            for r in speeds.values() if len(r) == across]


class _Backwards:
    """One rank's backward steps, run over charged, apart by whether one of its DP
    collectives was in flight when they began (NOTE [traced rows] 6)."""

    def __init__(self):
        self.posted: set = set()          # layers whose SYNC has posted, no UPD yet
        self.ratios = {True: [], False: []}

    def see(self, event: dict) -> None:
        """Follow the rank's posts and waits: call with every event, in order."""
        task = _parsed(event["name"])
        if task.kind == Kind.SYNC:
            self.posted.add(task.layer)
        elif task.kind == Kind.UPD:
            self.posted.discard(task.layer)

    def add(self, task, steps: list, charges: list) -> None:
        beside = bool(self.posted)
        if task.kind != (Kind.BL if beside else Kind.B):  # BL beside against B alone only
            return
        charged = sum(charge[0] for charge in charges)
        if charged > 0:
            self.ratios[beside].append(sum(s[3] for s in steps) * 1e-6 / charged)

    def slowdown(self) -> list[float]:
        """[this rank's sample], or [] where it ran only one of the two."""
        if not (self.ratios[True] and self.ratios[False]):
            return []
        return [statistics.median(self.ratios[True]) / statistics.median(self.ratios[False])]


def _drift_samples(events: list, program, skip: int) -> list:
    """See NOTE [arrival drift]: for each UPD of one rank's trace `events` after the first
    `skip` steps, ((stage, step, layer), replica, its wait there, seconds from the rank's
    last UPD of the step before to its SYNC)."""
    ends: dict[int, float] = {}                     # step -> end of its last UPD
    posts: dict[tuple, float] = {}                  # (step, layer) -> SYNC's start
    upds = []
    for event in events:
        step, name = event["args"].get("step", 0), event["name"]
        kind = _parsed(name).kind
        if kind == Kind.UPD:
            ends[step] = max(ends.get(step, 0.0), (event["ts"] + event["dur"]) * 1e-6)
            upds.append(event)
        elif kind == Kind.SYNC:
            posts[step, _parsed(name).layer] = event["ts"] * 1e-6
    out, seen = [], set()
    for event in upds:  # in the order the rank ran them: the step's first UPD only
        step, layer = event["args"]["step"], _parsed(event["name"]).layer
        if step in seen:
            continue
        seen.add(step)
        if step > skip and step - 1 in ends and (step, layer) in posts:
            out.append(((program.coords(event["pid"])[0], step, layer), program.coords(
                event["pid"])[1], sum(s[2] for s in event["args"]["calls"]) * 1e-6,
                posts[step, layer] - ends[step - 1]))
    return out


@functools.lru_cache(maxsize=None)
def _parsed(name: str):
    """The task a trace event names, parsed once per text (a run repeats them each step)."""
    return parse_task(name)


def drift_samples(rows: list, dp: int) -> list[float]:
    """One relative speed spread per UPD that every replica waited at (NOTE [arrival
    drift]) from _drift_samples' rows of every rank."""
    by_upd: dict = defaultdict(dict)
    for key, replica, wait, elapsed in rows:
        by_upd[key][replica] = (wait, elapsed)
    out = []
    for seen in by_upd.values():
        if dp < 2 or len(seen) < dp or min(w for w, _ in seen.values()) <= MIN_WAIT:
            continue
        elapsed = statistics.mean(e for _, e in seen.values())
        waits = [w for w, _ in seen.values()]
        if elapsed > 0:
            out.append((statistics.mean(waits) - min(waits))
                       / expected_largest_normal(dp) / elapsed)
    return out


def _add_samples(samples: dict, ratios: dict, warm: dict, charges: list,
                 calls: list) -> None:
    """Each call a task's traced steps ran (`calls`: (index in `charges`, seconds), _ran)
    gives its row a sample; `ratios` gets each call's run over its charge per op (NOTE
    [traced rows] 5); a kernel call's sample is what it would have taken fully cached
    where the profile knows its warm part, counted in `warm` (NOTE [traced residency])."""
    for i, run in calls:
        seconds, key, share, warm_part = charges[i]
        if key is None:
            continue
        if seconds > 0:
            ratios[key[:2]].append(run / seconds)
        if warm_part is not None:
            run *= warm_part
            warm[key] += 1
        samples[key].append(run / share)


def _add_host(host: dict, charges: list, ops: list, calls: list) -> None:
    """Each traced call (`calls`, as _add_samples') that moves data (`ops`: ProfileCosts.
    host_ops) gives its op a sample of its host time: its run less what the cost model
    charges it as compute, the copy of a send (NOTE [traced rows] 7)."""
    for i, run in calls:
        if ops[i] is not None:
            host[ops[i]].append(max(run - charges[i][0], 0.0))


def _ran(charges: list, steps: list):
    """(index in `charges`, seconds it ran) of each call the traced `steps` ran whose time
    they tell (_call_runs): each [index, calls, wait us, run us(, us per call)] beside
    the charges of the task's lowered calls (ProfileCosts.call_charges; a step the trace
    does not list, skipped by the commit rule, ran one runtime call)."""
    position, previous = 0, -1
    for index, count, _wait, run_us, *each in steps:
        position += index - previous - 1
        group = charges[position:position + count]
        yield from ((i, run) for i, run in enumerate(_call_runs(group, run_us, each),
                                                     start=position) if run is not None)
        position, previous = position + count, index


def _gap(previous: dict | None, event: dict) -> float:
    """Microseconds a rank ran between the task before `event` in the same step and it:
    the runtime's loop (NOTE [traced rows] 4)."""
    if previous is None or previous["args"].get("step") != event["args"].get("step"):
        return 0.0
    return max(event["ts"] - previous["ts"] - previous["dur"], 0.0)


def _clocked(step: list) -> float:
    """Microseconds of a traced step that its calls ran (NOTE [traced rows] 4): the sum
    of its calls' clocks where the generated function kept them, else its whole run."""
    return sum(step[4]) if len(step) > 4 else step[3]


def _call_runs(group: list, run_us: float, each: list) -> list:
    """Seconds each call of a step ran (NOTE [traced rows] 1): as the generated function
    clocked them, else the step's run spread by the calls' charges (None for a call of a
    step of several that the profile charges nothing)."""
    if each:
        return [us * 1e-6 for us in each[0]]
    charged = sum(charge[0] for charge in group)
    if charged <= 0:
        return [run_us * 1e-6 if len(group) == 1 else None] * len(group)
    return [run_us * 1e-6 * charge[0] / charged for charge in group]


def _median_row(values: list[float]) -> list:
    """A traced field: [the median of its samples, how many]."""
    return [float(f"{statistics.median(values):.4g}"), len(values)]


def traced_profile(profile: dict, runs: list[TracedRun], skip: int = SKIP_STEPS,
                   progress=lambda line: None) -> dict:
    """`profile` with the traced rows of `runs` (NOTE [traced rows] 3): in the `threads`
    entry the runs' ranks use, or at the top for a profile without one; `progress` gets
    a line as each run is read."""
    from ratrain.sim.simulate import rank_profile
    by_entry: dict = defaultdict(lambda: defaultdict(list))
    warm: dict = defaultdict(lambda: defaultdict(int))
    spreads: dict = defaultdict(list)
    overheads: dict = defaultdict(lambda: [0.0, 0])
    speeds: dict = defaultdict(lambda: defaultdict(list))
    hosts: dict = defaultdict(lambda: defaultdict(list))
    rank_spreads: dict = defaultdict(list)
    slowdowns: dict = defaultdict(list)
    for run in runs:
        progress(f"reading {run.trace} (the traces of {run.program})")
        samples = call_samples(run, profile, skip)
        entry = rank_profile(profile, samples.world).rank_threads
        for key, values in samples.calls.items():
            by_entry[entry][key_text(key)].extend(values)
        for key, scaled in samples.warm.items():
            warm[entry][key_text(key)] += scaled
        spreads[entry] += drift_samples(samples.drifts, samples.dp)
        overheads[entry][0] += samples.overhead
        overheads[entry][1] += samples.lowered_calls
        for op, values in samples.ratios.items():
            speeds[entry][key_text(op)].extend(values)
        for op, values in samples.host.items():
            hosts[entry][str(op)].extend(values)
        rank_spreads[entry] += samples.spread
        slowdowns[entry] += samples.beside
    out = json.loads(json.dumps(dict(profile)))
    source = {"programs": [str(r.program) for r in runs], "traces": [str(r.trace) for r in runs],
              "date": datetime.date.today().isoformat(), "machine": platform.node()}
    for entry, rows in by_entry.items():
        target = out if entry is None else out["threads"][str(entry)]
        traced = target.setdefault("traced", {"calls": {}, "sources": []})
        traced["calls"].update({key: [float(f"{statistics.median(values):.7g}"), len(values)]
                                + [0.0] * (warm[entry][key] == len(values))
                                for key, values in sorted(rows.items())})
        traced["sources"].append(source)
        seconds, calls = overheads[entry]
        if calls:  # NOTE [traced rows] 4
            traced["call_overhead"] = [float(f"{max(seconds, 0.0) / calls:.4g}"), calls]
        traced["op_speed"] = {op: _median_row(values)
                              for op, values in sorted(speeds[entry].items())}
        if hosts[entry]:  # NOTE [traced rows] 7
            traced["call_host"] = {op: _median_row(values)
                                   for op, values in sorted(hosts[entry].items())}
        for field, values in (("rank_spread", rank_spreads[entry]),  # NOTE [rank spread]
                              ("kernel_slowdown_beside", slowdowns[entry]),  # 6.
                              ("arrival_drift", spreads[entry])):  # NOTE [arrival drift]
            if values:
                traced[field] = _median_row(values)
    return out
