"""Bring a test cluster up and down: one namespace per rank (`rtc-<name>-r<k>`, address
10.213.0.<k+1> on its link `rtc0`) and a switch namespace (`rtc-<name>-sw`, a bridge with
one veth port `p<k>` per rank). Each link is shaped both ways: tbf + netem on the rank's
end (what it sends) and on the switch's port (what it receives). A state file records what
`up` made before it makes it, so `down` removes exactly that, also after a failed `up`.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ratrain.cluster import netns
from ratrain.hw.topology import node_per_rank
from ratrain.rt.launch import find_mpiexec, rank_python

PREFIX = "rtc"
PROBE_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
NAME = re.compile(r"[a-z0-9]{1,12}")
# NOTE [MPI over the links]: the mpich wheel (ch4) moves bytes between ranks of one host
# through shared memory, even across namespaces, unless NOLOCAL forbids it; the ofi netmod
# with libfabric's tcp provider bound to the rank's link then sends every byte over TCP
# through the shaped veth. PMI needs no network: hydra hands each rank a descriptor.
MPI_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "MPIR_CVAR_NOLOCAL": "1", "FI_PROVIDER": "tcp",
           "FI_TCP_IFACE": netns.RANK_LINK}


class ClusterError(RuntimeError):
    """A cluster that cannot be made, found or used; one line for the user."""


@dataclass(frozen=True)
class Cluster:
    name: str                           # [a-z0-9]{1,12}
    ranks: int                          # rank namespaces
    bandwidth: float                    # B/s of each link, each direction
    latency: float                      # s, one way rank to rank (two shaped hops)
    delay_applied: bool = False         # netem added it (NOTE [no netem])
    probed: dict | None = None          # link fields measured on it (`ratrain cluster probe`)

    @property
    def switch(self) -> str:
        return f"{PREFIX}-{self.name}-sw"

    def rank_namespace(self, rank: int) -> str:
        return f"{PREFIX}-{self.name}-r{rank}"

    @property
    def namespaces(self) -> list[str]:
        return [self.switch] + [self.rank_namespace(k) for k in range(self.ranks)]

    def address(self, rank: int) -> str:
        return f"{netns.SUBNET}.{rank + 1}"

    def placement(self, rank_command: list[str]) -> tuple[list[str], list[str]]:
        """(mpiexec options, rank command) that run each rank in its namespace over TCP
        (NOTE [MPI over the links])."""
        options = [a for k, v in MPI_ENV.items() for a in ("-genv", k, v)]
        enter = ["/bin/sh", "-c", f'exec ip netns exec {PREFIX}-{self.name}-r"$PMI_RANK" "$@"',
                 "rank"]
        return options, enter + list(rank_command)


def state_dir() -> Path:
    base = os.environ.get("RATRAIN_CLUSTER_STATE")
    return Path(base) if base else Path("/run/ratrain")


def state_path(name: str) -> Path:
    return state_dir() / f"cluster-{name}.json"


def check_name(name: str) -> None:
    if not NAME.fullmatch(name):
        raise ClusterError(f"cluster name {name!r}: use 1-12 lowercase letters or digits")


def require_root_and_iproute2() -> None:
    reason = netns.missing_requirement()
    if reason is not None:
        raise ClusterError(reason)


def read_cluster(name: str) -> Cluster | None:
    """The cluster `up` recorded under `name`, or None."""
    check_name(name)
    path = state_path(name)
    if not path.is_file():
        return None
    try:
        return Cluster(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise ClusterError(f"unreadable cluster state {path} ({e}): `ratrain cluster down "
                           f"{name}` removes it") from None


def bring_up(name: str, ranks: int, bandwidth: float, latency: float) -> Cluster:
    """Create the namespaces, links and qdiscs of a new cluster (nothing left on error)."""
    require_root_and_iproute2()
    check_name(name)
    if ranks < 1 or bandwidth <= 0 or latency < 0:
        raise ClusterError("a cluster needs ranks >= 1, a positive bandwidth and a latency "
                           ">= 0")
    if read_cluster(name) is not None or leftover_namespaces(name):
        raise ClusterError(f"cluster {name} is already up: `ratrain cluster down {name}` "
                           "first, or choose another name")
    cluster = Cluster(name, ranks, float(bandwidth), float(latency))
    state_dir().mkdir(parents=True, exist_ok=True)
    state_path(name).write_text(json.dumps(asdict(cluster)))  # before anything exists
    try:
        delayed = _build(cluster)
    except BaseException as e:
        bring_down(name)
        if isinstance(e, netns.NetnsError):
            raise ClusterError(f"cannot bring cluster {name} up: {e}") from None
        raise
    cluster = replace(cluster, delay_applied=delayed)
    state_path(name).write_text(json.dumps(asdict(cluster)))
    return cluster


def _build(cluster: Cluster) -> bool:
    """Make the cluster's namespaces, links and qdiscs; whether the delay was applied."""
    delayed = True
    netns.add_namespace(cluster.switch)
    netns.add_bridge(cluster.switch)
    hop_delay = cluster.latency / 2  # a message crosses two shaped hops
    for rank in range(cluster.ranks):
        namespace, port = cluster.rank_namespace(rank), f"p{rank}"
        netns.add_namespace(namespace)
        netns.add_rank_link(cluster.switch, port, namespace, cluster.address(rank))
        for where, device in ((namespace, netns.RANK_LINK), (cluster.switch, port)):
            netns.shape(where, device, cluster.bandwidth)
            if hop_delay > 0:
                delayed &= netns.add_delay(where, device, hop_delay)
    return delayed


