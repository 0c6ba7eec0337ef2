"""The machine a command plans for, compiles for or simulates on (hw/machine.py), from the
machine flags (cli/options.MACHINE_FLAGS), --machine FILE and --hw; for `ratrain simulate
DIR`, laid over the machine DIR records (NOTE [recorded machine]).
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.calibrate.this_machine import default_hw
from ratrain.cli.options import MACHINE_FLAGS, dest
from ratrain.errors import UserError
from ratrain.hw.machine import Machine, profile_identity, profile_sha256, read_machine
from ratrain.hw.profiles import Profile, ProfileError
from ratrain.inputs import load_hw

# the Machine fields a flag sets (node_memory_bandwidth only a machine file does)
FLAG_FIELDS = tuple(dest(f) for f in MACHINE_FLAGS if f != "--machine")


def given_machine(args) -> Machine:
    """The machine of --machine FILE with the machine flags given over it; its profile
    the file's (--hw is the command's to weigh against it)."""
    try:
        machine = read_machine(args.machine) if args.machine else Machine()
    except ProfileError as e:
        raise UserError(str(e)) from None
    return machine.updated(**{name: getattr(args, name) for name in FLAG_FIELDS})


def _profile_named(args, machine: Machine) -> str | None:
    """--hw or the machine file's profile; both given, they must agree."""
    if args.hw and machine.profile and args.hw != machine.profile:
        raise UserError(f"--hw {args.hw} and --machine {args.machine}'s profile "
                        f"{machine.profile} differ: give one of them")
    return args.hw or machine.profile


def planned_machine(args) -> tuple[Machine, dict, dict]:
    """(machine, its base profile as read, the profile planned on: the machine over the
    base) of plan and compile: --hw, else the machine file's profile, else this
    machine's (NOTE [this machine's profile]). Sets args.hw and, from --nodes,
    args.clusters (which must then agree)."""
    machine = given_machine(args)
    args.hw = _profile_named(args, machine) or default_hw()
    base = load_hw(args.hw)
    machine = replace(machine, profile=profile_identity(args.hw))
    profile = machine.over(base)
    ranks = machine.ranks(profile)
    if ranks is not None and getattr(args, "clusters", None) not in (None, ranks):
        raise UserError(f"--clusters {args.clusters} differs from the machine's {machine.nodes} "
                        f"nodes x {ranks // machine.nodes} ranks: give one of them")
    if hasattr(args, "clusters"):
        args.clusters = args.clusters or ranks
    return machine, base, profile


def program_machine(manifest: dict, args) -> tuple[dict, dict]:
    """(the machine's record, the profile to simulate on) of `ratrain simulate DIR`: the
    machine DIR records with the machine flags given over it (NOTE [recorded machine])."""
    recorded = manifest.get("machine", {})
    given = given_machine(args)
    named = _profile_named(args, given)
    machine = Machine.of_record(recorded).updated(
        **{name: getattr(given, name) for name in FLAG_FIELDS},
        profile=profile_identity(named) if named else None)
    base = load_hw(named) if named else manifest["hw"]
    machine = _on_ranks(machine, given, base, manifest["world_size"])
    sha = profile_sha256(base) if named else recorded.get("profile_sha256")
    return machine.given() | ({"profile_sha256": sha} if sha else {}), machine.over(base)


def _on_ranks(machine: Machine, given: Machine, base: dict, world_size: int) -> Machine:
    """The machine with its nodes fitted to the program's ranks: --nodes K alone gives
    ranks per node = ranks / K, --ranks-per-node alone drops the recorded node count."""
    if given.nodes is not None and given.ranks_per_node is None:
        if world_size % given.nodes:
            raise UserError(f"--nodes {given.nodes} does not divide the program's "
                            f"{world_size} ranks")
        machine = replace(machine, ranks_per_node=world_size // given.nodes)
    elif given.ranks_per_node is not None and given.nodes is None:
        machine = replace(machine, nodes=None)
    ranks = machine.ranks(base)
    if ranks not in (None, world_size):
        raise UserError(f"the machine's {machine.nodes} nodes x {ranks // machine.nodes} "
                        f"ranks differ from the program's {world_size} ranks: give --nodes "
                        "or --ranks-per-node")
    return machine


def describe_machine(record: dict, profile: dict, world_size: int) -> str:
    """`mt3000 (sha256 1a2b3c4d5e6f), 4 nodes of 8 ranks, each node's port 1.25 GB/s`."""
    from ratrain.planner.search import nodes_text
    from ratrain.sim.simulate import rank_profile
    name = record.get("profile", Profile.of(profile).name)
    sha = f" (sha256 {record['profile_sha256'][:12]})" if "profile_sha256" in record else ""
    nodes = nodes_text(rank_profile(profile, world_size), world_size)
    return f"{name}{sha}" + (f", {nodes}" if nodes else ", one node")
