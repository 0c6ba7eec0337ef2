"""Documents of a --data path: a .txt file (one document), a directory of .txt files (one
document each, sorted, recursive) or a .jsonl file (one document per line, its "text"
field). Each yields text pieces with their byte counts, for tokenizing and its progress.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".jsonl")
PIECE_BYTES = 4 * 2 ** 20               # a .txt is encoded in pieces of about this size
FORMATS = "a .txt file, a directory of .txt files, a .jsonl file or a .npy of token rows"


class DataError(ValueError):
    """The training data cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class Source:
    path: Path                          # one file of the data
    size: int                           # bytes, when fingerprinted
    mtime_ns: int                       # modification time, when fingerprinted


def find_sources(path: str, flag: str) -> list[Source]:
    """The files of a .txt/.jsonl/directory --data path, or a one-line DataError."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{flag} {path} does not exist; pass {FORMATS}")
    if p.is_dir():
        files = sorted(f for f in p.rglob("*.txt") if f.is_file())
        if not files:
            raise DataError(f"{flag} {path} is a directory without .txt files (searched "
                            "recursively); put the training text in *.txt files there")
    elif p.suffix in TEXT_SUFFIXES:
        files = [p]
    else:
        raise DataError(f"{flag} {path}: unknown extension {p.suffix or '(none)'!r}; pass "
                        f"{FORMATS}")
    sources = [_source(f) for f in files]
    if sum(s.size for s in sources) == 0:
        raise DataError(f"{flag} {path} is empty; it needs text to train on")
    return sources


def _source(path: Path) -> Source:
    stat = path.stat()
    return Source(path, stat.st_size, stat.st_mtime_ns)


def documents(sources: list[Source], flag: str):
    """Per document, (where it is, the list of its (text piece, bytes)); empty ones
    skipped."""
    for source in sources:
        if source.path.suffix == ".jsonl":
            yield from ((f"{source.path}:{n}", [piece])
                        for n, piece in _jsonl_texts(source.path, flag))
        else:
            pieces = list(_text_pieces(source.path, flag))
            if pieces:
                yield str(source.path), pieces


def _jsonl_texts(path: Path, flag: str):
    """(line number, (text, line bytes)) of every non-blank line of a .jsonl file."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            text = _line_text(raw, f"{flag} {path}:{number}")
            if text:
                yield number, (text, len(raw))


def _line_text(raw: bytes, where: str) -> str:
    try:
        record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{where}: not a JSON object ({e}); each line must be like "
                        '{"text": "..."}') from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise DataError(f'{where}: no "text" string field; each line must be a JSON object '
                        'like {"text": "..."}')
    return record["text"]


def _text_pieces(path: Path, flag: str, piece_bytes: int = PIECE_BYTES):
    """A .txt file as (text, bytes) pieces of about piece_bytes, each cut after a single
    line break between two non-space characters (NOTE [pieces of a long text]); a file
    that fits in one piece is one piece."""
    with open(path, "rb") as f:
        carry, done = b"", 0
        while block := f.read(piece_bytes):
            data = carry + block
            cut = _cut_point(data) if len(block) == piece_bytes else 0
            if cut:
                yield _decode(data[:cut], path, flag, done), cut
                data, done = data[cut:], done + cut
            carry = data
        if carry:
            yield _decode(carry, path, flag, done), len(carry)


# NOTE [pieces of a long text]: encoding a whole .txt in one call would hold all its
# tokens' Python objects at once, so long files are encoded in pieces of about 4 MiB. A
# piece ends after a single line break with a non-space character on both sides: the
# pre-tokenizers of GPT-2, LLaMA-3 and Qwen2 BPEs split there whether or not the text goes
# on, so the ids equal those of encoding the whole file. (A run of line breaks would not
# do: at the end of a text GPT-2's regex takes "\n\n" as one pre-token, inside it "\n",
# "\n"; a piece cut there gave other ids.) Tokenizers that add a prefix space to every
# call (sentencepiece-style Metaspace) still add one more token per 4 MiB piece.


def _cut_point(data: bytes) -> int:
    """Index after the last b"\\n" between two non-whitespace bytes; 0 if none."""
    at = len(data) - 1
    while (at := data.rfind(b"\n", 0, at)) > 0:
        if not data[at + 1:at + 2].isspace() and not data[at - 1:at].isspace():
            return at + 1
    return 0


def _decode(data: bytes, path: Path, flag: str, offset: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{flag} {path} is not UTF-8 text (byte {offset + e.start}); "
                        "convert it to UTF-8") from None
