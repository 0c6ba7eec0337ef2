"""Dynamic loss scaling of fp16 programs in the reference executor (rt/calls.py semantics,
torch.cuda.amp.GradScaler's rule): a non-finite gradient on any one rank skips the step on
every rank (no AdamW update, no moment change, AdamW's step count not advanced) and halves
the scale; finite windows double it; gradients are unscaled once, so fp16 tracks fp32."""
from functools import lru_cache

import numpy as np
import pytest

from ratrain import models
from ratrain.models.trace import trace_model
from ratrain.optim import AdamW, LossScaler
from ratrain.rt.reference import Executor
from ratrain.passes.lower import format_lowered
from ratrain.passes.lower_state import state_slots
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.program import CompileOptions, Program
from ratrain.rt import calls
from tiny_model import tiny_config

CONFIG = tiny_config(num_hidden_layers=3)
B, T = 2, 8
# eps near the gradients' size makes AdamW's update depend on the gradient's scale, so a
# gradient left scaled (or unscaled twice) would move the parameters visibly differently.
OPTIMIZER = AdamW(lr=1e-2, weight_decay=0.1, eps=1e-3)
# The scale a first step surely overflows at: the logits' cotangent is about
# scale / (M * B * T) = 2**19 where the target's probability is small, > fp16's 65504.
HUGE = 2.0 ** 24


@lru_cache(maxsize=None)
def compile_program(precision, pp=2, dp=1, m=2, zero=0, clip=None, update_rule="commit"):
    graph = trace_model(CONFIG, micro_batch_size=B, seq_len=T,
                        dtype="float16" if precision == "fp16" else "float32")
    options = CompileOptions(pp=pp, dp=dp, micro_batches=m, micro_batch_size=B, seq_len=T,
                             precision=precision, zero=zero, clip=clip, recompute="none",
                             update_rule=update_rule)
    return run_pipeline(Program(graph, options))[0]


def batch(program, seed: int = 0):
    o = program.options
    rng = np.random.default_rng(seed)
    return rng.integers(0, CONFIG["vocab_size"], (o.dp * o.micro_batches * B, T + 1))


def executor(program, scaler=None) -> Executor:
    return Executor(program, models.init_params(CONFIG, seed=0), OPTIMIZER, scaler)


def optimizer_state(ex: Executor) -> list[np.ndarray]:
    """Every rank's master params and AdamW moments (copies)."""
    return [st.view(slot).copy() for st in ex.ranks for layer in ex.program.stages[st.stage]
            for slot in state_slots(ex.program, layer)[:3]]


def run_steps(ex: Executor, tokens, steps: int) -> list[tuple[float, bool]]:
    """(scale the step ran with, skipped) of each step, every rank agreeing."""
    trail = []
    for _ in range(steps):
        scale = ex.ranks[0].scaler.scale
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is the point here
            ex.run_step(tokens)
        assert len({(st.overflow, st.scaler.scale, st.skipped_steps) for st in ex.ranks}) == 1
        trail.append((scale, ex.ranks[0].overflow))
    return trail


def test_fp16_lowering_scales_the_seed_and_unscales_in_place():
    text = format_lowered(compile_program("fp16", update_rule="after-norm"), 1)
    assert "= fill[loss_scale=True value=0.5]    # loss cotangent" in text
    norm = next(line for line in text.splitlines() if "global_norm" in line)
    written, read = norm.split("#")[0].split(" = global_norm[clip=None loss_scale=True] ")
    assert written.split() == read.split() and "grad.L3+0:f32" in read
    assert "loss_scale" not in format_lowered(compile_program("fp32", clip=1.0), 1)


def test_scaler_backs_off_grows_and_stays_float32():
    scaler = LossScaler(1000.0, growth_interval=3)
    for found_inf, expected in [(False, 1000), (False, 1000), (False, 2000), (True, 1000),
                                (False, 1000), (True, 500), (False, 500), (False, 500),
                                (False, 1000)]:
        scaler.update(found_inf)
        assert scaler.scale == expected
    top = LossScaler(float(np.finfo(np.float32).max), growth_interval=1)
    with np.errstate(over="ignore"):
        top.update(False)
    assert top.scale == float(np.finfo(np.float32).max) and top.growth_tracker == 0


