"""The hosts of a multi-host run (`ratrain run --hosts` / `--hostfile`): the host list,
checked, the one rule that places ranks on hosts (`rank_hosts`), and the mpiexec (hydra)
options that say that placement. rt/launch.py builds the job's command line here; the test
cluster (ratrain/cluster) passes its nodes' addresses and a launcher of its own.
"""
from __future__ import annotations

import re
from pathlib import Path

from ratrain.errors import UserError
from ratrain.program_format.placement import node_of_rank

# letters, digits, '.', '-', '_': host names and IPv4 addresses; ':' and ',' are hydra's
# separators (`-hosts a:2,b:2`), so an IPv6 address cannot be given here
HOST_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def parse_host_list(text: str) -> tuple[str, ...]:
    """The hosts of `--hosts h1,h2,...`, in order. Requires: nothing. Guarantees: each
    name is non-empty and valid (HOST_NAME), or a UserError names the bad entry."""
    hosts = tuple(part.strip() for part in text.split(","))
    for index, host in enumerate(hosts, 1):
        check_host_name(host, f"--hosts {text!r}: host {index}")
    return hosts


def read_hostfile(path: str | Path) -> tuple[tuple[str, int | None], ...]:
    """(host, ranks it asks for or None) of each line of a hostfile: `host` or `host:N`
    (hydra's form), blank lines and `#` comments skipped. A UserError for an unreadable
    file, a bad line or a file without hosts."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise UserError(f"cannot read --hostfile {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UserError(f"--hostfile {path} is not text: give one host name per line") from None
    entries = []
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if line:
            entries.append(_hostfile_entry(line, f"--hostfile {path} line {number}"))
    if not entries:
        raise UserError(f"--hostfile {path} names no host: give one host name per line")
    return tuple(entries)


def _hostfile_entry(line: str, where: str) -> tuple[str, int | None]:
    host, colon, count = line.partition(":")
    check_host_name(host.strip(), where)
    if not colon:
        return host.strip(), None
    if not count.strip().isdigit() or int(count) < 1:
        raise UserError(f"{where}: {line!r}: write `host` or `host:N` with N >= 1 ranks")
    return host.strip(), int(count)


def check_host_name(host: str, where: str) -> None:
    if not host:
        raise UserError(f"{where} is empty: give host names separated by commas")
    if not HOST_NAME.fullmatch(host):
        raise UserError(f"{where} {host!r} is not a host name: use letters, digits, '.', "
                        "'-' and '_' (an IPv4 address, not IPv6)")


def ranks_per_host(world_size: int, hosts: tuple[str, ...], counts=None) -> int:
    """How many ranks each host runs: world_size / len(hosts). Requires: hosts non-empty.
    Guarantees: the hosts are distinct, their number divides world_size and every count a
    hostfile gave equals the result, or a UserError says which."""
    repeated = sorted({h for h in hosts if hosts.count(h) > 1})
    if repeated:
        raise UserError(f"host {repeated[0]} is listed twice: list each host once (it "
                        f"runs world size / hosts ranks)")
    if world_size % len(hosts):
        fits = [str(d) for d in range(1, world_size + 1) if world_size % d == 0]
        choices = " or ".join(filter(None, [", ".join(fits[:-1]), fits[-1]]))
        raise UserError(f"{len(hosts)} hosts do not divide the program's {world_size} ranks: "
                        f"give {choices} hosts (each runs the same number of ranks)")
    per_host = world_size // len(hosts)
    for host, count in zip(hosts, counts or ()):
        if count is not None and count != per_host:
            raise UserError(f"hostfile asks {host}:{count}, but the program's {world_size} "
                            f"ranks on {len(hosts)} hosts place {per_host} on each: write "
                            f"{host}:{per_host} or just {host}")
    return per_host


def rank_hosts(world_size: int, hosts: tuple[str, ...]) -> tuple[str, ...]:
    """The host of each rank (NOTE [ranks on hosts]): world_size / len(hosts) consecutive
    ranks per host, in the order given. Requires: ranks_per_host(world_size, hosts)
    accepted them."""
    per_host = world_size // len(hosts)
    return tuple(hosts[node_of_rank(rank, per_host)] for rank in range(world_size))


# NOTE [ranks on hosts]: each host runs a block of consecutive ranks, as the planner's
# and the simulator's nodes hold them (program_format/placement.node_of_rank, the one
# statement of the rule); which (stage, replica)
# each rank is, and so what shares a host, is the program's placement (NOTE [placement],
# program_format/placement.py): pipeline-major keeps a pipeline on one host when its
# ranks per host are a multiple of pp and spreads each DP group over the hosts, DP-major
# keeps a stage's DP group on one host. `rank_hosts` is the only place hosts are given
# ranks by that rule: hydra is told it explicitly (`-hosts h:count,...`, one entry per run of
# consecutive ranks on a host).


def hydra_hosts_option(placed: tuple[str, ...]) -> list[str]:
    """mpiexec's `-hosts h1:c1,h2:c2,...` that puts rank r on placed[r]: hydra fills the
    entries in order, c ranks each, so one entry per run of consecutive equal hosts."""
    runs: list[list] = []
    for host in placed:
        if runs and runs[-1][0] == host:
            runs[-1][1] += 1
        else:
            runs.append([host, 1])
    return ["-hosts", ",".join(f"{host}:{count}" for host, count in runs)]


def resolve_hosts(host_list: str | None, hostfile: str | None,
                  world_size: int) -> tuple[str, ...] | None:
    """The hosts of `--hosts` or `--hostfile` (at most one of them), checked against the
    world size; None when neither is given."""
    if host_list is not None and hostfile is not None:
        raise UserError("give --hosts or --hostfile, not both")
    if host_list is None and hostfile is None:
        return None
    entries = (tuple((h, None) for h in parse_host_list(host_list)) if host_list is not None
               else read_hostfile(hostfile))
    hosts = tuple(host for host, _ in entries)
    ranks_per_host(world_size, hosts, [count for _, count in entries])
    return hosts


def job_command(mpiexec: str, ranks: int, rank_command: list[str], hosts=None,
                cluster=None) -> list[str]:
    """The whole command line of a job of `ranks` ranks: on this host, on `hosts` (hydra's
    default launcher, ssh), or on a test cluster's nodes (the cluster's own placement)."""
    if cluster is not None:
        return cluster.job_command(mpiexec, ranks, rank_command, hosts)
    placed = [] if hosts is None else hydra_hosts_option(rank_hosts(ranks, hosts))
    return [mpiexec, *placed, "-n", str(ranks), *rank_command]
