"""The environment variables ratrain reads for itself, in one place (the README's settings
table): where its per-user cache lives and which profile stands for this machine. The
runtime's thread variables are rt/threads.py's; the test cluster's state file is
cluster/harness.py's.
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$RATRAIN_CACHE, else ~/.cache/ratrain: built modules (build/), token caches
    (tokens/) and this machine's profiles (profiles/)."""
    return Path(os.environ.get("RATRAIN_CACHE", Path.home() / ".cache" / "ratrain"))


def default_hw_setting() -> str | None:
    """$RATRAIN_DEFAULT_HW: the profile (a name or a path) that stands for this machine
    where no --hw names one (NOTE [this machine's profile]); None: unset."""
    return os.environ.get("RATRAIN_DEFAULT_HW") or None
