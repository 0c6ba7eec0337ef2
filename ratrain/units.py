"""Byte sizes for people: one formatter for every report, error and picture."""
from __future__ import annotations

BINARY_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(nbytes: int | float | None) -> str:
    """Human-readable size in binary units (GiB/MiB/KiB); None means no limit."""
    if nbytes is None:
        return "unlimited"
    for unit, scale in BINARY_UNITS:
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"
