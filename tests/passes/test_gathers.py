"""insert_gathers (ZeRO-3): every use of a layer view reads the view its gather wrote,
no view slot is overwritten before its last use, the verifier catches a gather moved
past its use, and the ring of view slots needs less memory than ZeRO-2's views."""
from dataclasses import replace

import pytest

from ratrain import models
from ratrain.ir.tasks import GATHERS, Kind, parse_task
from ratrain.models.trace import trace_model
from ratrain.passes.insert_gathers import GatherError, gather_plan, verify_gathers
from ratrain.program_format.lowered import Slot
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.program import CompileOptions, Program
from tiny_model import MINI, tiny_config

CONFIG = tiny_config(MINI, num_hidden_layers=4)


def compiled(config=CONFIG, **flags):
    options = CompileOptions(**{"dp": 2, "zero": 3, "micro_batch_size": 1, "seq_len": 4,
                                **flags})
    return run_pipeline(Program(trace_model(config, micro_batch_size=1, seq_len=4),
                                options))[0]


def test_gather_text_forms_parse_back():
    for text in ("1GATH_F[L3]5", "0GATH_R[L2]0", "2GATH_B[L7]11"):
        assert str(parse_task(text)) == text
    assert parse_task("1GATH_B[L3]5").kind == Kind.GATH_B


LAYOUTS = [dict(pp=1, micro_batches=3), dict(pp=2, micro_batches=4),
           dict(pp=2, micro_batches=3, zero3_prefetch=0),
           dict(pp=3, micro_batches=4, zero3_prefetch=2, recompute="full"),
           dict(pp=2, micro_batches=3, recompute="selective", schedule="baseline"),
           dict(pp=2, micro_batches=2, grad_accum="scatter", precision="fp16")]


def _layout_id(flags):
    return "-".join(f"{k}{v}" for k, v in flags.items())


@pytest.mark.parametrize("flags", LAYOUTS, ids=_layout_id)
def test_every_use_reads_the_view_its_gather_wrote(flags):
    """Run each stage's lowered calls in order, tracking which layer's view each slot
    holds: a compute call of layer L reading a view slot must find L's view there, written
    by a gather of this step (so no slot was overwritten before its last use)."""
    program = compiled(**flags)
    for stage, lowered in program.lowered.items():
        holds, reads = {}, 0
        for item in lowered:
            for call in item.calls:
                if call.op == "gather_view":
                    holds[call.outputs[0].buffer] = call.layer
                    continue
                for slot in call.inputs:
                    if isinstance(slot, Slot) and slot.buffer.startswith("zview."):
                        assert holds.get(slot.buffer) == call.layer, \
                            (str(item.task), str(call))
                        reads += 1
        assert reads > 0
        assert not any(slot.buffer.startswith("view.")
                       for item in lowered for c in item.calls for slot in c.outputs)


@pytest.mark.parametrize("flags", LAYOUTS, ids=_layout_id)
def test_each_gather_stands_before_its_first_use(flags):
    program = compiled(**flags)
    for stage, tasks in program.tasks.items():
        plan = gather_plan(program, stage)
        assert [t for t in tasks if t.kind in GATHERS] == [g.task for g in plan]
        for g in plan:
            assert tasks.index(g.task) < tasks.index(g.uses[0][0])
        slots = {g.slot for g in plan}
        assert slots == set(range(min(len(plan), program.options.zero3_prefetch + 1)))


def test_no_gathers_and_no_slots_below_zero3():
    program = compiled(pp=2, micro_batches=2, zero=2)
    assert not any(t.kind in GATHERS for ts in program.tasks.values() for t in ts)
    assert not any(n.startswith("zview") for m in program.memory.stages.values()
                   for n in m.offsets)
    bad = dict(program.tasks)
    bad[0] = (parse_task("0GATH_F[L0]0"),) + bad[0]
    with pytest.raises(GatherError, match="not ZeRO-3"):
        verify_gathers(replace(program, tasks=bad))


