"""The choices the compiler makes and the planner's estimate predicts are one rule each,
which both call (docs/DESIGN.md 7.4): gradient accumulation (accumulates_locally) and
auto recompute's level (auto_recompute_level), each asked only what it needs."""
import pytest

from ratrain.passes.choose_grad_accumulation import accumulates_locally
from ratrain.passes.insert_recovery import RECOMPUTE_LEVELS, auto_recompute_level
from ratrain.program_format.options import CompileOptions


@pytest.mark.parametrize("zero,accum,budget,fits,local", [
    (1, "auto", 1, False, True),        # below ZeRO-2 nothing is scattered
    (2, "local", 1, False, True),
    (2, "scatter", None, True, False),
    (2, "auto", None, False, True),     # no budget: nothing to fit
    (2, "auto", 1, True, True),
    (3, "auto", 1, False, False),
])
def test_gradient_accumulation_is_one_rule(zero, accum, budget, fits, local):
    options = CompileOptions(dp=2, zero=zero, grad_accum=accum, budget=budget)
    asked = []
    assert accumulates_locally(options, lambda: asked.append(1) or fits) is local
    assert asked == ([1] if zero >= 2 and accum == "auto" and budget else [])


def test_auto_recompute_level_is_the_least_that_fits():
    for fitting in RECOMPUTE_LEVELS:
        asked = []
        fits = lambda level: asked.append(level) or \
            RECOMPUTE_LEVELS.index(level) >= RECOMPUTE_LEVELS.index(fitting)
        assert auto_recompute_level(fits) == fitting
        assert asked == list(RECOMPUTE_LEVELS[:min(RECOMPUTE_LEVELS.index(fitting) + 1, 2)])
    assert auto_recompute_level(lambda level: False) == "full"
