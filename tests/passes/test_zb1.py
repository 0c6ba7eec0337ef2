"""zb1 (NOTE [zb1 schedule], NOTE [B/W split]): the ZB-H1 order's properties and bubble,
the verifier's zb1 invariants (each broken on purpose), the planned memory against 1f1b,
and compiled zb1 programs computing 1f1b's losses and weights bit for bit."""
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ratrain.ir.buffers import BufferKind
from ratrain.ir.tasks import Kind, Task, format_tasks, parse_tasks
from ratrain.passes.buffers import task_effects
from ratrain.passes.layer_buffers import (input_gradients, recovers_in_backward,
                                          residual_layout, weight_operand_layout)
from ratrain.passes.dryrun import dry_run
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.program import CompileOptions, Program
from ratrain.passes.schedule_1f1b import compute_order, schedule_1f1b
from ratrain.passes.schedule_zb1 import johnson_order, schedule_zb1, zb1_compute_order
from ratrain.passes.verify_schedule import ScheduleInvariantError, verify_schedule
from ratrain.rt.reference import Executor

sys.path.insert(0, str(Path(__file__).parent))
from test_compiled_semantics import (B, CONFIGS, OPTIMIZER, T, assert_matches_reference,  # noqa: E402
                                     batches, graph)
from ratrain import models  # noqa: E402


def one_layer_stages(p: int):
    return tuple((s,) for s in range(p))


def unit(task: Task) -> float:
    """F = B = W = 1 (a micro-batch's W's one unit); 1F1B's B is B + W = 2."""
    return {Kind.F: 1.0, Kind.B: 1.0, Kind.W: 1.0}.get(task.kind, 0.0)


def test_zb1_bubble_is_at_most_a_third_of_1f1b_plus_one_over_m():
    p, m = 4, 8
    zb1 = dry_run(schedule_zb1(one_layer_stages(p), m), unit).bubble_fraction
    one_f_one_b = dry_run(schedule_1f1b(p, m), lambda t: {Kind.F: 1.0, Kind.B: 2.0}.get(
        t.kind, 0.0)).bubble_fraction
    assert one_f_one_b == pytest.approx(3 / 11)            # (P - 1) / (M + P - 1)
    assert zb1 <= one_f_one_b / 3 + 1 / m
    assert zb1 == pytest.approx(1 - 24 / 29)               # 3 M + 2 P - 3 slots


def test_stage_orders_p2_m4():
    order = zb1_compute_order(((0, 1), (2,)), 4)
    assert format_tasks(order[1]) == ("1F0 1B0 1F1 1B1 1W[L2]0 1F2 1B2 1W[L2]1 1F3 1B3 "
                                      "1W[L2]2 1W[L2]3")
    # Stage 0 runs F2 before W0, and B1 after it.
    assert format_tasks(order[0]).startswith("0F0 0F1 0B0 0F2 0W[L1]0 0W[L0]0 0B1 0F3")


@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (2, 5), (3, 3), (4, 8), (5, 3)])
def test_zb1_properties(p, m):
    stages = tuple(tuple(range(2 * s, 2 * s + 2)) for s in range(p))
    orders = zb1_compute_order(stages, m)
    for s, tasks in orders.items():
        assert [t for t in tasks if t.kind != Kind.W] == compute_order(s, p, m)  # 1F1B's
        at = {str(t): i for i, t in enumerate(tasks)}
        for layer in stages[s]:
            ws = [t.micro_batch for t in tasks if t.kind == Kind.W and t.layer == layer]
            assert ws == list(range(m))
            assert all(at[f"{s}B{k}"] < at[f"{s}W[L{layer}]{k}"] for k in range(m))
        before_b, before_w, bound = set(), set(), min(p - s, m)
        for t in tasks:
            if t.kind == Kind.F:
                before_b.add(t.micro_batch)
                before_w.add(t.micro_batch)
                assert len(before_b) <= bound and len(before_w) <= bound + 1
            if t.kind == Kind.B:
                before_b.discard(t.micro_batch)
            if t.kind == Kind.W and t.layer == stages[s][0]:
                before_w.discard(t.micro_batch)
    dry_run(schedule_zb1(stages, m))  # no deadlock