def leftover_namespaces(name: str) -> list[str]:
    return [n for n in netns.namespaces() if n.startswith(f"{PREFIX}-{name}-")]


def bring_down(name: str) -> list[str]:
    """Delete every namespace of cluster `name` (with their links and qdiscs) and its
    state file; the namespaces removed. Idempotent."""
    require_root_and_iproute2()
    check_name(name)
    with contextlib.suppress(ClusterError):
        recorded = read_cluster(name)
    gone = sorted(set((recorded.namespaces if recorded else []) + leftover_namespaces(name)))
    for namespace in gone:
        netns.delete_namespace(namespace)
    state_path(name).unlink(missing_ok=True)
    return [n for n in gone if n not in netns.namespaces()]


def link_counters(cluster: Cluster) -> dict[int, tuple[int, int]]:
    """rank -> (bytes it sent, bytes it received) as its link's qdiscs counted them."""
    return {rank: (netns.qdisc_bytes(cluster.rank_namespace(rank), netns.RANK_LINK),
                   netns.qdisc_bytes(cluster.switch, f"p{rank}"))
            for rank in range(cluster.ranks)}


@contextlib.contextmanager
def cluster_for_run(name: str, ranks: int, bandwidth: float | None = None,
                    latency: float | None = None):
    """The cluster `name` for a job of `ranks`: the one that is up, else a new one at the
    given (default: scaled) link, taken down when the job ends, fails or is stopped by
    SIGINT or SIGTERM (only what this run made)."""
    require_root_and_iproute2()
    cluster = read_cluster(name)
    if cluster is not None:
        if cluster.ranks < ranks:
            raise ClusterError(f"cluster {name} has {cluster.ranks} ranks, the job needs "
                               f"{ranks}: `ratrain cluster down {name}` and up with -n {ranks}")
        yield cluster
        return
    from ratrain.cluster.scaling import scaled_link
    default_bandwidth, default_latency = scaled_link()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        cluster = bring_up(name, ranks, bandwidth or default_bandwidth,
                           default_latency if latency is None else latency)
    except BaseException:
        signal.signal(signal.SIGTERM, previous)
        raise
    try:
        print(f"ratrain: cluster {name} up for this run ({describe(cluster)})",
              file=sys.stderr, flush=True)
        yield cluster
    finally:
        bring_down(name)
        signal.signal(signal.SIGTERM, previous)


def probe(cluster: Cluster) -> Cluster:
    """Measure the cluster's links from two of its ranks (ratrain/cluster/probe.py) and
    record the result in its state; the updated cluster."""
    import subprocess
    if cluster.ranks < 2:
        raise ClusterError(f"cluster {cluster.name} has one rank: probing needs two")
    options, command = cluster.placement(rank_python("ratrain.cluster.probe"))
    # one thread per rank, as on the cluster: set for the ranks before they start, since
    # importing ratrain.cluster loads numpy (and its BLAS threads) before probe.py runs
    env = dict(os.environ, **dict.fromkeys(PROBE_THREADS, "1"))
    run = subprocess.run([find_mpiexec(), *options, "-n", "2", *command],
                         capture_output=True, text=True, timeout=300, env=env)
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise ClusterError(f"probing cluster {cluster.name} failed (exit {run.returncode}): "
                           f"{last}")
    cluster = replace(cluster, probed=json.loads(lines[-1]))
    state_path(cluster.name).write_text(json.dumps(asdict(cluster)))
    return cluster


def link_fields(cluster: Cluster) -> dict:
    """The profile fields of the cluster's links for the simulator: as probed, else as
    shaped (no host cost known). Each rank is a node of its own whose link is its port,
    and its TCP collectives move while it computes (the runtime's progress thread, NOTE
    [progress while kernels run] in rt/comm.py)."""
    link = cluster.probed or {"link_bandwidth": cluster.bandwidth,
                              "link_latency": cluster.latency, "link_host_cost": 0.0}
    return node_per_rank(link) | {"collective_progress_share": 1.0}


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # the launcher stops mpiexec and the ranks, then we tear down


def describe(cluster: Cluster) -> str:
    delay = "" if cluster.delay_applied or cluster.latency == 0 else \
        " (not applied: the kernel has no netem)"
    probed = "" if not cluster.probed else "; probed: " + describe_link(cluster.probed)
    return (f"{cluster.ranks} ranks, {cluster.bandwidth / 1e6:.2f} MB/s and "
            f"{cluster.latency * 1e6:.1f} us{delay} per link{probed}")


def describe_link(fields: dict) -> str:
    return (f"{fields['link_bandwidth'] / 1e6:.2f} MB/s, {fields['link_latency'] * 1e6:.1f} us "
            f"one way, host {fields['link_host_cost'] * 1e9:.2f} ns per byte sent or received")
