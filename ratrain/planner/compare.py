"""compare_strategies: every strategy's best configuration on N ranks, side by side.

Runs one plan per strategy of strategies.py on a shared Planner (traced graphs, memory
verdicts and compiles are shared) and relates each best to ratrain's best.
`ratrain plan --schedule all` prints it; bench/paper.py reports it beside the paper.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ratrain.planner.candidates import Candidate
from ratrain.planner.search import Plan, Planner, Row
from ratrain.planner.strategies import OURS, STRATEGIES


@dataclass(frozen=True)
class StrategyBest:
    strategy: str                       # name in STRATEGIES
    row: Row | None                     # its best compiled and simulated row
    note: str                           # what recompute chose, or why nothing fits
    speedup: float | None               # ratrain's best tokens/s over this one's
    plan: Plan                          # the strategy's plan

    def to_json(self) -> dict:
        return {"strategy": self.strategy, "paper": STRATEGIES[self.strategy].paper,
                "best": self.row.to_json() if self.row else None, "note": self.note,
                "speedup": self.speedup}


def config_text(c: Candidate) -> str:
    """`pp 4 x dp 64, zero 2, 64 x 1, auto` (`dp 64 dp-major` under another placement
    than pipeline-major): a configuration in one table cell."""
    zero = f"zero {c.zero}" + ("" if c.zero3_prefetch is None else
                               f"/{c.zero3_prefetch or 'at use'}") + \
        ("" if c.update_rule is None else f", {c.update_rule}") + \
        ("" if c.grad_accum is None else f", {c.grad_accum}")
    placed = "" if c.placement == "pipeline" else f" {c.placement}-major" \
        if c.placement == "dp" else f" {c.placement}"
    return f"pp {c.pp} x dp {c.dp}{placed}, {zero}, {c.micro_batches} x {c.micro_batch_size}, " \
           f"{c.recompute}"


def strategy_plan(planner: Planner, clusters: int, name: str) -> Plan:
    """The plan of strategy `name` on `clusters` ranks."""
    return planner.plan(clusters, strategy=STRATEGIES[name])


# NOTE [seeded search]: a plan simulates only the few candidates its closed-form estimate
# ranks best (NOTE [simulation margin]), and the estimate can misorder configurations a
# few percent apart. Every other strategy's configuration is also one of ratrain's
# candidates, under the ratrain schedule with auto recompute (the least recompute that
# fits; ZeRO-3 with its views gathered ahead for zero3-heavy's), so ratrain's plan is made
# after the others' and simulates their best configurations too: its best is then never
# behind theirs because its estimate missed a configuration they found.
def compare_strategies(planner: Planner, clusters: int) -> tuple[StrategyBest, ...]:
    """Each strategy's best on `clusters` ranks, ratrain first (NOTE [seeded search])."""
    others = {name: strategy_plan(planner, clusters, name) for name in STRATEGIES
              if name != OURS}
    seeds = tuple(as_ratrain(p.best.candidate) for p in others.values() if p.best)
    plans = {OURS: planner.plan(clusters, strategy=STRATEGIES[OURS], seeds=seeds), **others}
    ours = plans[OURS].best
    return tuple(_best(name, plan, ours) for name, plan in plans.items())


def as_ratrain(c: Candidate) -> Candidate:
    """A strategy's configuration as ratrain's candidate (NOTE [seeded search])."""
    return replace(c, schedule="ratrain", recompute="auto", zero3_prefetch=None,
                   update_rule=None)


def _best(name: str, plan: Plan, ours: Row | None) -> StrategyBest:
    if plan.best is None:
        return StrategyBest(name, None, _why_nothing_fits(plan), None, plan)
    speedup = ours.tokens_per_s / plan.best.tokens_per_s if ours else None
    return StrategyBest(name, plan.best, plan.notes[plan.best.candidate], speedup, plan)


def merged_plan(bests: tuple[StrategyBest, ...], names=("ratrain", "tuned")) -> Plan:
    """One plan of the rows of the strategies `names` (every candidate of both
    schedules: what `--schedule all` searched before strategies), in search.py's order:
    simulated by step time, then by estimate, then the infeasible ones."""
    plans = [b.plan for b in bests if b.strategy in names]
    rows = [r for p in plans for r in p.rows]
    order = lambda r: ((0, r.step_time_s) if r.simulated else (1, 0.0) if r.feasible
                       else (2, r.peak_bytes))
    rows = sorted(rows, key=order)  # stable: each plan's own order within a group
    notes = {c: n for p in plans for c, n in p.notes.items()}
    best = rows[0] if rows and rows[0].simulated else None
    return replace(plans[0], rows=tuple(rows), best=best, notes=notes, strategy=None,
                   seconds=sum(p.seconds for p in plans))


def _why_nothing_fits(plan: Plan) -> str:
    """The candidate closest to fitting and its reason (rows: infeasible ones last,
    closest first)."""
    infeasible = [r for r in plan.rows if not r.feasible]
    if not infeasible:
        return "no candidate"
    row = infeasible[0]
    return f"does not fit; closest: {config_text(row.candidate)}: {row.reason}"
