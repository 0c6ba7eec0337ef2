"""What the readers of a --data path share: its one-line DataError, a Source (one file of
the data, fingerprinted for the token cache) and a Piece (a text to encode, as sources.py
and tables.py yield them).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple


class DataError(ValueError):
    """The training data cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class Source:
    path: Path                          # one file of the data
    size: int                           # bytes, when fingerprinted
    mtime_ns: int                       # modification time, when fingerprinted


class Piece(NamedTuple):
    text: str                           # the text to encode
    nbytes: int                         # its share of the data's bytes (progress)
    last: bool                          # it ends its document: EOS follows
    where: str                          # the file (and line or row), for messages