def test_johnson_order_puts_the_costly_syncs_first():
    w = {0: 1.0, 1: 1.0, 2: 1.0, 3: 3.0}.get
    sync = {0: 5.0, 1: 0.5, 2: 2.0, 3: 4.0}.get
    # W shorter than its SYNC first (shortest W first), then longest SYNC first
    assert johnson_order([0, 1, 2, 3], w, sync) == [0, 2, 3, 1]


def test_cool_down_order_follows_the_cost_model():
    cost_embed_sync = lambda t: 9.0 if t.kind == Kind.SYNC and t.layer == 0 else unit(t) / 2
    last = lambda order: [t.layer for t in order[0] if t.kind == Kind.W][-2:]
    assert last(zb1_compute_order(((0, 1), (2,)), 2)) == [1, 0]   # backward order
    assert last(zb1_compute_order(((0, 1), (2,)), 2, cost_embed_sync)) == [0, 1]


def compile_zb1(pp, dp, m, zero=0, schedule="ratrain", pipeline="zb1", recompute="none",
                clip=None, model="llama", update_rule="commit", grad_accum="local"):
    options = CompileOptions(pp=pp, dp=dp, micro_batches=m, micro_batch_size=B, seq_len=T,
                             schedule=schedule, zero=zero, recompute=recompute, clip=clip,
                             grad_accum=grad_accum, pipeline_schedule=pipeline,
                             update_rule=update_rule)
    return run_pipeline(Program(graph(model), options))[0]


def run_steps(program, dp, m, model="llama"):
    executor = Executor(program, models.init_params(CONFIGS[model], seed=0), OPTIMIZER)
    return [executor.run_step(tokens) for tokens in batches(dp, m)], executor.params()


CASES = [(2, 1, 4, 0, "ratrain", "none", "local"), (4, 1, 8, 0, "ratrain", "none", "local"),
         (3, 2, 3, 2, "ratrain", "none", "local"), (2, 2, 3, 1, "baseline", "none", "local"),
         (2, 1, 3, 0, "ratrain", "full", "local"), (3, 1, 4, 0, "baseline", "selective", "local"),
         (2, 2, 4, 3, "ratrain", "none", "local"), (2, 2, 3, 2, "ratrain", "none", "scatter"),
         (2, 2, 4, 3, "baseline", "full", "scatter")]


@pytest.mark.parametrize("pp,dp,m,zero,schedule,recompute,grad_accum", CASES)
def test_zb1_computes_1f1b_bits(pp, dp, m, zero, schedule, recompute, grad_accum):
    """B + W run the very calls of 1f1b's B, each layer's W's in micro-batch order, so
    the reference executor (numpy) gives identical losses and weights."""
    zb1 = compile_zb1(pp, dp, m, zero, schedule, "zb1", recompute, grad_accum=grad_accum)
    base = compile_zb1(pp, dp, m, zero, schedule, "1f1b", recompute, grad_accum=grad_accum)
    assert any(t.kind == Kind.W for t in zb1.tasks[0])
    (zb1_losses, zb1_params), (losses, params) = run_steps(zb1, dp, m), run_steps(base, dp, m)
    assert zb1_losses == losses
    assert all(np.array_equal(zb1_params[k], params[k]) for k in params)
    if recompute == "none":
        assert_matches_reference(zb1, dp, m)


@pytest.mark.parametrize("clip,model", [(0.05, "llama"), (None, "tied")])
def test_zb1_with_clipping_and_tied_weights_computes_1f1b_bits(clip, model):
    runs = [run_steps(compile_zb1(2, 2, 3, 1, clip=clip, model=model, pipeline=p), 2, 3,
                      model) for p in ("zb1", "1f1b")]
    assert runs[0][0] == runs[1][0]
    assert all(np.array_equal(runs[0][1][k], runs[1][1][k]) for k in runs[1][1])


def weight_operands(program, stage: int, micro_batch: int) -> int:
    """What the W's of a micro-batch read on the stage besides parameters (NOTE [weight
    operands]): the kept residuals they read (wact.L.mb), what B handed them (wop.L.mb)
    and the residuals a REC rebuilt before B (rec.L.mb)."""
    held = 0
    for layer in program.stages[stage]:
        rebuilt_before_b = (layer, micro_batch) in program.recompute and \
            not recovers_in_backward(program, stage, micro_batch)
        held += residual_layout(program, layer, micro_batch, BufferKind.WACT)[1] + \
            weight_operand_layout(program, layer, micro_batch)[1] + \
            (residual_layout(program, layer, micro_batch, BufferKind.REC)[1]
             if rebuilt_before_b else 0)
    return held


