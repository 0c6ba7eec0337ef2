"""Paper report (issue 6, item 4): the RATrain paper's experiments, simulated on the
`mt3000` profile with sequence length 2048 and a global batch of 4096 sequences.

1. LLaMA-2-7B: tokens/s and scaling efficiency of the best planned configuration at 256,
   512, 768 and 1024 clusters, beside the paper's figures where known (768, 1024).
2. Baichuan2-13B and Qwen2.5-32B at --clusters: every strategy of
   ratrain/planner/strategies.py (ratrain, tuned, backward-checkpointing, keep-all,
   zero3-heavy) at its best configuration, compiled and simulated, with where each
   step's time goes.
   Parts 1 and 2 print what the node's shared port changed: each best plan's step with
   four clusters a node sharing one network port (the profile) and with a port per
   cluster (the model before nodes, NOTE [shared port]).
3. Keeping all activations for the four paper models at --clusters: fits 20 GB or why not.
4. The smallest cluster count (and its pipeline degree) at which each model fits.
Figures come from the planner and simulator in-process (ratrain/planner, ratrain/sim);
progress goes to stderr. Usage: python bench/paper.py [--clusters 1024] [--simulate 3]
[--parts 1234]; a few minutes on this machine.
"""
import argparse
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ratrain.inputs import load_hw, load_model
from ratrain.units import format_budget, parse_size
from ratrain.ir.tasks import BACKWARDS, Kind
from ratrain.passes.layer_buffers import recovers_in_backward
from ratrain.passes.partition_stages import PartitionError
from ratrain.passes.pipeline import MEMORY_PIPELINE, run_pipeline
from ratrain.passes.plan_memory import MemoryBudgetError
from ratrain.passes.program import Program
from ratrain.planner import Candidate, Planner, Search
from ratrain.planner.candidates import layouts
from ratrain.planner.compare import compare_strategies, config_text
from ratrain.planner.estimate import Estimator
from ratrain.planner.screen import compile_reason
from ratrain.planner.search import recompute_note
from ratrain.sim import Simulation, simulate
from ratrain.sim.costs import bound_cost_model
from ratrain.units import format_bytes

SEQ_LEN, GLOBAL_BATCH, BUDGET = 2048, 4096, parse_size("20GB")
MODELS = ("llama2-7b", "baichuan2-13b", "qwen2.5-32b", "llama2-70b")
SCALING = (256, 512, 768, 1024)
COMPARED = ("baichuan2-13b", "qwen2.5-32b")
PAPER_TOKENS = {768: 85_465.0,      # LLaMA-2-7B tokens/s (issue 16, from the paper)
                1024: 112_790.55}   # ... on 1024 clusters (abstract)
PAPER_EFFICIENCY = 0.970            # scaling efficiency to 1024 clusters (abstract)
PAPER_SPEEDUP = 1.35                # best speedup over GPU-style strategies (abstract)
PAPER_OVER_CHECKPOINTING = 1.36     # over backward-time checkpointing (issue 16)
TOKENS_TOLERANCE, SPEEDUP_TARGET = 0.05, 1.3
STARTED = time.perf_counter()