def test_verifier_catches_a_gather_after_its_use():
    program = compiled(pp=2, micro_batches=2)
    tasks = list(program.tasks[1])
    gather = next(g for g in gather_plan(program, 1) if g.task.kind == Kind.GATH_B)
    tasks.remove(gather.task)
    tasks.insert(tasks.index(gather.uses[0][0]) + 1, gather.task)
    with pytest.raises(GatherError, match="before its gather"):
        verify_gathers(replace(program, tasks={**program.tasks, 1: tuple(tasks)}))


def test_verifier_catches_a_slot_overwritten_before_its_last_use():
    program = compiled(pp=1, micro_batches=2, zero3_prefetch=0)
    tasks = list(program.tasks[0])
    # with one slot, F1's first gather moved before B0 evicts the view B0 still needs
    moved = next(t for t in tasks if t.kind == Kind.GATH_F and t.micro_batch == 1)
    tasks.remove(moved)
    tasks.insert(tasks.index(parse_task("0B0")), moved)
    with pytest.raises(GatherError, match="overwrites view slot"):
        verify_gathers(replace(program, tasks={0: tuple(tasks)}))


def test_view_slots_need_less_than_zero2_views_where_views_dominate():
    """Many decoder layers on one stage, one micro-batch: ZeRO-2 keeps every layer's view
    all step, ZeRO-3 two slots of the largest."""
    config = models.fill_defaults({**CONFIG, "num_hidden_layers": 12, "hidden_size": 64,
                                   "intermediate_size": 128, "num_attention_heads": 4})
    zero3 = compiled(config, pp=1, micro_batches=1)
    zero2 = compiled(config, pp=1, micro_batches=1, zero=2)
    views = lambda p: sum(n for name, (_, n) in p.memory.stages[0].offsets.items()
                          if p.memory.stages[0].categories[name] == "views")
    assert views(zero3) * 5 < views(zero2)
    assert zero3.memory.peak_bytes < zero2.memory.peak_bytes
    at_use = compiled(config, pp=1, micro_batches=1, zero3_prefetch=0)
    assert views(at_use) * 2 == views(zero3)


# ---- semantics: the reference executor against the single-process reference ---------------

ZERO3_CASES = [(1, 2, 3, "ratrain", 1, "none"), (2, 2, 3, "ratrain", 0, "full"),
               (2, 2, 4, "baseline", 2, "selective"), (3, 2, 3, "ratrain", 1, "auto")]


@pytest.mark.parametrize("pp,dp,m,schedule,prefetch,recompute", ZERO3_CASES)
def test_zero3_programs_compute_the_reference_training(pp, dp, m, schedule, prefetch,
                                                       recompute):
    """Losses and weights of the reference (1e-6, test_compiled_semantics): gathers issued
    inside other tasks deliver the right view to every use, in every layout."""
    from test_compiled_semantics import (assert_matches_reference, auto_budget,
                                         compile_program)
    base = compile_program(pp, dp, m, schedule, 2, "none")
    options = replace(base.options, zero=3, zero3_prefetch=prefetch, recompute=recompute)
    program = Program(base.graph, options)
    if recompute == "auto":
        program = replace(program, options=replace(options, budget=auto_budget(program)))
    program = run_pipeline(program)[0]
    assert any(t.kind in GATHERS for ts in program.tasks.values() for t in ts)
    assert_matches_reference(program, dp, m)


def test_an_over_budget_zero3_program_gets_the_budget_message():
    """The budget message replans the program with full recompute: under ZeRO-3 that
    re-places the gathers of the new RECs too (it raised 'not a gather of the plan')."""
    from ratrain.compiler import trace_for
    from ratrain.passes.pipeline import PIPELINE, run_pipeline
    from ratrain.passes.plan_memory import MemoryBudgetError, plan_memory
    options = CompileOptions(pp=3, dp=2, zero=3, micro_batches=6, seq_len=32,
                             recompute="none")
    graph = trace_for(models.get_config("tiny"), "tiny", options)
    program = run_pipeline(Program(graph, options), PIPELINE + [plan_memory])[0]
    budget = program.memory.arena_bytes - 1
    with pytest.raises(MemoryBudgetError, match="over the budget .* by 1 B"):
        plan_memory(replace(program, options=replace(options, budget=budget)))
