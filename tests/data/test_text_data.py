"""Text --data: .txt, directories of .txt and .jsonl tokenized with a checkpoint's
tokenizer.json (a tiny BPE trained here) or as bytes, EOS-joined, packed into rows and
cached next to the data; every bad input is one line naming the file and the fix."""
import json
import os
import re

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from ratrain.data import DataError, cache, choose_tokenizer, token_stream
from ratrain.data.sources import _text_pieces, find_sources
from ratrain.rt.data import TextSettings, data_rows

WORDS = "the cat sat on a mat and the dog ran to the cat then a bird sang".split()
EOS = "</s>"


def sample_text(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    lines = [" ".join(rng.choice(WORDS, 8)) for _ in range(n)]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint-like directory: config.json (no eos_token_id) and a BPE tokenizer.json
    of 60 ids whose special tokens are <unk> (0) and </s> (1)."""
    folder = tmp_path_factory.mktemp("ckpt")
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([sample_text(200, 0)], trainers.BpeTrainer(
        vocab_size=60, special_tokens=["<unk>", EOS]))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 64}))
    return folder


def encode(checkpoint, text: str) -> list[int]:
    return Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids


def settings(checkpoint, vocab=64, **config):
    return TextSettings({"vocab_size": vocab, **config}, init_from=str(checkpoint))


def stream(path, checkpoint, vocab=64, **config):
    choice = choose_tokenizer({"vocab_size": vocab, **config}, None, str(checkpoint))
    return np.asarray(token_stream(str(path), "--data", choice, vocab))


def test_txt_is_the_tokenizers_own_ids_then_eos(tmp_path, checkpoint):
    text = sample_text(30, 1)
    (tmp_path / "a.txt").write_text(text)
    eos = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).token_to_id(EOS)
    assert eos == 1
    assert stream(tmp_path / "a.txt", checkpoint).tolist() == encode(checkpoint, text) + [eos]


def test_directory_is_sorted_recursive_documents_joined_by_eos(tmp_path, checkpoint):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "b.txt").write_text("the dog ran")
    (docs / "sub" / "c.txt").write_text("a bird sang")
    (docs / "a.txt").write_text("the cat sat")
    (docs / "notes.md").write_text("not text data")
    expected = [i for t in ("the cat sat", "the dog ran", "a bird sang")
                for i in encode(checkpoint, t) + [1]]
    assert stream(docs, checkpoint).tolist() == expected


def test_jsonl_documents_and_config_eos_first(tmp_path, checkpoint):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "the cat sat"}\n\n{"text": "on a mat", "id": 2}\n')
    expected = encode(checkpoint, "the cat sat") + [7] + encode(checkpoint, "on a mat") + [7]
    assert stream(path, checkpoint, eos_token_id=[7, 1]).tolist() == expected


def test_rows_pack_the_stream_consecutively(tmp_path, checkpoint):
    (tmp_path / "a.txt").write_text(sample_text(40, 2))
    ids = stream(tmp_path / "a.txt", checkpoint)
    rows = data_rows(str(tmp_path / "a.txt"), "--data", 17, settings(checkpoint))
    assert rows.shape == (len(ids) // 17, 17) and rows.dtype == np.uint16
    assert rows.ravel().tolist() == ids[:rows.size].tolist()


def test_cache_is_reused_then_invalidated_by_a_changed_source(tmp_path, checkpoint, monkeypatch):
    path = tmp_path / "a.txt"
    path.write_text(sample_text(20, 3))
    first = stream(path, checkpoint)
    caches = sorted(p.name for p in tmp_path.iterdir() if ".tokens." in p.name)
    assert len(caches) == 2 and caches[0].endswith(".bin") and caches[1].endswith(".json")
    assert np.fromfile(tmp_path / caches[0], np.uint16).tolist() == first.tolist()
    calls = []
    original = cache.TokenizerChoice.encoder
    monkeypatch.setattr(cache.TokenizerChoice, "encoder",
                        lambda self: calls.append(1) or original(self))
    assert stream(path, checkpoint).tolist() == first.tolist() and calls == []
    path.write_text("the cat sat on a mat\n")
    assert stream(path, checkpoint).tolist() == encode(checkpoint, "the cat sat on a mat\n") + [1]
    assert calls == [1]


def test_memmap_only_refuses_a_missing_cache(tmp_path, checkpoint):
    (tmp_path / "a.txt").write_text(sample_text(5, 4))
    text = TextSettings({"vocab_size": 64}, init_from=str(checkpoint), build=False)
    with pytest.raises(DataError, match="no token cache"):
        data_rows(str(tmp_path / "a.txt"), "--data", 5, text)


def test_unwritable_data_directory_caches_under_ratrain_cache(tmp_path, checkpoint,
                                                              monkeypatch, capsys):
    data, home = tmp_path / "ro", tmp_path / "cache"
    data.mkdir()
    (data / "a.txt").write_text(sample_text(5, 5))
    monkeypatch.setenv("RATRAIN_CACHE", str(home))
    real = cache.tempfile.TemporaryFile

    def refuse(dir=None, **kw):  # root writes anywhere: refuse the data's directory
        if str(dir) == str(data):
            raise PermissionError(13, "Permission denied")
        return real(dir=dir, **kw)
    monkeypatch.setattr(cache.tempfile, "TemporaryFile", refuse)
    ids = stream(data / "a.txt", checkpoint)
    assert "not writable" in capsys.readouterr().err
    assert not [p for p in data.iterdir() if ".tokens." in p.name]
    assert len(list((home / "tokens").glob("a.txt.*.tokens.bin"))) == 1
    text = TextSettings({"vocab_size": 64}, init_from=str(checkpoint), build=False)
    assert data_rows(str(data / "a.txt"), "--data", 5, text).ravel().tolist() == \
        ids[:len(ids) // 5 * 5].tolist()


def test_byte_tokens_without_a_tokenizer(tmp_path):
    (tmp_path / "a.txt").write_text("héllo")
    (tmp_path / "b.jsonl").write_text('{"text": "ab"}\n{"text": "c"}\n')
    bytes_only = TextSettings({"vocab_size": 300, "eos_token_id": 2})
    assert data_rows(str(tmp_path / "a.txt"), "--data", 7, bytes_only).tolist() == \
        [list("héllo".encode()) + [0]]
    assert data_rows(str(tmp_path / "b.jsonl"), "--data", 5, bytes_only).tolist() == \
        [[97, 98, 0, 99, 0]]
    with pytest.raises(DataError, match="pass --tokenizer DIR"):
        data_rows(str(tmp_path / "a.txt"), "--data", 7, TextSettings({"vocab_size": 64}))


def test_tokenizer_flag_wins_over_init_from(tmp_path, checkpoint):
    choice = choose_tokenizer({"vocab_size": 64}, str(checkpoint), str(tmp_path))
    assert choice.source == f"--tokenizer {checkpoint}" and choice.eos_id == 1
    assert choose_tokenizer({"vocab_size": 256}, None, str(tmp_path)).path is None


def test_a_resumed_run_tokenizes_with_its_checkpoints_tokenizer(tmp_path, checkpoint):
    """Without --tokenizer, the --resume checkpoint's tokenizer.json comes before
    --init-from's and before bytes (the vocabulary of 256 would take bytes silently)."""
    resumed = choose_tokenizer({"vocab_size": 256}, None, None, str(checkpoint))
    assert resumed.source == f"--resume {checkpoint}" and resumed.eos_id == 1
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_text((checkpoint / "tokenizer.json").read_text())
    assert choose_tokenizer({"vocab_size": 64}, None, str(other), str(checkpoint)).source \
        == f"--resume {checkpoint}"
    assert choose_tokenizer({"vocab_size": 64}, str(other), None, str(checkpoint)).source \
        == f"--tokenizer {other}"


def test_long_text_pieces_cut_after_a_line_break(tmp_path):
    text = sample_text(50, 6) + "  indented\n\n\nlast"
    (tmp_path / "a.txt").write_text(text)
    pieces = list(_text_pieces(tmp_path / "a.txt", "--data", piece_bytes=64))
    assert len(pieces) > 5 and "".join(p for p, _ in pieces) == text
    assert sum(n for _, n in pieces) == len(text.encode())
    assert all(p.endswith("\n") and not after[0].isspace()
               for (p, _), (after, _) in zip(pieces, pieces[1:]))


def one_line_error(path, checkpoint, row_len=17, vocab=64, flag="--data") -> str:
    with pytest.raises(DataError) as e:
        data_rows(str(path), flag, row_len, settings(checkpoint, vocab))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_bad_inputs_are_one_line_errors_naming_the_file(tmp_path, checkpoint):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "empty").mkdir()
    (tmp_path / "short.txt").write_text("the cat")
    (tmp_path / "data.csv").write_text("a,b")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    (tmp_path / "broken.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    cases = {
        "missing.txt": r"--data \S*missing.txt does not exist; pass a .txt file",
        "empty.txt": r"--data \S*empty.txt is empty",
        "empty": r"--data \S*empty is a directory without .txt files",
        "short.txt": r"--data \S*short.txt has 3 tokens, fewer than one row of seq-len \+ 1 "
                     r"= 17",
        "data.csv": r"--data \S*data.csv: unknown extension '.csv'; pass a .txt",
        "bad.jsonl": r'--data \S*bad.jsonl:2: no "text" string field',
        "broken.jsonl": r"--data \S*broken.jsonl:2: not a JSON object",
        "latin1.txt": r"--data \S*latin1.txt is not UTF-8 text \(byte 3\)",
    }
    for name, pattern in cases.items():
        assert re.fullmatch(pattern + ".*", one_line_error(tmp_path / name, checkpoint)), name
    (tmp_path / "big.txt").write_text(sample_text(5, 7))
    message = one_line_error(tmp_path / "big.txt", checkpoint, vocab=20, flag="--eval-data")
    assert re.match(r"--eval-data: --init-from \S+ makes token id \d+ for \S*big.txt, but the "
                    r"model's vocabulary has 20 ids; pass the model's own tokenizer", message)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("big.txt.")]
    with pytest.raises(DataError, match="holds no tokenizer.json"):
        choose_tokenizer({"vocab_size": 64}, str(tmp_path), None)
    assert find_sources(str(tmp_path / "big.txt"), "--data")[0].size == \
        os.path.getsize(tmp_path / "big.txt")


def test_pieces_encode_to_the_ids_of_the_whole_text(tmp_path):
    """See NOTE [pieces of a long text]: with a GPT-2 style byte-level BPE, blank lines, runs
    of spaces and indentation, the pieces' ids joined are the whole file's ids."""
    lines = sample_text(300, 3).splitlines()
    text = "".join(line + rng_sep for line, rng_sep in
                   zip(lines, np.random.default_rng(1).choice(["\n", "\n\n", "\n  ", " \n"],
                                                              len(lines))))
    (tmp_path / "a.txt").write_text(text)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    # documents ending in blank lines teach it a "\n\n" token, as real corpora do
    bpe.train_from_iterator([line + "\n\n" for line in lines], trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    assert len(bpe.encode("a\n\n").ids) == 2
    pieces = list(_text_pieces(tmp_path / "a.txt", "--data", piece_bytes=256))
    assert len(pieces) > 20 and "".join(p for p, _ in pieces) == text
    joined = [i for p, _ in pieces for i in bpe.encode(p, add_special_tokens=False).ids]
    assert joined == bpe.encode(text, add_special_tokens=False).ids
    assert len(list(_text_pieces(tmp_path / "a.txt", "--data",
                                 piece_bytes=len(text.encode()) + 1))) == 1
