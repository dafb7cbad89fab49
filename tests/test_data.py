"""Vocabulary, encoding, the on-disk cache, splits and batches."""

import numpy as np
import pytest
import torch

from chargpt.data.corpus import Batches, encode_corpus, split_sizes
from chargpt.data.tokenizer import Vocab
from chargpt.errors import DataError

MIXED = "Hello, 世界! 床前明月光，疑是地上霜。 emoji 🙂🚀 tab\tend\r\n"


def test_vocab_round_trip_chinese_and_emoji():
    vocab = Vocab.from_text(MIXED)
    assert vocab.chars == sorted(set(MIXED))
    assert vocab.decode(vocab.encode(MIXED)) == MIXED
    ids = vocab.ids_from_codepoints(np.array([ord(c) for c in MIXED], dtype=np.uint32))
    assert ids.tolist() == vocab.encode(MIXED)  # vectorised and per-character encodings agree


def test_encode_corpus_round_trip_and_dtype(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_text(MIXED * 50, encoding="utf-8", newline="")
    enc = encode_corpus(str(path))
    ids = enc.ids()
    assert ids.dtype == np.uint16 and isinstance(ids, np.memmap)
    assert enc.vocab.decode(ids) == MIXED * 50  # \r\n and characters outside the BMP survive


def test_cache_skips_second_encoding(tmp_path, monkeypatch):
    path = tmp_path / "a.txt"
    path.write_text("abc" * 100, encoding="utf-8")
    first = encode_corpus(str(path))
    import chargpt.data.corpus as data
    monkeypatch.setattr(data, "iter_text", lambda *a, **k: pytest.fail("re-encoded a cached corpus"))
    second = encode_corpus(str(path))
    assert second.ids_path == first.ids_path and second.vocab == first.vocab
    path.write_text("abd" * 100, encoding="utf-8")  # new content -> new cache entry
    monkeypatch.undo()
    assert encode_corpus(str(path)).ids_path != first.ids_path


def test_directory_corpus_reads_text_files_in_sorted_order(tmp_path):
    d = tmp_path / "poems"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_text("second\n", encoding="utf-8")
    (d / "a.txt").write_text("first", encoding="utf-8")  # no final newline: one is added between files
    (d / "sub" / "c.md").write_text("third\n", encoding="utf-8")
    (d / "image.bin").write_bytes(b"\x89PNG\x00\x00\x01")  # binary files are skipped
    enc = encode_corpus(str(d))
    assert enc.vocab.decode(enc.ids()) == "first\nsecond\nthird\n"
    assert enc.name == "poems"


def test_split_sizes():
    assert split_sizes(1000, 0.1, 16) == (900, 100)
    with pytest.raises(DataError, match="too short"):
        split_sizes(100, 0.1, 16)
    with pytest.raises(DataError, match="validation split is empty"):
        split_sizes(5, 0.1, 2)


def test_batch_targets_are_inputs_shifted_by_one():
    ids = np.arange(1000, dtype=np.uint16)
    batches = Batches(ids, 0.1, block_size=8, batch_size=4, device="cpu")
    gen = torch.Generator().manual_seed(0)
    x, y = batches.get("train", gen)
    assert x.shape == y.shape == (4, 8) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y - x, torch.ones_like(x))
    assert x.max() < 900  # training windows come from the first 90%
    xv, yv = batches.get("val", gen)
    assert xv.min() >= 900 and yv.max() < 1000
    again = Batches(ids, 0.1, 8, 4, "cpu").get("train", torch.Generator().manual_seed(0))[0]
    assert torch.equal(x, again)  # the generator alone decides the windows


def test_default_corpus_is_builtin_python_help():
    enc = encode_corpus(None)
    assert enc.name == "pydoc-topics" and enc.length > 100_000
    assert "def" in enc.vocab.decode(enc.ids()[:20000])
