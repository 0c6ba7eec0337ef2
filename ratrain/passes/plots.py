"""Pictures of a compiled Program: the schedule as a Gantt chart and the memory timeline.

Read-only views of the same per-stage task lists the runtime and simulator use: times come
from dry_run, bytes from plan_memory's MemoryPlan. Headless (matplotlib's Agg backend).
"""
from __future__ import annotations

from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from ratrain.ir.tasks import BACKWARDS, GATHERS, GRAD_PRODUCERS, Kind, Task  # noqa: E402
from ratrain.passes.buffers import CATEGORIES  # noqa: E402
from ratrain.passes.dryrun import DryRunResult, dry_run  # noqa: E402

COMMS = frozenset({Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B, Kind.POST_F,
                   Kind.POST_B, Kind.NORM, Kind.TIE})
# Relative durations when a task carries no estimate and no profile's costs are given
# (the axis then says "cost units"; with a profile, sim.costs.task_cost_model in "s"): a backward is two forwards, the
# lifecycle tasks are cheaper than a layer pass, messages cheaper still, FREE is free; a
# zb1 W (one layer's weight gradients) as a lifecycle task. A per-layer piece of a B
# counts as one forward: a unit cost knows no layer count.
UNIT_COSTS = {Kind.F: 1.0, Kind.B: 2.0, Kind.BL: 1.0, Kind.W: 0.5, Kind.REC: 1.0,
              Kind.SYNC: 0.5, Kind.UPD: 0.5, Kind.PREF: 0.5,
              Kind.FREE: 0.0} | dict.fromkeys(COMMS, 0.1) | \
    dict.fromkeys(GATHERS, 0.1)
# Bar colour and legend label per group of kinds (all comms share one colour).
GROUPS = {"F": "#4c72b0", "B": "#55a868", "W": "#8de5a1", "REC": "#dd8452", "SYNC": "#8172b3",
          "UPD": "#c44e52", "PREF": "#937860", "GATH": "#da8bc3", "SEND/RECV": "#a0a0a0"}
CATEGORY_COLORS = dict(zip(CATEGORIES, ("#4c72b0", "#8172b3", "#64b5cd", "#55a868",
                                        "#dd8452", "#a0a0a0", "#ccb974")))


def unit_cost(task: Task) -> float:
    """The task's own estimate, else UNIT_COSTS by kind."""
    return task.cost if task.cost is not None else UNIT_COSTS[task.kind]


def options_title(program) -> str:
    o = program.options
    return (f"{program.graph.name}: pp={o.pp} dp={o.dp} M={o.micro_batches} "
            f"schedule={o.schedule} recompute={o.recompute} zero={o.zero} {o.precision}")


def _group(kind: Kind) -> str:
    return "SEND/RECV" if kind in COMMS else "GATH" if kind in GATHERS else \
        "B" if kind in BACKWARDS else str(kind)


def schedule_png(program, path, timeline: DryRunResult | None = None,
                 cost: Callable[[Task], float] = unit_cost, unit: str = "cost units") -> int:
    """Gantt chart of the per-stage task lists, one row per stage, FREE tasks skipped.

    Times come from `timeline` if given (a simulated or measured run), else from
    dry_run(program.tasks, cost); `unit` names what they count (the axis says it: "s"
    for a profile's cost model or a simulation). Returns the number of task bars drawn.
    """
    timeline = timeline or dry_run(program.tasks, cost)
    height = 1 + 0.6 * len(timeline.timeline)
    width = min(40, max(8, timeline.makespan * 0.25))    # inches; long steps get dense
    fig, ax = plt.subplots(figsize=(width, height))
    for group, (ys, lefts, widths) in _task_bars(timeline).items():
        ax.barh(ys, widths, left=lefts, height=0.8, color=GROUPS[group], edgecolor="black",
                linewidth=0.3, label=group)
    _label_micro_batches(ax, timeline)
    _finish_gantt(ax, program, timeline, unit)
    drawn = sum(len(container.patches) for container in ax.containers)
    _save(fig, path)
    return drawn


