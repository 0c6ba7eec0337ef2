"""Documents of a --data path: a .txt file (one document), a directory of .txt files (one
document each, sorted, recursive), a .jsonl file (one document per line, its text field),
or a table (tables.py: a parquet file or a saved Hugging Face `datasets` directory, one
document per row). They are read as a stream of text pieces, each with its share of the
data's bytes (for progress) and whether it ends its document, so memory stays flat.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from ratrain.data.records import DataError, Piece, Source
from ratrain.data.tables import is_table, table_files, table_pieces

TEXT_SUFFIXES = (".txt", ".jsonl")
TEXT_FIELD = "text"                     # the field of a .jsonl line / table column read
PIECE_BYTES = 4 * 2 ** 20               # pieces of a text that may not be cut small
SMALL_PIECE_BYTES = 256 * 2 ** 10       # pieces of one that may (NOTE [pieces of a long text])
FORMATS = ("a .txt file, a directory of .txt files, a .jsonl file, a .parquet file, a saved "
           "Hugging Face datasets directory or a .npy of token rows")


def find_sources(path: str, flag: str) -> list[Source]:
    """The files of a --data path (a table's too), or a one-line DataError."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{flag} {path} does not exist; pass {FORMATS}")
    if is_table(p):
        files = table_files(p, flag)
    elif p.is_dir():
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


def documents(path: str, sources: list[Source], flag: str, piece_bytes: int = PIECE_BYTES,
              field: str = TEXT_FIELD) -> Iterator[Piece]:
    """The Pieces of every document of the data, in order; empty documents skipped. A
    .txt is cut into pieces of about piece_bytes; a line or row is one piece."""
    if is_table(Path(path)):
        yield from table_pieces(Path(path), sources, flag, field)
        return
    for source in sources:
        if source.path.suffix == ".jsonl":
            yield from _jsonl_pieces(source.path, flag, field)
        else:
            yield from _ending(_text_pieces(source.path, flag, piece_bytes), str(source.path))


def _ending(pieces, where: str) -> Iterator[Piece]:
    """(text, bytes) pieces of one document as Pieces, the last one marked (one ahead)."""
    previous = None
    for text, nbytes in pieces:
        if previous is not None:
            yield Piece(*previous, False, where)
        previous = (text, nbytes)
    if previous is not None:
        yield Piece(*previous, True, where)


def _jsonl_pieces(path: Path, flag: str, field: str) -> Iterator[Piece]:
    """A Piece of every non-blank line of a .jsonl file with a non-empty text."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            text = _line_text(raw, f"{flag} {path}:{number}", field)
            if text:
                yield Piece(text, len(raw), True, f"{path}:{number}")


def _line_text(raw: bytes, where: str, field: str) -> str:
    try:
        record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{where}: not a JSON object ({e}); each line must be like "
                        f'{{"{field}": "..."}}') from None
    if not isinstance(record, dict) or not isinstance(record.get(field), str):
        hint = "" if field != TEXT_FIELD else " (or name its field with --text-field)"
        raise DataError(f'{where}: no "{field}" string field; each line must be a JSON object '
                        f'like {{"{field}": "..."}}{hint}')
    return record[field]


def _text_pieces(path: Path, flag: str, piece_bytes: int = PIECE_BYTES
                 ) -> Iterator[tuple[str, int]]:
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
# tokens' Python objects at once and run on one core, so long files are encoded in pieces.
# A piece ends after a single line break with a non-space character on both sides: the
# pre-tokenizers of GPT-2, LLaMA-3 and Qwen2 BPEs split there whether or not the text goes
# on, so the ids equal those of encoding the whole file. (A run of line breaks would not
# do: at the end of a text GPT-2's regex takes "\n\n" as one pre-token, inside it "\n",
# "\n"; a piece cut there gave other ids.) Whether a tokenizer splits there is probed
# (tokenizer.cuts_at_line_breaks: its normalizer and pre-tokenizer on "x\ny" against "x\n"
# and "y", for letters, digits, punctuation and non-ASCII on both sides); one that does is
# cut into SMALL_PIECE_BYTES pieces, so a batch spreads over every core (NOTE [encoding on
# every core]), with the same ids as format 2's 4 MiB pieces and as the whole file. One
# that does not (sentencepiece-style Metaspace, or a ByteLevel with add_prefix_space,
# which add a prefix to every call; no pre-tokenizer at all) keeps PIECE_BYTES pieces and
# its format-2 ids: one more prefix token per 4 MiB piece, as before.


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
