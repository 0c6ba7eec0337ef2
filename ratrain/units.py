"""Byte sizes and counts for people: one formatter for every report, error and picture,
and one reader of the sizes users write (`--budget 20GB`)."""
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


def size_arg(text: str) -> int:
    """parse_size as an argparse type: a bad size is a usage error naming the units."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
