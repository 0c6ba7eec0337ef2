"""Dry run: replay per-rank task lists in order and prove them deadlock-free.

Checks the output of schedule_1f1b and of every later pass that adds or moves tasks.
SENDs are eager (the runtime posts them non-blocking); a RECV blocks until its matching
SEND on the neighbour rank has ended; the TIEs of a step (NOTE [tied weights]) start
together, once every rank holding one has reached it. SYNC, UPD, PREF, NORM are still
local tasks here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import networkx as nx

from ratrain.ir.tasks import (BACKWARDS, GRAD_PRODUCERS, PIPE_COLLECTIVES, PIPELINE_COMMS,
                              RECVS, VOCAB_TASKS, Kind, Schedule, Task, counterpart)

Node = tuple[int, int]   # (rank, position in that rank's program)


class ScheduleError(Exception):
    """A schedule that cannot run as written."""


class UnmatchedComm(ScheduleError):
    """A SEND or RECV without exactly one counterpart on the neighbour stage."""


class ScheduleDeadlock(ScheduleError):
    """Some ranks wait forever; the message prints the time x rank grid."""

    def __init__(self, message: str, stuck: dict[int, Task], cycle: list[int]):
        super().__init__(message)
        self.stuck = stuck      # rank -> the task it waits at forever
        self.cycle = cycle      # ranks of one wait-for cycle, in waiting order


@dataclass(frozen=True)
class TaskTiming:
    task: Task          # what ran
    start: float        # when it started, seconds from the step start
    end: float          # start + its cost


@dataclass(frozen=True)
class DryRunResult:
    timeline: dict[int, tuple[TaskTiming, ...]]  # rank -> its tasks' times, program order
    makespan: float                              # end of the last task on any rank
    busy: dict[int, float]                       # rank -> summed cost of all its tasks
    bubble_fraction: float                       # 1 - F/B/W time / (ranks * makespan)
    exposed_tail: dict[int, float]               # rank with a B -> its end - last B end


def default_cost(task: Task) -> float:
    """The task's own estimate, or one unit when it has none."""
    return 1.0 if task.cost is None else task.cost


def dry_run(schedule: Schedule, cost: Callable[[Task], float] | None = None) -> DryRunResult:
    """Replay `schedule` with `cost` (default: default_cost) and time every task.

    Raises UnmatchedComm if a SEND/RECV has no single counterpart, ScheduleDeadlock if
    some rank waits forever (message: stuck ranks, wait-for cycle, time x rank grid).
    """
    cost = cost or default_cost
    check_comm_matching(schedule)
    graph = task_graph(schedule)
    runnable = _runnable_nodes(graph)
    timeline = _replay(schedule, graph, runnable, cost)
    if len(runnable) < graph.number_of_nodes():
        raise _deadlock(schedule, timeline, graph)
    return _summarize(timeline)


def _locate(schedule: Schedule) -> dict[Task, list[Node]]:
    where: dict[Task, list[Node]] = {}
    for rank, tasks in schedule.items():
        for position, task in enumerate(tasks):
            where.setdefault(task, []).append((rank, position))
    return where


def check_comm_matching(schedule: Schedule) -> None:
    """Raise UnmatchedComm unless every SEND/RECV meets exactly one counterpart."""
    where, problems = _locate(schedule), []
    for task, nodes in where.items():
        if task.kind not in PIPELINE_COMMS:
            continue
        peer = counterpart(task)
        found = len(where.get(peer, [])) if peer else 0
        ranks = ", ".join(str(rank) for rank, _ in nodes)
        if len(nodes) > 1:
            problems.append(f"{task} appears {len(nodes)} times (ranks {ranks})")
        if not peer:
            problems.append(f"{task} on rank {ranks}: no neighbour stage to pair with")
        elif found != 1:
            problems.append(f"{task} on rank {ranks}: {found or 'no'} matching {peer} "
                            f"on any rank, expected exactly one")
    if problems:
        raise UnmatchedComm("unmatched pipeline communication:\n  " + "\n  ".join(problems))


