"""A bandwidth-constrained test cluster on one machine (issue 7): one network namespace
per MPI rank joined through a bridge in a "switch" namespace by veth links shaped with tc,
so ranks talk over TCP at a chosen rate and delay. `ratrain cluster up|down|status` and
`ratrain run --cluster NAME` use it; it needs root and iproute2 (ip, tc).
"""
from ratrain.cluster.harness import (ClusterError, bring_down, bring_up, cluster_for_run,
                                     link_counters, read_cluster)

__all__ = ["ClusterError", "bring_down", "bring_up", "cluster_for_run", "link_counters",
           "read_cluster"]
