"""Tokenizing at scale: small line-aligned pieces spread over the cores give the ids of the
format-2 path (the whole file's) for tokenizers that may be cut, and the old 4 MiB pieces
for those that may not; progress lines with MiB/s and the time left; parquet and saved
`datasets` tables (skipped without the extra), their text column named by --text-field."""
import io
import json

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from ratrain.data import DataError, cache, choose_tokenizer, encode, progress, token_stream
from ratrain.data import tokenizer as tokenizer_module
from ratrain.data.sources import PIECE_BYTES, SMALL_PIECE_BYTES
from ratrain.rt.data import TextSettings, data_rows

LINES = ["def f(x):", "    return x + 1", "", "class A:  # note", "\tpass", "x = [1, 2]",
         "print('héllo, 中文')", "  ", "if a and b:", "    y = a.b(c) * 3"]


def source_text(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return "".join(LINES[i] + sep for i, sep in
                   zip(rng.integers(0, len(LINES), n), rng.choice(["\n", "\n\n", " \n"], n)))


def byte_level_bpe(folder, prefix_space=False, normalizer=None):
    """A GPT-2 style byte-level BPE (or, with prefix_space, one that adds a space to every
    call) saved as folder/tokenizer.json, <|endoftext|> its id 0."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    bpe.normalizer = normalizer
    bpe.train_from_iterator([source_text(400, 0)], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder.mkdir(exist_ok=True)
    bpe.save(str(folder / "tokenizer.json"))
    return bpe


@pytest.fixture()
def small_pieces(monkeypatch):
    """Pieces of about 300 bytes and batches of 4 pieces: many of both in a small file."""
    monkeypatch.setattr(tokenizer_module, "SMALL_PIECE_BYTES", 300)
    monkeypatch.setattr(cache, "batch_bytes", lambda piece: 4 * piece)
    calls = []
    real = encode.hf_encode

    def counted(tokenizer):
        inner = real(tokenizer)
        return lambda texts: calls.append(len(texts)) or inner(texts)
    monkeypatch.setattr(tokenizer_module, "hf_encode", counted)
    return calls


def stream_of(path, folder, vocab=400, field="text"):
    choice = choose_tokenizer({"vocab_size": vocab}, str(folder), None)
    return np.asarray(token_stream(str(path), "--data", choice, vocab, field=field)).tolist()


def test_small_pieces_give_the_format_2_ids(tmp_path, small_pieces):
    """See NOTE [pieces of a long text]: the pieces' ids are the whole file's, which is what
    format 2 wrote for a file under 4 MiB (one piece): old caches stay valid."""
    bpe = byte_level_bpe(tmp_path / "tok")
    text = source_text(600, 1)
    (tmp_path / "a.txt").write_text(text)
    whole = bpe.encode(text, add_special_tokens=False).ids + [0]
    assert stream_of(tmp_path / "a.txt", tmp_path / "tok") == whole
    assert len(small_pieces) > 5 and max(small_pieces) > 1   # batches of several pieces
    assert cache.FORMAT == "ratrain-tokens/2"


def test_tokenizers_that_may_not_be_cut_keep_large_pieces(tmp_path):
    folder = tmp_path / "tok"
    byte_level_bpe(folder)
    cut = choose_tokenizer({"vocab_size": 400}, str(folder), None).encoder()
    assert cut.piece_bytes == SMALL_PIECE_BYTES
    for name, tokenizer in {
            "prefix space": byte_level_bpe(folder, prefix_space=True),
            "prepend": byte_level_bpe(folder, normalizer=normalizers.Prepend("▁"))}.items():
        assert not tokenizer_module.cuts_at_line_breaks(tokenizer), name
        choice = choose_tokenizer({"vocab_size": 400}, str(folder), None)
        assert choice.encoder().piece_bytes == PIECE_BYTES, name
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    assert not tokenizer_module.cuts_at_line_breaks(tokenizer)


def test_progress_lines_carry_the_rate_and_time_left():
    now = [0.0]
    out = io.StringIO()
    bar = progress.Progress("tokenizing a.txt", 10 * 2 ** 20, stream=out, clock=lambda: now[0])
    bar.tick()
    assert out.getvalue() == ""                       # nothing before the first second
    now[0] = 1.0
    bar.tick()
    now[0] = 2.0
    bar.advance(4 * 2 ** 20)                          # within LOG_EVERY_S: no line
    now[0] = 12.0
    bar.advance(2 * 2 ** 20)
    now[0] = 15.0
    bar.done("3 documents, 1,000 tokens")
    assert out.getvalue().splitlines() == [
        "tokenizing a.txt: 0.0/10.0 MiB (0%), starting",
        "tokenizing a.txt: 6.0/10.0 MiB (60%), 0.5 MiB/s, 8 s left",
        "tokenizing a.txt: 3 documents, 1,000 tokens in 15.0 s (0.4 MiB/s)"]


def test_tokenizing_prints_progress_lines(tmp_path, small_pieces, monkeypatch, capsys):
    monkeypatch.setattr(progress, "FIRST_LINE_S", 0.0)
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    byte_level_bpe(tmp_path / "tok")
    (tmp_path / "a.txt").write_text(source_text(300, 2))
    stream_of(tmp_path / "a.txt", tmp_path / "tok")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) > 3 and all(l.startswith(f"tokenizing {tmp_path}/a.txt: ") for l in lines)
    assert "MiB/s" in lines[1] and lines[1].endswith(" left")
    assert " documents, " in lines[-1] and lines[-1].endswith(" MiB/s)")


def test_text_field_of_jsonl_and_refused_for_plain_text(tmp_path):
    bpe = byte_level_bpe(tmp_path / "tok")
    (tmp_path / "d.jsonl").write_text('{"body": "x = 1"}\n{"body": "def f(): pass"}\n')
    expected = [i for t in ("x = 1", "def f(): pass")
                for i in bpe.encode(t, add_special_tokens=False).ids + [0]]
    assert stream_of(tmp_path / "d.jsonl", tmp_path / "tok", field="body") == expected
    with pytest.raises(DataError, match=r'd.jsonl:1: no "text" string field.*--text-field'):
        stream_of(tmp_path / "d.jsonl", tmp_path / "tok")
    (tmp_path / "a.txt").write_text("x = 1\n")
    text = TextSettings({"vocab_size": 400}, tokenizer=str(tmp_path / "tok"),
                        text_field="body")
    with pytest.raises(DataError, match=r"^--text-field body names a field of .jsonl, parquet "
                       r"or datasets records, but --data \S+a.txt is plain text: leave"):
        data_rows(str(tmp_path / "a.txt"), "--data", 3, text)


ROWS = {"text": ["x = 1", "", "def f(): pass", "print(2)"],
        "body": ["a = 2", "b", "c = 3", ""]}


def expected_rows(bpe, column):
    return [i for t in ROWS[column] if t for i in bpe.encode(t, add_special_tokens=False).ids
            + [0]]


def test_parquet_rows_are_documents(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="parquet data needs the optional pyarrow")
    import pyarrow.parquet as pq
    bpe = byte_level_bpe(tmp_path / "tok")
    pq.write_table(pa.table({**ROWS, "n": [1, 2, 3, 4]}), tmp_path / "d.parquet",
                   row_group_size=2)
    assert stream_of(tmp_path / "d.parquet", tmp_path / "tok") == expected_rows(bpe, "text")
    assert stream_of(tmp_path / "d.parquet", tmp_path / "tok", field="body") == \
        expected_rows(bpe, "body")
    for field, message in (("title", r"has no column 'title' \(its columns: text, body, n\); "
                                     r"name the text column with --text-field"),
                           ("n", r"column 'n' holds int64, not text")):
        with pytest.raises(DataError, match=message):
            stream_of(tmp_path / "d.parquet", tmp_path / "tok", field=field)


def test_saved_datasets_directory_rows_are_documents(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets data needs the optional "
                                   "datasets package")
    bpe = byte_level_bpe(tmp_path / "tok")
    datasets.Dataset.from_dict(ROWS).save_to_disk(str(tmp_path / "ds"))
    assert stream_of(tmp_path / "ds", tmp_path / "tok") == expected_rows(bpe, "text")
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict(ROWS),
                                   "test": datasets.Dataset.from_dict(ROWS)})
    splits.save_to_disk(str(tmp_path / "dd"))
    assert stream_of(tmp_path / "dd", tmp_path / "tok", field="body") == \
        expected_rows(bpe, "body")
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(ROWS)}).save_to_disk(
        str(tmp_path / "only-test"))
    with pytest.raises(DataError, match=r"holds the splits test and no 'train'; pass one "
                       r"split's directory"):
        stream_of(tmp_path / "only-test", tmp_path / "tok")
    sidecar = next(tmp_path.glob("dd.*.tokens.json"))
    assert json.loads(sidecar.read_text())["text_field"] == "body"
