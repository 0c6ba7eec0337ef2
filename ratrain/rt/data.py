"""Training tokens: rows of T+1 token ids and the global batch of every step.

The built-in corpus exists on every machine: the installed Python standard library's
*.py files in sorted order, as bytes (vocab 256). `--data FILE.npy` gives int rows [N, T+1].
Step k (0-based) takes rows [k*G, (k+1)*G) of the (seeded, shuffled) row order, wrapping.
"""
from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import numpy as np

CORPUS_BYTES = 4 * 2 ** 20              # cap of the built-in corpus


class DataError(ValueError):
    """The training data cannot be used; the message is one line for the user."""


def stdlib_corpus(limit: int = CORPUS_BYTES) -> bytes:
    """The standard library's source files, concatenated in sorted path order."""
    chunks, size = [], 0
    for path in _stdlib_sources():
        if size >= limit:
            break
        try:
            chunks.append(path.read_bytes())
        except OSError:  # unreadable file: the corpus is whatever can be read
            continue
        size += len(chunks[-1])
    return b"".join(chunks)[:limit]


def _stdlib_sources():
    """*.py under the stdlib in sorted order, not descending into site-packages."""
    for folder, dirs, files in os.walk(sysconfig.get_paths()["stdlib"]):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "__pycache__"))
        yield from (Path(folder) / f for f in sorted(files) if f.endswith(".py"))


def byte_rows(text: bytes, row_len: int) -> np.ndarray:
    """Byte tokens cut into consecutive non-overlapping rows of row_len."""
    n = len(text) // row_len
    if n == 0:
        raise DataError(f"the corpus has {len(text)} bytes, fewer than one row of {row_len}")
    return np.frombuffer(text[:n * row_len], np.uint8).astype(np.int32).reshape(n, row_len)


def load_rows(path: str, row_len: int, vocab: int) -> np.ndarray:
    """int rows [N, row_len] from a .npy file, checked against the model's vocabulary."""
    try:
        rows = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read --data {path}: {str(e).splitlines()[0]}; pass a .npy "
                        "of integer token rows [N, seq-len + 1], or leave out --data for the "
                        "built-in corpus") from None
    if rows.ndim != 2 or rows.shape[1] != row_len or not np.issubdtype(rows.dtype, np.integer):
        raise DataError(f"--data {path} holds {rows.dtype}{list(rows.shape)}; it must be "
                        f"integer token rows [N, {row_len}] (seq-len + 1)")
    if rows.size == 0 or rows.min() < 0 or rows.max() >= vocab:
        raise DataError(f"--data {path}: token ids must lie in [0, {vocab}) for this model "
                        f"(found {rows.min() if rows.size else 'none'}.."
                        f"{rows.max() if rows.size else 'none'})")
    return rows.astype(np.int32)


class Batches:
    """The global batch [G, T+1] of every step over a fixed row order."""

    def __init__(self, rows: np.ndarray, global_batch: int, shuffle: bool, seed: int):
        self.rows, self.global_batch = rows, global_batch
        n = len(rows)
        self.order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)

    def step(self, k: int) -> np.ndarray:
        """Rows [k*G, (k+1)*G) of the order, wrapping around its end (k is 0-based)."""
        at = (k * self.global_batch + np.arange(self.global_batch)) % len(self.order)
        return self.rows[self.order[at]]


def training_rows(data: str | None, seq_len: int, vocab: int) -> np.ndarray:
    """--data rows, or the built-in corpus (which needs a byte vocabulary)."""
    if data is not None:
        return load_rows(data, seq_len + 1, vocab)
    if vocab < 256:
        raise DataError(f"the built-in corpus is bytes (256 token ids) but the model's "
                        f"vocabulary has {vocab}: pass --data FILE.npy")
    return byte_rows(stdlib_corpus(), seq_len + 1)