def _task_bars(timeline: DryRunResult) -> dict[str, tuple[list, list, list]]:
    """(stage rows, starts, durations) of the non-FREE tasks, per group in GROUPS order."""
    bars = {group: ([], [], []) for group in GROUPS}
    for stage, row in timeline.timeline.items():
        for timing in row:
            if timing.task.kind != Kind.FREE:
                ys, lefts, widths = bars[_group(timing.task.kind)]
                ys.append(stage)
                lefts.append(timing.start)
                widths.append(timing.end - timing.start)
    return {group: bar for group, bar in bars.items() if bar[0]}


def _label_micro_batches(ax, timeline: DryRunResult) -> None:
    """Write the micro-batch number inside F, B and REC bars."""
    for stage, row in timeline.timeline.items():
        for timing in row:
            if timing.task.kind in (Kind.F, Kind.REC) or timing.task.kind in GRAD_PRODUCERS:
                ax.text((timing.start + timing.end) / 2, stage, str(timing.task.micro_batch),
                        ha="center", va="center", fontsize=6, color="white")


def _finish_gantt(ax, program, timeline: DryRunResult, unit: str) -> None:
    stages = sorted(timeline.timeline)
    ax.set_yticks(stages, [f"stage {s}" for s in stages])
    ax.invert_yaxis()
    ax.set_xlim(0, max(timeline.makespan, 1e-9))
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(f"{options_title(program)}\nstep {timeline.makespan:.4g} {unit}, "
                 f"bubble {timeline.bubble_fraction:.0%}", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)


def memory_png(program, path) -> int:
    """Per stage, a stacked area of live bytes by category over task index, with the
    arena size and the budget (if set) as lines. Returns the number of stages drawn."""
    from ratrain.passes.plan_memory import unplanned_memory
    plan = program.memory or unplanned_memory(program)
    stages = sorted(plan.stages)
    # A budget far above the arena would flatten the picture: draw it only when near.
    budget = plan.budget if plan.budget and plan.budget <= 2 * plan.arena_bytes else None
    unit, unit_name = _byte_unit(max(plan.arena_bytes, budget or 0))
    fig, axes = plt.subplots(len(stages), 1, figsize=(10, 2.2 * len(stages) + 0.8),
                             sharey=True, squeeze=False)
    for ax, stage in zip(axes[:, 0], stages):
        _draw_stage_memory(ax, stage, plan.stages[stage], budget, unit, unit_name)
    axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    axes[-1, 0].set_xlabel("task index (final per-stage order)")
    off_scale = "" if budget or not plan.budget else \
        f" (budget {plan.budget / unit:.0f} {unit_name}, far above the arena)"
    fig.suptitle(options_title(program) + off_scale, fontsize=9)
    _save(fig, path)
    return len(stages)


def _draw_stage_memory(ax, stage: int, memory, budget, unit: float, unit_name: str) -> None:
    rows = memory.timeline + memory.timeline[-1:]   # repeat the last task so its step shows
    x = range(len(rows))
    layers = [[row[c] / unit for row in rows] for c in CATEGORIES]
    ax.stackplot(x, layers, labels=CATEGORIES, step="post",
                 colors=[CATEGORY_COLORS[c] for c in CATEGORIES])
    ax.axhline(memory.arena_bytes / unit, color="black", linestyle=":", linewidth=1, label="arena")
    if budget is not None:
        ax.axhline(budget / unit, color="red", linestyle="--", linewidth=1, label="budget")
    ax.axvline(memory.peak_task, color="black", linewidth=0.5, alpha=0.5)
    ax.set_ylabel(unit_name)
    ax.set_title(f"stage {stage}: peak {memory.peak_bytes / unit:.2f} {unit_name} at task "
                 f"{memory.peak_task} ({memory.peak_task_name})", fontsize=8)


def _byte_unit(nbytes: int) -> tuple[float, str]:
    return (float(1 << 30), "GiB") if nbytes >= 1 << 30 else (float(1 << 20), "MiB")


def _save(fig, path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
