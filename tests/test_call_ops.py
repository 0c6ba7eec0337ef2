"""The grammar of runtime calls (program_format/call_ops.py, NOTE [one table of call ops]):
every op declares every fact; the runtime, the simulator and the cluster's traffic count
register exactly the ops of the table; the facts agree with what the simulator charges;
every call the compiler writes fits its op's schema, and edited ones are refused."""
from dataclasses import replace
from functools import lru_cache

import pytest

from ratrain import models
from ratrain.calibrate.cases import _groups
from ratrain.cluster import volume
from ratrain.compiler import compile_graph, trace_for
from ratrain.hw import load_profile
from ratrain.ir.vocab import state_layers
from ratrain.passes.program import CompileOptions
from ratrain.program_format import call_ops
from ratrain.program_format.call_ops import (CALL_OPS, Arity, CallContext, CallOp, CallSpec,
                                             Calibration, Domain, Param, Traffic,
                                             check_call, describe, registered)
from ratrain.program_format.checks import FieldError
from ratrain.rt import calls as rt_calls
from ratrain.sim import calls as sim_calls
from ratrain.sim.steps import Send, Start, TieSum, WorldSum

LINKED = (Send, Start, TieSum, WorldSum)     # steps that put bytes on a link


def test_every_op_declares_every_fact():
    assert set(CALL_OPS) == set(CallOp)
    for op, spec in CALL_OPS.items():
        assert isinstance(spec, CallSpec) and spec.does, op
        assert isinstance(spec.asynchronous, bool) and isinstance(spec.traced, bool), op
        assert isinstance(spec.calibration, Calibration), op
        assert (spec.calibration.case is None) == bool(spec.calibration.why), op
        assert isinstance(spec.traffic, Traffic), op
        assert isinstance(spec.inputs, Arity) and isinstance(spec.outputs, Arity), op
        for param in spec.params:
            assert isinstance(param, Param) and isinstance(param.domain, Domain), (op, param)
            assert param.domain.what and callable(param.domain.check), (op, param)
        assert spec.relation is None or callable(spec.relation), op


def test_the_runtime_the_simulator_and_the_traffic_count_register_every_op():
    assert set(rt_calls.CALLS) == set(CallOp)
    assert set(sim_calls.CHARGES) == set(CallOp)
    assert set(volume.TRAFFIC) == {op for op, spec in CALL_OPS.items()
                                   if spec.traffic in (Traffic.MESSAGE, Traffic.DP,
                                                       Traffic.WORLD)}
    for table in (rt_calls.CALLS, sim_calls.CHARGES, volume.TRAFFIC):
        assert all(callable(handler) for handler in table.values())
    assert sim_calls.ASYNC_CALLS == {op for op, s in CALL_OPS.items() if s.asynchronous}
    assert set(sim_calls.UNTRACED_RUNTIME_CALLS) == {CallOp.POST_RECV, CallOp.REDO_UPDATE}


def test_a_table_missing_an_op_is_refused_at_import():
    table = dict.fromkeys(set(CallOp) - {CallOp.ADAMW}, print) | {"fused_adamw": print}
    with pytest.raises(TypeError, match=r"sim/calls.py CHARGES must cover .* missing "
                                        r"\['adamw'\], not in the grammar \['fused_adamw'\]"):
        registered(table, "sim/calls.py CHARGES")


def test_every_calibration_case_is_one_calibrate_makes():
    made = {op for names in _groups() for op in names}
    for op, spec in CALL_OPS.items():
        assert spec.calibration.case is None or spec.calibration.case in made, op
    assert set(call_ops.timed_ops()) == {CallOp.ADAMW, CallOp.PREFETCH_VIEW,
                                         CallOp.GRAD_SYNC, CallOp.GATHER_VIEW}


def test_describe_prints_an_ops_schema():
    assert describe(CallOp.GRAD_SYNC) == "grad_sync[op] 1 -> 1"
    assert describe(CallOp.ADAMW) == "adamw[zero speculative? loss_scale? skip?] 1 -> 3 to 6"


# ---- the compiler's calls against the table ---------------------------------------------