def progress(message: str) -> None:
    print(f"# [{time.perf_counter() - STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


def mark(ok: bool) -> str:
    return "ok" if ok else "MISS"


@dataclass(frozen=True)
class Outcome:
    """One compiled and simulated configuration, or why it does not fit."""
    label: str                          # what it stands for ("(a) baseline, auto")
    candidate: Candidate | None
    sim: Simulation | None = None
    peak: int | None = None             # bytes per rank
    reason: str | None = None           # why it does not fit
    note: str = ""                      # what recompute chose

    @property
    def tokens_per_s(self) -> float | None:
        return self.sim.tokens_per_s if self.sim else None


# ---- compiling and simulating ----------------------------------------------------------------

class Runs:
    """Planners per (model, schedule), sharing the profile; compiles on demand."""

    def __init__(self, simulate_best: int):
        self.profile = load_hw("mt3000")
        self.simulate_best = simulate_best
        self.planners: dict = {}

    def planner(self, model: str, schedule: str = "ratrain") -> Planner:
        if (model, schedule) not in self.planners:
            config, name = load_model(model)
            search = Search(config, name, GLOBAL_BATCH, SEQ_LEN, self.profile, BUDGET,
                            (schedule,), self.profile.default_precision, self.simulate_best)
            self.planners[model, schedule] = Planner(search)
        return self.planners[model, schedule]

    def plan(self, model: str, clusters: int, schedule: str = "ratrain", simulate=True):
        progress(f"planning {model} on {clusters} clusters ({schedule} schedule"
                 + ("" if simulate else ", memory only") + ")")
        return self.planner(model, schedule).plan(clusters, simulate=simulate)

    def compile(self, model: str, c: Candidate, budget: int = BUDGET, micro_batches=None,
                memory_only: bool = False):
        """The compiled Program of candidate `c`, or the reason it does not fit."""
        planner = self.planner(model, c.schedule)
        options = replace(c.options(planner.search), budget=budget,
                          micro_batches=micro_batches or c.micro_batches)
        program = Program(planner.graphs.get(c.micro_batch_size), options,
                          cost_model=bound_cost_model(self.profile))  # as the planner's
        passes = MEMORY_PIPELINE if memory_only else None
        try:
            return run_pipeline(program, passes, verify=False)[0]
        except (PartitionError, MemoryBudgetError) as e:
            return compile_reason(e)

    def run(self, model: str, label: str, c: Candidate) -> Outcome:
        progress(f"{model}: compiling and simulating {label}: {c}")
        program = self.compile(model, c)
        if isinstance(program, str):
            return Outcome(label, c, reason=program)
        return Outcome(label, c, simulate(program, self.profile), program.memory.peak_bytes,
                       note=recompute_note(program))


# ---- the four parts ---------------------------------------------------------------------------

# NOTE [1F1B bound]: no schedule of a layout beats (M + pp - 1) x T / pp per step, T the
# forward and backward seconds of one sequence through every layer (mbs 1, M = G / dp
# micro-batches): perfectly balanced stages, no recompute, communication, update or
# tail. With pp x dp = N and dp dividing G = 4096, 768 = 3 x 256 clusters force pp >= 3,
# so its best layout keeps a bubble of at least (pp - 1) / (M + pp - 1) = 2/18, while 512
# and 1024 run pp 1 (no bubble) and 256 pp 4 with M = 64 (3/67). Nor would replicas with
# unequal batches help: a step of whole sequences on 768 clusters lasts at least 6
# sequence-times per cluster (pp 1: some replicas run 6 of the 4096; pp 2 x dp 384: 11
# micro-batches + 1; pp 3 x dp 256: 16 + 2 over 3 stages), for 4096 / 768 = 5.33 of work:
# at most 8/9 of the per-cluster rate of 1024 (4 sequences each, no bubble) in any
# synchronous schedule that does not split a sequence. The paper's 85,465 tokens/s at 768
# is 1.010x its own 1024 figure per cluster.
def bound_1f1b(runs: Runs, model: str, clusters: int) -> tuple[float, int]:
    """(tokens/s, pp) of the best layout's NOTE [1F1B bound]."""
    planner = runs.planner(model)
    s = planner.search
    c = Candidate(1, 1, 0, 1, 1, "none", "ratrain")
    program = Program(planner.graphs.get(1), c.options(s))
    seconds = sum(planner.estimator.times(program, l).forward +
                  planner.estimator.times(program, l).backward
                  for l in range(program.num_layers))
    step = lambda pp, dp: (s.global_batch // dp + pp - 1) * seconds / pp
    return max((s.global_batch * s.seq_len / step(pp, dp), pp)
               for pp, dp in layouts(clusters, s.global_batch, s.num_layers))


def scaling(runs: Runs) -> list[str]:
    rows = []
    for clusters in SCALING:
        best = planned(runs.plan("llama2-7b", clusters))
        rows.append((clusters, runs.run("llama2-7b", "ratrain", best.candidate)))
    base_clusters, base = rows[0]
    per_cluster = base.tokens_per_s / base_clusters
    lines = ["1. LLaMA-2-7B scaling: best planned configuration (ratrain schedule); efficiency "
             f"= tokens/s per cluster against {base_clusters} clusters",
             f"{'clusters':>8}  {'configuration':<46} {'step s':>8} {'tokens/s':>10} "
             f"{'paper':>10} {'ours/paper':>10} {'/cluster':>8} {'efficiency':>10} "
             f"{'bubble':>7} {'tail s':>7} {'1F1B bound':>14}"]
    for clusters, o in rows:
        efficiency = o.tokens_per_s / clusters / per_cluster
        paper = PAPER_TOKENS.get(clusters)
        lines.append(f"{clusters:>8}  {config_text(o.candidate):<46} {o.sim.step_time:>8.4g} "
                     f"{o.tokens_per_s:>10,.0f} {f'{paper:,.0f}' if paper else '-':>10} "
                     f"{f'{o.tokens_per_s / paper:.3f}' if paper else '-':>10} "
                     f"{o.tokens_per_s / clusters:>8.1f} {efficiency:>10.1%} "
                     f"{o.sim.bubble_fraction:>7.1%} {o.sim.exposed_tail:>7.3g} "
                     f"{bound_text(runs, clusters):>14}")
    for clusters, o in rows:
        if clusters in PAPER_TOKENS:
            error = o.tokens_per_s / PAPER_TOKENS[clusters] - 1
            lines.append(f"tokens/s at {clusters}: {o.tokens_per_s:,.0f}, paper "
                         f"{PAPER_TOKENS[clusters]:,.2f} ({error:+.1%}; target within "
                         f"{TOKENS_TOLERANCE:.0%}): {mark(abs(error) <= TOKENS_TOLERANCE)}")
    worst = min((o.tokens_per_s / c / per_cluster, c) for c, o in rows[1:])
    lines.append(f"lowest scaling efficiency against {base_clusters}: {worst[0]:.1%} at "
                 f"{worst[1]} clusters (paper {PAPER_EFFICIENCY:.1%} at 1024; target >= "
                 f"{PAPER_EFFICIENCY:.1%} at every point): {mark(worst[0] >= PAPER_EFFICIENCY)}")
    lines.append("1F1B bound: tokens/s no schedule of the best layout can beat, and its pp "
                 "(NOTE [1F1B bound] in bench/paper.py)")
    lines.append("what the node's shared port changed (NOTE [shared port]):")
    lines += [port_line(runs, f"{clusters} clusters", o) for clusters, o in rows]
    return lines


# NOTE [shared port]: the mt3000 profile puts four clusters on a node behind one network
# port (hw/mt3000.json); before nodes every cluster had a port of its own. The best
# plan's program, simulated again on the profile with ranks_per_node 1 (each cluster its
# own node and port at the same inter_node_bandwidth), shows what sharing the port
# costs that plan (the plan itself, its placement included, stays the one chosen with
# the shared port).
def port_line(runs: Runs, label: str, o: Outcome) -> str:
    """The step of `o`'s program with the node's shared port and with a port per
    cluster (NOTE [shared port])."""
    if o.sim is None:
        return f"  shared port, {label}: not simulated ({o.reason})"
    own = simulate(o.sim.program, runs.profile | {"ranks_per_node": 1}).step_time
    shared, p = o.sim.step_time, runs.profile
    return (f"  shared port, {label} ({config_text(o.candidate)}): step {shared:.4g} s with "
            f"{p.ranks_per_node} clusters a node sharing one "
            f"{p.inter_node_bandwidth / 1e9:.3g} GB/s port, {own:.4g} s with a port per "
            f"cluster ({shared / own - 1:+.1%})")


def bound_text(runs: Runs, clusters: int) -> str:
    tokens, pp = bound_1f1b(runs, "llama2-7b", clusters)
    return f"{tokens:,.0f} pp {pp}"


def planned(plan):
    """The plan's best row; the report cannot go on without one."""
    if plan.best is None:
        sys.exit(f"bench/paper: no configuration of {plan.model} fits on {plan.clusters} "
                 "clusters; see `ratrain plan`")
    return plan.best


def best_row(plan, recompute: str):
    """The best row of a policy: simulated first, then by estimate (the plan's order)."""
    return next((r for r in plan.rows if r.recompute == recompute and r.feasible), None)


def closest_reason(plan, recompute: str) -> str:
    row = next(r for r in plan.rows if r.recompute == recompute and not r.feasible)
    return f"{config_text(row.candidate)}: {row.reason}"


def strategies(runs: Runs, model: str, clusters: int) -> list[Outcome]:
    """Every strategy's best, compiled and simulated again for its time breakdown."""
    progress(f"{model}: planning every strategy on {clusters} clusters")
    outcomes = []
    for best in compare_strategies(runs.planner(model), clusters):
        if best.row is not None:
            outcomes.append(runs.run(model, best.strategy, best.row.candidate))
        else:
            outcomes.append(Outcome(best.strategy, None, reason=best.note))
    return outcomes


# NOTE [step breakdown]: where a simulated step goes on its busiest rank (the one with
# the most compute): F, B and REC compute, the other compute (gradient accumulation,
# SYNC/UPD/PREF work on the stream), the idle time up to its last B (pipeline bubble
# and waits for messages or collectives), and the tail after the pipeline's last B
# (exposed sync, norm, update and prefetch). The columns add up to the step. Recompute
# at backward time runs inside B tasks; its share is moved from B to REC by the
# planner's per-layer recompute seconds (the simulator's roofline of the same nodes).
BREAKDOWN = ("F", "B", "REC", "other", "idle", "tail")


def breakdown(sim: Simulation) -> dict[str, float]:
    """NOTE [step breakdown] of `sim`."""
    r = sim.replay
    rank = max(r.ends, key=r.busy)
    kinds = {str(span.task): span.task.kind for span in r.spans[rank]}  # label: str(task)
    out = dict.fromkeys(BREAKDOWN, 0.0)
    for interval in r.intervals[rank]:
        if interval.lane == "compute":
            kind = kinds.get(interval.label.split(" ")[0])  # "3B0 (finish)": 3B0
            kind = Kind.B if kind in BACKWARDS else kind  # a B's per-layer piece: B
            out[kind if kind in (Kind.F, Kind.B, Kind.REC) else "other"] += \
                interval.end - interval.start
    in_backward = backward_recompute(sim.program, sim.stage_of(rank), sim.profile)
    out["B"] -= in_backward
    out["REC"] += in_backward
    out["tail"] = sim.exposed_tail
    out["idle"] = sim.step_time - sum(out.values())
    return out


def backward_recompute(program, stage: int, profile: dict) -> float:
    """Seconds of the stage's recompute that runs inside its B tasks."""
    estimator = Estimator(profile)
    return sum(estimator.times(program, layer).recompute[mode]
               for (layer, m), mode in program.recompute.items()
               if layer in program.stages[stage] and recovers_in_backward(program, stage, m))


def comparison(runs: Runs, clusters: int) -> list[str]:
    lines = [f"2. ratrain vs the GPU-style strategies on {clusters} clusters (mt3000, 20 GB per "
             "cluster), each at its best configuration; step breakdown on the busiest rank "
             "(NOTE [step breakdown]), seconds"]
    for model in COMPARED:
        outcomes = strategies(runs, model, clusters)
        ours = outcomes[0]
        lines += [f"{model}:", f"  {'strategy':<24} {'configuration':<46} {'peak':>10} "
                  f"{'step s':>8} {'tokens/s':>9} {'ratrain/x':>9}  "
                  + " ".join(f"{k:>7}" for k in BREAKDOWN)]
        lines += [outcome_line(o, ours) for o in outcomes]
        lines += verdict_lines(ours, outcomes[1:])
        lines.append(port_line(runs, f"{model} ratrain", ours))
        lines += [f"    {o.label}, pp {o.candidate.pp}: {o.note}" for o in outcomes if o.note]
    return lines


def verdict_lines(ours: Outcome, others: list[Outcome]) -> list[str]:
    """ratrain over the best other strategy (target >= 1.0x), and over backward-time
    checkpointing where memory forces recompute (ratrain's best recomputes; target
    1.3x), with what that ratio could at most be (NOTE [checkpointing ceiling])."""
    ran = [o for o in others if o.sim]
    lines = [ratio_line(ours, ran, "best other strategy", 1.0)]
    checkpointing = next((o for o in ran if o.label == "backward-checkpointing"), None)
    if checkpointing and ours.sim.program.recompute:
        lines.append(ratio_line(ours, [checkpointing], "memory forces recompute",
                                SPEEDUP_TARGET, f"; paper {PAPER_OVER_CHECKPOINTING}x"))
        lines.append(ceiling_line(checkpointing))
    return lines


# NOTE [checkpointing ceiling]: backward-time checkpointing differs from the others by
# its recompute; were all of it free, its step would shrink by the REC seconds of its
# busiest rank at most, so no strategy at its layout can be faster than step / (step -
# REC) times it. A decoder's full recompute is its forward but the last projections
# (planner/estimate.kind_times): 0.27 of its F + B for LLaMA-2-7B and Baichuan2-13B on
# mt3000, so the ceiling stays near 1.2-1.3x unless the layouts differ.
def ceiling_line(checkpointing: Outcome) -> str:
    parts = breakdown(checkpointing.sim)
    step = checkpointing.sim.step_time
    return (f"    backward-checkpointing spends {parts['REC']:.4g} s of its {step:.4g} s step "
            f"recomputing (busiest rank): free recompute would make it at most "
            f"{step / (step - parts['REC']):.3f}x faster at its layout (NOTE "
            "[checkpointing ceiling])")


def ratio_line(ours: Outcome, others: list[Outcome], which: str, target: float,
               paper: str = "") -> str:
    best = max(others, key=lambda o: o.tokens_per_s)
    ratio = ours.tokens_per_s / best.tokens_per_s
    return (f"  ratrain / {best.label} ({which}, {config_text(best.candidate)}): "
            f"{ratio:.3f}x (target >= {target}x{paper}): {mark(ratio >= target)}")


def outcome_line(o: Outcome, ours: Outcome) -> str:
    config = config_text(o.candidate) if o.candidate else "-"
    if o.sim is None:
        return f"  {o.label:<24} {config:<46} infeasible: {o.reason}"
    parts = breakdown(o.sim)
    return (f"  {o.label:<24} {config:<46} {format_bytes(o.peak):>10} "
            f"{o.sim.step_time:>8.4g} {o.tokens_per_s:>9,.0f} "
            f"{ours.tokens_per_s / o.tokens_per_s:>8.3f}x  "
            + " ".join(f"{parts[k]:>7.2f}" for k in BREAKDOWN))


def keep_all(runs: Runs, clusters: int) -> list[str]:
    lines = [f"3. keeping all activations (recompute none) on {clusters} clusters, any "
             "layout, ZeRO stage and micro-batch size, under 20 GB per cluster"]
    verdicts = []
    for model in MODELS:
        plan = runs.plan(model, clusters, simulate=False)
        row = best_row(plan, "none")
        if row is None:
            verdicts.append(True)
            lines.append(f"  {model:<14} infeasible: closest {closest_reason(plan, 'none')}")
            continue
        c = row.candidate
        program = runs.compile(model, c, micro_batches=min(c.micro_batches, c.pp),
                               memory_only=True)
        verdicts.append(isinstance(program, str))
        lines.append(f"  {model:<14} " + (f"infeasible when compiled: {config_text(c)}: "
                     f"{program}" if verdicts[-1] else f"FITS: {config_text(c)}, peak "
                     f"{format_bytes(program.memory.peak_bytes)} (plan_memory)"))
    lines.append(f"keep-all infeasible for all four models (paper: infeasible): "
                 f"{mark(all(verdicts))}")
    return lines


def smallest(runs: Runs) -> list[str]:
    lines = ["4. smallest feasible cluster count (the planner's --min-clusters; memory checked "
             "by compiling)",
             f"  {'model':<14} {'clusters':>8} {'pp':>4} {'dp':>4}  {'configuration':<46} "
             f"{'peak':>10}  paper"]
    for model in MODELS:
        progress(f"smallest cluster count of {model}")
        planner = runs.planner(model)
        plan = planner.smallest(GLOBAL_BATCH * planner.search.num_layers)
        best = plan.best
        lines.append(f"  {model:<14} {plan.clusters:>8} {best.pp:>4} {best.dp:>4}  "
                     f"{config_text(best.candidate):<46} {format_bytes(best.peak_bytes):>10}  "
                     "n/a (only the abstract is available here)")
    return lines


def revision() -> str:
    """The commit this report ran, and whether ratrain/ had uncommitted changes (other
    engineers edit the shared tree; figures follow the lowering and the cost model)."""
    git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True,
                                    cwd=Path(__file__).parent).stdout.strip()
    rev = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", "../ratrain")
    return (rev or "unknown revision") + (" + uncommitted changes in ratrain/" if dirty else "")


def header() -> list[str]:
    return [f"RATrain paper report (ratrain {revision()}): mt3000 profile "
            f"(uncalibrated), sequence {SEQ_LEN}, global batch {GLOBAL_BATCH} sequences, "
            f"budget {format_budget(BUDGET)} per cluster, fp16",
            "paper figures: abstract of arXiv 2606.10415 (112,790.55 tokens/s and 97.0% "
            "scaling efficiency for LLaMA-2-7B on 1024 clusters; up to 1.35x over GPU-style)"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", type=int, default=1024,
                    help="cluster count of parts 2 and 3 (default: 1024)")
    ap.add_argument("--simulate", type=int, default=3, metavar="S", help="the planner "
                    "compiles and simulates at most S candidates per plan (default: 3)")
    ap.add_argument("--parts", default="1234", metavar="DIGITS", help="which parts to run, "
                    "e.g. 12 (default: 1234)")
    args = ap.parse_args()
    runs = Runs(args.simulate)
    parts = {"1": lambda: scaling(runs), "2": lambda: comparison(runs, args.clusters),
             "3": lambda: keep_all(runs, args.clusters), "4": lambda: smallest(runs)}
    sections = [header()] + [parts[p]() for p in args.parts if p in parts]
    print("\n\n".join("\n".join(s) for s in sections))
    print(f"\n(wall time {time.perf_counter() - STARTED:.0f} s)")


if __name__ == "__main__":
    main()
