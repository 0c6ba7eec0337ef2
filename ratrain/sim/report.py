"""What `ratrain simulate` shows of a Simulation: a text summary, a JSON record, a Chrome
trace (chrome://tracing or ui.perfetto.dev) and the schedule picture of the simulated step.
"""
from __future__ import annotations

import json

from ratrain.units import format_bytes


def stage_rows(sim) -> list[dict]:
    """Per simulated rank: stage, compute busy time, end, last backward end, peak."""
    r, peaks = sim.replay, sim.memory_peaks()
    return [{"rank": rank, "stage": sim.stage_of(rank), "busy_s": r.busy(rank),
             "end_s": r.ends[rank], "last_backward_end_s": r.last_backward_end(rank),
             "straggle_s": r.straggle(rank), "peak_bytes": peaks[rank]}
            for rank in sorted(r.ends)]


def _record(sim, profile: dict) -> dict:
    """What a simulation's JSON record says of the program it replayed."""
    o = sim.program.options
    return {"model": sim.program.graph.name, "hw": profile.name, "pp": o.pp, "dp": o.dp,
            "zero": o.zero, "micro_batches": o.micro_batches,
            "micro_batch_size": o.micro_batch_size, "seq_len": o.seq_len,
            "schedule": o.schedule, "precision": o.precision}


def summary(sim) -> dict:
    """The JSON record of a simulation (`ratrain simulate --json`)."""
    return _record(sim, sim.profile) | {
        "step_time_s": sim.step_time, "tokens_per_step": sim.tokens_per_step,
        "tokens_per_s": sim.tokens_per_s, "bubble_fraction": sim.bubble_fraction,
        "exposed_tail_s": sim.exposed_tail,
        "step_alone_s": max(sim.replay.ends.values(), default=0.0), "ranks": stage_rows(sim)}


def _alone(sim) -> str:
    """See NOTE [steady state]: the step time is that of a step of a run; say what one step
    timed alone (everything it started drained, the `end s` column) takes."""
    alone = max(sim.replay.ends.values(), default=0.0)
    if sim.replay.period is None or abs(alone - sim.replay.step_time) < 1e-9 * alone:
        return ""
    return f"\n(a step of a run, in steady state: collectives still in flight at its end " \
           f"overlap the next step; one step alone takes {alone:.4g} s)"


def _headline(sim, profile: dict, tokens_per_step: int) -> list[str]:
    o = sim.program.options
    return [
        f"simulated {sim.program.graph.name} on {profile.name} "
        f"({'calibrated' if profile.calibrated else 'uncalibrated'} profile): pp "
        f"{o.pp} x dp {o.dp} = {o.world_size} ranks, {o.micro_batches} micro-batches of "
        f"{o.micro_batch_size} x {o.seq_len} tokens, schedule {o.schedule} ({o.pipeline_schedule}), zero {o.zero}, "
        f"{o.precision}",
        f"simulated step {sim.step_time:.4g} s, {sim.tokens_per_s:,.0f} tokens/s "
        f"({tokens_per_step:,} tokens per step), bubble {sim.bubble_fraction:.1%}, "
        f"exposed tail {sim.exposed_tail:.4g} s"] + ([
        f"(the mean of {len(sim.rotations)} rotations of the stages' traced speed spread, "
        f"{min(sim.rotations):.4g}-{max(sim.rotations):.4g} s; the rows below are the one "
        f"nearest it: NOTE [rank spread])"] if sim.rotations else [])


def periodic_summary(sim) -> dict:
    """The JSON record of a PeriodicSimulation (sim/periodic.py)."""
    instance = sim.instance
    return _record(sim, instance.profile) | {
        "step_time_s": sim.step_time, "tokens_per_step": instance.tokens_per_step,
        "tokens_per_s": sim.tokens_per_s, "bubble_fraction": sim.bubble_fraction,
        "exposed_tail_s": sim.exposed_tail, "extended_from": sim.built,
        "ranks": [{"rank": r, "stage": instance.stage_of(r), "peak_bytes": b}
                  for r, b in sorted(sim.peaks.items())]}


