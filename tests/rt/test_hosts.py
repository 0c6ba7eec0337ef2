"""Hosts of a multi-host run (rt/hosts.py): the host list and hostfile are checked with one
line per mistake, ranks go to hosts in blocks of consecutive ranks, and hydra is told that
placement explicitly. No MPI or root needed."""
import pytest

from ratrain.errors import UserError
from ratrain.rt.hosts import (hydra_hosts_option, job_command, parse_host_list,
                              rank_hosts, ranks_per_host, read_hostfile, resolve_hosts)


def error_of(call, *args) -> str:
    with pytest.raises(UserError) as caught:
        call(*args)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_host_list_keeps_order_and_strips_spaces():
    assert parse_host_list("node1, node2,10.0.0.3") == ("node1", "node2", "10.0.0.3")


@pytest.mark.parametrize("text, message", [
    ("a,,b", "--hosts 'a,,b': host 2 is empty: give host names separated by commas"),
    ("a,", "--hosts 'a,': host 2 is empty: give host names separated by commas"),
    ("", "--hosts '': host 1 is empty: give host names separated by commas"),
    ("a,b c", "--hosts 'a,b c': host 2 'b c' is not a host name: use letters, digits, '.', "
              "'-' and '_' (an IPv4 address, not IPv6)"),
    ("a:2", "--hosts 'a:2': host 1 'a:2' is not a host name: use letters, digits, '.', "
            "'-' and '_' (an IPv4 address, not IPv6)")])
def test_bad_host_lists_are_one_line_errors(text, message):
    assert error_of(parse_host_list, text) == message


def test_hostfile_lines_comments_and_counts(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the machines\nnode1\n\n  node2:4   # the big one\nnode3:4\n")
    assert read_hostfile(path) == (("node1", None), ("node2", 4), ("node3", 4))


def test_bad_hostfiles_are_one_line_errors(tmp_path):
    missing = tmp_path / "missing"
    assert error_of(read_hostfile, missing) == \
        f"cannot read --hostfile {missing}: No such file or directory"
    assert error_of(read_hostfile, tmp_path) == \
        f"cannot read --hostfile {tmp_path}: Is a directory"
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n\n")
    assert error_of(read_hostfile, empty) == \
        f"--hostfile {empty} names no host: give one host name per line"
    bad = tmp_path / "bad"
    bad.write_text("node1\nnode2:two\n")
    assert error_of(read_hostfile, bad) == \
        f"--hostfile {bad} line 2: 'node2:two': write `host` or `host:N` with N >= 1 ranks"
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    assert error_of(read_hostfile, binary) == \
        f"--hostfile {binary} is not text: give one host name per line"


def test_hosts_must_divide_the_ranks_and_be_distinct():
    assert ranks_per_host(8, ("a", "b")) == 4
    assert ranks_per_host(8, ("a", "b"), [4, None]) == 4
    assert error_of(ranks_per_host, 8, ("a", "b", "c")) == \
        "3 hosts do not divide the program's 8 ranks: give 1, 2, 4 or 8 hosts (each runs " \
        "the same number of ranks)"
    assert error_of(ranks_per_host, 2, ("a", "b", "c")).startswith(
        "3 hosts do not divide the program's 2 ranks: give 1 or 2 hosts")
    assert error_of(ranks_per_host, 4, ("a", "a")) == \
        "host a is listed twice: list each host once (it runs world size / hosts ranks)"
    assert error_of(ranks_per_host, 8, ("a", "b"), [4, 2]) == \
        "hostfile asks b:2, but the program's 8 ranks on 2 hosts place 4 on each: write " \
        "b:4 or just b"


def test_consecutive_ranks_share_a_host():
    assert rank_hosts(4, ("a", "b")) == ("a", "a", "b", "b")
    assert rank_hosts(6, ("a", "b", "c")) == ("a", "a", "b", "b", "c", "c")
    assert rank_hosts(2, ("a", "b")) == ("a", "b")
    assert rank_hosts(3, ("solo",)) == ("solo",) * 3


def test_hydra_is_told_each_run_of_ranks():
    assert hydra_hosts_option(rank_hosts(8, ("a", "b"))) == ["-hosts", "a:4,b:4"]
    # a placement that returns to a host gets an entry per run, in rank order
    assert hydra_hosts_option(("a", "b", "b", "a")) == ["-hosts", "a:1,b:2,a:1"]


def test_resolve_hosts_from_either_option(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1:2\nn2\n")
    assert resolve_hosts(None, None, 4) is None
    assert resolve_hosts("n1,n2", None, 4) == ("n1", "n2")
    assert resolve_hosts(None, str(hostfile), 4) == ("n1", "n2")
    assert error_of(resolve_hosts, "n1", str(hostfile), 4) == \
        "give --hosts or --hostfile, not both"
    assert error_of(resolve_hosts, None, str(hostfile), 2).startswith("hostfile asks n1:2")


def test_job_command_on_this_host_and_on_hosts():
    rank = ["python", "-P", "-m", "ratrain.rt", "DIR"]
    assert job_command("mpiexec", 2, rank) == ["mpiexec", "-n", "2", *rank]
    assert job_command("mpiexec", 4, rank, ("n1", "n2")) == \
        ["mpiexec", "-hosts", "n1:2,n2:2", "-n", "4", *rank]
