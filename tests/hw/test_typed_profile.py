"""A profile is typed (NOTE [typed profile], hw/profiles.py): its attributes are the rows
of docs/DESIGN.md 7.1's table, defaults filled once where it is read, a misspelt field
refused by name, and its JSON kept byte for byte through every change laid over it."""
import json
import re
from pathlib import Path

import pytest

from ratrain.hw import Profile, ProfileError, load_profile
from ratrain.hw.machine import Machine
from ratrain.hw.profiles import FIELDS, PROFILE_DIR, known_profiles
from ratrain.sim.kernels import rank_profile
from test_profile_fields import documented_fields

RATRAIN = Path(__file__).parents[2] / "ratrain"


def test_the_attributes_are_the_design_table():
    """One attribute per row of the table, none else (the machine file's own fields,
    `profile` and `nodes`, are not a profile's)."""
    assert set(FIELDS) == documented_fields() - {"profile", "nodes"}


@pytest.mark.parametrize("name", known_profiles())
def test_the_json_round_trips_byte_for_byte(name):
    """to_dict is the file's JSON, key for key in its order, after any change laid
    over it and taken back off."""
    text = json.dumps(json.loads((PROFILE_DIR / f"{name}.json").read_text()))
    profile = load_profile(name)
    assert json.dumps(profile.to_dict()) == text
    assert json.dumps(Profile.from_dict(json.loads(text)).to_dict()) == text
    wider = profile.with_fields(link_bandwidth=1.0)
    assert list(wider.to_dict()) == list(profile.to_dict())   # a given field: in its place
    assert json.dumps(wider.to_dict() | {"link_bandwidth": profile.link_bandwidth}) == text


def test_optional_fields_hold_their_defaults_and_the_json_does_not():
    """mt3000 gives no node_cores, link_host_cost or op_costs: the attributes hold the
    defaults, the JSON stays without them; the node's come from NOTE [node defaults]."""
    mt3000 = load_profile("mt3000")
    assert (mt3000.node_cores, mt3000.link_host_cost, mt3000.op_costs) == (None, 0.0, {})
    assert "link_host_cost" not in mt3000.to_dict()
    plain = Profile.from_dict({k: v for k, v in mt3000.items() if k not in (
        "ranks_per_node", "inter_node_bandwidth", "inter_node_latency",
        "node_memory_bandwidth", "collective_progress_share")})
    assert (plain.ranks_per_node, plain.inter_node_bandwidth, plain.inter_node_latency,
            plain.collective_progress_share) == (1, 15e9, 1e-6, 1.0)
    assert plain.node_memory_bandwidth == plain.ddr_bandwidth


def test_a_narrowed_profile_sets_rank_threads_and_its_node():
    """rank_profile lays the threads entry over the profile and records the count; the
    node's ranks follow from it (node_cores // threads per rank)."""
    cpu = load_profile("cpu")
    one, two = rank_profile(cpu, 2), rank_profile(cpu, 1)
    assert (one.rank_threads, one.ranks_per_node) == (1, 2)
    assert (two.rank_threads, two.ranks_per_node) == (2, 1)
    assert one.ddr_bandwidth == cpu.threads["1"]["ddr_bandwidth"] != cpu.ddr_bandwidth
    assert cpu.rank_threads is None and "rank_threads" not in cpu


def test_a_misspelt_field_is_refused_where_it_is_read(tmp_path):
    """In a file: a ProfileError naming it and the field meant; in code: AttributeError."""
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(load_profile("mt3000").to_dict() | {"ddr_bandwith": 1e9}))
    with pytest.raises(ProfileError, match=r"unknown field 'ddr_bandwith' \(did you mean "
                                           r"'ddr_bandwidth'\?\)"):
        load_profile(path)
    with pytest.raises(AttributeError):
        load_profile("mt3000").ddr_bandwith  # noqa: B018


def test_a_machine_laid_over_keeps_the_profile_typed():
    """A machine file's fields over a profile: a Profile whose JSON is the profile's with
    them, as program.json records it (NOTE [recorded machine])."""
    over = Machine(ranks_per_node=8, inter_node_bandwidth=1.25e9).over(load_profile("mt3000"))
    assert isinstance(over, Profile) and over.ranks_per_node == 8
    assert over.to_dict() == load_profile("mt3000").to_dict() | {
        "ranks_per_node": 8, "inter_node_bandwidth": 1.25e9}


def test_no_field_is_read_by_string_outside_hw():
    """ratrain reads a profile's fields as attributes (NOTE [typed profile]): no
    profile["..."] or profile.get("...") outside ratrain/hw/."""
    read = re.compile(r"""profile(\[|\.get\()["']""")
    found = [f"{path.relative_to(RATRAIN)}:{n}" for path in RATRAIN.rglob("*.py")
             if path.parent.name != "hw"
             for n, line in enumerate(path.read_text().splitlines(), 1) if read.search(line)]
    assert found == []