@pytest.mark.parametrize("pp,dp,m,zero,schedule,recompute,grad_accum", CASES)
def test_zb1_peak_is_1f1b_plus_one_micro_batchs_weight_operands_two_on_the_last_stage(
        pp, dp, m, zero, schedule, recompute, grad_accum):
    """Under NOTE [zb1 schedule] and NOTE [weight operands], act.L.mb dies with B and a B
    waits for older W's, so a stage but the last holds 1F1B's peak plus at most one
    micro-batch's W operands; the last stage, whose B's run as soon as they can, one
    micro-batch's more (there the LM head's kept logits gradient is most of them)."""
    zb1 = compile_zb1(pp, dp, m, zero, schedule, "zb1", recompute, grad_accum=grad_accum)
    base = compile_zb1(pp, dp, m, zero, schedule, "1f1b", recompute, grad_accum=grad_accum)
    peaks = [[p.memory.stages[s].peak_bytes for s in range(pp)] for p in (zb1, base)]
    operands = [max(weight_operands(zb1, s, k) for k in range(m)) for s in range(pp)]
    for s in range(pp):
        assert peaks[0][s] <= peaks[1][s] + operands[s] * (2 if s == pp - 1 else 1)


def test_w_reads_no_residual_buffer_b_frees():
    """act.L.mb is last read by B, wact.L.mb by W (NOTE [weight operands])."""
    program = compile_zb1(2, 1, 3)
    reads = {t: task_effects(program, t).reads for t in program.tasks[0]}
    w_reads = {name for t, names in reads.items() if t.kind == Kind.W for name in names}
    assert any(name.startswith("wact.") for name in w_reads)
    assert not any(name.startswith("act.") for name in w_reads)


@pytest.fixture(scope="module")
def program():
    return compile_zb1(2, 1, 3)


def broken(program, stage, text):
    return replace(program, tasks={**program.tasks, stage: parse_tasks(text)})


STAGE1 = "1F0 1B0 1F1 1B1 1W[L4]0 1W[L3]0 1F2 1B2 1W[L4]1 1W[L4]2 1W[L3]1 1W[L3]2"


def test_stage1_of_the_compiled_program(program):
    assert format_tasks(t for t in program.tasks[1] if t.kind in (Kind.F, Kind.B, Kind.W)) \
        == STAGE1
    verify_schedule(program)


@pytest.mark.parametrize("words,message", [
    ("1F0 1W[L4]0 1B0 1W[L3]0 1F1 1B1 1W[L4]1 1W[L3]1 1F2 1B2 1W[L4]2 1W[L3]2",
     "does not follow its backward"),
    ("1F0 1B0 1W[L4]0 1W[L3]0 1F1 1B1 1F2 1B2 1W[L4]2 1W[L3]2 1W[L4]1 1W[L3]1",
     "out of micro-batch order"),
    ("1F0 1B0 1F1 1B1 1F2 1B2 1W[L4]0 1W[L3]0 1W[L4]1 1W[L3]1 1W[L4]2 1W[L3]2",
     "in flight \\(F to last W\\)"),
    ("1F0 1F1 1B0 1B1 1W[L4]0 1W[L3]0 1F2 1B2 1W[L4]1 1W[L3]1 1W[L4]2 1W[L3]2",
     "in flight \\(F to B\\)"),
    ("1F0 1B0 1W[L4]0 1W[L3]0 1F1 1B1 1W[L4]1 1W[L3]1 1F2 1B2 1W[L4]2",
     "has W's of micro-batches"),
])
def test_each_zb1_invariant_has_a_negative(program, words, message):
    stage1 = [t for t in program.tasks[1] if t.kind not in (Kind.F, Kind.B, Kind.W)]
    text = []
    for w in words.split():  # keep every message around its F / B
        mb = w[-1]
        if w.startswith("1F"):
            text += [f"1POST_F{mb}", f"1RECV_F{mb}", w]
        elif w.startswith("1B"):
            text += [w, f"1SEND_B{mb}"]
        else:
            text.append(w)
    tail = [str(t) for t in stage1 if t.kind in (Kind.SYNC, Kind.UPD, Kind.PREF)]
    with pytest.raises(ScheduleInvariantError, match=message):
        verify_schedule(broken(program, 1, " ".join(text + tail)))


