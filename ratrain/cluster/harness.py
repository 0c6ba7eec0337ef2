"""Bring a test cluster up and down: one namespace per node (`rtc-<name>-n<k>`, address
10.213.0.<k+1> on its link `rtc0`, shared by the node's ranks) and a switch namespace
(`rtc-<name>-sw`, a bridge with one veth port `p<k>` per node). Each link is shaped both
ways: tbf + netem on the node's end (what it sends) and on the switch's port (what it
receives). A state file records what `up` made before it makes it, so `down` removes
exactly that, also after a failed `up`. Jobs run on the nodes as on hosts (NOTE [nodes as
hosts]).
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
from ratrain.rt.hosts import hydra_hosts_option, rank_hosts
from ratrain.program_format.placement import nodes_spanned
from ratrain.rt.launch import find_mpiexec, rank_python

PREFIX = "rtc"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
NAME = re.compile(r"[a-z0-9]{1,12}")
# NOTE [MPI over the links]: the mpich wheel (ch4) moves bytes through shared memory
# between the ranks hydra says share a host, and through its netmod between the others.
# A job on the cluster gives hydra each node's address as a host (NOTE [nodes as hosts]),
# so ranks of one node share memory, as on a real node, and every byte between nodes goes
# through the ofi netmod with libfabric's tcp provider bound to the node's link: over TCP
# through the shaped veth (checked by the qdisc counters, tests/cluster).
MPI_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": netns.RANK_LINK}


class ClusterError(RuntimeError):
    """A cluster that cannot be made, found or used; one line for the user."""


@dataclass(frozen=True)
class Cluster:
    name: str                           # [a-z0-9]{1,12}
    nodes: int                          # node namespaces, one shaped link each
    bandwidth: float                    # B/s of each link, each direction
    latency: float                      # s, one way node to node (two shaped hops)
    ranks_per_node: int = 1             # MPI ranks a node runs, sharing its namespace and link
    delay_applied: bool = False         # netem added it (NOTE [no netem])
    probed: dict | None = None          # link fields measured on it (`ratrain cluster probe`)

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def switch(self) -> str:
        return f"{PREFIX}-{self.name}-sw"

    def node_namespace(self, node: int) -> str:
        return f"{PREFIX}-{self.name}-n{node}"

    @property
    def namespaces(self) -> list[str]:
        return [self.switch] + [self.node_namespace(k) for k in range(self.nodes)]

    def address(self, node: int) -> str:
        return f"{netns.SUBNET}.{node + 1}"

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(self.address(k) for k in range(self.nodes))

    @property
    def launcher(self) -> Path:
        """hydra's launcher for this cluster's nodes (NOTE [nodes as hosts])."""
        return state_dir() / f"cluster-{self.name}.launcher"

    def hosts_for(self, ranks: int, hosts: tuple[str, ...] | None = None) -> tuple[str, ...]:
        """The node addresses a job of `ranks` runs on: `hosts` if given (each a node's
        address, no more ranks per node than it has), else the first ranks /
        ranks_per_node nodes. A ClusterError says why a job does not fit."""
        if hosts is None:
            if ranks % self.ranks_per_node or ranks > self.ranks:
                raise ClusterError(
                    f"cluster {self.name} has {self.nodes} nodes of {self.ranks_per_node} "
                    f"ranks; a job of {ranks} ranks does not fill whole nodes of it: "
                    f"`ratrain cluster down {self.name}` and up with --nodes and "
                    f"--ranks-per-node that multiply to {ranks}, or give --hosts")
            return self.addresses[:nodes_spanned(ranks, self.ranks_per_node)]
        strangers = [h for h in hosts if h not in self.addresses]
        if strangers:
            raise ClusterError(f"host {strangers[0]} is not a node of cluster {self.name}: "
                               f"its nodes are {', '.join(self.addresses)}")
        if ranks > len(hosts) * self.ranks_per_node:
            raise ClusterError(f"{ranks} ranks on {len(hosts)} nodes of cluster {self.name} "
                               f"are more than its {self.ranks_per_node} ranks per node")
        return hosts

    def job_command(self, mpiexec: str, ranks: int, rank_command: list[str],
                    hosts: tuple[str, ...] | None = None, environ=os.environ) -> list[str]:
        """The command line that runs a job of `ranks` on the cluster's nodes as hosts:
        mpiexec in rank 0's node namespace, the other nodes' proxies started in theirs by
        the cluster's launcher (NOTE [nodes as hosts]), MPI over the links (NOTE [MPI over
        the links]); `environ` is the one mpiexec will run with."""
        placed = rank_hosts(ranks, self.hosts_for(ranks, hosts))
        options = [a for k, v in {**MPI_ENV, **shared_core_env(ranks, environ)}.items()
                   for a in ("-genv", k, v)]
        options += ["-launcher", "rsh", "-launcher-exec", str(self.launcher),
                    *hydra_hosts_option(placed)]
        first = self.node_namespace(self.addresses.index(placed[0]))
        return ["ip", "netns", "exec", first, mpiexec, *options, "-n", str(ranks),
                *rank_command]


# NOTE [nodes as hosts]: a job on the cluster runs as a multi-host job does: hydra is given
# the nodes' addresses as hosts (`-hosts 10.213.0.1:R,...`, rt/hosts.py), so it starts one
# proxy per node and tells MPI which ranks share a host. mpiexec itself runs in rank 0's
# node namespace: the proxies connect back to it over the links (the namespaces have no
# route to the root namespace), and hydra starts that node's proxy itself (the address is
# local there). For every other node hydra runs its rsh launcher, here the cluster's own
# script (`-launcher-exec`, written by `up` beside the state file): `SCRIPT ADDRESS
# PROXY-COMMAND` runs the proxy command, which hydra quotes for a remote shell, with
# /bin/sh inside the namespace that holds ADDRESS. So `--hosts` is tested end to end on
# one machine, as root, without ssh.


def shared_core_env(ranks: int, environ=os.environ) -> dict[str, str]:
    """Thread counts for a job whose `ranks` all share this machine's cores, as hydra's
    MPI_LOCALNRANKS (one node's ranks) would give on one host (rt/__main__.py), except
    those the user set."""
    threads = str(max(1, (os.cpu_count() or 1) // ranks))
    return {v: threads for v in THREAD_VARIABLES if v not in environ}


def launcher_script(cluster: Cluster) -> str:
    """The cluster's rsh launcher for hydra: argument 1 is a node's address, the rest the
    proxy command as a remote shell would read it (NOTE [nodes as hosts])."""
    cases = "".join(f'    {cluster.address(k)}) exec ip netns exec '
                    f'{cluster.node_namespace(k)} /bin/sh -c "exec $*" ;;\n'
                    for k in range(cluster.nodes))
    return (f"#!/bin/sh\n# hydra's launcher for the nodes of ratrain test cluster "
            f"{cluster.name}\nhost=$1\nshift\ncase $host in\n{cases}"
            f'    *) echo "ratrain: error: $host is not a node of cluster {cluster.name}" >&2'
            f"\n       exit 1 ;;\nesac\n")


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


def bring_up(name: str, nodes: int, bandwidth: float, latency: float,
             ranks_per_node: int = 1) -> Cluster:
    """Create the namespaces, links, qdiscs and launcher of a new cluster (nothing left
    on error)."""
    require_root_and_iproute2()
    check_name(name)
    if nodes < 1 or ranks_per_node < 1 or bandwidth <= 0 or latency < 0:
        raise ClusterError("a cluster needs nodes >= 1, ranks per node >= 1, a positive "
                           "bandwidth and a latency >= 0")
    if nodes > 250:
        raise ClusterError(f"{nodes} nodes: a cluster has at most 250 (one /24 of addresses)")
    if read_cluster(name) is not None or leftover_namespaces(name):
        raise ClusterError(f"cluster {name} is already up: `ratrain cluster down {name}` "
                           "first, or choose another name")
    cluster = Cluster(name, nodes, float(bandwidth), float(latency), ranks_per_node)
    state_dir().mkdir(parents=True, exist_ok=True)
    check_launcher_runs(state_dir())
    state_path(name).write_text(json.dumps(asdict(cluster)))  # before anything exists
    try:
        cluster.launcher.write_text(launcher_script(cluster))
        cluster.launcher.chmod(0o700)
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
    for node in range(cluster.nodes):
        namespace, port = cluster.node_namespace(node), f"p{node}"
        netns.add_namespace(namespace)
        netns.add_rank_link(cluster.switch, port, namespace, cluster.address(node))
        for where, device in ((namespace, netns.RANK_LINK), (cluster.switch, port)):
            netns.shape(where, device, cluster.bandwidth)
            if hop_delay > 0:
                delayed &= netns.add_delay(where, device, hop_delay)
    return delayed


def check_launcher_runs(directory: Path) -> None:
    """hydra must execute the cluster's launcher from the state directory."""
    if os.statvfs(directory).f_flag & os.ST_NOEXEC:
        raise ClusterError(f"{directory} is on a noexec mount, and hydra runs the cluster's "
                           "launcher from it: set RATRAIN_CLUSTER_STATE to a directory on "
                           "another mount (e.g. /var/lib/ratrain)")


def leftover_namespaces(name: str) -> list[str]:
    return [n for n in netns.namespaces() if n.startswith(f"{PREFIX}-{name}-")]


def bring_down(name: str) -> list[str]:
    """Delete every namespace of cluster `name` (with their links and qdiscs) and its
    state file; the namespaces removed. Idempotent."""
    require_root_and_iproute2()
    check_name(name)
    recorded = None
    with contextlib.suppress(ClusterError):  # an unreadable state: remove by name prefix
        recorded = read_cluster(name)
    gone = sorted(set((recorded.namespaces if recorded else []) + leftover_namespaces(name)))
    for namespace in gone:
        netns.delete_namespace(namespace)
    (state_dir() / f"cluster-{name}.launcher").unlink(missing_ok=True)
    state_path(name).unlink(missing_ok=True)
    return [n for n in gone if n not in netns.namespaces()]


def link_counters(cluster: Cluster) -> dict[int, tuple[int, int]]:
    """node -> (bytes it sent, bytes it received) as its link's qdiscs counted them."""
    return {node: (netns.qdisc_bytes(cluster.node_namespace(node), netns.RANK_LINK),
                   netns.qdisc_bytes(cluster.switch, f"p{node}"))
            for node in range(cluster.nodes)}


@contextlib.contextmanager
def cluster_for_run(name: str, ranks: int, hosts: tuple[str, ...] | None = None,
                    bandwidth: float | None = None, latency: float | None = None):
    """The cluster `name` for a job of `ranks` (on `hosts`, its node addresses, if given):
    the one that is up, else a new one (a node per host, or per rank) at the given
    (default: scaled) link, taken down when the job ends, fails or is stopped by SIGINT or
    SIGTERM (only what this run made)."""
    require_root_and_iproute2()
    cluster = read_cluster(name)
    if cluster is not None:
        cluster.hosts_for(ranks, hosts)
        yield cluster
        return
    from ratrain.cluster.scaling import link_source, scaled_link
    default_bandwidth, default_latency = scaled_link()
    scaled = f"; link {link_source()}" if bandwidth is None else ""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        nodes = len(hosts) if hosts else ranks
        cluster = bring_up(name, nodes, bandwidth or default_bandwidth,
                           default_latency if latency is None else latency, ranks // nodes)
        cluster.hosts_for(ranks, hosts)
    except BaseException:
        signal.signal(signal.SIGTERM, previous)
        raise
    try:
        print(f"ratrain: cluster {name} up for this run ({describe(cluster)}{scaled})",
              file=sys.stderr, flush=True)
        yield cluster
    finally:
        bring_down(name)
        signal.signal(signal.SIGTERM, previous)


def probe(cluster: Cluster) -> Cluster:
    """Measure the cluster's links from one rank on each of its first two nodes
    (ratrain/cluster/probe.py) and record the result in its state; the updated cluster."""
    import subprocess
    if cluster.nodes < 2:
        raise ClusterError(f"cluster {cluster.name} has one node: probing needs two")
    # one thread per rank, as on the cluster: set for the ranks before they start, since
    # importing ratrain.cluster loads numpy (and its BLAS threads) before probe.py runs
    env = dict(os.environ, **dict.fromkeys(THREAD_VARIABLES, "1"))
    command = cluster.job_command(find_mpiexec(), 2, rank_python("ratrain.cluster.probe"),
                                  cluster.addresses[:2], env)
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
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
    shaped (no host cost known). Each node's link is its port, shared by its ranks (which
    talk within the node as the profile says), and its TCP collectives move while the rank
    computes (the runtime's progress thread, NOTE [progress while kernels run] in
    rt/comm.py); with one rank per node the link is the rank's own."""
    link = cluster.probed or {"link_bandwidth": cluster.bandwidth,
                              "link_latency": cluster.latency, "link_host_cost": 0.0}
    if cluster.ranks_per_node == 1:
        return link | {"ranks_per_node": 1, "inter_node_bandwidth": link["link_bandwidth"],
                       "inter_node_latency": link["link_latency"],
                       "collective_progress_share": 1.0}
    return {"ranks_per_node": cluster.ranks_per_node,
            "inter_node_bandwidth": link["link_bandwidth"],
            "inter_node_latency": link["link_latency"],
            "link_host_cost": link.get("link_host_cost", 0.0),
            "collective_progress_share": 1.0}


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # the launcher stops mpiexec and the ranks, then we tear down


def describe(cluster: Cluster) -> str:
    delay = "" if cluster.delay_applied or cluster.latency == 0 else \
        " (not applied: the kernel has no netem)"
    probed = "" if not cluster.probed else "; probed: " + describe_link(cluster.probed)
    return (f"{counted(cluster.nodes, 'node')} x {counted(cluster.ranks_per_node, 'rank')}, "
            f"{cluster.bandwidth / 1e6:.2f} MB/s and {cluster.latency * 1e6:.1f} us{delay} "
            f"per node link{probed}")


def counted(number: int, thing: str) -> str:
    return f"{number} {thing}{'' if number == 1 else 's'}"


def describe_link(fields: dict) -> str:
    return (f"{fields['link_bandwidth'] / 1e6:.2f} MB/s, {fields['link_latency'] * 1e6:.1f} us "
            f"one way, host {fields['link_host_cost'] * 1e9:.2f} ns per byte sent or received")
