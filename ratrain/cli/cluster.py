"""`ratrain cluster up|down|status`: the bandwidth-constrained test cluster (ratrain/cluster).

up makes one network namespace per node (its ranks share it) on a shaped link (default:
the scaled MT-3000 link, NOTE [link scaling]); down removes everything up made and is safe
to repeat; status shows the links and the bytes their qdiscs have counted; probe measures
what the links give and cost from two nodes, for `ratrain simulate --cluster NAME`.
`ratrain run --cluster NAME [--hosts ...]` runs a program on its nodes.
"""
from __future__ import annotations

from ratrain.cli.options import add_options
from ratrain.errors import UserError


def cmd_up(args) -> None:
    from ratrain.cluster.harness import bring_up, describe
    from ratrain.cluster.scaling import link_source, scaled_link
    bandwidth, latency = scaled_link()
    nodes = node_count(args.ranks, args.nodes, args.ranks_per_node)
    cluster = bring_up(args.name, nodes, args.link_bandwidth or bandwidth,
                       latency if args.link_latency is None else args.link_latency,
                       args.ranks_per_node)
    scaled = f" (link {link_source()})" if args.link_bandwidth is None else ""
    print(f"cluster {cluster.name} up: {describe(cluster)}{scaled}; `ratrain run DIR -n "
          f"{cluster.ranks} --cluster {cluster.name}` runs on it")


def node_count(ranks: int | None, nodes: int | None, ranks_per_node: int) -> int:
    """Nodes of `cluster up`: --nodes, or -n ranks over --ranks-per-node."""
    if nodes is not None:
        return nodes
    if ranks_per_node < 1 or ranks % ranks_per_node:
        raise UserError(f"-n {ranks} ranks do not fill nodes of --ranks-per-node "
                        f"{ranks_per_node}: give --nodes N, or -n a multiple of it")
    return ranks // ranks_per_node


def cmd_down(args) -> None:
    from ratrain.cluster.harness import bring_down
    gone = bring_down(args.name)
    print(f"cluster {args.name} down: removed {', '.join(gone)}" if gone else
          f"cluster {args.name} down: nothing of it was left")


def cluster_up(name: str, first: str = "makes one"):
    """The cluster `name` that is up, else a UserError saying what to run `first`."""
    from ratrain.cluster import ClusterError
    from ratrain.cluster.harness import read_cluster
    try:
        cluster = read_cluster(name)
    except ClusterError as e:
        raise UserError(str(e)) from None
    if cluster is None:
        raise UserError(f"no cluster {name} is up: `ratrain cluster up {name} -n N` {first}")
    return cluster


def cmd_status(args) -> None:
    from ratrain.cluster.harness import describe, link_counters
    cluster = cluster_up(args.name)
    print(f"cluster {cluster.name}: {describe(cluster)}")
    print(f"{'node':>4} {'namespace':<18} {'address':<12} {'sent bytes':>14} "
          f"{'received bytes':>14}")
    for node, (sent, received) in link_counters(cluster).items():
        print(f"{node:>4} {cluster.node_namespace(node):<18} {cluster.address(node):<12} "
              f"{sent:>14,} {received:>14,}")


def cmd_probe(args) -> None:
    from ratrain.cluster.harness import describe_link, probe
    cluster = cluster_up(args.name)
    print(f"probing cluster {cluster.name} from ranks 0 and 1 (a few seconds)...", flush=True)
    cluster = probe(cluster)
    print(f"cluster {cluster.name} links: {describe_link(cluster.probed)}; `ratrain simulate "
          f"DIR --cluster {cluster.name}` uses them")


def run_cluster_command(args) -> None:
    from ratrain.cluster import ClusterError
    from ratrain.cluster.netns import NetnsError
    try:
        args.action(args)
    except (ClusterError, NetnsError) as e:
        raise UserError(str(e)) from None


def add_cluster_parser(sub) -> None:
    p = sub.add_parser("cluster", help="a bandwidth-constrained test cluster on this machine "
                       "(network namespaces on shaped links; needs root)",
                       description="One network namespace per node (shared by its MPI ranks), "
                       "joined through a bridge by veth links that tc shapes to a chosen "
                       "bandwidth (and delay, where the kernel has netem); MPI runs over TCP "
                       "on them between nodes, through shared memory within one.")
    actions = p.add_subparsers(dest="cluster_command", metavar="ACTION", required=True,
                               help="up, down, status or probe; `ratrain cluster ACTION "
                               "--help`")
    up = actions.add_parser("up", help="make a cluster of node namespaces")
    up.add_argument("name", metavar="NAME", help="1-12 lowercase letters or digits")
    size = up.add_mutually_exclusive_group(required=True)
    size.add_argument("-n", "--ranks", type=int, metavar="N",
                      help="MPI ranks in all: N / --ranks-per-node nodes")
    add_options(size, "--nodes", nodes={"help": "node namespaces, each on its own shaped "
                                          "link", "metavar": "N"})
    add_options(up, "--ranks-per-node", "--link-bandwidth", "--link-latency",
                ranks_per_node={"default": 1, "help": "MPI ranks each node runs, sharing its "
                                "namespace and link (default: 1)"},
                link_bandwidth={"help": "bytes/s of each link and direction, e.g. 62MB/s or "
                                "500Mbit (default: the MT-3000's 3.7 GB/s scaled to this "
                                "machine's rank compute rate)"},
                link_latency={"help": "one-way latency, e.g. 5us (default: the mt3000 "
                              "profile's link_latency)"})
    up.set_defaults(action=cmd_up)
    down = actions.add_parser("down", help="remove every namespace, link and qdisc of NAME")
    down.add_argument("name", metavar="NAME", help="the cluster's name, as given to up")
    down.set_defaults(action=cmd_down)
    status = actions.add_parser("status", help="links, addresses and qdisc byte counters")
    status.add_argument("name", metavar="NAME", help="the cluster's name, as given to up")
    status.set_defaults(action=cmd_status)
    probe = actions.add_parser("probe", help="measure the links from two nodes: MPI "
                               "bandwidth and latency, and the CPU a rank spends per byte "
                               "it moves (NOTE [link host cost]); for `simulate --cluster`")
    probe.add_argument("name", metavar="NAME", help="the cluster's name, as given to up")
    probe.set_defaults(action=cmd_probe)
    p.set_defaults(func=run_cluster_command)
