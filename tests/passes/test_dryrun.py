"""dry_run: timings, grid text, deadlock and unmatched-communication reports."""
import dataclasses

import networkx as nx
import pytest

from ratrain.ir.tasks import Kind, parse_schedule, parse_task
from ratrain.passes.dryrun import (ScheduleDeadlock, TaskTiming, UnmatchedComm, dry_run,
                                   format_grid, task_graph)
from ratrain.passes.schedule_1f1b import schedule_1f1b


def compute_only(task):
    return float(task.kind in (Kind.F, Kind.B))


def assert_text(expected, actual):
    assert actual == expected, f"actual:\n{actual}"


def test_unit_cost_timeline_of_2_stages_2_micro_batches():
    result = dry_run(schedule_1f1b(2, 2))
    starts = {rank: [(str(t.task), t.start) for t in row] for rank, row in result.timeline.items()}
    assert starts[0] == [("0F0", 0), ("0SEND_F0", 1), ("0F1", 2), ("0SEND_F1", 3),
                         ("0RECV_B0", 6), ("0B0", 7), ("0RECV_B1", 10), ("0B1", 11)]
    assert starts[1] == [("1RECV_F0", 2), ("1F0", 3), ("1B0", 4), ("1SEND_B0", 5),
                         ("1RECV_F1", 6), ("1F1", 7), ("1B1", 8), ("1SEND_B1", 9)]
    assert result.timeline[0][0] == TaskTiming(parse_task("0F0"), 0, 1.0)
    assert result.makespan == 12
    assert result.busy == {0: 8, 1: 8}
    assert result.bubble_fraction == 1 - 8 / 24
    assert result.exposed_tail == {0: 0, 1: 1}


def test_format_grid_one_column_per_start_time():
    assert_text(
        "time    0    1         2         3         4    5         6         7    8    9    "
        "     10        11\n"
        "rank 0  0F0  0SEND_F0  0F1       0SEND_F1                 0RECV_B0  0B0            "
        "     0RECV_B1  0B1\n"
        "rank 1                 1RECV_F0  1F0       1B0  1SEND_B0  1RECV_F1  1F1  1B1  1SEND_B1",
        format_grid(dry_run(schedule_1f1b(2, 2))))


def test_format_grid_puts_zero_cost_tasks_in_one_cell():
    result = dry_run(schedule_1f1b(2, 1), cost=compute_only)
    assert_text("time    0    1             2    3\n"
                "rank 0  0F0  0SEND_F0           0RECV_B0 0B0\n"
                "rank 1       1RECV_F0 1F0  1B0  1SEND_B0",
                format_grid(result))
    assert result.makespan == 4


def test_task_annotations_are_the_default_cost():
    costs = {Kind.F: 2.0, Kind.B: 3.0}
    schedule = {rank: tuple(dataclasses.replace(t, cost=costs.get(t.kind, 0.0)) for t in tasks)
                for rank, tasks in schedule_1f1b(2, 2).items()}
    result = dry_run(schedule)
    assert result.makespan == (2 + 2 - 1) * (2.0 + 3.0)
    assert result.busy == {0: 10.0, 1: 10.0}


def test_lifecycle_tasks_after_last_backward_are_the_exposed_tail():
    schedule = schedule_1f1b(2, 2)
    schedule[0] += tuple(map(parse_task, ["0SYNC[L0]", "0UPD[L0]", "0NORM"]))
    schedule[1] += tuple(map(parse_task, ["1SYNC[L1]", "1UPD[L1]", "1FREE[grad.L1]"]))
    cost = {Kind.F: 1, Kind.B: 1, Kind.SYNC: 5, Kind.UPD: 2, Kind.NORM: 1}
    result = dry_run(schedule, cost=lambda task: cost.get(task.kind, 0))
    assert result.exposed_tail == {0: 8, 1: 7}
    assert result.makespan == 6 + 8


def test_task_graph_is_program_order_plus_send_before_recv():
    schedule = schedule_1f1b(3, 4)
    graph = task_graph(schedule)
    tasks = sum(len(t) for t in schedule.values())
    recvs = sum(t.kind in (Kind.RECV_F, Kind.RECV_B) for ts in schedule.values() for t in ts)
    assert graph.number_of_nodes() == tasks
    assert graph.number_of_edges() == (tasks - 3) + recvs
    assert nx.is_directed_acyclic_graph(graph)
    assert graph.nodes[(1, 0)]["task"] == parse_task("1RECV_F0")
    assert graph.has_edge((0, 1), (1, 0))   # 0SEND_F0 -> 1RECV_F0


