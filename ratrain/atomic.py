"""Directories that appear whole: write into a temporary sibling, then `replace_dir` it
into place. Program directories and checkpoints both use it, so a crash leaves the old or
the new directory under the name, never a half-written one and never neither."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def replace_dir(new: Path, target: Path) -> None:
    """Rename `new` to `target`; an old `target` is moved aside first, deleted last."""
    if not target.exists():
        os.rename(new, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    os.rename(target, old / target.name)
    os.rename(new, target)
    shutil.rmtree(old, ignore_errors=True)
