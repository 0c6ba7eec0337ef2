"""Placement (program_format/placement.py, NOTE [placement]): rank <-> (stage, replica)
for every block, its text form, and the placements the planner tells apart on nodes."""
import pytest

from ratrain.hw.topology import crossings, node_of_rank, placements
from ratrain.program_format.options import CompileOptions
from ratrain.program_format.placement import Placement, parse_placement


@pytest.mark.parametrize("pp,dp", [(1, 4), (2, 2), (2, 8), (4, 8), (3, 6)])
def test_rank_and_coords_are_inverse_for_every_block(pp, dp):
    for block in (b for b in range(1, dp + 1) if dp % b == 0):
        p = Placement(pp, dp, block)
        assert sorted(p.rank(s, r) for s in range(pp) for r in range(dp)) == \
            list(range(pp * dp))
        assert all(p.rank(*p.coords(rank)) == rank for rank in range(pp * dp))


def test_pipeline_and_dp_major_rank_orders():
    assert [Placement(2, 3, 1).coords(r) for r in range(6)] == \
        [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert [Placement(2, 3, 3).coords(r) for r in range(6)] == \
        [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [Placement(2, 4, 2).coords(r) for r in range(8)] == \
        [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]


@pytest.mark.parametrize("text,block", [("pipeline", 1), ("dp", 8), ("dp:4", 4)])
def test_text_form_parses_back(text, block):
    p = parse_placement(text, 4, 8)
    assert p.block == block and str(p) == text and parse_placement(str(p), 4, 8) == p


def test_pp_1_has_one_placement_and_bad_forms_are_refused():
    assert str(Placement(1, 8, 8)) == "pipeline"
    with pytest.raises(ValueError, match="divides dp 8"):
        parse_placement("dp:3", 4, 8)
    with pytest.raises(ValueError, match="pipeline, dp, dp:B"):
        parse_placement("stage", 4, 8)
    with pytest.raises(ValueError, match="divides dp 2"):
        CompileOptions(pp=2, dp=2, placement="dp:4")


def test_placements_tell_apart_what_shares_a_node():
    """pp 4 x dp 8 on nodes of 8: dp:2 puts two whole pipelines on a node as pipeline-
    major does (the same nodes), so three placements differ."""
    found = placements(4, 8, 8)
    assert [str(p) for p in found] == ["pipeline", "dp:4", "dp"]
    assert [crossings(p, 0, 8) for p in found] == [0, 0, 8]
    assert [node_of_rank(found[2].rank(s, 5), 8) for s in range(4)] == [0, 1, 2, 3]
    assert [str(p) for p in placements(4, 8, 1)] == ["pipeline"]  # a node per rank
