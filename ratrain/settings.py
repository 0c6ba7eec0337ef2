"""The environment variables ratrain reads for itself, in one place (the README's settings
table): where its per-user cache lives. The runtime's thread variables are rt/threads.py's;
the test cluster's state file is cluster/harness.py's.
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$RATRAIN_CACHE, else ~/.cache/ratrain: built modules (build/), token caches
    (tokens/) and this machine's profiles (profiles/)."""
    return Path(os.environ.get("RATRAIN_CACHE", Path.home() / ".cache" / "ratrain"))

