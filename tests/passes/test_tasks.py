"""Task IR text form: golden strings, round trips, annotations, parse errors."""
import pytest

from ratrain.ir.tasks import (BACKWARDS, GRAD_PRODUCERS, Kind, Task, backward_of,
                              counterpart, format_schedule, format_tasks, parse_schedule,
                              parse_task, parse_tasks)

GOLDEN = [
    ("1F3", Task(1, Kind.F, micro_batch=3)),
    ("1B3", Task(1, Kind.B, micro_batch=3)),
    ("1B[L5]3", Task(1, Kind.BL, micro_batch=3, layer=5)),
    ("1W[L5]3", Task(1, Kind.W, layer=5, micro_batch=3)),
    ("0SEND_F2", Task(0, Kind.SEND_F, micro_batch=2)),
    ("1RECV_F2", Task(1, Kind.RECV_F, micro_batch=2)),
    ("1SEND_B2", Task(1, Kind.SEND_B, micro_batch=2)),
    ("0RECV_B2", Task(0, Kind.RECV_B, micro_batch=2)),
    ("1SYNC[L7]", Task(1, Kind.SYNC, layer=7)),
    ("1UPD[L7]", Task(1, Kind.UPD, layer=7)),
    ("1PREF[L7]", Task(1, Kind.PREF, layer=7)),
    ("1REC[L5]3", Task(1, Kind.REC, layer=5, micro_batch=3)),
    ("1FREE[act.L5.mb3]", Task(1, Kind.FREE, buffer="act.L5.mb3")),
    ("3NORM", Task(3, Kind.NORM)),
    ("12F105", Task(12, Kind.F, micro_batch=105)),
]


@pytest.mark.parametrize("text, task", GOLDEN)
def test_golden_text_round_trips(text, task):
    assert str(task) == text
    assert parse_task(text) == task
    assert str(parse_task(text)) == text


def test_annotations_are_not_identity():
    annotated = Task(1, Kind.F, micro_batch=3, cost=2.5e-3, mem_delta=1 << 20)
    assert annotated == Task(1, Kind.F, micro_batch=3)
    assert hash(annotated) == hash(Task(1, Kind.F, micro_batch=3))
    assert str(annotated) == "1F3"
    assert (annotated.cost, annotated.mem_delta) == (2.5e-3, 1 << 20)
    assert parse_task("1F3").cost is None and parse_task("1F3").mem_delta == 0


def test_kind_given_as_text_becomes_kind():
    assert Task(0, "SEND_F", micro_batch=1).kind is Kind.SEND_F


def test_parse_tasks_list_and_format_back():
    text = "1RECV_F0 1F0  1B0\n1SEND_B0 1SYNC[L7]"
    tasks = parse_tasks(text)
    assert [t.kind for t in tasks] == [Kind.RECV_F, Kind.F, Kind.B, Kind.SEND_B, Kind.SYNC]
    assert format_tasks(tasks) == "1RECV_F0 1F0 1B0 1SEND_B0 1SYNC[L7]"
    assert parse_tasks("") == ()


@pytest.mark.parametrize("bad", ["", "F3", "1F", "1X3", "1f3", "-1F3", "1SYNC[7]",
                                 "1SYNC[L7]3", "1REC[L5]", "1FREE[]", "1FREE[a b]",
                                 "1NORM0", "1F3x", "1SEND_F", "1 F3", "1B[L5]", "1B[5]3"])
def test_parse_error_quotes_text_and_forms(bad):
    with pytest.raises(ValueError) as error:
        parse_task(bad)
    message = str(error.value)
    assert f"cannot parse task {bad.strip()!r}" in message
    assert "<stage>F<micro_batch>" in message
    assert "<stage>REC[L<layer>]<micro_batch>" in message
    assert "<stage>FREE[<buffer>]" in message


@pytest.mark.parametrize("kwargs, problem", [
    (dict(stage=0, kind=Kind.F), "F task needs a micro_batch"),
    (dict(stage=0, kind=Kind.SYNC, layer=1, micro_batch=2), "SYNC task takes no micro_batch"),
    (dict(stage=0, kind=Kind.REC, layer=1), "REC task needs a micro_batch"),
    (dict(stage=0, kind=Kind.BL, micro_batch=1), "BL task needs a layer"),
    (dict(stage=0, kind=Kind.FREE, buffer="a]b"), "FREE task: bad buffer 'a]b'"),
    (dict(stage=0, kind=Kind.B, micro_batch=-1), "B task: bad micro_batch -1"),
    (dict(stage=-1, kind=Kind.NORM), "NORM task: stage must be an int >= 0, got -1"),
])
def test_construction_rejects_tasks_without_text_form(kwargs, problem):
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        Task(**kwargs)


def test_a_backward_piece_belongs_to_its_b():
    """See NOTE [sync issue point]: a per-layer piece names the B whose calls it runs."""
    assert backward_of(parse_task("1B[L5]3")) == parse_task("1B3")
    assert backward_of(parse_task("1B3")) == parse_task("1B3")
    assert GRAD_PRODUCERS >= {Kind.B, Kind.BL} and BACKWARDS == {Kind.B, Kind.BL}


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="'WAIT' is not a valid Kind"):
        Task(0, "WAIT")


@pytest.mark.parametrize("text, peer", [
    ("0SEND_F2", "1RECV_F2"), ("1RECV_F2", "0SEND_F2"),
    ("1SEND_B2", "0RECV_B2"), ("0RECV_B2", "1SEND_B2"),
])
def test_counterpart_pairs_neighbour_stages(text, peer):
    assert counterpart(parse_task(text)) == parse_task(peer)
    assert counterpart(parse_task(peer)) == parse_task(text)


def test_counterpart_of_non_comm_or_missing_stage_is_none():
    assert counterpart(parse_task("1F3")) is None
    assert counterpart(parse_task("1SYNC[L7]")) is None
    assert counterpart(parse_task("0RECV_F0")) is None
    assert counterpart(parse_task("0SEND_B0")) is None


SCHEDULE_TEXT = """\
rank 0: 0F0 0SEND_F0 0RECV_B0 0B0 0SYNC[L0] 0UPD[L0]
rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1FREE[act.L1.mb0]
rank 2:"""


def test_schedule_text_round_trips():
    schedule = parse_schedule(SCHEDULE_TEXT)
    assert sorted(schedule) == [0, 1, 2]
    assert schedule[2] == ()
    assert schedule[1][4] == Task(1, Kind.FREE, buffer="act.L1.mb0")
    assert format_schedule(schedule) == SCHEDULE_TEXT
    assert parse_schedule(format_schedule(schedule)) == schedule


def test_schedule_text_skips_comments_and_blank_lines():
    text = "# two ranks\n\nrank 1: 1RECV_F0 1F0  # last stage\nrank 0: 0F0 0SEND_F0\n"
    assert format_schedule(parse_schedule(text)) == "rank 0: 0F0 0SEND_F0\nrank 1: 1RECV_F0 1F0"


@pytest.mark.parametrize("text, problem", [
    ("rank 0: 0F0\nstage 1: 1F0", "schedule line 2 expected 'rank <r>: <task> <task> ...': "
                                  "'stage 1: 1F0'"),
    ("rank 0: 0F0\nrank 0: 0B0", "schedule line 2 repeats a rank: 'rank 0: 0B0'"),
    ("rank 0: 0F0 0Z0", "cannot parse task '0Z0'"),
])
def test_schedule_text_errors(text, problem):
    with pytest.raises(ValueError) as error:
        parse_schedule(text)
    assert problem in str(error.value)