def test_a_sync_before_its_layers_last_w_is_rejected(program):
    words = [str(t) for t in program.tasks[1]]
    sync, last_w = words.index("1SYNC[L3]"), words.index("1W[L3]2")
    words.insert(last_w, words.pop(sync))
    with pytest.raises(ScheduleInvariantError, match="before 1W\\[L3\\]2|right after"):
        verify_schedule(broken(program, 1, " ".join(words)))


def test_scattered_gradients_are_reduce_scattered_by_w_from_what_b_hands_it():
    """See NOTE [weight operands]: under scatter accumulation B keeps the gradients it makes
    (a decoder's norms', the LM head's final norm's) in wop.L.mb and W[L] starts the
    micro-batch's one reduce-scatter of them all; auto chooses scatter under zb1 as under
    1f1b."""
    program = compile_zb1(2, 2, 3, 2, grad_accum="scatter")
    scatters = {(lt.task.kind, c.layer) for s in program.lowered
                for lt in program.lowered[s] for c in lt.calls if c.op == "grad_scatter"}
    assert {layer for _, layer in scatters} == set(program.scatter_grads)
    assert {kind for kind, _ in scatters} == {Kind.W}
    per_micro_batch = [c for lt in program.lowered[0] for c in lt.calls
                       if c.op == "grad_scatter"]
    assert len(per_micro_batch) == 3 * len(program.stages[0])
    kind = program.graph.kinds["decoder"]
    assert input_gradients(kind) and all(v.id in weight_operand_layout(program, 1, 0)[0]
                                         for v in input_gradients(kind))
    head, head_kind = program.stages[-1][-1], program.graph.kinds["head"]
    handed = weight_operand_layout(program, head, 0)
    assert input_gradients(head_kind) and all(v.id in handed[0]
                                              for v in input_gradients(head_kind))
    unscattered = weight_operand_layout(compile_zb1(2, 2, 3, 2), head, 0)
    assert handed[1] == unscattered[1] + sum(v.nbytes for v in input_gradients(head_kind))
    options = CompileOptions(pp=2, dp=2, micro_batches=2, micro_batch_size=B, seq_len=T,
                             zero=2, budget=1, pipeline_schedule="zb1")  # auto, nothing fits
    from ratrain.passes.choose_grad_accumulation import choose_grad_accumulation
    from ratrain.passes.partition_stages import partition_stages
    from ratrain.passes.schedule_zb1 import schedule_pipeline
    program = schedule_pipeline(partition_stages(Program(graph(), replace(options,
                                                                          budget=None))))
    zb1 = choose_grad_accumulation(replace(program, options=options)).scatter_grads
    one_f_one_b = replace(program, options=replace(options, pipeline_schedule="1f1b"))
    assert zb1 and zb1 == choose_grad_accumulation(one_f_one_b).scatter_grads


def test_weight_operand_buffers_are_named_by_the_grammar(program):
    from ratrain.ir.buffers import BufferKind, parse_buffer
    for stage, memory in program.memory.stages.items():
        kinds = {parse_buffer(n).kind for n in memory.offsets}
        assert BufferKind.WOP in kinds and all(str(parse_buffer(n)) == n for n in memory.offsets)


def test_a_b_before_older_ws_is_rejected_but_on_the_last_stage(program):
    """Stage 0 runs 0B1 after the W's of micro-batch 0; moving 0W[L0]0 after it breaks
    that (NOTE [zb1 schedule]); the last stage's 1B1 may precede 1W[L4]0 and does."""
    tasks = [t for t in program.tasks[0] if str(t) != "0W[L0]0"]
    b1 = next(i for i, t in enumerate(tasks) if str(t) == "0B1")
    tasks.insert(b1 + 1, parse_tasks("0W[L0]0")[0])
    with pytest.raises(ScheduleInvariantError, match="0B1 runs before the W's of micro-batch 0"):
        verify_schedule(replace(program, tasks={**program.tasks, 0: tuple(tasks)}))
    order = [str(t) for t in program.tasks[1]]
    assert order.index("1B1") < order.index("1W[L4]0")
