"""Text pieces to token ids at the encoder's best rate, in order, with flat memory: pieces
are grouped into batches of a few pieces per core, each batch encoded on a pool thread
(`tokenizers` spreads a batch over every core and releases the GIL), IN_FLIGHT batches at
once so that the cores never wait for Python between two batches (NOTE [encoding on every
core]). Used by cache.py; the encoders come from tokenizer.py.
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

IN_FLIGHT = 2                           # batches being encoded at once
PIECES_PER_CORE = 2                     # pieces of a batch per core
MAX_BATCH_BYTES = 8 * 2 ** 20           # text per batch at most, whatever the pieces
TICK_S = 0.2                            # how often a waiting caller hears back

# NOTE [encoding on every core]: `tokenizers` encodes one text on one core, and a batch
# on as many cores as it has texts. Cutting long text into 4 MiB pieces and encoding 8 MiB
# batches (format 2's path) kept at most two cores busy, idle while Python converted the
# ids and wrote them, and held every token's Encoding (about 90 bytes of offsets, strings
# and masks per token) of a whole batch. Here a text that may be cut (NOTE [pieces of a
# long text]) is cut into SMALL_PIECE_BYTES pieces, a batch holds PIECES_PER_CORE of them
# per core, and while the caller turns one batch's ids into arrays and writes them, the
# next is already being encoded. `encode_batch_fast` (tokenizers >= 0.21) skips the
# offsets, which cost about as much as the encoding itself. (Pieces of 256 KiB encoded
# about 8% faster than 64 KiB ones here, 1 MiB no faster.) Memory is IN_FLIGHT batches'
# Encodings: a few tens of MiB per core, whatever the size of the data.


@dataclass(frozen=True)
class Encoder:
    encode: Callable[[list[str]], list[np.ndarray]]  # texts -> their ids, no specials
    piece_bytes: int                                   # a long text is cut near this size


def batch_bytes(piece_bytes: int, cores: int | None = None) -> int:
    """Text per batch: PIECES_PER_CORE pieces per core, at most MAX_BATCH_BYTES."""
    cores = cores or len(os.sched_getaffinity(0))
    return min(MAX_BATCH_BYTES, PIECES_PER_CORE * cores * piece_bytes)


def batches(pieces: Iterable[tuple[str, object]], limit: int) -> Iterator[list]:
    """(text, tag) pieces in groups of about `limit` bytes of text (a group closes once
    it reaches it)."""
    batch, size = [], 0
    for text, tag in pieces:
        batch.append((text, tag))
        size += len(text)  # characters: a cheap stand-in for bytes
        if size >= limit:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def encode_in_order(groups: Iterable[list], encode: Callable, tick: Callable[[], None]
                    ) -> Iterator[tuple[np.ndarray, object]]:
    """(ids, tag) of every piece of every group, in order; up to IN_FLIGHT groups are
    encoded at once on pool threads, and `tick` is called every TICK_S while waiting."""
    with ThreadPoolExecutor(max_workers=IN_FLIGHT, thread_name_prefix="encode") as pool:
        pending = deque()
        for group in groups:
            pending.append((pool.submit(encode, [text for text, _ in group]), group))
            if len(pending) >= IN_FLIGHT:
                yield from _finished(*pending.popleft(), tick)
        while pending:
            yield from _finished(*pending.popleft(), tick)


def _finished(future, group: list, tick: Callable[[], None]):
    while not wait([future], timeout=TICK_S).done:
        tick()
    yield from zip(future.result(), (tag for _, tag in group))


def hf_encode(tokenizer) -> Callable[[list[str]], list[np.ndarray]]:
    """texts -> id arrays through a `tokenizers.Tokenizer`, without its offsets where
    the library can (NOTE [encoding on every core])."""
    batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    return lambda texts: [np.asarray(e.ids, np.int64)
                          for e in batch(texts, add_special_tokens=False)]


def byte_encode(texts: list[str]) -> list[np.ndarray]:
    """texts -> their UTF-8 bytes as ids (NOTE [byte documents])."""
    return [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