def task_graph(schedule: Schedule) -> nx.DiGraph:
    """Happens-before graph: program order on each rank, and each SEND before its RECV.

    Nodes are (rank, position) with a `task` attribute. Requires check_comm_matching.
    DP collectives (SYNC of one layer across a DP group) are local tasks for now; to
    match them, add here an edge from each participant's program-order predecessor to
    every other participant, so a collective starts once all members have arrived.
    """
    graph, where = nx.DiGraph(), _locate(schedule)
    for rank, tasks in schedule.items():
        graph.add_nodes_from(((rank, i), {"task": task}) for i, task in enumerate(tasks))
        nx.add_path(graph, [(rank, i) for i in range(len(tasks))])
    ties = []
    for node, task in list(graph.nodes(data="task")):
        if task.kind in RECVS:
            graph.add_edge(where[counterpart(task)][0], node)
        elif task.kind == Kind.TIE:
            ties.append(node)
    for node in ties:  # a TIE starts once every other rank's TIE has been reached
        rank, i = node
        if i > 0:
            graph.add_edges_from(((rank, i - 1), other) for other in ties if other != node)
    _add_shard_edges(graph, schedule)
    return graph


def _add_shard_edges(graph: nx.DiGraph, schedule: Schedule) -> None:
    """See NOTE [vocabulary-parallel schedule]: S(m) after the last stage's F(m) (hn's
    broadcast), T(m) after every S(m) (the statistics' all-gather), and the last stage's
    backward of m after every T(m) (the reduce of hn's gradient); stage 0's F(m) after
    every E(m) (the lookups' reduce), and G(m) after stage 0's backward of m (the
    broadcast of the lookup's gradient, NOTE [vocabulary-parallel embedding])."""
    by_kind: dict = {}
    for node, task in graph.nodes(data="task"):
        by_kind.setdefault((task.kind, task.micro_batch), []).append(node)
    if not any(kind in PIPE_COLLECTIVES for kind, _ in by_kind):
        return
    first, last = min(schedule), max(schedule)
    on = lambda rank, kinds, m: [n for k in kinds for n in by_kind.get((k, m), [])
                                 if n[0] == rank]
    shards = any(kind in VOCAB_TASKS for kind, _ in by_kind)
    for (kind, m), nodes in list(by_kind.items()):
        sources = {Kind.S: on(last, (Kind.F,), m), Kind.T: by_kind.get((Kind.S, m), []),
                   Kind.G: on(first, BACKWARDS, m)}.get(kind, [])
        for node in nodes:
            extra = []
            if kind in BACKWARDS and node[0] == last and shards:
                extra = by_kind.get((Kind.T, m), [])
            elif kind == Kind.F and node[0] == first:
                extra = by_kind.get((Kind.E, m), [])
            graph.add_edges_from((source, node) for source in sources + extra
                                 if source != node)


def _runnable_nodes(graph: nx.DiGraph) -> set[Node]:
    """Nodes that run: neither on a happens-before cycle nor after one."""
    cyclic = {node for part in nx.strongly_connected_components(graph) if len(part) > 1
              for node in part}
    blocked = set(cyclic)
    for node in cyclic:
        blocked |= nx.descendants(graph, node)
    return set(graph) - blocked


def _replay(schedule, graph, runnable, cost) -> dict[int, tuple[TaskTiming, ...]]:
    """Earliest start of each runnable task: when all its predecessors have ended."""
    timing: dict[Node, TaskTiming] = {}
    for node in nx.topological_sort(graph.subgraph(runnable)):
        task = graph.nodes[node]["task"]
        start = max((timing[pred].end for pred in graph.predecessors(node)), default=0)
        timing[node] = TaskTiming(task, start, start + cost(task))
    return {rank: tuple(timing[(rank, i)] for i in range(len(tasks)) if (rank, i) in timing)
            for rank, tasks in schedule.items()}


