"""The iproute2 commands of the cluster harness: namespaces, veth links, a bridge and tc
qdiscs, and the qdiscs' byte counters. Every command names its namespace (`ip -n NS`,
`tc -n NS`), so nothing is ever created in the root namespace. Needs root and iproute2.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

BRIDGE = "br0"                          # the switch's bridge
RANK_LINK = "rtc0"                      # a rank's end of its veth, in its namespace
SUBNET = "10.213.0"                     # each cluster's /24, private to its namespaces
MTU = 9000                              # jumbo frames: headers ~0.7% of the bytes, not 4.4%


class NetnsError(RuntimeError):
    """An ip/tc command failed, or root / iproute2 is missing."""


def missing_requirement() -> str | None:
    """Why the harness cannot run here, or None."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the cluster harness needs iproute2 (`ip` and `tc`), which is not installed"
    if os.geteuid() != 0:
        return "the cluster harness needs root (network namespaces and tc): run as root"
    return None


def run(*argv: str, check: bool = True) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if check and done.returncode:
        raise NetnsError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def namespaces() -> list[str]:
    """Names of every network namespace (`ip netns list`)."""
    return [line.split()[0] for line in run("ip", "netns", "list").splitlines() if line.strip()]


def add_namespace(name: str) -> None:
    run("ip", "netns", "add", name)
    run("ip", "-n", name, "link", "set", "lo", "up")


def delete_namespace(name: str) -> None:
    """Remove a namespace and with it every link and qdisc inside (a veth goes with
    either of its ends); quiet when it is already gone."""
    run("ip", "netns", "delete", name, check=False)


def add_bridge(switch: str) -> None:
    run("ip", "-n", switch, "link", "add", BRIDGE, "type", "bridge")
    run("ip", "-n", switch, "link", "set", BRIDGE, "addrgenmode", "none", "mtu", str(MTU))
    run("ip", "-n", switch, "link", "set", BRIDGE, "up")


def add_rank_link(switch: str, port: str, rank_ns: str, address: str) -> None:
    """A veth pair from the switch's bridge (end `port`) into rank_ns (end RANK_LINK,
    holding `address`/24), both ends up."""
    run("ip", "-n", switch, "link", "add", port, "type", "veth", "peer", "name", RANK_LINK,
        "netns", rank_ns)
    for namespace, device in ((switch, port), (rank_ns, RANK_LINK)):  # no IPv6 chatter
        run("ip", "-n", namespace, "link", "set", device, "addrgenmode", "none", "mtu",
            str(MTU))
    run("ip", "-n", switch, "link", "set", port, "master", BRIDGE)
    run("ip", "-n", switch, "link", "set", port, "up")
    run("ip", "-n", rank_ns, "addr", "add", f"{address}/24", "dev", RANK_LINK)
    run("ip", "-n", rank_ns, "link", "set", RANK_LINK, "up")


def shape(namespace: str, device: str, bandwidth: float) -> None:
    """Egress of `device`: tbf at `bandwidth` B/s as the root qdisc (handle 1:)."""
    run("tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", "handle", "1:",
        "tbf", "rate", f"{int(bandwidth * 8)}bit", "burst", str(burst_bytes(bandwidth)),
        "latency", "200ms")


def add_delay(namespace: str, device: str, delay: float) -> bool:
    """netem `delay` s under the tbf of `device`; False when the kernel has no netem
    (CONFIG_NET_SCH_NETEM), which leaves the path's own latency (NOTE [no netem])."""
    done = subprocess.run(["tc", "-n", namespace, "qdisc", "replace", "dev", device,
                           "parent", "1:1", "handle", "10:", "netem", "delay",
                           f"{delay * 1e6:.1f}us", "limit", "100000"],
                          capture_output=True, text=True)
    if done.returncode and "unknown" in done.stderr:
        return False
    if done.returncode:
        raise NetnsError(f"netem delay on {device} in {namespace} failed: {done.stderr.strip()}")
    return True


# NOTE [no netem]: some kernels (this machine's among them) are built without sch_netem,
# so tc cannot add delay. The cluster then runs at the latency of its path (veth, bridge
# and the TCP stack: tens of microseconds per message, already above the MT-3000's 5 us),
# `ratrain cluster status` says the delay was not applied, and the bandwidth, which is
# what the scaled regime is about, is shaped as asked.


def burst_bytes(bandwidth: float) -> int:
    """tbf bucket: 2 ms at the rate, at least two 64 KiB GSO packets (NOTE [tbf burst])."""
    return max(int(bandwidth * 2e-3), 2 * 65536)


# NOTE [tbf burst]: veth hands tbf GSO packets of up to 64 KiB; a bucket smaller than a
# packet makes tbf split it (or drop it), and a bucket much larger than a few ms of rate
# lets bursts pass faster than the link. 2 ms at the rate, at least 128 KiB, keeps the
# long-run rate exact and bursts short against steps of tens to hundreds of ms.


def qdisc_bytes(namespace: str, device: str) -> int:
    """Bytes the root qdisc of `device` has sent (packets with their headers)."""
    shown = json.loads(run("tc", "-s", "-j", "-n", namespace, "qdisc", "show", "dev", device)
                       or "[]")
    roots = [q for q in shown if q.get("root")]
    return int(roots[0]["bytes"]) if roots else 0


def qdiscs(namespace: str) -> list[str]:
    """`tc qdisc show` lines of a namespace that are not the kernel's defaults."""
    shown = run("tc", "-n", namespace, "qdisc", "show", check=False).splitlines()
    return [line for line in shown if " noqueue " not in line and line.strip()]
