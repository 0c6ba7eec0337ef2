"""The pass pipeline: one visible PIPELINE list and the runner that times, verifies and
records every pass's output for `ratrain inspect`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ratrain.passes.choose_grad_accumulation import choose_grad_accumulation
from ratrain.passes.insert_gathers import insert_gathers, verify_gathers
from ratrain.passes.insert_grad_sync import insert_grad_sync
from ratrain.passes.insert_prefetch import insert_prefetch
from ratrain.passes.insert_recovery import insert_recovery
from ratrain.passes.insert_tied_sum import insert_tied_sum
from ratrain.passes.insert_update import insert_update
from ratrain.passes.lower_comms import lower_comms
from ratrain.passes.partition_stages import partition_stages
from ratrain.passes.plan_memory import plan_memory, verify_memory_plan
from ratrain.passes.program import Program
from ratrain.passes.schedule_zb1 import schedule_pipeline
from ratrain.passes.verify_schedule import verify_schedule

PIPELINE = [
    partition_stages,   # first: every later pass works per stage
    schedule_pipeline,  # the F/B(/W) skeleton (1F1B or zb1) the lifecycle tasks go around
    lower_comms,        # posts receives before any lifecycle task, so REC can fill the wait
    choose_grad_accumulation,  # ZeRO-2 gradient buffers first: recovery's budget sees them
    insert_recovery,    # needs the F/B/RECV_B order to put recompute on the forward side
    insert_grad_sync,   # needs the final last-B position of each stage
    insert_update,      # each UPD after its SYNC (after NORM when global scalars rule)
    insert_tied_sum,    # a shared weight's gradient summed before its SYNC, NORM and UPD
    insert_prefetch,    # each PREF after its UPD: the view is built from updated params
    insert_gathers,     # ZeRO-3: last, every F/REC/B is in place to gather its views for
]

# The memory-only pipeline: every task in its final order and the memory plan over them,
# not lowered; what memory questions about a whole configuration run (the planner's
# candidates, the other schedule's report, bench/paper.py).
MEMORY_PIPELINE = PIPELINE + [plan_memory]


def _late_passes():
    # plan_memory needs the final task order; lower needs the arena offsets it assigns.
    from ratrain.passes.lower import lower
    return [plan_memory, lower]


def verify_program(program) -> None:
    """The one verifier run after every pass: schedule invariants, then the memory plan."""
    verify_schedule(program)
    verify_gathers(program)
    verify_memory_plan(program)


@dataclass(frozen=True)
class PassRecord:
    name: str                           # pass function name
    seconds: float                      # wall time of the pass
    text: str                           # the program after it (per-stage task lists,
                                        # and the lowered calls once `lower` made them)


def record_text(before: Program, after: Program) -> str:
    """What `ratrain inspect` shows after a pass: str(program), followed by every stage's
    lowered calls (format_lowered) when this pass made them; deterministic text."""
    text = str(after)
    if after.lowered is None or after.lowered is before.lowered:
        return text
    from ratrain.passes.lower import format_lowered
    return "\n".join([text] + [format_lowered(after, s) for s in sorted(after.lowered)])


def run_pipeline(program: Program, passes=None, *, verify: bool = True, record: bool = True):
    """Run `passes` (default: PIPELINE + plan_memory + lower); return (program, records).
    record=False leaves each record's text empty (the planner reads none of them)."""
    records, verified = [], None
    for compiler_pass in passes if passes is not None else PIPELINE + _late_passes():
        start, before = time.perf_counter(), program
        program = compiler_pass(program)
        seconds = time.perf_counter() - start
        # Tasks and memory plan are what the verifier reads; a pass that kept both
        # objects (lower) cannot have broken them.
        if verify and (verified is None or verified[0] is not program.tasks
                       or verified[1] is not program.memory):
            verify_program(program)
            verified = (program.tasks, program.memory)
        records.append(PassRecord(compiler_pass.__name__, seconds,
                                  record_text(before, program) if record else ""))
    return program, records