def _summarize(timeline: dict[int, tuple[TaskTiming, ...]]) -> DryRunResult:
    timings = [timing for row in timeline.values() for timing in row]
    makespan = max((timing.end for timing in timings), default=0)
    work = sum(t.end - t.start for t in timings
               if t.task.kind == Kind.F or t.task.kind in GRAD_PRODUCERS)
    bubble = 1 - work / (len(timeline) * makespan) if makespan else 0
    busy = {rank: sum(t.end - t.start for t in row) for rank, row in timeline.items()}
    return DryRunResult(timeline, makespan, busy, bubble, _exposed_tail(timeline))


def _exposed_tail(timeline: dict[int, tuple[TaskTiming, ...]]) -> dict[int, float]:
    """Per rank that runs a B: how long it still works after its last B ends."""
    tail = {}
    for rank, row in timeline.items():
        backward_ends = [t.end for t in row if t.task.kind in BACKWARDS]
        if backward_ends:
            tail[rank] = max(t.end for t in row) - max(backward_ends)
    return tail


def _deadlock(schedule: Schedule, timeline, graph: nx.DiGraph) -> ScheduleDeadlock:
    where = _locate(schedule)
    stuck = {rank: tasks[len(timeline[rank])] for rank, tasks in schedule.items()
             if len(timeline[rank]) < len(tasks)}
    wait_for = nx.DiGraph()
    lines = []
    for rank, task in sorted(stuck.items()):
        if task.kind == Kind.TIE:  # waits for the TIEs other ranks have not reached
            for peer, nodes in where.items():
                if peer.kind == Kind.TIE and nodes[0][0] != rank and \
                        len(timeline[nodes[0][0]]) <= nodes[0][1]:
                    wait_for.add_edge(rank, nodes[0][0])
                    lines.append(f"rank {rank} waits at {task} for {peer} on rank {nodes[0][0]}")
            continue
        if task.kind not in RECVS:  # an S, T, E, G, or an F or backward they feed
            for peer_rank, i in graph.predecessors((rank, len(timeline[rank]))):
                if peer_rank != rank and len(timeline[peer_rank]) <= i:
                    wait_for.add_edge(rank, peer_rank)
                    lines.append(f"rank {rank} waits at {task} for "
                                 f"{schedule[peer_rank][i]} on rank {peer_rank}")
            continue
        peer = counterpart(task)   # any other stuck head is a RECV: see _runnable_nodes
        peer_rank = where[peer][0][0]
        wait_for.add_edge(rank, peer_rank)
        lines.append(f"rank {rank} waits at {task} for {peer} on rank {peer_rank}")
    cycle = [rank for rank, _ in nx.find_cycle(wait_for)]
    lines.append("wait-for cycle: " + " -> ".join(f"rank {r}" for r in cycle + cycle[:1]))
    ready = {rank: row[-1].end if row else 0 for rank, row in timeline.items()}
    marks = {rank: (ready[rank], f">{task}<") for rank, task in stuck.items()}
    message = (f"schedule deadlocks: {len(stuck)} of {len(schedule)} ranks stuck\n  "
               + "\n  ".join(lines) + "\n" + _grid(timeline, marks))
    return ScheduleDeadlock(message, stuck, cycle)


def format_grid(result: DryRunResult) -> str:
    """The time x rank grid of a run: one column per start time, one row per rank."""
    return _grid(result.timeline, {})


def _grid(timeline, marks: dict[int, tuple[float, str]]) -> str:
    """Cells hold the tasks a rank starts at that time; `marks` adds one cell per rank."""
    cells: dict[tuple[int, float], list[str]] = {}
    for rank, row in timeline.items():
        for timing in row:
            cells.setdefault((rank, timing.start), []).append(str(timing.task))
    for rank, (time, text) in marks.items():
        cells.setdefault((rank, time), []).append(text)
    times = sorted({time for _, time in cells})
    header = ["time"] + [f"{float(time):g}" for time in times]
    rows = [header] + [[f"rank {rank}"] + [" ".join(cells.get((rank, t), [])) for t in times]
                       for rank in sorted(timeline)]
    widths = [max(len(row[col]) for row in rows) for col in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)
