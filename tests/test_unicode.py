"""Any text survives: more than 65,535 distinct characters (ids stored as uint32), \\r\\n line ends, a byte-order
mark, very long lines, characters outside the Basic Multilingual Plane, and multi-byte characters split across
read chunks. encode -> train -> checkpoint vocabulary -> decode gives back exactly the text."""

import numpy as np
import pytest

import chargpt
from chargpt.data import corpus as data
from chargpt.data.tokenizer import Vocab
from chargpt.errors import DataError

TINY_KW = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0, threads=1,
               sample_chars=0, dtype="float32", warmup_iters=0, max_iters=2, eval_interval=2)

TRICKY = ("\ufeffA byte-order mark opens this file.\r\n"
          "Windows line ends\r\nand Unix ones\nand an old Mac one\rtoo.\r\n"
          "Emoji and other astral characters: \U0001f600\U0001f389 \U0001d11e \U00020000 \U0001f469\u200d\U0001f4bb\n"
          "Combining: e\u0301 vs \u00e9; right-to-left: \u05e9\u05dc\u05d5\u05dd; CJK: \u4e2d\u6587; tab\there.\n")


def ids_of(corpus):
    return np.asarray(corpus.ids())


def test_tricky_text_round_trips_through_encode_train_and_the_checkpoint(tmp_path):
    text = TRICKY * 20 + "a very long line " * 12_000 + "\r\n" + TRICKY  # ~200k characters with no newline
    (tmp_path / "tricky.txt").write_bytes(text.encode("utf-8"))

    corpus = data.encode_corpus("tricky.txt")
    assert corpus.length == len(text)
    assert corpus.vocab.decode(ids_of(corpus)) == text
    chargpt.train(log=lambda msg: None, data="tricky.txt", out_dir="run", **TINY_KW)

    gen = chargpt.load("run", device="cpu")
    assert gen.vocab.chars == sorted(set(text))  # exactly those characters, nothing normalised or lost
    assert gen.vocab.decode(gen.vocab.encode(text)) == text
    assert gen.vocab.decode(ids_of(corpus)) == text
    sample = gen.generate(TRICKY[-40:], max_new_tokens=20, seed=1, temperature=1.0)[0]
    assert len(sample) == 20 and set(sample) <= set(text)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_characters_split_across_read_chunks(tmp_path, monkeypatch, chunk):
    """Incremental decoding: a 4-byte emoji or a \\r\\n cut between two reads comes out whole."""
    monkeypatch.setattr(data, "CHUNK_BYTES", chunk)
    (tmp_path / "t.txt").write_bytes(TRICKY.encode("utf-8"))
    corpus = data.encode_corpus("t.txt")
    assert corpus.vocab.decode(ids_of(corpus)) == TRICKY


def test_undecodable_byte_offset_is_exact_in_a_later_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "CHUNK_BYTES", 7)
    good = ("\U0001f600 caf\u00e9\r\n" * 50).encode("utf-8")
    (tmp_path / "a.txt").write_text("first file is fine\n", encoding="utf-8")
    (tmp_path / "b.txt").write_bytes(good + b"\xe2\x82" + b"!" + good)  # a truncated 3-byte sequence
    with pytest.raises(DataError, match=rf"b\.txt is not valid utf-8: undecodable byte 0xe2 at byte offset "
                                        rf"{len(good)};"):
        data.encode_corpus(str(tmp_path))
    assert not (tmp_path / "cache").exists()  # nothing half-written


def test_directory_corpus_joins_files_with_newlines(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "1.txt").write_text("no trailing newline", encoding="utf-8")
    (tmp_path / "d" / "2.txt").write_text("\U0001f600 second\r\n", encoding="utf-8")
    corpus = data.encode_corpus("d")
    assert corpus.vocab.decode(ids_of(corpus)) == "no trailing newline\n\U0001f600 second\r\n"


def test_more_than_65535_distinct_characters_use_uint32_ids(tmp_path):
    points = [p for p in range(0x100, 0x100 + 75_000) if not 0xD800 <= p <= 0xDFFF][:70_000]  # no surrogates
    rng = np.random.default_rng(0)
    order = np.concatenate([rng.permutation(len(points)) for _ in range(2)])
    text = "".join(chr(points[i]) for i in order) + "\n"
    (tmp_path / "many.txt").write_text(text, encoding="utf-8")

    corpus = data.encode_corpus("many.txt")
    assert len(corpus.vocab) == 70_001 and corpus.vocab.id_dtype == np.uint32
    assert corpus.ids_path.stat().st_size == 4 * len(text)
    ids = ids_of(corpus)
    assert ids.max() == 70_000 and corpus.vocab.decode(ids) == text

    chargpt.train(log=lambda msg: None, data="many.txt", out_dir="run", **TINY_KW)
    gen = chargpt.load("run", device="cpu")
    assert len(gen.vocab) == gen.model.config.vocab_size == 70_001
    assert gen.vocab == Vocab(sorted(set(text)))
    sample = gen.generate(text[:10], max_new_tokens=8, seed=0, temperature=1.0)[0]
    assert len(sample) == 8 and set(sample) <= set(text)
