"""plan: search configurations of a model on N ranks and rank them by simulated step time.

Every candidate (candidates.py) goes through the memory screen (screen.py); those that
may fit get a closed-form step-time estimate (estimate.py); the best few by estimate
are compiled (the pass pipeline) and replayed by the simulator (ratrain/sim). Rows come
out simulated first (by simulated step time), then the other candidates that may fit
(by estimate), then the infeasible ones (closest to fitting first).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import MISSING, asdict, dataclass, field, fields, replace

from ratrain.hw.profiles import Profile
from ratrain.hw.topology import node_of
from ratrain.passes.insert_update import commits_updates
from ratrain.passes.partition_stages import PartitionError
from ratrain.passes.plan_memory import MemoryBudgetError
from ratrain.planner.candidates import (Candidate, GraphCache, candidates, cluster_counts,
                                        divisors)
from ratrain.planner.estimate import Estimator
from ratrain.planner.margin import SIMULATION_MARGIN
from ratrain.planner.screen import Screen, compile_reason
from ratrain.planner.strategies import Strategy
from ratrain.program_format.placement import nodes_spanned
from ratrain.sim.simulate import rank_profile

# SIMULATION_MARGIN: NOTE [simulation margin] (margin.py); read here, so tests can patch it

# NOTE [near-tie siblings]: candidates that differ only in micro-batch size (one layout,
# ZeRO stage, gradient accumulation, schedule and update rule) share most of the
# estimate's error, so it orders them much better than NOTE [simulation margin] allows
# for (the estimated gap was within 0.3% of the simulated one: 0.15% vs 0.11% for
# LLaMA-2-7B on 8 mt3000 clusters, 6.85% vs 7.11% for LLaMA-2-70B on 1024). A candidate
# estimated no faster than a simulated sibling, and within SIBLING_TIE of it, could beat
# it by little more than that, while its simulation can cost seconds (the 8-cluster
# one: 6.2 s for 4096 micro-batches of 1, to find it 0.1% behind 2048 of 2). It is
# listed with its estimate instead, and does not take a simulation slot.
SIBLING_TIE = 0.01


CANDIDATE_FIELDS = frozenset(f.name for f in fields(Candidate))


@dataclass(frozen=True, init=False)
class Row:
    """One candidate and its outcome. Its candidate's fields read as its own (row.pp);
    its JSON record (`ratrain plan --json`) is the candidate's fields then the outcome's,
    and reads back as Row(**record)."""
    candidate: Candidate                # the configuration
    feasible: bool                      # fits the budget (compiled, or estimated)
    reason: str | None                  # why not, or why it was not simulated
    peak_bytes: int                     # compiled peak, else estimated (a dominated
                                        # candidate's: its dominator's, a lower bound)
    step_time_s: float | None           # simulated step time
    tokens_per_s: float | None          # simulated tokens/s
    estimated_step_s: float | None      # the closed-form estimate (estimate.py) of a row
                                        # that may fit, simulated or not
    bound: str | None = None            # what bounds its estimated step: compute, port,
                                        # node-memory or link (NOTE [bound], estimate.py)

    def __init__(self, candidate: Candidate | None = None, **given):
        """Row(candidate, feasible=..., ...), or with the candidate's fields by name in
        its place (or over it) as the JSON record holds them. Requires: every outcome
        field without a default."""
        chosen = {name: given.pop(name) for name in CANDIDATE_FIELDS & given.keys()}
        candidate = Candidate(**chosen) if candidate is None else replace(candidate, **chosen)
        object.__setattr__(self, "candidate", candidate)
        for f in fields(self)[1:]:
            if f.name not in given and f.default is MISSING:
                raise TypeError(f"Row() needs {f.name}")
            object.__setattr__(self, f.name, given.pop(f.name, f.default))
        if given:
            raise TypeError(f"Row() takes no {', '.join(sorted(given))}")

    def __getattr__(self, name: str):
        """A candidate field read through the row (only called when no attribute of the
        row's own has the name)."""
        if name in CANDIDATE_FIELDS:
            return getattr(self.candidate, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def simulated(self) -> bool:
        return self.step_time_s is not None

    def to_json(self) -> dict:
        outcome = {f.name: getattr(self, f.name) for f in fields(self)[1:]}
        return asdict(self.candidate) | outcome


@dataclass(frozen=True)
class Plan:
    model: str                          # model name
    clusters: int                       # ranks planned for
    global_batch: int                   # sequences per step
    seq_len: int                        # tokens per sequence
    budget: int                         # usable bytes per rank
    hw: str                             # hardware profile name
    rows: tuple[Row, ...]               # simulated, estimated, infeasible (see module doc)
    best: Row | None                    # the best compiled row that fits
    notes: dict = field(default_factory=dict)  # compiled candidate -> what auto chose
    seconds: float = 0.0                # wall time of the search
    strategy: str | None = None         # the strategy searched (strategies.py), if one
    machine: str = ""                   # the nodes, where there are several (nodes_text)


@dataclass(frozen=True)
class Compiled:
    """A candidate that compiled within the budget."""
    peak_bytes: int                     # plan_memory's peak
    note: str                           # what auto recompute chose (recompute_note)
    step_time_s: float | None = None    # simulated step; None if only its memory was checked
    tokens_per_s: float | None = None
    checked_with: int | None = None     # micro-batches of a memory-only check


@dataclass(frozen=True)
class Search:
    """What to plan for (the command's arguments, resolved)."""
    config: dict                        # HF config of the model
    name: str                           # model name
    global_batch: int                   # sequences per step
    seq_len: int                        # tokens per sequence
    profile: dict                       # hardware profile
    budget: int                         # usable bytes per rank
    schedules: tuple[str, ...] = ("ratrain",)
    precision: str = "fp32"             # fp32 or fp16 (the profile's default_precision)
    simulate: int = 3                   # most candidates compiled and simulated

    @property
    def num_layers(self) -> int:
        from ratrain import models
        return len(models.layer_specs(self.config))


class Planner:
    """Plans of one model at any cluster count, sharing traced graphs and verdicts."""

    def __init__(self, search: Search):
        self.search = search
        self.graphs = GraphCache(search.config, search.name, search.seq_len, search.precision)
        self.estimator = Estimator(search.profile)
        self.screen = Screen(self.estimator, self.graphs, search)
        self._compiled: dict = {}       # (candidate, micro-batches, simulate) -> outcome

    def candidates(self, clusters: int, strategy: Strategy | None = None) -> list[Candidate]:
        """The search's candidates, or only those `strategy` allows (its schedule)."""
        s = self.search
        ranks = rank_profile(s.profile, clusters).ranks_per_node
        if strategy is None:
            return candidates(clusters, s.global_batch, s.num_layers, s.schedules, ranks)
        return strategy.candidates(candidates(clusters, s.global_batch, s.num_layers,
                                              (strategy.schedule,), ranks))

    def may_fit(self, clusters: int) -> bool:
        """Does any candidate on `clusters` ranks pass the memory screen?"""
        return any(self._judge(c)[1].fits for c in self.candidates(clusters)
                   if c.recompute == "auto")

    def plan(self, clusters: int, simulate: bool = True,
             strategy: Strategy | None = None, seeds: tuple = ()) -> Plan:
        """Every candidate's row on `clusters` ranks (of `strategy`, if given).
        simulate=False only checks the memory of the best candidate by estimate (NOTE
        [memory check]); `seeds`: candidates simulated as well as the best few by
        estimate, where they fit (NOTE [seeded search], compare.py)."""
        start, s = time.perf_counter(), self.search
        policy = strategy.simulated_policy if strategy else "auto"
        judged = [self._judge(c) for c in self.candidates(clusters, strategy)]
        estimated = {c: self.estimator.step_and_bound(placed_program(v.program, c),
                                                      list(v.plans))
                     for c, v in judged if v.fits}
        estimates = {c: seconds for c, (seconds, _) in estimated.items()}
        bounds = {c: bound for c, (_, bound) in estimated.items()}
        skipped = grad_accumulation_skips(judged)
        queue = sorted((c for c, v in judged if v.fits and c.recompute == policy
                        and c not in skipped), key=lambda c: (estimates[c], _order(c)))
        compiled, failed = (self._simulate(queue, dict(judged), estimates, seeds)
                            if simulate else self._check(queue))
        twins = zb1_twins(dict(judged), compiled, failed)
        judged += twins
        # the bound weighs each resource's load per step, which the schedule leaves as is
        bounds |= {t: bounds.get(twinned(t)) for t, _ in twins}
        rows = _rows(judged, estimates, compiled, failed, policy, skipped, bounds)
        best = rows[0] if rows and rows[0].candidate in compiled else None
        return Plan(s.name, clusters, s.global_batch, s.seq_len, s.budget,
                    Profile.of(s.profile).name,
                    rows, best, {c: r.note for c, r in compiled.items()},
                    time.perf_counter() - start, strategy.name if strategy else None,
                    nodes_text(rank_profile(s.profile, clusters), clusters))

    def smallest(self, limit: int) -> Plan | None:
        """The plan (memory checked, not simulated) at the smallest cluster count up to
        `limit` where a candidate compiles within the budget."""
        s = self.search
        for clusters in cluster_counts(s.global_batch, s.num_layers, limit):
            if self.may_fit(clusters):
                plan = self.plan(clusters, simulate=False)
                if plan.best is not None:
                    return plan
        return None

    def _verdict(self, c: Candidate):
        sizes = divisors(self.search.global_batch // c.dp)
        return self.screen.judge(c, sizes)

    # NOTE [update rule fallback]: the commit rule (NOTE [commit rule], insert_update.py)
    # keeps an undo copy of every updated layer's master and moments until the NORM: 12
    # bytes per parameter of the stage's (shard of) state. With ZeRO 0 on few clusters that
    # is gigabytes and the candidate no longer fits, while the NORM-then-UPD rule it falls
    # back to needs nothing extra, is exactly as exact, and only leaves the updates in the
    # tail. So a candidate that does not fit under commit is judged again under after-norm.
    def _judge(self, c: Candidate) -> tuple[Candidate, object]:
        """(candidate, verdict); after-norm in its place where only that fits (NOTE
        [update rule fallback])."""
        verdict = self._verdict(c)
        if verdict.fits or c.update_rule is not None or \
                not commits_updates(c.options(self.search)):
            return c, verdict
        fallback = replace(c, update_rule="after-norm")
        other = self._verdict(fallback)
        return (fallback, other) if other.fits else (c, verdict)

    def _simulate(self, queue, verdicts, estimates, seeds=()):
        """Compile and simulate the best candidates of `queue` (those of the simulated
        policy: auto, unless a strategy fixes one) by estimate (NOTE [simulation
        margin]); other policies of a configuration never beat its auto, which
        recomputes the least that fits. Returns the compiled and the failed ones."""
        compiled, failed, best = {}, {}, float("inf")
        for c in queue:
            if len(compiled) == self.search.simulate or \
                    estimates[c] > best * (1 + SIMULATION_MARGIN):
                break
            if self.estimator.compute_bound(verdicts[c].program) >= best or \
                    near_tie_sibling(c, compiled, estimates) is not None:
                continue
            outcome = self._compile(c, c.micro_batches)
            if isinstance(outcome, str):
                failed[c] = outcome
                continue
            compiled[c] = outcome
            best = min(best, outcome.step_time_s)
        for seed in seeds:
            c, verdict = self._judge(seed)
            if c in verdicts and verdict.fits and c not in compiled and c not in failed:
                outcome = self._compile(c, c.micro_batches)
                (failed if isinstance(outcome, str) else compiled)[c] = outcome
        for c in [c for c in compiled if c.pp > 1 and c.grad_accum != "scatter"]:
            for twin in self._twins_of(c):
                outcome = self._compile(twin, c.micro_batches)
                (failed if isinstance(outcome, str) else compiled)[twin] = outcome
        return compiled, failed

    def _twins_of(self, c: Candidate) -> list[Candidate]:
        """See NOTE [zb1 twins]: a pipelined candidate's zb1 twin, and where the vocabulary
        splits over its stages its vocabulary-parallel (head and embedding) 1f1b and zb1
        twins."""
        out = [replace(c, pipeline_schedule="zb1")]
        if c.zero < 3 and self.graphs.splits(c.pp):
            out += [replace(c, pipeline_schedule=s, vocab_parallel="both")
                    for s in ("1f1b", "zb1")]
        return out

    # NOTE [memory check]: in 1F1B stage s holds at most min(P - s, M) micro-batches in
    # flight, so for M >= P the live buffers of every stage repeat those of M = P, and a
    # program under a fixed recompute policy has the same peaks with min(M, P)
    # micro-batches as with M. Under auto it fits exactly when its all-full program
    # does, so the smaller program answers "does it fit" for a fraction of the compile
    # time (the smallest cluster counts have the fewest replicas, so the most micro-batches).
    def _check(self, queue):
        """Compile the best candidates by estimate through plan_memory with min(M, pp)
        micro-batches until one fits (at most `search.simulate` tries)."""
        failed = {}
        for c in queue[:self.search.simulate]:
            outcome = self._compile(c, min(c.micro_batches, c.pp), simulate=False)
            if not isinstance(outcome, str):
                return {c: outcome}, failed
            failed[c] = outcome
        return {}, failed

    def _compile(self, c: Candidate, micro_batches: int, simulate: bool = True):
        """Compiled (and simulated, or memory-checked), or why it does not fit; each
        once per planner (strategies share candidates: ratrain, tuned)."""
        key = (c, micro_batches, simulate)
        if key not in self._compiled:
            self._compiled[key] = self._compile_once(c, micro_batches, simulate)
        return self._compiled[key]

    def _compile_once(self, c: Candidate, micro_batches: int, simulate: bool):
        """The simulated step is extended from instances of a few micro-batches (NOTE
        [periodic steps], sim/periodic.py)."""
        from ratrain.sim.periodic import simulate_periodic
        s = self.search
        options = replace(c.options(s), micro_batches=micro_batches)
        try:
            if not simulate:
                program = self._instance(c, options, micro_batches, memory_only=True)
                return Compiled(program.memory.peak_bytes, recompute_note(program),
                                checked_with=micro_batches)
            sim = simulate_periodic(lambda n: self._instance(c, options, n), micro_batches,
                                    c.pp, s.profile)
        except (PartitionError, MemoryBudgetError) as e:
            return compile_reason(e)
        return Compiled(max(sim.peaks.values()), recompute_note(sim.program), sim.step_time,
                        sim.tokens_per_s)

    def _instance(self, c: Candidate, options, built: int, memory_only: bool = False):
        """The candidate's program holding `built` of its micro-batches."""
        from ratrain.passes.pipeline import MEMORY_PIPELINE, run_pipeline
        from ratrain.passes.program import Program
        from ratrain.sim.costs import bound_cost_model
        program = Program(self.graphs.get(c.micro_batch_size,
                                          c.pp if options.splits_head else 0,
                                          options.splits_embedding), options,
                          built_micro_batches=None if built == options.micro_batches else built,
                          cost_model=bound_cost_model(self.search.profile))
        return run_pipeline(program, MEMORY_PIPELINE if memory_only else None,
                            verify=False, record=False)[0]


# NOTE [zb1 twins]: the closed-form estimate models 1F1B's bubble, not zb1's, so the
# planner does not rank zb1 candidates by estimate: every pipelined candidate it compiles
# and simulates (pp > 1; not a scatter row) is simulated again under --pipeline-schedule
# zb1 (its twin), and the twin's row, memory and step from its own compile, stands beside
# it (a twin that does not fit, its W operands on top of 1F1B's peak, is an infeasible
# row saying why). A twin keeps its gradients local (Candidate.options): with the
# reduce-scatter of every micro-batch in its W's, bench/paper.py's qwen2.5-32b plans on
# 256 clusters spent over 10 minutes in simulate_periodic's instances of zb1 scatter
# programs (the whole part took 283 s without them). Their auto recompute flipped where
# recovery runs with the micro-batch count, so no period showed (NOTE [where recovery
# runs]); with that fixed, pp 16 x dp 16 ZeRO 2 at 256 micro-batches finds its period at
# 44 of them in 169 s, against 13 s at 21 for its 1f1b program: still too slow to twin.
# Its `bound` is its 1f1b candidate's: NOTE [bound] weighs each resource's load per step,
# which the schedule does not change. The same candidates get two more twins where the
# vocabulary-sized layers' rows split over their stages (pp > 1, ZeRO 0-2, the vocabulary
# divisible by pp): --vocab-parallel both (the LM head's and the input embedding's rows,
# NOTE [vocabulary-parallel head], NOTE [vocabulary-parallel embedding]) under 1f1b and
# under zb1, also simulated only, since the estimate models the whole head on the last
# stage and the whole embedding on the first; the row's `vocab_parallel` ("both";
# `+vp:both` in the schedule column) says what it spreads. Not "head" alone: on node16
# (tests/sim/test_node16_vocab.py) both gains more, and a tied model's head-only split
# sums its embedding's gradient over every stage where both sums it on each.
def twinned(c: Candidate) -> Candidate:
    """The 1f1b candidate a twin was made of (itself for one that is no twin)."""
    return replace(c, pipeline_schedule="1f1b", vocab_parallel="none")


def zb1_twins(verdicts: dict, compiled, failed) -> list:
    """(twin, its 1f1b candidate's verdict) of each twin (zb1, vocabulary-parallel)
    compiled or tried."""
    return [(c, verdicts[twinned(c)]) for c in [*compiled, *failed] if twinned(c) != c]


def near_tie_sibling(c: Candidate, compiled, estimates) -> Candidate | None:
    """A simulated candidate that differs from `c` only in micro-batch size and that `c`
    is estimated not to beat by more than nothing and to trail by at most SIBLING_TIE
    (NOTE [near-tie siblings])."""
    key = replace(c, micro_batch_size=0, micro_batches=0)
    for s in compiled:
        if replace(s, micro_batch_size=0, micro_batches=0) == key and s in estimates and \
                estimates[s] <= estimates[c] <= estimates[s] * (1 + SIBLING_TIE):
            return s
    return None


def grad_accumulation_skips(judged) -> dict:
    """Fitting candidates not worth a compile for their gradient accumulation (NOTE
    [planned gradient accumulation], candidates.py), each with why: one under the
    compiler's auto that the estimate has reduce-scatter every stage (it follows
    choose_grad_accumulation's rule) is its scatter twin's program; a scatter one whose
    auto twin keeps every stage's full gradient without recompute can only add link
    traffic (its memory buys nothing)."""
    verdicts, out = dict(judged), {}
    for c, v in judged:
        if not v.fits or c.zero < 2:
            continue
        twin = verdicts.get(replace(c, grad_accum=None if c.grad_accum else "scatter"))
        if twin is None or not twin.fits:
            continue
        if c.grad_accum is None and not any(plan.local_grads for plan in v.plans):
            out[c] = ("auto reduce-scatters every stage's gradients here: the scatter row's "
                      "program")
        elif c.grad_accum == "scatter" and all(
                plan.local_grads and plan.level == "none" and not plan.lowered
                for plan in twin.plans):
            out[c] = ("auto keeps full gradients without recompute here: reduce-scattering "
                      "each micro-batch only adds link traffic")
    return out


def recompute_note(program) -> str:
    """What auto recompute chose: `4473 of 5120 (layer, micro-batch) pairs recomputed
    (full 3355, selective 1118)`. For an instance of the step (NOTE [periodic steps]),
    counted over its micro-batches."""
    pairs = sum(program.graph.layers[l].kind == "decoder" for l in range(program.num_layers))
    pairs *= program.micro_batches
    modes = Counter(program.recompute.values())
    detail = ", ".join(f"{m} {n}" for m, n in sorted(modes.items()))
    instance = ("" if program.built_micro_batches is None else
                f" in an instance of {program.micro_batches} micro-batches")
    return (f"{len(program.recompute)} of {pairs} (layer, micro-batch) pairs recomputed"
            + (f" ({detail})" if detail else "") + instance)


def _order(c: Candidate) -> tuple:
    return (c.pp, c.dp, -c.zero, c.micro_batch_size, c.recompute, c.schedule,
            c.grad_accum or "", c.placement != "pipeline", c.placement)


def nodes_text(profile: dict, clusters: int) -> str:
    """`4 nodes of 8 ranks, each node's port 1.25 GB/s`, or "" on one node."""
    node = node_of(profile)
    if clusters <= node.ranks:
        return ""
    return (f"{nodes_spanned(clusters, node.ranks)} nodes of {node.ranks} ranks, each node's port "
            f"{node.port_bandwidth / 1e9:.3g} GB/s")


def placed_program(program, c: Candidate):
    """The screen's partitioned program (shared by the placements of one memory key,
    memory_key) under `c`'s placement, which the estimate costs (NOTE [placement])."""
    if program.options.placement == c.placement:
        return program
    return replace(program, options=replace(program.options, placement=c.placement))


def _rows(judged, estimates, compiled, failed, policy: str = "auto",
          skipped: dict | None = None, bounds: dict | None = None) -> tuple[Row, ...]:
    best = min((r.step_time_s for r in compiled.values() if r.step_time_s), default=None)
    rows = [replace(_row(c, v, estimates, compiled, failed, best, policy,
                         (skipped or {}).get(c)), bound=(bounds or {}).get(c))
            for c, v in judged]
    key = lambda r: ((0, r.step_time_s or 0.0) if r.candidate in compiled else
                     (1, estimates[r.candidate]) if r.feasible else (2, r.peak_bytes),
                     _order(r.candidate))
    return tuple(sorted(rows, key=key))


def _row(c: Candidate, verdict, estimates, compiled, failed, best, policy: str,
         skipped: str | None = None) -> Row:
    """The row of `c`; `policy` is the recompute policy whose candidates were compiled;
    `skipped`: why its gradient accumulation was not compiled (grad_accumulation_skips)."""
    auto = replace(c, recompute=policy)
    estimated = None if auto in failed else estimates.get(c)  # fits: estimated
    row = lambda **outcome: Row(c, estimated_step_s=estimated, **outcome)
    if c in compiled:
        r = compiled[c]
        reason = None if r.checked_with is None else (
            f"not simulated: memory checked with {r.checked_with} micro-batches; 1F1B holds "
            f"at most pp in flight, so {c.micro_batches} fit alike")
        return row(feasible=True, reason=reason, peak_bytes=r.peak_bytes,
                   step_time_s=r.step_time_s, tokens_per_s=r.tokens_per_s)
    if not verdict.fits:
        return row(feasible=False, reason=verdict.reason, peak_bytes=verdict.peak,
                   step_time_s=None, tokens_per_s=None)
    if auto in failed:
        reason = failed[auto] if c == auto else \
            f"needs more than with recompute {policy}, which does not fit: {failed[auto]}"
        return row(feasible=False, reason=reason, peak_bytes=verdict.peak,
                   step_time_s=None, tokens_per_s=None)
    return row(feasible=True,
               reason=_not_simulated(c, estimates, best, policy, compiled, skipped),
               peak_bytes=verdict.peak, step_time_s=None, tokens_per_s=None)


def _not_simulated(c: Candidate, estimates, best, policy: str, compiled=(),
                   skipped: str | None = None) -> str:
    """Why a row that may fit was not simulated (its estimate is the row's own field)."""
    if c.recompute != policy:
        return "not simulated: recompute auto recomputes no more here"
    if skipped:
        return f"not simulated: {skipped}"
    sibling = near_tie_sibling(c, compiled, estimates)
    if sibling is not None:
        return (f"not simulated: estimated within {SIBLING_TIE:.0%} of the simulated "
                f"{sibling.batching} (NOTE [near-tie siblings])")
    if best is not None and estimates[c] > best:
        return f"not simulated: estimated slower than the best simulated {best:.4g} s"
    return "not simulated: only the best few by estimate are (NOTE [simulation margin])"