def test_overflow_on_one_rank_skips_the_step_on_every_rank(monkeypatch):
    program = compile_program("fp16", pp=2, dp=2, zero=1)
    sync = calls.CALLS["grad_sync"]

    def poison_rank0_step2(t, st, call):  # after its DP all-reduce: nobody else sees it
        sync(t, st, call)
        if t.step == 2 and st.rank == 0:
            st.view(call.outputs[0]).flat[0] = np.inf
    monkeypatch.setitem(calls.CALLS, "grad_sync", poison_rank0_step2)
    ex = executor(program, LossScaler(2.0 ** 10))
    tokens = batch(program)
    assert run_steps(ex, tokens, 1) == [(2.0 ** 10, False)]
    before = optimizer_state(ex)
    assert run_steps(ex, tokens, 1) == [(2.0 ** 10, True)]
    after = optimizer_state(ex)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert [st.skipped_steps for st in ex.ranks] == [1, 1, 1, 1]
    assert all(st.scaler.scale == 2.0 ** 9 for st in ex.ranks)
    assert run_steps(ex, tokens, 1) == [(2.0 ** 9, False)]
    assert not all(np.array_equal(a, b) for a, b in zip(after, optimizer_state(ex)))


def test_skipped_steps_leave_adamw_step_count_and_state_alone():
    """k overflowing steps, then one update on the same batch == one update from the
    backed-off scale: parameters and moments bit for bit (bias correction of step 1)."""
    program = compile_program("fp16", pp=2, dp=2, zero=2)
    tokens, start = batch(program), optimizer_state(executor(program))
    skipping = executor(program, LossScaler(HUGE))
    trail = []
    while not trail or trail[-1][1]:
        trail += run_steps(skipping, tokens, 1)
        if trail[-1][1]:
            assert all(np.array_equal(a, b) for a, b in zip(start, optimizer_state(skipping)))
    k = len(trail) - 1
    assert k >= 1 and trail == [(HUGE / 2 ** i, i < k) for i in range(k + 1)]
    direct = executor(program, LossScaler(HUGE / 2 ** k))
    assert run_steps(direct, tokens, 1) == [(HUGE / 2 ** k, False)]
    assert all(np.array_equal(a, b) for a, b in
               zip(optimizer_state(skipping), optimizer_state(direct)))
    assert skipping.ranks[0].skipped_steps == k and direct.ranks[0].skipped_steps == 0


def test_scale_halves_on_overflow_and_doubles_after_the_window():
    program = compile_program("fp16", pp=2, dp=1)
    ex = executor(program, LossScaler(HUGE, growth_interval=2))
    trail = run_steps(ex, batch(program), 24)
    assert trail[0] == (HUGE, True)
    scale, good = HUGE, 0
    for (ran, skipped), (following, _) in zip(trail, trail[1:]):
        assert ran == scale
        good = 0 if skipped else good + 1
        scale = scale / 2 if skipped else scale * 2 if good == 2 else scale
        good = good % 2
        assert following == scale
    grown = [a < b for (a, _), (b, _) in zip(trail, trail[1:])]
    assert any(grown) and sum(s for _, s in trail) == ex.ranks[0].skipped_steps


@pytest.mark.parametrize("pp,dp,zero", [(2, 1, 0), (1, 2, 2), (3, 2, 1)])
def test_fp16_tracks_fp32(pp, dp, zero):
    """Same start, same batches: the losses agree to fp16 rounding, and the first step's
    gradient norm (unscaled once, before clipping) is fp32's to 1%."""
    runs = {}
    for precision in ("fp32", "fp16"):
        program = compile_program(precision, pp, dp, 2, zero, clip=1.0)
        ex = executor(program)
        losses, norms = [], []
        for step in range(6):
            losses.append(ex.run_step(batch(program, step)))
            norms.append(ex.ranks[0].grad_norm)
        runs[precision] = losses, norms, ex.ranks[0]
    (loss32, norm32, st32), (loss16, norm16, st16) = runs["fp32"], runs["fp16"]
    assert loss16 == pytest.approx(loss32, rel=3e-3)
    assert norm16[0] == pytest.approx(norm32[0], rel=1e-2) and norm32[0] > 1.0  # clipped
    assert st16.scaler.scale == 2.0 ** 16 and st16.skipped_steps == 0
    assert st32.scaler.scale == 1.0 and st32.skipped_steps == 0


def test_fp32_programs_never_scale_or_skip(monkeypatch):
    program = compile_program("fp32", clip=1.0)
    sync = calls.CALLS["grad_sync"]

    def poison(t, st, call):
        sync(t, st, call)
        st.view(call.outputs[0]).flat[0] = np.inf
    monkeypatch.setitem(calls.CALLS, "grad_sync", poison)
    ex = executor(program)
    before = optimizer_state(ex)
    assert run_steps(ex, batch(program), 1) == [(1.0, False)]
    assert not any(np.array_equal(a, b) for a, b in zip(before, optimizer_state(ex)))
