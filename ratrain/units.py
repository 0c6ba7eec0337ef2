"""Byte sizes and counts for people: one formatter for every report, error and picture,
and one reader of the sizes users write (`--budget 20GB`); likewise the link bandwidths
and latencies they write (`--inter-node-bandwidth 1.25GB/s`, `--link-latency 5us`)."""
from __future__ import annotations

import argparse
import re

BINARY_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(nbytes: int | float | None) -> str:
    """Human-readable size in binary units (GiB/MiB/KiB); None means no limit."""
    if nbytes is None:
        return "unlimited"
    for unit, scale in BINARY_UNITS:
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"


def format_count(count: int) -> str:
    """A count in decimal units to one decimal, as parameter counts are said: 1.2M,
    21.5K, 7.0B; a count that rounds below 1.0K as itself."""
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if round(count / scale, 1) >= 1:
            return f"{count / scale:.1f}{unit}"
    return str(count)


SIZE_UNITS = {"": 1, "b": 1} | {f"{p}{s}": 1000 ** (i + 1) for i, p in enumerate("kmgt")
                                 for s in ("", "b")} \
    | {f"{p}i{s}": 1024 ** (i + 1) for i, p in enumerate("kmgt") for s in ("", "b")}
SIZE_HELP = ("decimal units are powers of 10 (KB/MB/GB/TB, or K/M/G/T: 20GB = 20 * 10^9 "
             "bytes, as in the MT-3000's '20 GB'); binary units need an i (KiB/MiB/GiB/TiB: "
             "20GiB = 20 * 2^30); a plain number is bytes")


def format_budget(nbytes: int) -> str:
    """Both readings of a budget: `20 GB (18.63 GiB)`."""
    scale, unit = next((s, u) for s, u in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"),
                                           (1, "B")) if nbytes >= s or u == "B")
    return f"{nbytes / scale:.4g} {unit} ({format_bytes(nbytes)})"


def parse_size(text: str) -> int:
    """Bytes of a size like `20GB` (10^9), `20GiB` (2^30), `1.5G`, `512MB`, `4096`."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*([a-z]*)\s*",
                         str(text), re.I)
    unit = match and match[3].lower()
    if not match or unit not in SIZE_UNITS:
        raise ValueError(f"cannot read size {text!r}: {SIZE_HELP}")
    nbytes = round(float(match[1] + (f"e{match[2]}" if match[2] else "")) * SIZE_UNITS[unit])
    if nbytes < 1:
        raise ValueError(f"size {text!r} must be at least one byte")
    return nbytes


def _arg(parse):
    """`parse` as an argparse type: a bad value is a usage error saying what to give."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert


size_arg = _arg(parse_size)             # a bad size is a usage error naming the units


RATE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text: str) -> float:
    """B/s from '61.7e6', '62MB/s', '500Mbit' or '0.5Gbit/s' (decimal prefixes)."""
    match = re.fullmatch(r"([0-9.eE+-]+)\s*([kKmMgGtT]?)(B|bit|b)?(/s|ps)?", text.strip())
    try:
        value = float(match.group(1)) if match else -1.0
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"bandwidth {text!r}: give bytes per second, e.g. 61.7e6, 62MB/s "
                         "or 500Mbit")
    scale = RATE_UNITS[match.group(2).lower()]
    return value * scale / (8 if match.group(3) in ("bit", "b") else 1)


def parse_latency(text: str) -> float:
    """Seconds from '5e-6', '5us', '0.1ms' or '1s'."""
    units = {"": 1, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    match = re.fullmatch(r"([0-9.eE+-]+)\s*(s|ms|us|ns)?", text.strip())
    try:
        value = float(match.group(1)) if match else -1.0
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(f"latency {text!r}: give seconds, e.g. 5e-6, 5us or 0.1ms")
    return value * units[match.group(2) or ""]


bandwidth_arg = _arg(parse_bandwidth)
latency_arg = _arg(parse_latency)
