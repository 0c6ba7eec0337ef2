"""The memory screen: which candidates can fit the budget, and why the others cannot.

Runs before anything is compiled. A candidate is out when partition_stages (the
compiler's first pass) finds no split that fits, or when the estimate of estimate.py
(equal to plan_memory's peaks for fixed recompute policies, tests/planner) puts a stage
over the budget, or when a less-memory neighbour is out (NOTE [dominance]). The reason
names the stage, its ranks and layers, and the memory categories largest first. The
memory key leaves the schedule out but for the commit rule's undo copies (memory_key).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ratrain.passes.partition_stages import PartitionError, partition_stages
from ratrain.sim.costs import bound_cost_model
from ratrain.passes.program import Program
from ratrain.planner.candidates import POLICIES_BY_MEMORY, Candidate
from ratrain.planner.estimate import Estimator
from ratrain.planner.memory_estimate import StagePlan, total
from ratrain.units import format_bytes


@dataclass(frozen=True)
class Verdict:
    program: object | None              # the partitioned Program, if it may fit
    plans: tuple[StagePlan, ...] = ()   # estimated per-stage choices and peaks
    peak: int = 0                       # estimated peak (least achievable if it cannot fit)
    reason: str | None = None           # why it cannot fit
    root: tuple | None = None           # memory key the reason was found on

    @property
    def fits(self) -> bool:
        return self.reason is None


def memory_key(c: Candidate) -> tuple:
    """What a candidate's memory depends on. The schedules hold the same buffers at the
    peak, but for the undo copies of the commit rule (NOTE [commit rule]), which only the
    ratrain schedule under its default update rule may keep."""
    undo = c.schedule == "ratrain" and c.update_rule is None
    return (c.pp, c.dp, c.zero, c.micro_batch_size, c.recompute, c.grad_accum or "auto", undo)


# NOTE [dominance]: a candidate needs at least as much memory as one with a higher ZeRO
# stage up to 2 (ZeRO-3's view slots can outweigh few small persistent views, so it
# dominates nothing and is screened on its own), a smaller micro-batch size (the
# activations in flight, min(P - s, M) x B, only grow with B at a fixed global batch), a
# policy earlier in POLICIES_BY_MEMORY or scattered gradients (a shard where auto keeps
# the full gradient or scatters too), all else equal. So once such a neighbour is out,
# so is the candidate, for the same reason.
def dominators(c: Candidate, sizes: list[int]) -> list[tuple]:
    """Memory keys of the candidate's less-memory neighbours."""
    out = []
    if c.zero < 2 and c.dp > 1:
        out.append(memory_key(replace(c, zero=c.zero + 1)))
    if c.zero >= 2 and c.grad_accum is None:
        out.append(memory_key(replace(c, grad_accum="scatter")))
    smaller = [b for b in sizes if b < c.micro_batch_size]
    if smaller:
        out.append(memory_key(replace(c, micro_batch_size=smaller[-1])))
    policy = POLICIES_BY_MEMORY.index(c.recompute)
    if policy:
        out.append(memory_key(replace(c, recompute=POLICIES_BY_MEMORY[policy - 1])))
    return out


def differences(key: tuple, root: tuple) -> str:
    """`zero 2 and recompute auto`: what the root of a reason has that `key` has not."""
    names = ("pp", "dp", "zero", "micro-batch size", "recompute", "gradient accumulation")
    return " and ".join(f"{n} {r}" for n, k, r in zip(names, key, root) if k != r)


class Screen:
    """Verdicts of candidates by memory key, each judged once."""

    def __init__(self, estimator: Estimator, graphs, search):
        self.estimator, self.graphs, self.search = estimator, graphs, search
        self.verdicts: dict[tuple, Verdict] = {}

    def judge(self, c: Candidate, sizes: list[int]) -> Verdict:
        """The candidate's verdict; `sizes` are the micro-batch sizes being searched."""
        key = memory_key(c)
        if key not in self.verdicts:
            self.verdicts[key] = self._inherited(c, sizes) or self._judge(c)
        return self.verdicts[key]

    def _inherited(self, c: Candidate, sizes: list[int]) -> Verdict | None:
        for key in dominators(c, sizes):
            verdict = self.verdicts.get(key)
            if verdict is not None and not verdict.fits:
                root = verdict.root or key
                reason = verdict.reason.split(", which does not fit: ", 1)[-1]
                return Verdict(None, peak=verdict.peak, root=root, reason=(
                    f"needs more than with {differences(memory_key(c), root)}, which does "
                    f"not fit: {reason}"))
        return None

    def _judge(self, c: Candidate) -> Verdict:
        options = c.options(self.search)
        try:  # the partition the compiler makes: by the profile's costs (sim/task_seconds.py)
            program = partition_stages(Program(self.graphs.get(c.micro_batch_size), options,
                                               cost_model=bound_cost_model(self.search.profile)))
        except PartitionError as e:
            return Verdict(None, peak=e.peak, reason=partition_reason(e, options))
        plans = tuple(self.estimator.stage_plans(program))
        worst = max(range(c.pp), key=lambda s: total(plans[s].need))
        peak = total(plans[worst].need)
        if peak > self.search.budget:
            return Verdict(None, plans, peak, estimate_reason(program, worst, plans[worst].need))
        return Verdict(program, plans, peak)


def stage_text(stage: int, layers, options) -> str:
    """`stage 6 (layers 60-70; ranks 6, 14, ...)`: where a memory problem sits (its
    replicas' ranks under the options' placement)."""
    at = options.rank_placement.rank
    ranks = f"ranks {at(stage, 0)}, {at(stage, 1)}, ..." if options.dp > 1 else \
        f"rank {at(stage, 0)}"
    return f"stage {stage} (layers {layers[0]}-{layers[-1]}; {ranks})"


def categories_text(breakdown: dict) -> str:
    """Non-zero categories, largest first."""
    parts = sorted(((b, c) for c, b in breakdown.items() if b), reverse=True)
    return ", ".join(f"{c} {format_bytes(b)}" for b, c in parts)


def partition_reason(e: PartitionError, options) -> str:
    split = f"no split into {options.pp} stages fits: " if options.pp > 1 else ""
    return (f"{split}{stage_text(e.stage, e.layers, options)} needs at least "
            f"{format_bytes(e.peak)} > {format_bytes(e.budget)}: {categories_text(e.breakdown)}")


def estimate_reason(program, stage: int, need: dict) -> str:
    o = program.options
    return (f"estimated: {stage_text(stage, program.stages[stage], o)} needs "
            f"about {format_bytes(total(need))} > {format_bytes(o.budget)}: "
            f"{categories_text(need)}")


def compile_reason(error: Exception) -> str:
    """The first two lines of plan_memory's MemoryBudgetError (stage, arena, the peak's
    categories), or a PartitionError's message, on one line."""
    return "; ".join(str(error).splitlines()[:2])
