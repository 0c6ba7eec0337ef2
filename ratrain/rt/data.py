"""Training tokens: rows of T+1 token ids and the global batch of every step.

The built-in corpus exists on every machine: the installed Python standard library's
*.py files in sorted order, as bytes (vocab 256). `--data FILE.npy` gives int rows [N, T+1];
`--data` text (.txt, a directory of them, .jsonl, .parquet, a saved `datasets` directory)
is tokenized once into a cached stream (ratrain/data) and packed into consecutive rows. Step k (0-based) takes rows
[k*G, (k+1)*G) of the (seeded, shuffled) row order, wrapping.
"""
from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ratrain.data import (DataError, cache_files, cache_key, choose_tokenizer, find_sources,
                          token_stream)
from ratrain.data.sources import TEXT_FIELD
from ratrain.data.tables import is_table

CORPUS_BYTES = 4 * 2 ** 20              # cap of the built-in corpus


@dataclass(frozen=True)
class TextSettings:
    """How text data becomes token ids (NOTE [tokenize once])."""
    config: dict                        # the model's HF config: vocab_size, eos_token_id
    tokenizer: str | None = None        # --tokenizer DIR
    init_from: str | None = None        # --init-from DIR (its tokenizer.json, if any)
    resume: str | None = None           # the --resume checkpoint (its tokenizer.json)
    build: bool = True                  # tokenize when no cache exists; False: memmap only
    text_field: str = TEXT_FIELD        # --text-field: a .jsonl's or a table's text


# NOTE [tokenize once]: text is tokenized before the ranks start: `ratrain train` and
# `ratrain run` call prepare_text_data in the CLI process, before mpiexec. Started
# directly under mpiexec, rank 0 calls it while the other ranks wait at the set-up
# agreement (rt/run.py). Either way the ranks then only memmap the cache
# (TextSettings.build=False), so a missing cache there is an error, not a second
# tokenization.


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


