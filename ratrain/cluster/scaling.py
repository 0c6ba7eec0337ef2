"""The link of the test cluster, scaled from the MT-3000 to this machine, and link
overrides of a hardware profile for `ratrain simulate` and `ratrain cluster up` (the
bandwidths and latencies users write are read by ratrain/units.py).
"""
from __future__ import annotations

from collections.abc import Mapping

from ratrain.calibrate.this_machine import default_hw
from ratrain.hw.profiles import Profile

MT3000_LINK_BANDWIDTH = 3.7e9           # B/s of a node's port (DESIGN section 7)
MT3000_SUSTAINED_FLOPS = 0.70 * 8.1e12  # hand-written FP16 GEMM: ~70% of the peak
RANK_THREADS = 1                        # one rank per core on the cluster

# NOTE [link scaling]: the paper's regime is set by how long a rank computes against how
# long its link needs for the same step's bytes. Keeping bytes/FLOP of the link equal to
# the MT-3000's, link = 3.7e9 B/s x (sustained FLOP/s of one rank here) / (0.70 x 8.1e12
# FLOP/s), makes every communication/compute ratio of a program match the MT-3000's. The
# rank's sustained rate is this machine's profile's measured rate at one thread per rank
# (see NOTE [this machine's profile]: the shipped cpu profile's rate is another CPU's, and
# scaled links from it left ratrain 1.18x over the baseline on an AMD Zen 5 where the
# matching machine gave 1.3x), in the profile's default precision; latency is the mt3000
# profile's between nodes (5 us per message): each rank of the cluster is a node of its
# own.


def rank_compute_rate(profile: Profile | Mapping, threads: int = RANK_THREADS) -> float:
    """Sustained FLOP/s of one rank running `threads` threads (the profile's measured
    entry for that count, if any)."""
    from ratrain.sim.costs import compute_rate
    profile = Profile.of(profile)
    narrowed = profile.with_fields(**profile.threads.get(str(threads), {}))
    return compute_rate(narrowed, profile.default_precision)


def scaled_link(cpu: str | None = None, reference: str = "mt3000") -> tuple[float, float]:
    """(bandwidth B/s, latency s) of the cluster's links (NOTE [link scaling]), scaled
    from the profile `cpu` names, else this machine's (link_source says which)."""
    from ratrain.hw.profiles import load_profile
    from ratrain.hw.topology import node_of
    rate = rank_compute_rate(load_profile(cpu or default_hw()))
    return (MT3000_LINK_BANDWIDTH * rate / MT3000_SUSTAINED_FLOPS,
            node_of(load_profile(reference)).port_latency)


def link_source(cpu: str | None = None) -> str:
    """Which profile scaled_link(cpu) scales from, for the outputs that print the link."""
    from ratrain.hw.identity import profile_label
    from ratrain.hw.profiles import load_profile
    hw = cpu or default_hw()
    return f"scaled from {profile_label(load_profile(hw), hw)}"


def with_link(profile: Profile | Mapping, bandwidth: float | None = None,
              latency: float | None = None, host_cost: float | None = None) -> Profile:
    """`profile` with its link_bandwidth / link_latency / link_host_cost replaced where
    given."""
    override = {"link_bandwidth": bandwidth, "link_latency": latency,
                "link_host_cost": host_cost}
    return Profile.of(profile).with_fields(
        **{k: float(v) for k, v in override.items() if v is not None})
