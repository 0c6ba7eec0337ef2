"""The schedule verifier accepts compiled programs and rejects each broken invariant."""
from dataclasses import replace

import pytest

from ratrain.ir.tasks import parse_tasks
from ratrain.models.trace import trace_model
from ratrain.passes.dryrun import ScheduleDeadlock, UnmatchedComm
from ratrain.passes.pipeline import PIPELINE, run_pipeline
from ratrain.passes.program import CompileOptions, Program
from ratrain.passes.verify_schedule import ScheduleInvariantError, verify_schedule
from tiny_model import MINI, tiny_config

CONFIG = tiny_config(MINI, num_key_value_heads=None)


def compiled(schedule="ratrain", recompute="full"):
    graph = trace_model(CONFIG, micro_batch_size=1, seq_len=4)
    options = CompileOptions(pp=2, micro_batches=2, micro_batch_size=1, seq_len=4,
                             schedule=schedule, recompute=recompute)
    return run_pipeline(Program(graph, options), PIPELINE)[0]


def with_stage(program, stage: int, text: str):
    return replace(program, tasks={**program.tasks, stage: parse_tasks(text)})


STAGE0 = ("0F0 0SEND_F0 0POST_B0 0F1 0SEND_F1 0REC[L1]0 0RECV_B0 0POST_B1 0B0 "
          "0REC[L1]1 0RECV_B1 0B[L1]1 0SYNC[L1] 0B[L0]1 0SYNC[L0] 0UPD[L1] 0PREF[L1] 0UPD[L0] "
          "0PREF[L0]")


def test_compiled_programs_verify():
    for schedule in ("ratrain", "baseline"):
        verify_schedule(compiled(schedule))
    assert " ".join(map(str, compiled().tasks[0])) == STAGE0


@pytest.mark.parametrize("text,message", [
    (STAGE0.replace("0F1 ", "0F1 0F1 "), "2 F tasks for micro-batch 1"),
    (STAGE0.replace("0SYNC[L0] ", ""), "layer 0 is synced 0 times"),
    (STAGE0.replace("0SYNC[L0] ", "0SYNC[L0] 0SYNC[L0] "), "synced 2 times"),
    # See NOTE [sync issue point]: a SYNC moved before the piece producing its gradient
    (STAGE0.replace("0B[L1]1 0SYNC[L1]", "0SYNC[L1] 0B[L1]1"),
     "0SYNC[L1] starts before 0B[L1]1, the last task producing layer 1's gradient"),
    (STAGE0.replace("0B[L0]1 0SYNC[L0]", "0SYNC[L0] 0B[L0]1"),
     "0SYNC[L0] starts before 0B[L0]1, the last task producing layer 0's gradient"),
    (STAGE0.replace("0B[L1]1 0SYNC[L1] 0B[L0]1", "0SYNC[L1] 0B1"),
     "0SYNC[L1] starts before 0B1, the last task producing layer 1's gradient"),
    (STAGE0.replace("0B[L1]1 0SYNC[L1] 0B[L0]1", "0B[L0]1 0SYNC[L1] 0B[L1]1"),
     "micro-batch 1's backward pieces cover layers [0, 1], not [1, 0]"),
    (STAGE0.replace("0B[L1]1 0SYNC[L1] 0B[L0]1", "0B[L1]1 0SYNC[L1] 0B1 0B[L0]1"),
     "micro-batch 1's backward pieces cover layers [1, 0] besides its B"),
    (STAGE0.replace("0RECV_B1 0B[L1]1", "0RECV_B1 0UPD[L1] 0B[L1]1")
     .replace("0SYNC[L0] 0UPD[L1]", "0SYNC[L0]"),
     "0UPD[L1] is not preceded by its SYNC"),
    (STAGE0.replace("0UPD[L1] 0PREF[L1]", "0PREF[L1] 0UPD[L1]"), "0PREF[L1] is not preceded by its UPD"),
    (STAGE0.replace("0REC[L1]0 0RECV_B0", "0RECV_B0 0REC[L1]0"), "recovery runs on the forward side"),
    (STAGE0.replace("0REC[L1]0 0RECV_B0 0POST_B1 0B0", "0RECV_B0 0POST_B1 0B0 0REC[L1]0"),
     "0REC[L1]0 does not precede its backward"),
    (STAGE0.replace("0POST_B1 ", ""), "0RECV_B1 has no earlier POST_B"),
])
def test_each_invariant_has_a_negative(text, message):
    with pytest.raises(ScheduleInvariantError, match=message.replace("[", r"\[").replace("]", r"\]")):
        verify_schedule(with_stage(compiled(), 0, text))


def test_baseline_may_sync_late_but_ratrain_may_not():
    late = STAGE0.replace("0B[L1]1 0SYNC[L1] 0B[L0]1 0SYNC[L0] 0UPD[L1]",
                          "0B[L1]1 0B[L0]1 0UPD[L9] 0SYNC[L1] 0SYNC[L0] 0UPD[L1]")
    with pytest.raises(ScheduleInvariantError, match=r"0SYNC\[L1\] does not start right after "
                       r"0B\[L1\]1, the last task producing its gradient: 0UPD\[L9\] delays it"):
        verify_schedule(with_stage(compiled(), 0, late))
    baseline = compiled("baseline")
    tasks = [str(t) for t in baseline.tasks[0]]
    assert tasks[tasks.index("0B1") + 1:tasks.index("0B1") + 3] == ["0SYNC[L1]", "0SYNC[L0]"]
    verify_schedule(with_stage(baseline, 0, " ".join(tasks).replace(
        "0B1 0SYNC[L1]", "0B1 0NORM 0SYNC[L1]")))


def test_send_without_receive_is_reported():
    program = compiled()
    stage1 = " ".join(str(t) for t in program.tasks[1] if str(t) != "1RECV_F1")
    with pytest.raises(UnmatchedComm):
        verify_schedule(with_stage(program, 1, stage1))


def test_deadlock_is_reported():
    program = compiled()
    swapped = STAGE0.replace("0F1 0SEND_F1", "0RECV_B0 0F1 0SEND_F1").replace(
        "0REC[L1]0 0RECV_B0", "0REC[L1]0")
    with pytest.raises((ScheduleDeadlock, ScheduleInvariantError)):
        verify_schedule(with_stage(program, 0, swapped))
