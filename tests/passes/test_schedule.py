"""schedule_1f1b: golden text for a small case, properties over a grid of (P, M)."""
import itertools
from collections import Counter
from fractions import Fraction

import pytest

from ratrain.ir.tasks import (PIPELINE_COMMS, Kind, counterpart, format_schedule,
                              parse_schedule)
from ratrain.passes.dryrun import dry_run
from ratrain.passes.schedule_1f1b import compute_order, schedule_1f1b, warmup_forwards

GRID = list(itertools.product(range(1, 7), range(1, 11)))   # (P, M)

# Written by hand from the rule: stage 0 warms up min(2-0-1, 4) = 1 forward, stage 1 none;
# F is preceded by RECV_F on s > 0 and followed by SEND_F on s < P-1; B by RECV_B on
# s < P-1 and followed by SEND_B on s > 0.
GOLDEN_2x4 = """\
rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 0F3 0SEND_F3 0RECV_B2 0B2 0RECV_B3 0B3
rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F2 1F2 1B2 1SEND_B2 1RECV_F3 1F3 1B3 1SEND_B3"""


def assert_schedule_text(expected, schedule):
    actual = format_schedule(schedule)
    assert actual == expected, f"actual schedule:\n{actual}"


def test_golden_2_stages_4_micro_batches():
    assert_schedule_text(GOLDEN_2x4, schedule_1f1b(2, 4))
    assert parse_schedule(GOLDEN_2x4) == schedule_1f1b(2, 4)


def test_golden_single_stage_has_no_comms():
    assert_schedule_text("rank 0: 0F0 0B0 0F1 0B1 0F2 0B2", schedule_1f1b(1, 3))


def test_golden_fewer_micro_batches_than_stages():
    assert_schedule_text(
        "rank 0: 0F0 0SEND_F0 0RECV_B0 0B0\n"
        "rank 1: 1RECV_F0 1F0 1SEND_F0 1RECV_B0 1B0 1SEND_B0\n"
        "rank 2: 2RECV_F0 2F0 2B0 2SEND_B0", schedule_1f1b(3, 1))


@pytest.mark.parametrize("stages, micro_batches", [(0, 4), (2, 0), (-1, 1)])
def test_rejects_empty_pipeline(stages, micro_batches):
    with pytest.raises(ValueError, match="needs num_stages >= 1 and num_micro_batches >= 1"):
        schedule_1f1b(stages, micro_batches)


def test_warmup_counts():
    assert [warmup_forwards(s, 4, 8) for s in range(4)] == [3, 2, 1, 0]
    assert [warmup_forwards(s, 4, 2) for s in range(4)] == [2, 2, 1, 0]


def compute_kinds(schedule, stage):
    return "".join(t.kind for t in schedule[stage] if t.kind in (Kind.F, Kind.B))


@pytest.mark.parametrize("P, M", GRID)
def test_each_stage_mb_has_one_f_and_one_b_in_order(P, M):
    schedule = schedule_1f1b(P, M)
    assert sorted(schedule) == list(range(P))
    for stage, tasks in schedule.items():
        assert all(t.stage == stage for t in tasks)
        for kind in (Kind.F, Kind.B):
            assert [t.micro_batch for t in tasks if t.kind == kind] == list(range(M))


@pytest.mark.parametrize("P, M", GRID)
def test_warmup_then_alternate_then_drain(P, M):
    schedule = schedule_1f1b(P, M)
    for stage in range(P):
        warmup = min(P - stage - 1, M)
        steady = M - warmup
        expected = "F" * warmup + "FB" * steady + "B" * warmup
        assert compute_kinds(schedule, stage) == expected


@pytest.mark.parametrize("P, M", GRID)
def test_activations_in_flight_peak_at_min_p_minus_s_and_m(P, M):
    schedule = schedule_1f1b(P, M)
    for stage, tasks in schedule.items():
        in_flight, peak = 0, 0
        for task in tasks:
            in_flight += {Kind.F: 1, Kind.B: -1}.get(task.kind, 0)
            peak = max(peak, in_flight)
            assert in_flight >= 0
        assert peak == min(P - stage, M)
        assert in_flight == 0


@pytest.mark.parametrize("P, M", GRID)
def test_every_send_has_exactly_one_recv(P, M):
    schedule = schedule_1f1b(P, M)
    comms = Counter(t for tasks in schedule.values() for t in tasks if t.kind in PIPELINE_COMMS)
    assert all(count == 1 for count in comms.values())
    assert all(comms[counterpart(task)] == 1 for task in comms)
    # P-1 links, each carrying M activations forward and M gradients backward, two ends each
    assert len(comms) == 4 * (P - 1) * M


@pytest.mark.parametrize("P, M", GRID)
def test_comms_wrap_the_compute_they_feed(P, M):
    for stage, tasks in schedule_1f1b(P, M).items():
        for before, task in zip(tasks, tasks[1:]):
            if task.kind == Kind.F and stage > 0:
                assert (before.kind, before.micro_batch) == (Kind.RECV_F, task.micro_batch)
            if task.kind == Kind.B and stage < P - 1:
                assert (before.kind, before.micro_batch) == (Kind.RECV_B, task.micro_batch)
            if before.kind == Kind.F and stage < P - 1:
                assert (task.kind, task.micro_batch) == (Kind.SEND_F, before.micro_batch)
            if before.kind == Kind.B and stage > 0:
                assert (task.kind, task.micro_batch) == (Kind.SEND_B, before.micro_batch)


def unit_compute(task):
    return Fraction(int(task.kind in (Kind.F, Kind.B)))


@pytest.mark.parametrize("P, M", GRID)
def test_dry_run_bubble_is_p_minus_1_over_m_plus_p_minus_1(P, M):
    result = dry_run(schedule_1f1b(P, M), cost=unit_compute)   # raises on deadlock
    assert result.makespan == 2 * (M + P - 1)
    assert result.bubble_fraction == Fraction(P - 1, M + P - 1)
    assert result.busy == {stage: 2 * M for stage in range(P)}
    assert result.exposed_tail == {stage: 0 for stage in range(P)}


def test_compute_order_is_the_schedule_without_comms():
    schedule = schedule_1f1b(4, 6)
    for stage in range(4):
        order = [t for t in schedule[stage] if t.kind in (Kind.F, Kind.B)]
        assert order == compute_order(stage, 4, 6)