def load_rows(path: str, row_len: int, vocab: int, flag: str = "--data") -> np.ndarray:
    """int rows [N, row_len] from a .npy file, checked against the model's vocabulary."""
    try:
        rows = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        text = str(e).splitlines()[0] if str(e) else "empty file"
        raise DataError(f"cannot read {flag} {path}: {text}; pass a .npy "
                        "of integer token rows [N, seq-len + 1], or leave out --data for the "
                        "built-in corpus") from None
    if rows.ndim != 2 or rows.shape[1] != row_len or not np.issubdtype(rows.dtype, np.integer):
        raise DataError(f"{flag} {path} holds {rows.dtype}{list(rows.shape)}; it must be "
                        f"integer token rows [N, {row_len}] (seq-len + 1)")
    if rows.size == 0 or rows.min() < 0 or rows.max() >= vocab:
        raise DataError(f"{flag} {path}: token ids must lie in [0, {vocab}) for this model "
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
        return np.asarray(self.rows[self.order[at]], np.int32)


def data_rows(path: str, flag: str, row_len: int, text: TextSettings) -> np.ndarray:
    """Token rows [N, row_len] of a .npy, or of text packed from its cached token stream."""
    vocab = int(text.config["vocab_size"])
    if path.endswith(".npy"):
        return load_rows(path, row_len, vocab, flag)
    check_text_field(path, flag, find_sources(path, flag), text.text_field)
    return pack_rows(token_stream(path, flag, text_tokenizer(text), vocab, text.build,
                                  text.text_field), row_len, flag, path)


def check_text_field(path: str, flag: str, sources, field: str) -> None:
    """--text-field names a field of records: refused for plain text, which has none."""
    if field != TEXT_FIELD and not is_table(Path(path)) and \
            all(s.path.suffix == ".txt" for s in sources):
        raise DataError(f"--text-field {field} names a field of .jsonl, parquet or datasets "
                        f"records, but {flag} {path} is plain text: leave --text-field out")


def pack_rows(stream: np.ndarray, row_len: int, flag: str, path: str) -> np.ndarray:
    """The stream cut into consecutive rows of row_len (a view: memmapped stays so);
    the tail shorter than a row is left out."""
    n = len(stream) // row_len
    if n == 0:
        raise DataError(f"{flag} {path} has {len(stream)} tokens, fewer than one row of "
                        f"seq-len + 1 = {row_len}: give it more text or compile a shorter "
                        "--seq-len")
    return stream[:n * row_len].reshape(n, row_len)


def prepare_text_data(args, config: dict, seq_len: int) -> list[Path]:
    """Tokenize --data and --eval-data text into their caches now, if not cached yet
    (NOTE [tokenize once]), for a model of `config` trained on `seq_len` tokens; the
    cache files made. A failure leaves no cache it made behind."""
    paths = [(flag, getattr(args, name, None)) for flag, name in
             (("--data", "data"), ("--eval-data", "eval_data"))]
    texts = [(flag, p) for flag, p in paths if p is not None and not p.endswith(".npy")]
    if not texts:
        return []
    text = text_settings(args, config, build=True)
    for flag, path in texts:
        find_sources(path, flag)  # a missing or empty file first: no tokenizer fixes that
    files = [f for _, path in texts for f in cache_files(path, text_tokenizer(text))]
    existing = {f for f in files if f.exists()}
    try:
        for flag, path in texts:
            data_rows(path, flag, seq_len + 1, text)
    except BaseException:  # e.g. too few tokens for a row: no cache of a failed start
        for file in files:
            if file not in existing:
                file.unlink(missing_ok=True)
        raise
    return [f for f in files if f not in existing and f.exists()]


def prepare_program_text_data(args, program_dir) -> None:
    """prepare_text_data for the model and sequence length of a compiled program."""
    from ratrain.rt.load import read_manifest
    manifest = read_manifest(Path(program_dir))
    prepare_text_data(args, manifest["model"]["config"], manifest["options"]["seq_len"])


def text_settings(args, config: dict, build: bool) -> TextSettings:
    return TextSettings(config, getattr(args, "tokenizer", None),
                        getattr(args, "init_from", None), resumed_checkpoint(args), build,
                        getattr(args, "text_field", None) or TEXT_FIELD)


def text_tokenizer(text: TextSettings):
    return choose_tokenizer(text.config, text.tokenizer, text.init_from, text.resume)


def resumed_checkpoint(args) -> str | None:
    """The checkpoint directory --resume names, or None (none, or none found there: the
    set-up reports that)."""
    from ratrain.rt.checkpoint import find_resume_checkpoint
    try:
        return str(find_resume_checkpoint(args.resume)) if args.resume else None
    except ValueError:
        return None


# ---- the identity of a token stream ------------------------------------------------------

# NOTE [token stream identity]: a checkpoint's trainer_state.json records which tokens
# its run trained on: the --data path (resolved) and its size in bytes, the sha256 of the
# tokenizer.json (or "bytes"), its EOS id and the cache key they make, and --text-field
# when it is not "text" (left out otherwise, so older checkpoints still compare equal). A resumed run
# computes the same for its own --data and tokenizer and refuses to start when any of them
# differs (unless --allow-data-change): the rows of step k would be other rows, and a
# byte-tokenized stream fed to a BPE-trained model trains happily on garbage.

def token_stream_identity(data: str | None, text: TextSettings) -> dict:
    """What identifies the training tokens of `data` made under `text` (NOTE [token
    stream identity]); a DataError for data that cannot be read."""
    if data is None:
        return {"data": None, "tokenizer": "bytes"}  # the built-in corpus
    path = Path(data).resolve()
    if data.endswith(".npy"):
        try:
            return {"data": str(path), "data_bytes": path.stat().st_size, "tokenizer": None}
        except OSError as e:
            raise DataError(f"cannot read --data {data}: {e.strerror}") from None
    sources = find_sources(data, "--data")
    choice = text_tokenizer(text)
    return {"data": str(path), "data_bytes": sum(s.size for s in sources),
            "tokenizer": choice.digest, "eos_id": choice.eos_id,
            "cache_key": cache_key(choice),
            **({"text_field": text.text_field} if text.text_field != TEXT_FIELD else {})}


def stream_change(saved: dict, current: dict) -> str | None:
    """How the token stream `current` differs from a checkpoint's `saved` (one phrase
    naming the first difference), or None when they are the same."""
    for key, what in (("data", "--data"), ("data_bytes", "--data size in bytes"),
                      ("tokenizer", "tokenizer"), ("eos_id", "end-of-document id"),
                      ("text_field", "--text-field")):
        if saved.get(key) != current.get(key):
            return (f"its {what} was {_shown(key, saved.get(key))}, this run's is "
                    f"{_shown(key, current.get(key))}")
    return None


def _shown(key: str, value) -> str:
    if key == "data" and value is None:
        return "the built-in corpus"
    if key == "text_field" and value is None:
        return TEXT_FIELD
    if key == "tokenizer":
        return {"bytes": "UTF-8 bytes", None: "none (token rows)"}.get(
            value, f"tokenizer.json sha256 {str(value)[:12]}")
    return f"{value:,}" if isinstance(value, int) else str(value)


def training_rows(data: str | None, seq_len: int, vocab: int,
                  text: TextSettings | None = None) -> np.ndarray:
    """--data rows, or the built-in corpus (which needs a byte vocabulary)."""
    if data is not None:
        return data_rows(data, "--data", seq_len + 1,
                         text or TextSettings({"vocab_size": vocab}))
    if vocab < 256:
        raise DataError(f"the built-in corpus is bytes (256 token ids) but the model's "
                        f"vocabulary has {vocab}: pass --data with text and --tokenizer "
                        "DIR, or --data FILE.npy")
    return byte_rows(stdlib_corpus(), seq_len + 1)