PROGRAMS = {  # between them every op of the grammar
    "commit fp16": ("tiny", dict(pp=2, dp=2, zero=1, precision="fp16", clip=1.0)),
    "after-norm": ("tiny", dict(pp=2, dp=1, clip=1.0, update_rule="after-norm")),
    "zero3 tied": ("tiny-tied", dict(pp=1, dp=2, zero=3, grad_accum="scatter")),
    "vocab-parallel tied": ("tiny-tied", dict(pp=2, dp=1, vocab_parallel="both")),
}


@lru_cache(maxsize=None)
def compiled(name: str):
    model, flags = PROGRAMS[name]
    options = CompileOptions(micro_batches=2, micro_batch_size=2, seq_len=32, **flags)
    return compile_graph(trace_for(models.get_config(model), model, options), options)[0]


def runtime_calls(program):
    """(task, call, its CallContext) of every runtime call of the program."""
    from ratrain.passes.insert_tied_sum import tie_stages
    for stage, lowered in program.lowered.items():
        context = CallContext(program.options, stage, state_layers(program, stage),
                              len(program.graph.layers), tie_stages(program))
        for lt in lowered:
            for call in lt.calls:
                if call_ops.is_call_op(call.op):
                    yield lt.task, call, context


def test_the_programs_here_hold_every_op():
    """All but accumulate_grad, which these models' gradients fold into the op making them
    (NOTE [fused gradient accumulation]): lower keeps it for other ops' gradients."""
    seen = {call.op for name in PROGRAMS for _, call, _ in runtime_calls(compiled(name))}
    assert seen == set(CallOp) - {CallOp.ACCUMULATE_GRAD}


@pytest.mark.parametrize("name", PROGRAMS)
def test_every_compiled_call_fits_its_schema_and_its_charge(name):
    """The schema accepts what lower writes; a call whose charge starts a collective is
    of an asynchronous op, and a call of an op without traffic charges no link."""
    program = compiled(name)
    costs = sim_calls.ProfileCosts(program, load_profile("cpu"))
    for task, call, context in runtime_calls(program):
        check_call(call, context, str(task))
        steps = sim_calls.CHARGES[call.op](costs, task, call)
        if any(isinstance(s, Start) for s in steps):
            assert CALL_OPS[call.op].asynchronous, call
        if CALL_OPS[call.op].traffic == Traffic.NONE:
            assert not any(isinstance(s, LINKED) for s in steps), call


def _first(name: str, op: CallOp):
    return next((c, ctx) for _, c, ctx in runtime_calls(compiled(name)) if c.op == op)


def _refusal(call, context) -> str:
    with pytest.raises(FieldError) as e:
        check_call(call, context, "rows[3].steps[0].call")
    return str(e.value)


@pytest.mark.parametrize("op, params, expected", [
    (CallOp.SEND, (("peer", 1), ("tag", 4)), "params.tag must be a message tag of the step "
     "(0 <= tag < 2 x micro_batches), got 4"),
    (CallOp.SEND, (("peer", 1),), "params.tag is missing"),
    (CallOp.SEND, (("peer", 1), ("tag", 0), ("size", 3)), "params.size is not a param of "
     "send (it takes peer, tag)"),
    (CallOp.ADAMW, (("loss_scale", True), ("speculative", True), ("zero", 0)),
     "params.zero must be the program's ZeRO stage (options.zero), got 0"),
    (CallOp.GRAD_SYNC, (("op", "reduce_scatter"),), "(grad_sync): params.op must be "
     "allreduce under ZeRO 1"),
    (CallOp.FILL, (("value", 0.5),), "(fill): params.loss_scale must be true in a fp16 "
     "program"),
])
def test_an_edited_call_is_refused_naming_its_field(op, params, expected):
    call, context = _first("commit fp16", op)
    assert expected in _refusal(replace(call, params=params), context)


def test_an_edited_layer_or_operand_count_is_refused():
    call, context = _first("commit fp16", CallOp.ADAMW)
    assert "layer must be a layer of stage" in _refusal(replace(call, layer=None), context)
    assert "outputs must be 3 to 6 operands" in _refusal(replace(call, outputs=()), context)
