"""Tables as --data: a .parquet file (pyarrow) or a directory saved by Hugging Face
`datasets` (`save_to_disk`; its "train" split when it holds several), one document per
row from its text column ("text", or --text-field). Read in record batches, so memory
stays flat; both libraries are an optional extra (`pip install ratrain[data]`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from ratrain.data.records import DataError, Piece, Source

ROWS_PER_BATCH = 1024                   # rows read at once
DATASET_MARKERS = ("state.json", "dataset_dict.json")   # what save_to_disk writes
SPLIT = "train"                          # the split a DatasetDict is trained on
EXTRA = "pip install 'ratrain[data]' (or pip install pyarrow datasets)"


def is_table(path: Path) -> bool:
    """A .parquet file, or a directory `datasets` saved."""
    if path.is_dir():
        return any((path / marker).is_file() for marker in DATASET_MARKERS)
    return path.suffix == ".parquet"


def table_files(path: Path, flag: str) -> list[Path]:
    """The files whose sizes and times fingerprint the table (a directory's, sorted)."""
    if path.is_dir():
        return sorted(f for f in path.rglob("*") if f.is_file())
    return [path]


def table_pieces(path: Path, sources: list[Source], flag: str, field: str
                 ) -> Iterator[Piece]:
    """A Piece per row with a non-empty text, each row's share of the table's bytes its
    progress (the shares add up to the files' total)."""
    batches, rows = (_dataset_batches if path.is_dir() else _parquet_batches)(path, flag, field)
    total, done, row = sum(s.size for s in sources), 0, 0
    for texts in batches:
        for text in texts:
            row += 1
            share = total * row // max(rows, 1) - done
            done += share
            if text:
                yield Piece(text, share, True, f"{path} row {row}")


def _parquet_batches(path: Path, flag: str, field: str):
    """(batches of the column's values, row count) of a parquet file."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{flag} {path} is a parquet file, which needs pyarrow: "
                        f"{EXTRA}") from None
    try:
        table = pq.ParquetFile(path)
    except Exception as e:  # pyarrow's errors have no common base worth naming
        raise DataError(f"{flag} {path}: cannot read it as parquet ({_first_line(e)}); pass "
                        "a parquet file with a text column") from None
    _check_column(table.schema_arrow, path, flag, field)
    batches = (b.column(0).to_pylist()
               for b in table.iter_batches(ROWS_PER_BATCH, columns=[field]))
    return batches, table.metadata.num_rows


def _dataset_batches(path: Path, flag: str, field: str):
    """(batches of the column's values, row count) of a saved `datasets` directory."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"{flag} {path} is a Hugging Face datasets directory, which needs "
                        f"datasets: {EXTRA}") from None
    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises several unrelated kinds
        raise DataError(f"{flag} {path}: cannot load it with datasets.load_from_disk "
                        f"({_first_line(e)})") from None
    if isinstance(dataset, datasets.DatasetDict):
        dataset = _train_split(dataset, path, flag)
    _check_column(dataset.data.schema, path, flag, field)
    arrow = dataset.select_columns([field]).with_format("arrow")
    batches = (b.column(0).to_pylist() for b in arrow.iter(batch_size=ROWS_PER_BATCH))
    return batches, dataset.num_rows


def _train_split(splits, path: Path, flag: str):
    if SPLIT not in splits:
        raise DataError(f"{flag} {path} holds the splits {', '.join(splits)} and no "
                        f"{SPLIT!r}; pass one split's directory, {path}/NAME")
    return splits[SPLIT]


def _check_column(schema, path: Path, flag: str, field: str) -> None:
    """The column exists and holds strings."""
    import pyarrow as pa
    if field not in schema.names:
        raise DataError(f"{flag} {path} has no column {field!r} (its columns: "
                        f"{', '.join(schema.names)}); name the text column with --text-field")
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{flag} {path}: column {field!r} holds {kind}, not text; name the "
                        "text column with --text-field")


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
