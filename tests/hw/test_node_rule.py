"""The rank -> node rule is one function (program_format/placement.node_of_rank): the
simulator's nodes, `ratrain run --hosts` and the test cluster place ranks by it."""
from ratrain.cluster.harness import Cluster
from ratrain.hw.topology import node_of_rank as topology_node_of_rank
from ratrain.program_format.placement import node_of_rank, nodes_spanned
from ratrain.rt.hosts import rank_hosts


def test_nodes_hold_consecutive_ranks():
    assert [node_of_rank(r, 4) for r in range(9)] == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    assert [node_of_rank(r, 0) for r in range(3)] == [0, 1, 2]  # no count: a node per rank
    assert [nodes_spanned(n, 4) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
    assert topology_node_of_rank is node_of_rank


def test_hosts_follow_the_node_rule():
    hosts = ("a", "b", "c")
    assert rank_hosts(6, hosts) == tuple(hosts[node_of_rank(r, 2)] for r in range(6))


def test_the_cluster_fills_the_nodes_the_rule_spans():
    cluster = Cluster("t", nodes=3, bandwidth=1e9, latency=1e-6, ranks_per_node=2)
    assert cluster.hosts_for(4) == cluster.addresses[:2]
    assert cluster.hosts_for(6) == cluster.addresses