def format_periodic_summary(sim) -> str:
    """The text summary of a PeriodicSimulation: the step, and each stage's peak."""
    o, instance = sim.program.options, sim.instance
    budget = format_bytes(o.budget) if o.budget else "unlimited"
    lines = _headline(sim, instance.profile, instance.tokens_per_step)
    lines.append(f"(extended from replays of instances of {sim.built} micro-batches and "
                 "more, NOTE [periodic steps]; --trace or --schedule-png replay the whole step)")
    lines.append(f"  {'stage':>5} {'peak':>10}  (budget {budget})")
    lines += [f"  {instance.stage_of(r):>5} {format_bytes(b):>10}" for r, b in sorted(sim.peaks.items())]
    return "\n".join(lines)


def format_summary(sim) -> str:
    o = sim.program.options
    budget = format_bytes(o.budget) if o.budget else "unlimited"
    lines = _headline(sim, sim.profile, sim.tokens_per_step)
    lines[-1] += _alone(sim)
    rows = stage_rows(sim)
    straggle = any(row["straggle_s"] for row in rows)  # NOTE [stragglers]
    lines += [
        f"  {'stage':>5} {'busy s':>10} {'last B s':>10} {'end s':>10} {'peak':>10}"
        + (f" {'stragglers s':>12}" if straggle else "") + f"  (budget {budget})"]
    for row in rows:
        last_b = row["last_backward_end_s"]
        lines.append(f"  {row['stage']:>5} {row['busy_s']:>10.4g} "
                     f"{'-' if last_b is None else f'{last_b:.4g}':>10} {row['end_s']:>10.4g} "
                     f"{format_bytes(row['peak_bytes']):>10}"
                     + (f" {row['straggle_s']:>12.4g}" if straggle else ""))
    return "\n".join(lines)


# ---- Chrome trace ----------------------------------------------------------------------------

def _metadata(pid: int, name: str, lanes: list[str]) -> list[dict]:
    events = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}},
              {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}}]
    return events + [{"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                      "args": {"name": lane}} for tid, lane in enumerate(lanes)]


def chrome_trace(sim) -> dict:
    """Trace Event Format: one process per simulated rank, one thread per lane (compute,
    waits, each port channel), and a counter of the rank's live memory."""
    events = []
    for rank, intervals in sim.replay.intervals.items():
        lanes = sorted({i.lane for i in intervals}, key=lambda l: (l != "compute", l))
        events += _metadata(rank, f"stage {sim.stage_of(rank)} (rank {rank})", lanes)
        events += [{"ph": "X", "pid": rank, "tid": lanes.index(i.lane), "name": i.label,
                    "ts": i.start * 1e6, "dur": (i.end - i.start) * 1e6}
                   | ({"args": {"bytes": i.nbytes}} if i.nbytes else {}) for i in intervals]
        events += [{"ph": "C", "pid": rank, "name": "memory", "ts": t * 1e6,
                    "args": {"GiB": b / 2**30}} for t, b in sim.memory_timeline(rank)]
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {k: v for k, v in summary(sim).items() if k != "ranks"}}


def write_trace(sim, path) -> int:
    """Write the Chrome trace; the number of events."""
    trace = chrome_trace(sim)
    with open(path, "w") as f:
        json.dump(trace, f)
    return len(trace["traceEvents"])


def write_schedule_png(sim, path) -> int:
    """The schedule picture (passes/plots.py) with simulated times; bars drawn."""
    from ratrain.passes.dryrun import DryRunResult, TaskTiming
    from ratrain.passes.plots import schedule_png
    r = sim.replay
    timeline = {rank: tuple(TaskTiming(s.task, s.start, s.end) for s in spans)
                for rank, spans in r.spans.items()}
    tails = {rank: r.ends[rank] - r.last_backward_end(rank) for rank in r.ends
             if r.last_backward_end(rank) is not None}
    result = DryRunResult(timeline, r.step_time, {rank: r.busy(rank) for rank in r.ends},
                          r.bubble_fraction, tails)
    return schedule_png(sim.program, path, timeline=result, unit="s")