def test_empty_schedule_runs():
    result = dry_run({0: (), 1: ()})
    assert (result.makespan, result.bubble_fraction, result.exposed_tail) == (0, 0, {})


RECV_BEFORE_SEND = """\
rank 0: 0RECV_B0 0SEND_F0
rank 1: 1RECV_F0 1SEND_B0"""


def test_each_rank_receiving_first_deadlocks_with_grid():
    with pytest.raises(ScheduleDeadlock) as error:
        dry_run(parse_schedule(RECV_BEFORE_SEND))
    assert_text("schedule deadlocks: 2 of 2 ranks stuck\n"
                "  rank 0 waits at 0RECV_B0 for 1SEND_B0 on rank 1\n"
                "  rank 1 waits at 1RECV_F0 for 0SEND_F0 on rank 0\n"
                "  wait-for cycle: rank 0 -> rank 1 -> rank 0\n"
                "time    0\n"
                "rank 0  >0RECV_B0<\n"
                "rank 1  >1RECV_F0<",
                str(error.value))
    assert error.value.stuck == {0: parse_task("0RECV_B0"), 1: parse_task("1RECV_F0")}
    assert error.value.cycle == [0, 1]


# Rank 1 takes a second forward before returning the first gradient; rank 0 waits for it.
MID_RUN_DEADLOCK = """\
rank 0: 0F0 0SEND_F0 0RECV_B0 0B0 0F1 0SEND_F1 0RECV_B1 0B1
rank 1: 1RECV_F0 1F0 1RECV_F1 1F1 1B0 1SEND_B0 1B1 1SEND_B1"""


def test_deadlock_after_some_progress_marks_where_each_rank_stops():
    with pytest.raises(ScheduleDeadlock) as error:
        dry_run(parse_schedule(MID_RUN_DEADLOCK))
    message = str(error.value)
    assert_text("time    0    1         2           3    4\n"
                "rank 0  0F0  0SEND_F0  >0RECV_B0<\n"
                "rank 1                 1RECV_F0    1F0  >1RECV_F1<",
                message[message.index("time"):])
    assert "rank 1 waits at 1RECV_F1 for 0SEND_F1 on rank 0" in message


def test_rank_waiting_on_a_deadlocked_rank_is_stuck_but_not_in_the_cycle():
    schedule = parse_schedule("rank 0: 0RECV_B0 0SEND_F0\n"
                              "rank 1: 1RECV_F0 1SEND_B0 1SEND_F1\n"
                              "rank 2: 2RECV_F1")
    with pytest.raises(ScheduleDeadlock) as error:
        dry_run(schedule)
    assert sorted(error.value.stuck) == [0, 1, 2]
    assert error.value.cycle == [0, 1]
    assert "rank 2 waits at 2RECV_F1 for 1SEND_F1 on rank 1" in str(error.value)
    assert "3 of 3 ranks stuck" in str(error.value)


def test_send_without_recv_is_reported():
    schedule = parse_schedule("rank 0: 0F0 0SEND_F0 0F1 0SEND_F1\n"
                              "rank 1: 1RECV_F0 1F0")
    with pytest.raises(UnmatchedComm) as error:
        dry_run(schedule)
    assert_text("unmatched pipeline communication:\n"
                "  0SEND_F1 on rank 0: no matching 1RECV_F1 on any rank, expected exactly one",
                str(error.value))


@pytest.mark.parametrize("text, problem", [
    ("rank 0: 0RECV_B0 0B0\nrank 1: 1B0",
     "0RECV_B0 on rank 0: no matching 1SEND_B0 on any rank, expected exactly one"),
    ("rank 0: 0RECV_F0 0F0", "0RECV_F0 on rank 0: no neighbour stage to pair with"),
    ("rank 0: 0SEND_F0\nrank 1: 1RECV_F0 1RECV_F0",
     "0SEND_F0 on rank 0: 2 matching 1RECV_F0 on any rank, expected exactly one"),
    ("rank 0: 0SEND_F0\nrank 1: 1RECV_F0 1RECV_F0", "1RECV_F0 appears 2 times (ranks 1, 1)"),
])
def test_other_unmatched_comms_are_reported(text, problem):
    with pytest.raises(UnmatchedComm) as error:
        dry_run(parse_schedule(text))
    assert problem in str(error.value)
