"""Tied input/output embeddings through the pass pipeline (NOTE [tied weights]): the
embed and head layers each keep a copy of the shared matrix, a TIE sums the two gradient
halves before either copy is synced, and the program computes exactly the whole model's
losses and parameters while both copies stay bit-identical."""
import itertools
from dataclasses import replace

import numpy as np
import pytest

import test_compiled_semantics as semantics
from ratrain import models
from ratrain.ir.tasks import parse_schedule
from ratrain.models.trace import trace_model
from ratrain.passes.dryrun import ScheduleDeadlock, dry_run
from ratrain.passes.verify_schedule import ScheduleInvariantError, verify_schedule

UNTIED, TIED = semantics.CONFIGS["llama"], semantics.CONFIGS["tied"]
EMBED = "model.embed_tokens.weight"
HEAD = len(models.layer_specs(TIED)) - 1      # the head layer's index


def compiled(pp, dp, zero=0, schedule="ratrain", clip=None, recompute="none", m=3,
             update_rule="commit"):
    return semantics.compile_program(pp, dp, m, schedule, zero, recompute, clip=clip,
                                     model="tied", update_rule=update_rule)


def assert_matches_reference(program, dp, clip=None):
    return semantics.assert_matches_reference(program, dp, 3, clip=clip, model="tied")


def test_the_model_holds_the_matrix_once_and_both_layers_bind_it():
    graph = trace_model(TIED, micro_batch_size=2, seq_len=8)
    assert graph.tied == {EMBED: (0, HEAD)}
    assert "lm_head.weight" not in models.param_shapes(TIED)
    untied = models.count_params(UNTIED)
    assert models.count_params(TIED) == untied - TIED["vocab_size"] * TIED["hidden_size"]
    assert graph.num_params() == models.count_params(TIED)


GRID = [(pp, dp, zero, schedule, clip)
        for pp, dp, zero in itertools.product((1, 2, 3), (1, 2), (0, 1, 2))
        for schedule, clip in (("ratrain", None), ("baseline", None), ("ratrain", 0.05))]


@pytest.mark.parametrize("pp,dp,zero,schedule,clip", GRID)
def test_tied_program_matches_whole_model_and_copies_agree(pp, dp, zero, schedule, clip):
    program = compiled(pp, dp, zero, schedule, clip)
    executor = assert_matches_reference(program, dp, clip)
    for st in executor.ranks:  # every copy on every rank, bit for bit
        copies = [program.view_slots(l)[-1 if l == HEAD else 0]
                  for l in (0, HEAD) if program.stage_of_layer(l) == st.stage]
        for slot in copies:
            assert np.array_equal(st.view(slot), st.view(copies[0]))
    if pp > 1:
        first = [st for st in executor.ranks if st.stage == 0]
        last = [st for st in executor.ranks if st.stage == pp - 1]
        for a, b in zip(first, last):
            assert np.array_equal(a.view(program.view_slots(0)[0]),
                                  b.view(program.view_slots(HEAD)[-1]))


def test_tied_program_matches_under_recompute_auto():
    program = compiled(2, 2, 2, recompute="auto")
    assert program.recompute, "the budget should force recomputation"
    assert_matches_reference(program, 2)


def test_tie_is_in_the_dumps_before_the_tied_syncs():
    program = compiled(2, 1)
    text = str(program)
    assert "0TIE[L0]" in text and f"1TIE[L{HEAD}]" in text
    for stage, layer in ((0, 0), (1, HEAD)):
        words = [str(t) for t in program.tasks[stage]]
        tie = words.index(f"{stage}TIE[L{layer}]")
        assert words.index(f"{stage}SYNC[L{layer}]") == tie + 1
        assert words.index(f"{stage}UPD[L{layer}]") > tie
        other_updates = [i for i, w in enumerate(words) if "UPD" in w and f"[L{layer}]" not in w]
        assert max(other_updates) < tie   # the other layers update while TIE waits
    lowered = {str(lt.task): lt.calls for lt in program.lowered[1]}[f"1TIE[L{HEAD}]"]
    assert [c.op for c in lowered] == ["tie_sum"]
    assert dict(lowered[0].params)["stages"] == (0, 1)


def test_pp1_sums_both_copies_on_one_stage():
    program = compiled(1, 1)
    ties = [t for t in program.tasks[0] if str(t).startswith("0TIE")]
    assert [str(t) for t in ties] == ["0TIE[L0]"]
    (call,) = {str(lt.task): lt.calls for lt in program.lowered[0]}["0TIE[L0]"]
    assert {s.buffer for s in call.inputs} == {"grad.L0", f"grad.L{HEAD}"}
    assert dict(call.params)["stages"] == (0,)


def test_with_a_norm_the_tie_comes_right_before_it():
    """After-norm: TIE and the tied SYNC right before the NORM; under the commit rule the
    tied UPD and PREF follow them, and the NORM ends the step (NOTE [commit rule])."""
    for rule, tail in (("after-norm", ["TIE", "SYNC"]), ("commit", ["TIE", "SYNC", "UPD", "PREF"])):
        program = compiled(2, 2, clip=0.05, update_rule=rule)
        for stage in (0, 1):
            words = [str(t) for t in program.tasks[stage] if t.kind != "FREE"]
            norm = words.index(f"{stage}NORM")
            layer = 0 if stage == 0 else HEAD
            expected = [f"{stage}{kind}[L{layer}]" for kind in tail]
            assert words[norm - len(tail):norm] == expected, (rule, words)
            assert (rule == "commit") == (norm == len(words) - 1)


def test_the_head_copy_is_counted_in_the_last_stage_memory():
    plan = compiled(2, 1).memory.stages[1]
    n = models.param_shapes(TIED)["model.norm.weight"][0] + TIED["vocab_size"] * TIED["hidden_size"]
    assert plan.offsets["master.L%d" % HEAD][1] >= 4 * n
    assert f"master.L{HEAD}" in plan.persistent and f"opt.L{HEAD}" in plan.persistent


def test_a_tied_sync_before_its_tie_is_rejected():
    program = compiled(2, 1)
    tasks = list(program.tasks[1])
    tie = next(i for i, t in enumerate(tasks) if t.kind == "TIE")
    tasks[tie], tasks[tie + 1] = tasks[tie + 1], tasks[tie]
    with pytest.raises(ScheduleInvariantError, match="before 1TIE"):
        verify_schedule(replace(program, tasks={**program.tasks, 1: tuple(tasks)}))


def test_ties_waiting_on_each_other_through_a_message_deadlock():
    schedule = parse_schedule("rank 0: 0TIE[L0] 0SEND_F0\nrank 1: 1RECV_F0 1TIE[L4]")
    with pytest.raises(ScheduleDeadlock, match="waits at 1RECV_F0"):
        dry_run(schedule)
    ok = dry_run(parse_schedule("rank 0: 0SEND_F0 0TIE[L0]\nrank 1: 1RECV_F0 1TIE[L4]"))
    ties = {r: next(t for t in row if t.task.kind == "TIE") for r, row in ok.timeline.items()}
    assert ties[0].start == ties[1].start  # a TIE starts when both ranks have reached it
