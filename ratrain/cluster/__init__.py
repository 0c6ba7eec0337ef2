"""A bandwidth-constrained test cluster on one machine (issues 7, 24): one network
namespace per node (shared by its ranks) joined through a bridge in a "switch" namespace by
veth links shaped with tc, so nodes talk over TCP at a chosen rate and delay, and jobs run
on the nodes as on hosts. `ratrain cluster up|down|status|probe` and `ratrain run --cluster
NAME [--hosts ...]` use it; it needs root and iproute2 (ip, tc).
"""
from ratrain.cluster.harness import (ClusterError, bring_down, bring_up, cluster_for_run,
                                     link_counters, read_cluster)

__all__ = ["ClusterError", "bring_down", "bring_up", "cluster_for_run", "link_counters",
           "read_cluster"]
