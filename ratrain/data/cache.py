"""The token stream of a --data path, tokenized once and cached next to the data (nanoGPT
style): NAME.<key>.tokens.bin (uint16 or uint32 ids, each document followed by its EOS)
and NAME.<key>.tokens.json, the sidecar recording what it was made from. A later run with
the same sources and tokenizer only memmaps it. See NOTE [token cache].
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from ratrain.data.encode import batch_bytes, batches, encode_in_order
from ratrain.data.progress import Progress
from ratrain.data.sources import TEXT_FIELD, DataError, documents, find_sources
from ratrain.data.tokenizer import TokenizerChoice
from ratrain.settings import cache_root

FORMAT = "ratrain-tokens/2"              # 2: pieces cut only where ids cannot change

# NOTE [token cache]: the sidecar records the sources (path, size and mtime of every file),
# the sha256 of tokenizer.json, the EOS id, the dtype and the .bin's size; any difference
# re-tokenizes. The .bin and the sidecar are written under temporary names and renamed
# into place, the old sidecar removed first, so a crash leaves no cache that looks valid.
# The key in the file names (a hash of tokenizer and EOS) lets caches of two tokenizers
# sit side by side. When the data's directory is not writable, the cache goes under
# $RATRAIN_CACHE/tokens (default ~/.cache/ratrain/tokens). A text field other than "text"
# (--text-field, of a .jsonl or a table) is recorded too; the default is not, so caches
# made before the flag existed stay valid. The ids do not depend on how the text was cut
# or batched (NOTE [pieces of a long text]): format 2's caches are read as they are.


def token_stream(path: str, flag: str, choice: TokenizerChoice, vocab: int,
                 build: bool = True, field: str = TEXT_FIELD) -> np.ndarray:
    """The data's token ids (np.memmap), tokenized now if no valid cache exists and
    `build`; a DataError if ids reach `vocab` or the cache is missing without `build`.
    `field` is the text field of a .jsonl line or table row."""
    sources = find_sources(path, flag)
    meta = _expected(path, sources, choice, vocab, field)
    for place in _places(path, choice):
        if _valid(place, meta):
            return _open(place, flag, path, choice, vocab)
    if not build:
        raise DataError(f"{flag} {path} has no token cache: rank 0 writes it first (run the "
                        "job again, or start it with `ratrain run`)")
    place = _writable_place(path, choice)
    _write(place, meta, sources, flag, path, choice, vocab, field)
    return _open(place, flag, path, choice, vocab)


def token_dtype(vocab: int) -> np.dtype:
    """uint16 when every id of the model fits, else uint32 (nanoGPT's .bin)."""
    return np.dtype(np.uint16 if vocab <= 2 ** 16 else np.uint32)


def _expected(path: str, sources, choice: TokenizerChoice, vocab: int, field: str) -> dict:
    root = Path(path)
    return {"format": FORMAT, "tokenizer": choice.digest, "eos_id": choice.eos_id,
            "dtype": token_dtype(vocab).name,
            "sources": [[str(s.path.relative_to(root)) if root.is_dir() else s.path.name,
                         s.size, s.mtime_ns] for s in sources],
            **({"text_field": field} if field != TEXT_FIELD else {})}


def _places(path: str, choice: TokenizerChoice) -> tuple[Path, Path]:
    """Base names of the cache: next to the data, and under $RATRAIN_CACHE."""
    data, key = Path(path).resolve(), cache_key(choice)
    root = cache_root()
    where = hashlib.sha256(str(data).encode()).hexdigest()[:12]
    return (data.parent / f"{data.name}.{key}.tokens",
            root / "tokens" / f"{data.name}.{where}.{key}.tokens")


def cache_key(choice: TokenizerChoice) -> str:
    """The key in a cache's file names: a hash of the tokenizer and its EOS id."""
    return hashlib.sha256(f"{choice.digest}:{choice.eos_id}".encode()).hexdigest()[:10]


def cache_files(path: str, choice: TokenizerChoice) -> list[Path]:
    """Every file a token cache of `path` under `choice` may have (in both places)."""
    return [f(place) for place in _places(path, choice) for f in (_bin, _sidecar)]


def _bin(place: Path) -> Path:
    return place.with_name(place.name + ".bin")


def _sidecar(place: Path) -> Path:
    return place.with_name(place.name + ".json")


def _valid(place: Path, expected: dict) -> bool:
    try:
        meta = json.loads(_sidecar(place).read_text())
        size = _bin(place).stat().st_size
    except (OSError, ValueError):
        return False
    keys = {*expected, "text_field"}  # a cache of another field is not one of "text"
    return all(meta.get(k) == expected.get(k) for k in keys) and meta.get("bin_bytes") == size


def _open(place: Path, flag: str, path: str, choice, vocab: int) -> np.ndarray:
    meta = json.loads(_sidecar(place).read_text())
    if meta["max_id"] >= vocab:
        raise DataError(f"{flag} {path}: {choice.source} makes token id {meta['max_id']}, "
                        f"but the model's vocabulary has {vocab} ids; pass the model's own "
                        "tokenizer with --tokenizer DIR")
    if meta["tokens"] == 0:
        return np.zeros(0, meta["dtype"])
    return np.memmap(_bin(place), dtype=meta["dtype"], mode="r")


def _writable_place(path: str, choice: TokenizerChoice) -> Path:
    beside, fallback = _places(path, choice)
    try:
        tempfile.TemporaryFile(dir=beside.parent).close()
        return beside
    except OSError:
        pass
    fallback.parent.mkdir(parents=True, exist_ok=True)
    print(f"ratrain: {beside.parent} is not writable; caching the tokens of {path} in "
          f"{fallback.parent}", file=sys.stderr, flush=True)
    return fallback


def _write(place: Path, meta: dict, sources, flag: str, path: str, choice, vocab: int,
           field: str) -> None:
    """Tokenize every document into a temporary .bin, then rename it and the sidecar
    into place (NOTE [token cache])."""
    _sidecar(place).unlink(missing_ok=True)
    total = sum(s.size for s in sources)
    temp = place.with_name(f".{place.name}.bin.{os.getpid()}.tmp")
    progress = Progress(f"tokenizing {path}", total)
    try:
        with open(temp, "wb") as out:
            counts = _tokenize(out, sources, flag, path, choice, vocab, field, progress)
        os.replace(temp, _bin(place))
    except BaseException:
        progress.stop()
        temp.unlink(missing_ok=True)
        raise
    meta = {**meta, **counts, "bin_bytes": _bin(place).stat().st_size}
    _replace_text(_sidecar(place), json.dumps(meta, indent=1) + "\n")


def _tokenize(out, sources, flag: str, path: str, choice, vocab: int, field: str,
              progress) -> dict:
    """Write every document's ids and its EOS to `out` as they come (NOTE [encoding on
    every core]); counts and the largest id. Ids are checked against the model's
    vocabulary before they are narrowed to its dtype."""
    encoder, dtype = choice.encoder(), token_dtype(vocab)
    tokens = docs = 0
    max_id = _check_id(choice.eos_id, vocab, flag, choice, "its end-of-document id")
    pieces = ((piece.text, piece) for piece in
              documents(path, sources, flag, encoder.piece_bytes, field))
    groups = batches(pieces, batch_bytes(encoder.piece_bytes))
    for ids, piece in encode_in_order(groups, encoder.encode, progress.tick):
        if ids.size:
            max_id = max(max_id, _check_id(int(ids.max()), vocab, flag, choice, piece.where))
        chunk = np.concatenate([ids, [choice.eos_id]]) if piece.last else ids
        chunk.astype(dtype).tofile(out)
        tokens, docs = tokens + chunk.size, docs + piece.last
        progress.advance(piece.nbytes)
    progress.done(f"{docs} documents, {tokens:,} tokens")
    return {"tokens": tokens, "max_id": max_id, "documents": docs}


def _check_id(top: int, vocab: int, flag: str, choice, where) -> int:
    if top >= vocab:
        raise DataError(f"{flag}: {choice.source} makes token id {top} for {where}, but the "
                        f"model's vocabulary has {vocab} ids; pass the model's own tokenizer "
                        "with --tokenizer DIR")
    return top


def _replace_text(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    temp.write_text(text)
    os.replace(temp, path)
